"""One function's names while it is read (:class:`Scope`), and what a reading found so far (:class:`Budget`)."""

from __future__ import annotations

import ast
import builtins
import types
from typing import TYPE_CHECKING, Any

from ._found import Effect, Kind
from ._refs import (
    MISSING,
    NOTHING,
    Ref,
    Root,
    object_ref,
    root_ref,
    static_attribute,
)
from ._source import FunctionNode, params_of
from ._syntax import (
    imported,
    own_nodes,
    string_choices,
)

if TYPE_CHECKING:
    from ._reader import Reader

__all__ = ["Budget", "Scope"]


class Budget:
    def __init__(self) -> None:
        self.functions = 0
        self.found: dict[tuple[str, str], Effect] = {}
        self.trusted: dict[str, None] = {}
        self.stack: list[types.CodeType] = []
        self.local_calls: set[int] = set()  # nested functions being read (by node id)

    def add(self, kind: Kind, what: str, where: str) -> None:
        """Record an effect once; one found in a function it calls names that function."""
        if len(self.stack) > 1:
            code = self.stack[-1]
            what = f"{what} in {getattr(code, 'co_qualname', code.co_name)}()"
        self.found.setdefault((kind, what), Effect(kind, what, where))


class Scope:
    """One function's names while it is read: what each may refer to."""

    def __init__(
        self,
        reader: Reader,
        fn: types.FunctionType,
        node: FunctionNode,
        params: dict[str, Ref],
        known: dict[str, Any],
        parent: Scope | None = None,
    ):
        self.reader, self.fn, self.node, self.parent = reader, fn, node, parent
        self.code = fn.__code__
        self.env: dict[str, Ref] = dict(params)
        self.known = known  # names whose object is known (a bound method's self)
        self.globals_declared: set[str] = set()
        self.nonlocals: set[str] = set()
        self.locals: set[str] = set(params_of(node))
        self.returns = NOTHING
        body = node.body if isinstance(node.body, list) else [node.body]
        for sub in own_nodes(body):
            if isinstance(sub, ast.Global):
                self.globals_declared.update(sub.names)
            elif isinstance(sub, ast.Nonlocal):
                self.nonlocals.update(sub.names)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                self.locals.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.locals.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                self.locals.update((a.asname or a.name).split(".")[0] for a in sub.names)
                self.known.update(imported(sub))
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                self.locals.add(sub.name)
        self.locals -= self.globals_declared | self.nonlocals
        #: local names that hold one of a few literal strings (a loop's)
        self.choices = string_choices(body, params_of(node))
        #: while a comprehension is read, its targets that loop over literal strings
        self.comprehending: dict[str, tuple[str, ...] | None] = {}
        #: functions and lambdas defined here, by the name they are bound to
        self.functions: dict[str, FunctionNode] = {}
        self.cells: dict[str, Any] = {}
        for name, cell in zip(self.code.co_freevars, fn.__closure__ or ()):
            try:
                self.cells[name] = cell.cell_contents
            except ValueError:
                self.cells[name] = MISSING

    # -- names and values

    def lookup(self, name: str) -> Ref:
        if name in self.locals:
            if name not in self.env and name in self.known:  # a local import
                return object_ref(self.known[name], f"`{name}`")
            return self.env.get(name, NOTHING)
        if self.parent is not None and name not in self.globals_declared:
            return self.parent.lookup(name)
        if name in self.cells:
            value = self.cells[name]
            if value is MISSING:
                return root_ref(Root("shared", f"closure variable `{name}`"))
            return object_ref(value, f"closure variable `{name}`")
        value = self.global_value(name)
        if value is MISSING:
            return NOTHING
        return object_ref(value, f"module-level `{name}`")

    def global_value(self, name: str) -> Any:
        if name in self.cells:
            return self.cells[name]
        namespace = self.fn.__globals__
        if name in namespace:
            return namespace[name]
        spaces = namespace.get("__builtins__", builtins)
        spaces = vars(spaces) if isinstance(spaces, types.ModuleType) else spaces
        return spaces.get(name, MISSING) if isinstance(spaces, dict) else MISSING

    def value(self, expr: ast.expr) -> Any:
        """The object ``expr`` names, found by dictionary lookups only, or MISSING."""
        if isinstance(expr, ast.Name):
            if expr.id in self.known:
                return self.known[expr.id]
            if expr.id in self.locals:
                return MISSING
            if self.parent is not None and expr.id not in self.globals_declared:
                return self.parent.value(expr)
            return self.global_value(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.value(expr.value)
            if owner is MISSING:
                return MISSING
            return static_attribute(owner, expr.attr)
        return MISSING

    def candidates(self, expr: ast.expr) -> list[Any] | None:
        """The objects ``getattr(module, name)`` may be, each found, or None.

        ``name`` a literal string or a local name bound only by looping
        over literal strings (:func:`string_choices`, or a comprehension's
        own target while it is read): ``getattr(hashlib, n)`` in ``for n in
        ("md5", "sha1")`` is ``hashlib.md5`` or ``hashlib.sha1``. Only a
        module's (a plain module object): an instance's attribute may come
        from ``__getattribute__`` or a descriptor, and a class's function
        takes its object first (``getattr(random.Random, "seed")(rng, x)``),
        which the names of methods that change their object judge only when
        written out.
        """
        if not (
            isinstance(expr, ast.Call)
            and len(expr.args) == 2
            and not expr.keywords
            and self.value(expr.func) is getattr
        ):
            return None
        owner, name = self.value(expr.args[0]), expr.args[1]
        if type(owner) is not types.ModuleType:
            return None
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            names: tuple[str, ...] = (name.value,)
        elif isinstance(name, ast.Name) and self._choices(name.id) is not None:
            names = self._choices(name.id) or ()
        else:
            return None
        found = [static_attribute(owner, n) for n in names]
        return None if any(f is MISSING for f in found) else found

    def _choices(self, name: str) -> tuple[str, ...] | None:
        if name in self.comprehending:
            return self.comprehending[name]
        if name in self.locals:
            return self.choices.get(name)
        if self.parent is not None and name not in self.globals_declared:
            return self.parent._choices(name)
        return None

    def local_function(self, name: str) -> FunctionNode | None:
        """The function or lambda defined in this function (or one around it) that ``name`` calls."""
        if name in self.functions:
            return self.functions[name]
        if name in self.locals or self.parent is None:
            return None
        return self.parent.local_function(name)

    def bind(self, name: str, ref: Ref) -> None:
        if name in self.locals:
            old = self.env.get(name, NOTHING)
            self.env[name] = old | ref
        elif self.parent is not None and name in self.nonlocals:
            self.parent.bind(name, ref)
