"""What a function's syntax tree says by itself: its own nodes, the tests that find a name present or missing, operators' dunder names, what a local import binds."""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any

from ._refs import (
    MISSING,
    Call,
)
from ._source import FunctionNode

__all__ = [
    "own_nodes",
    "owner_class",
    "first_param_of",
    "present",
    "missing",
    "imported",
    "string_choices",
    "literal_strings",
]


def own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """The nodes of ``body``, not descending into nested functions, lambdas or classes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def owner_class(fn: types.FunctionType) -> type | None:
    """The class a method is defined in, found from its ``__qualname__`` in its module (or None)."""
    parts = fn.__qualname__.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return None
    found: Any = fn.__globals__.get(parts[0])
    for part in parts[1:-1]:
        found = vars(found).get(part) if isinstance(found, type) else None
    return found if isinstance(found, type) else None


def first_param_of(node: FunctionNode) -> str:
    """The name of ``node``'s first positional parameter (``self``), or ""."""
    positional = [*node.args.posonlyargs, *node.args.args]
    return positional[0].arg if positional else ""


_OPERATORS: dict[type, str] = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.MatMult: "matmul",
    ast.Div: "truediv", ast.FloorDiv: "floordiv", ast.Mod: "mod", ast.Pow: "pow",
    ast.LShift: "lshift", ast.RShift: "rshift", ast.BitOr: "or", ast.BitXor: "xor",
    ast.BitAnd: "and",
}  # fmt: skip

#: ``a + b`` calls ``__add__`` (then ``__radd__``): the name between the underscores.
_BIN_DUNDERS: dict[type, str] = _OPERATORS

#: ``a += b`` calls ``__iadd__`` (else ``__add__``).
_AUG_DUNDERS: dict[type, tuple[str, ...]] = {
    op: (f"__i{name}__", f"__{name}__") for op, name in _OPERATORS.items()
}


def _leaves(body: list[ast.stmt]) -> bool:
    """Whether ``body`` always ends the function or loop (its last statement returns, raises, ...)."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def fill_hidden(branch: list[ast.stmt], target: str, function: ast.AST) -> bool:
    """Whether a call's result cannot tell that ``branch`` ran, as a pure cache fill's cannot.

    ``branch`` is the code that runs when the cache ``target`` was found
    missing (it fills it) or found present (it reads it). A call whose
    result says which (``if x in _SEEN: return False``, ``if k not in _C:
    _C[k] = v; return True``) sees the other calls' writes: each return in
    ``branch`` must return ``target`` itself, nothing in it may leave the
    loop, and no name it binds may be read outside it.
    """
    inside = {id(node) for stmt in branch for node in ast.walk(stmt)}
    bound = set()
    for stmt in branch:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Return) and (
                node.value is None or ast.unparse(node.value) != target
            ):
                return False
            if isinstance(node, (ast.Break, ast.Continue)):
                return False
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id != target:
                bound.add(node.id)  # (the cache itself, `_X = build()`, is what is filled)
    return not any(
        isinstance(node, ast.Name) and node.id in bound and id(node) not in inside
        for node in ast.walk(function)
    )


def present(test: ast.expr) -> set[str]:
    """The targets ``test`` finds present: ``k in X``, ``X is not None``, ``X`` (the mirror of :func:`missing`)."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, ast.In):
            return {ast.unparse(ast.Subscript(right, left))}
        if isinstance(op, ast.IsNot) and isinstance(right, ast.Constant) and right.value is None:
            return {ast.unparse(left)}
        return set()
    if isinstance(test, (ast.Name, ast.Attribute, ast.Subscript)):
        return {ast.unparse(test)}
    return set()


def missing(test: ast.expr) -> set[str]:
    """The targets ``test`` finds missing: ``X is None``, ``not X``, ``k not in X``, ``X.get(k) is None``.

    Returned as source text (``"_X"``, ``"_CACHE[key]"``); either side of an
    ``or`` counts.
    """
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        # A fill only when every way into the branch finds it missing:
        # `_M is None or _M[0] != x` also overwrites what is there.
        found = [missing(v) for v in test.values]
        return set.intersection(*found) if found else set()
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return {ast.unparse(test.operand)}
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return set()
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, ast.NotIn):
        return {ast.unparse(ast.Subscript(right, left))}
    if not (
        isinstance(op, (ast.Is, ast.Eq)) and isinstance(right, ast.Constant) and right.value is None
    ):
        return set()
    if isinstance(left, ast.Call) and isinstance(left.func, ast.Attribute):
        if left.func.attr == "get" and len(left.args) == 1:
            return {ast.unparse(ast.Subscript(left.func.value, left.args[0]))}
    return {ast.unparse(left)}


def imported(node: ast.Import | ast.ImportFrom) -> dict[str, Any]:
    """The modules (and their attributes) a local ``import`` binds, where already loaded.

    Lookups in ``sys.modules`` only: nothing is imported.
    """
    found: dict[str, Any] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            module = sys.modules.get(alias.name if alias.asname else name)
            if module is not None:
                found[name] = module
    elif node.module and not node.level:
        module = sys.modules.get(node.module)
        for alias in node.names if module is not None else ():
            value = vars(module).get(alias.name, MISSING)
            if value is not MISSING:
                found[alias.asname or alias.name] = value
    return found


def _no_copy(call: Call) -> bool:
    """A ``copy=`` keyword was passed (``copy=False``): the result may be the object itself."""
    return "copy" in call.keywords


#: Names through which code reaches a frame's local variables.
_FRAME_NAMES = frozenset(
    {"locals", "vars", "exec", "eval", "_getframe", "currentframe", "f_locals", "f_back"}
)


def string_choices(body: Iterable[ast.AST], params: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Local names bound only by looping over literal strings, and the strings each may hold.

    ``for name in ("md5", "sha1")``; a comprehension's target is its own,
    not the function's (see :attr:`Scope.comprehending`). A name bound
    any other way too (assigned, a comprehension's target, a parameter, imported, caught,
    a ``match`` capture, ``nonlocal`` in a function defined inside) is left
    out; so is every name of code that reaches its frame's locals
    (``locals()``, ``sys._getframe().f_locals``: writable from 3.13).
    """
    body = list(body)
    choices: dict[str, set[str]] = {}
    loop_targets: set[int] = set()
    for node in own_nodes(body):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            strings = literal_strings(node.iter)
            if strings is not None:
                choices.setdefault(node.target.id, set()).update(strings)
                loop_targets.add(id(node.target))
    if not choices:  # most functions: one pass, nothing more to look at
        return {}
    other: set[str] = set(params)
    for node in body:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Nonlocal):
                other.update(inner.names)
            elif (isinstance(inner, ast.Name) and inner.id in _FRAME_NAMES) or (
                isinstance(inner, ast.Attribute) and inner.attr in _FRAME_NAMES
            ):
                return {}
    for node in own_nodes(body):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            if id(node) not in loop_targets:
                other.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            other.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for field in ("name", "rest"):  # defs, except handlers, match captures
                bound = getattr(node, field, None)
                if isinstance(bound, str):
                    other.add(bound)
    return {name: tuple(sorted(s)) for name, s in choices.items() if name not in other}


def literal_strings(expr: ast.expr) -> tuple[str, ...] | None:
    """The strings of a literal tuple, list or set of strings only (``("md5", "sha1")``), or None."""
    items = expr.elts if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) else []
    strings = tuple(
        e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)
    )
    return strings if items and len(strings) == len(items) else None
