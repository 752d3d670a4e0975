"""Finding the syntax tree a function was compiled from, in its source file."""

from __future__ import annotations

import ast
import collections
import inspect
import linecache
import textwrap
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


def block_tree(code: types.CodeType, module_globals: dict[str, Any]) -> ast.Module | None:
    """The parsed lines of ``code`` (its first to its last, :func:`last_line`), in the file's line numbers.

    A function's own lines, not its whole file: a 488-line module took ~8
    ms to parse and walk, its function ~1 ms. The lines come from the code
    object, not from ``inspect.getblock``, whose tokenizer compiles its
    regular expressions on first use (~5 ms of a process's first map).
    None where they do not parse alone: a lambda in a statement that began
    on an earlier line, or (Python 3.10, which keeps no end lines) a last
    statement whose closing lines hold no instruction.
    """
    lines = linecache.getlines(code.co_filename, module_globals)
    first = code.co_firstlineno
    if not 0 < first <= len(lines):
        return None
    try:
        block = lines[first - 1 : last_line(code)]
        tree = ast.parse(textwrap.dedent("".join(block)))
    except Exception:  # noqa: BLE001 - a syntax error: the whole file is read
        return None
    return ast.increment_lineno(tree, first - 1)


def last_line(code: types.CodeType) -> int:
    """The last source line of ``code`` and the code nested in it (its instructions' end lines)."""
    last = code.co_firstlineno
    positions = getattr(code, "co_positions", None)  # Python 3.11+
    if positions is not None:
        ends = (end for _, end, _, _ in positions())
    else:
        ends = (line for _, _, line in code.co_lines())
    for end in ends:
        if end is not None and end > last:
            last = end
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            last = max(last, last_line(const))
    return last


def nodes_of(fn: types.FunctionType) -> list[FunctionNode] | None:
    """The syntax tree nodes ``fn``'s code was compiled from, or None when not found.

    A node matches on its first line, its name and its parameters; two
    lambdas on one line with the same parameters both match (both are read).
    Looked for in the function's own lines first, then in its whole file.
    """
    code = fn.__code__
    for read in (block_tree, source_tree):
        tree = read(code, fn.__globals__)
        found = _matching(tree, code) if tree is not None else None
        if found:
            return found
    return None


def _matching(tree: ast.Module, code: types.CodeType) -> list[FunctionNode]:
    """The function nodes of ``tree`` that ``code`` was compiled from (first line, name, parameters)."""
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
    return found
