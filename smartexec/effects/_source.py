"""Finding the syntax tree a function was compiled from, in its source file."""

from __future__ import annotations

import ast
import collections
import inspect
import linecache
import threading
import types
from typing import Any

# --- finding a function's syntax tree ------------------------------------------

_TREES: collections.OrderedDict[tuple[str, int, int], ast.Module | None] = collections.OrderedDict()
_TREES_LOCK = threading.Lock()
_MAX_TREES = 64

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def source_tree(code: types.CodeType, module_globals: dict[str, Any]) -> ast.Module | None:
    """The parsed source file of ``code``, cached while the file's lines are unchanged."""
    lines = linecache.getlines(code.co_filename, module_globals)
    if not lines:
        return None
    key = (code.co_filename, len(lines), hash("".join(lines)))  # any edit is a new key
    with _TREES_LOCK:
        if key in _TREES:
            _TREES.move_to_end(key)
            return _TREES[key]
    try:
        tree: ast.Module | None = ast.parse("".join(lines))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        tree = None
    with _TREES_LOCK:
        _TREES[key] = tree
        while len(_TREES) > _MAX_TREES:
            _TREES.popitem(last=False)
    return tree


def params_of(node: FunctionNode) -> list[str]:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names


def code_params(code: types.CodeType) -> list[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:n])


def nodes_of(fn: types.FunctionType) -> list[FunctionNode] | None:
    """The syntax tree nodes ``fn``'s code was compiled from, or None when not found.

    A node matches on its first line, its name and its parameters; two
    lambdas on one line with the same parameters both match (both are read).
    """
    code = fn.__code__
    tree = source_tree(code, fn.__globals__)
    if tree is None:
        return None
    name, first, params = code.co_name, code.co_firstlineno, code_params(code)
    found: list[FunctionNode] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda):
            lines = {node.lineno}
            node_name = "<lambda>"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = {node.lineno, *(d.lineno for d in node.decorator_list[:1])}
            node_name = node.name
        else:
            continue
        if first in lines and node_name == name and params_of(node) == params:
            found.append(node)
    return found or None
