"""Reading one function's syntax tree for its writes and calls, following calls into the user's own code."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any

from ._bytecode import read_bytecode
from ._found import MAX_DEPTH, MAX_FUNCTIONS, Effect, is_declared
from ._refs import (
    MISSING,
    NOTHING,
    Call,
    Ref,
    Root,
    bind_call,
    dotted,
    first_param,
    object_ref,
    result_ref,
    root_ref,
    static_attribute,
)
from ._scope import Budget, Scope
from ._source import nodes_of, params_of
from ._syntax import (
    _AUG_DUNDERS,
    _BIN_DUNDERS,
    _leaves,
    _no_copy,
    fill_hidden,
    first_param_of,
    literal_strings,
    missing,
    owner_class,
    present,
)
from ._tables import (
    ELEMENT_METHODS,
    ITER_METHODS,
    METHODS_WRITING_ARGUMENT,
    MUTATING_METHODS,
    VIEW_METHODS,
    WRITES_ARGUMENT,
    global_generators,
    is_generator,
    is_ufunc,
    place,
    qualified,
    reads_only,
    stdlib_type,
    table_effect,
    user_code,
    user_module,
)

# --- reading ----------------------------------------------------------------


#: Slot wrappers that change their object (``object.__setattr__(obj, k, v)``).
_SETTING_DUNDERS = frozenset({"__setattr__", "__delattr__", "__setitem__", "__delitem__"})


def _key_names(text: str) -> set[str]:
    """The names a fill's target (``_C[k]``, ``_X``) is keyed by: all but a bare name itself."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:  # pragma: no cover - unparsed from the tree
        return set()
    if isinstance(tree, ast.Name):
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - _root_names(tree)


def _root_names(tree: ast.expr) -> set[str]:
    """The name a subscript or attribute chain starts from (``_C`` in ``_C[k]``)."""
    while isinstance(tree, (ast.Subscript, ast.Attribute)):
        tree = tree.value
    return {tree.id} if isinstance(tree, ast.Name) else set()


class Reader:
    """Reads functions for effects, into one :class:`Budget`."""

    def __init__(self) -> None:
        self.budget = Budget()
        #: per module namespace (by id): method name -> the user's functions of that name
        self.methods: dict[int, dict[str, list[types.FunctionType]]] = {}

    def effects(self) -> tuple[tuple[Effect, ...], tuple[str, ...]]:
        return tuple(self.budget.found.values()), tuple(self.budget.trusted)

    def user_methods(self, fn: types.FunctionType, name: str) -> list[types.FunctionType]:
        """The user's methods called ``name``, of the classes ``fn``'s module has at its top level.

        What ``obj.name(...)`` may run when ``obj`` is not known
        (``_POOL[0].run(i)``, ``super().run(i)``).
        """
        space = fn.__globals__
        methods = self.methods.get(id(space))
        if methods is None:
            methods = self.methods[id(space)] = {}
            classes = [v for v in list(space.values()) if isinstance(v, type)]
            for cls in classes:
                for base in cls.__mro__:
                    for key, value in list(vars(base).items()):
                        if isinstance(value, (staticmethod, classmethod)):
                            value = value.__func__
                        if isinstance(value, types.FunctionType) and user_code(value.__code__):
                            found = methods.setdefault(key, [])
                            if value not in found:
                                found.append(value)
        return methods.get(name, [])

    def unread(self, what: str, where: str = "") -> None:
        self.budget.add("unread", what, where)

    def write(self, ref: Ref, how: str, where: str) -> None:
        """Record a write through a reference: into an argument, a shared object, the process."""
        for root in sorted(ref.direct, key=lambda r: (r.kind, r.label)):
            if root.kind == "argument":
                self.budget.add("argument", f"writes into its argument {root.label}{how}", where)
            elif root.kind == "process":
                self.budget.add("process", f"changes {root.label}{how}", where)
            else:
                self.budget.add("shared", f"writes {root.label}{how}", where)

    def function(
        self,
        fn: types.FunctionType,
        call: Call,
        known: dict[str, Any] | None = None,
        self_ref: Ref | None = None,
    ) -> Ref:
        """Read ``fn`` called with ``call``'s references; returns what its result may refer to."""
        code = fn.__code__
        if is_declared(fn) or not user_code(code):
            return NOTHING
        if code in self.budget.stack:
            return NOTHING  # recursion: read once
        if len(self.budget.stack) >= MAX_DEPTH or self.budget.functions >= MAX_FUNCTIONS:
            self.unread(f"calls {fn.__qualname__}, past what is read", "")
            return NOTHING
        nodes = nodes_of(fn)
        if nodes is None:
            return read_bytecode(self.budget, fn)
        self.budget.functions += 1
        self.budget.stack.append(code)
        try:
            result = NOTHING
            for node in nodes:
                params = bind_call(fn, node, call, self_ref)
                scope = Scope(self, fn, node, params, known or {})
                FunctionReader(scope).read()
                result = result | scope.returns
            return result
        finally:
            self.budget.stack.pop()


class FunctionReader:
    """Walks one function's body: binds names to references, then records its writes and calls."""

    #: Passes over the body to let names settle (``a = b`` before ``b = arg``).
    PASSES = 3

    #: Statements whose parts may run or not, or more than once: a name bound
    #: inside one may still hold what it held before.
    BRANCHING = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)

    def __init__(self, scope: Scope):
        self.scope = scope
        self.record = False
        #: targets the enclosing ``if`` tests found missing (a cache being filled)
        self.fills: list[set[str]] = []
        #: how many branching statements enclose the one being read
        self.depth = 0
        #: what each name held at the start (its parameters)
        self.initial = dict(scope.env)
        #: names rebound outside any branch: from there on they hold only the new value
        self.rebound: set[str] = set()

    def read(self) -> None:
        node = self.scope.node
        body: list[ast.AST] = list(node.body) if isinstance(node.body, list) else [node.body]
        for _ in range(self.PASSES):
            self.restart()
            before = dict(self.scope.env)
            self.block(body)
            if before == self.scope.env:
                break
        self.restart()
        self.record = True
        self.block(body)
        if isinstance(node, ast.Lambda):
            self.scope.returns = self.ref(node.body)

    def restart(self) -> None:
        """Names rebound in straight-line code hold their first value again (a new pass)."""
        for name in self.rebound:
            self.scope.env[name] = self.initial.get(name, NOTHING)

    def block(self, stmts: Iterable[ast.AST]) -> None:
        """Read statements in order; after ``if k in _C: return _C[k]`` the rest fills ``_C[k]``."""
        guards = 0
        for stmt in stmts:
            self.visit(stmt)
            if isinstance(stmt, ast.If) and not stmt.orelse and _leaves(stmt.body):
                node = self.scope.node
                self.fills.append(
                    {t for t in present(stmt.test) if fill_hidden(stmt.body, t, node)}
                )
                guards += 1
        del self.fills[len(self.fills) - guards :]

    def where(self, node: ast.AST) -> str:
        return place(self.scope.code, getattr(node, "lineno", self.scope.code.co_firstlineno))

    # -- statements

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, self.BRANCHING):
            self.depth += 1
            try:
                self.dispatch(node)
            finally:
                self.depth -= 1
        else:
            self.dispatch(node)

    def dispatch(self, node: ast.AST) -> None:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            method(node)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            self.nested(node)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.ref(child)
            else:
                self.visit(child)

    def visit_Assign(self, node: ast.Assign) -> None:
        ref = self.ref(node.value)
        for target in node.targets:
            self.store(target, ref, node)
            if isinstance(node.value, ast.Lambda) and isinstance(target, ast.Name):
                self.scope.functions[target.id] = node.value  # sq = lambda v: v * v

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.store(node.target, self.ref(node.value), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.ref(node.value)
        target = node.target
        if isinstance(target, ast.Name):
            # In place on a mutable object (a list, an array): the object it names.
            self.write(self.scope.lookup(target.id), " in place", node)
            self.store(target, NOTHING, node)
        else:
            # `d["v"] += k`, `self.data *= k`: the element itself changes in
            # place (an array, a list), then is stored back.
            self.write(self.ref(target), " in place", node)
            self.dunders(_AUG_DUNDERS.get(type(node.op), ()), target, [self.ref(node.value)])
            self.store(target, NOTHING, node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.store(target, NOTHING, node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        iterated = self.ref(node.iter)
        self.dunders(("__iter__", "__next__"), node.iter, [])
        self.store(node.target, iterated.element(), node)
        self.block(node.body)
        self.block(node.orelse)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            ref = self.ref(item.context_expr)
            ref = ref | self.dunders(("__enter__", "__exit__"), item.context_expr, [])
            if item.optional_vars is not None:
                self.store(item.optional_vars, ref, node)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncWith = visit_With

    def visit_If(self, node: ast.If) -> None:
        self.ref(node.test)
        # A fill stores what any call would only while what it is keyed by
        # stays as tested: `if k not in _C: k = i; _C[k] = i` is no fill.
        rebound = {
            name.id
            for stmt in node.body
            for name in ast.walk(stmt)
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
        }
        self.fills.append(
            {
                t
                for t in missing(node.test)
                if not (_key_names(t) & rebound)
                and fill_hidden(node.body, t, self.scope.node)
                and fill_hidden(node.orelse, t, self.scope.node)
            }
        )
        self.block(node.body)
        self.fills.pop()
        self.block(node.orelse)

    def filling(self, target: ast.expr) -> bool:
        """Whether a store to ``target`` fills a cache an enclosing ``if`` found empty.

        ``if _X is None: _X = build()``, ``if key not in _CACHE: _CACHE[key] =
        f(key)``: every call that fills it stores what any other would, so
        the calls cannot see each other's writes there.
        """
        if not self.fills:
            return False
        text = ast.unparse(target)
        return any(text in found for found in self.fills)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.scope.returns = self.scope.returns | self.ref(node.value)

    def visit_Global(self, node: ast.Global) -> None:
        return None

    def nested(self, node: ast.AST, params: dict[str, Ref] | None = None) -> None:
        """A nested function or class: its body is read as if it ran (its names see ours).

        ``params``: what its parameters may be (a lambda passed to a call), else nothing known.
        """
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                self.visit(stmt)
            return
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for default in (*node.args.defaults, *(d for d in node.args.kw_defaults if d)):
            self.ref(default)
        if self.record:
            inner = Scope(self.scope.reader, self.scope.fn, node, params or {}, {}, self.scope)
            inner.cells = {}
            FunctionReader(inner).read()
        if not isinstance(node, ast.Lambda):
            self.scope.bind(node.name, NOTHING)
            self.scope.functions[node.name] = node

    def local_call(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, call: Call
    ) -> Ref:
        """A call of a function defined in this one (``def sq(v): ...; sq(x)``): read with its arguments."""
        budget = self.scope.reader.budget
        if not self.record or id(node) in budget.local_calls:
            return NOTHING  # recursion: read once
        names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
        params = dict(zip(names, call.args))
        for name, ref in call.keywords.items():
            params[name] = params.get(name, NOTHING) | ref
        for name in params_of(node):
            params.setdefault(name, call.spread)
        inner = Scope(self.scope.reader, self.scope.fn, node, params, {}, self.scope)
        inner.cells = {}
        budget.local_calls.add(id(node))
        try:
            FunctionReader(inner).read()
        finally:
            budget.local_calls.discard(id(node))
        return inner.returns

    # -- stores and writes

    def store(self, target: ast.expr, ref: Ref, node: ast.AST) -> None:
        scope = self.scope
        if isinstance(target, ast.Name):
            if target.id in scope.globals_declared:
                if self.record and not self.filling(target):
                    scope.reader.budget.add(
                        "shared", f"rebinds module-level `{target.id}`", self.where(node)
                    )
            elif target.id in scope.nonlocals and scope.parent is None:
                if self.record:
                    scope.reader.budget.add(
                        "shared", f"rebinds closure variable `{target.id}`", self.where(node)
                    )
            elif (
                self.depth == 0
                and target.id in scope.locals
                and not isinstance(node, ast.AugAssign)
            ):
                # Straight-line code: from here on the name holds the new value
                # only (`x = x - x.mean()` then `x /= s` writes a new array).
                scope.env[target.id] = ref
                self.rebound.add(target.id)
            else:
                scope.bind(target.id, ref)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.store(elt, ref.element(), node)
        elif isinstance(target, ast.Starred):
            self.store(target.value, ref.holding(), node)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            if isinstance(target, ast.Subscript):
                self.ref(target.slice)
            owner = self.ref(target.value)
            if not self.filling(target):
                self.write(owner, "", node)

    def write(self, ref: Ref, how: str, node: ast.AST) -> None:
        if self.record:
            self.scope.reader.write(ref, how, self.where(node))

    # -- expressions

    def ref(self, expr: ast.expr) -> Ref:
        """What ``expr``'s value may refer to; records the writes and calls in it."""
        scope = self.scope
        if isinstance(expr, ast.Name):
            found = scope.lookup(expr.id)
            if self.record and expr.id not in scope.locals:
                self.thread_state(expr)
                self.consumes(expr, found)
            return found
        if isinstance(expr, ast.Attribute):
            owner = scope.value(expr.value)
            if isinstance(owner, types.ModuleType):
                value = static_attribute(owner, expr.attr)
                if value is not MISSING:
                    found = object_ref(value, f"module-level `{dotted(expr)}`")
                    if self.record:
                        self.thread_state(expr)
                        self.consumes(expr, found)
                    return found
            if expr.attr in MUTATING_METHODS:
                # A method that changes its object, taken as a value: whoever
                # calls it writes the object (`list(map(rows.append, xs))`).
                self.write(self.ref(expr.value), f" (.{expr.attr}, taken as a value)", expr)
            return self.ref(expr.value).element() | self.class_attribute(expr)
        if isinstance(expr, (ast.Yield, ast.YieldFrom)):
            # A generator's values are what it gives (a contextmanager's `as`).
            if expr.value is not None:
                scope.returns = scope.returns | self.ref(expr.value)
            return NOTHING
        if isinstance(expr, ast.Subscript):
            key = self.ref(expr.slice)
            owner = self.ref(expr.value)
            got = self.dunders(("__getitem__",), expr.value, [key])
            return owner.element() | got
        if isinstance(expr, ast.BinOp):
            left, right = self.ref(expr.left), self.ref(expr.right)
            name = _BIN_DUNDERS.get(type(expr.op))
            if name is None:
                return NOTHING
            got = self.dunders((f"__{name}__",), expr.left, [right])
            return got | self.dunders((f"__r{name}__",), expr.right, [left])
        if isinstance(expr, ast.Starred):
            return self.ref(expr.value)
        if isinstance(expr, ast.NamedExpr):
            ref = self.ref(expr.value)
            self.store(expr.target, ref, expr)
            return ref
        if isinstance(expr, ast.Call):
            return self.call(expr)
        if isinstance(expr, (ast.IfExp, ast.BoolOp)):
            parts = [expr.body, expr.orelse] if isinstance(expr, ast.IfExp) else expr.values
            if isinstance(expr, ast.IfExp):
                self.ref(expr.test)
            return functools.reduce(Ref.__or__, (self.ref(p) for p in parts), NOTHING)
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            refs = [self.ref(e) for e in expr.elts]
            return functools.reduce(Ref.__or__, refs, NOTHING).holding()
        if isinstance(expr, ast.Dict):
            refs = [self.ref(e) for e in (*expr.keys, *expr.values) if e is not None]
            return functools.reduce(Ref.__or__, refs, NOTHING).holding()
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            self.depth += 1  # its targets are its own; it runs any number of times
            try:
                return self.comprehension(expr)
            finally:
                self.depth -= 1
        if isinstance(expr, ast.Lambda):
            self.nested(expr)
            return NOTHING
        for child in ast.iter_child_nodes(expr):
            if isinstance(child, ast.expr):
                self.ref(child)
            elif isinstance(child, ast.AST):
                self.visit(child)
        return NOTHING

    def comprehension(
        self, expr: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> Ref:
        comprehending = self.scope.comprehending
        outer = dict(comprehending)
        try:
            for gen in expr.generators:
                iterated = self.ref(gen.iter)
                self.dunders(("__iter__", "__next__"), gen.iter, [])
                self.store(gen.target, iterated.element(), expr)
                if isinstance(gen.target, ast.Name):  # its own name, only in here
                    comprehending[gen.target.id] = literal_strings(gen.iter)
                for cond in gen.ifs:
                    self.ref(cond)
            parts = [expr.key, expr.value] if isinstance(expr, ast.DictComp) else [expr.elt]
            refs = [self.ref(p) for p in parts]
        finally:
            comprehending.clear()
            comprehending.update(outer)
        return functools.reduce(Ref.__or__, refs, NOTHING).holding()

    def call(self, node: ast.Call) -> Ref:
        call = Call()
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                call.spread = call.spread | self.ref(arg.value).element()
            else:
                call.args.append(self.ref(arg))
        for kw in node.keywords:
            if kw.arg is None:
                call.spread = call.spread | self.ref(kw.value).element()
            else:
                call.keywords[kw.arg] = self.ref(kw.value)
        for kw in node.keywords:
            if kw.arg == "out":  # out=a, or out=(a, b): each array is written
                outs = kw.value.elts if isinstance(kw.value, ast.Tuple) else [kw.value]
                for out in outs:
                    self.write(self.ref(out), " (out=)", node)
        if self.record:
            self.passed_functions(node, call)
        callee = self.scope.value(node.func)
        if callee is super and not node.args:
            return self.scope.lookup(first_param_of(self.scope.node))  # super(): self
        if callee is not MISSING:
            return self.known_call(callee, call, node)
        func = node.func
        candidates = self.scope.candidates(func)
        if candidates is not None:  # getattr(hashlib, name), name one of a loop's strings
            self.ref(func)
            return functools.reduce(
                Ref.__or__, (self.known_call(c, call, node) for c in candidates), NOTHING
            )
        if isinstance(func, ast.Attribute):
            receiver = self.ref(func.value)
            if func.attr in MUTATING_METHODS and call.args and self.of_type(func.value):
                # `type(rows).append(rows, x)`: the method's object is its first argument.
                self.write(call.args[0], f" (`{dotted(func) or func.attr}`)", node)
            if is_generator(self.scope.value(func.value)):
                self.write(receiver, f" (draws from it: `{dotted(func)}`)", node)
            library = self.library_module(func.value)
            if library is not None:
                # A library's function not loaded yet (numpy.random before its
                # first use): judged by its name, as the library's functions are.
                return self.method_call(func.attr, receiver, call, node, library)
            return self.method_call(func.attr, receiver, call, node)
        if isinstance(func, ast.Name):
            local = self.scope.local_function(func.id)
            if local is not None:
                return self.local_call(local, call)
        target = self.ref(func)
        if self.record:
            what = dotted(func) or "a callable it computes"
            if target.direct or isinstance(func, ast.Name):
                self.scope.reader.unread(
                    f"calls `{what}`, which it cannot see into", self.where(node)
                )
            else:
                self.scope.reader.unread(
                    f"calls {what}, which it cannot see into", self.where(node)
                )
        return NOTHING

    def consumes(self, expr: ast.Name | ast.Attribute, found: Ref) -> None:
        """A module-level iterator (``itertools.count()``, a generator, a file): any use may advance it.

        ``for n in _IDS``, ``zip(_IDS, xs)``, ``next(iter(_IDS))``: each takes
        items another call would have had.
        """
        value = self.scope.value(expr)
        if (
            value is not MISSING
            and not isinstance(value, type)
            and hasattr(type(value), "__next__")
        ):
            self.write(found, " (an iterator: using it takes its items)", expr)

    def of_type(self, expr: ast.expr) -> bool:
        """Whether ``expr`` is ``type(...)``: a class, whose methods take their object first."""
        return isinstance(expr, ast.Call) and self.scope.value(expr.func) is type

    def library_module(self, expr: ast.expr) -> types.ModuleType | None:
        """The library module ``expr`` (``np.random``) starts from, when it is not found from there."""
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        found = self.scope.value(expr)
        if isinstance(found, types.ModuleType) and not user_module(found):
            return found
        return None

    def thread_state(self, expr: ast.Name | ast.Attribute) -> None:
        """A module-level ``threading.local`` holding values set in this thread: a pool thread has none."""
        value = self.scope.value(expr)
        if isinstance(value, threading.local) and vars(value):
            self.scope.reader.budget.add(
                "shared",
                f"reads `{dotted(expr)}`, a threading.local set in this thread (a pool "
                f"thread starts without its values)",
                self.where(expr),
            )

    def class_attribute(self, expr: ast.Attribute) -> Ref:
        """``self.items`` where ``items`` is a class attribute of the method's class: shared by every instance."""
        scope = self.scope
        if not (isinstance(expr.value, ast.Name) and scope.parent is None):
            return NOTHING
        if expr.value.id != first_param_of(scope.node):
            return NOTHING
        cls = owner_class(scope.fn)
        if cls is None:
            return NOTHING
        try:
            value = inspect.getattr_static(cls, expr.attr)
        except AttributeError:
            return NOTHING
        if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
            return NOTHING
        return object_ref(value, f"class attribute `{cls.__qualname__}.{expr.attr}`")

    def dunders(self, names: Iterable[str], expr: ast.expr, args: list[Ref]) -> Ref:
        """Read the user's methods an operator calls on ``expr`` (``obj[i]``: ``__getitem__``).

        Only where the lookups find the object (a module-level instance of
        a user's class, ``_LOOKUP[i]``): an operator on an argument or an
        element is taken as the built-in types' (they run no code of the
        user's), as reading every class's ``__getitem__`` for every
        subscript would keep most numpy code off threads.
        """
        if not self.record:
            return NOTHING
        value = self.scope.value(expr)
        if value is MISSING or isinstance(value, (type, types.ModuleType)):
            return NOTHING
        cls = type(value)
        module = sys.modules.get(getattr(cls, "__module__", ""))
        if module is None or not user_module(module):
            return NOTHING
        receiver, result = self.ref(expr), NOTHING
        for name in names:
            method = inspect.getattr_static(cls, name, None)
            if isinstance(method, types.FunctionType) and user_code(method.__code__):
                known = {first_param(method): value}
                result = result | self.scope.reader.function(
                    method, Call(list(args)), known, receiver
                )
        return result

    def passed_functions(self, node: ast.Call, call: Call) -> None:
        """Read the user's functions and lambdas passed as arguments, as the callee may call them.

        ``map(f, rows)``, ``functools.reduce(lambda acc, p: ..., parts)``,
        ``sorted(xs, key=f)``: each parameter may be any of the other
        arguments or their elements.
        """
        given = [*node.args, *(kw.value for kw in node.keywords)]
        others = functools.reduce(Ref.__or__, [*call.args, *call.keywords.values()], call.spread)
        others = others | others.element()
        for arg in given:
            if isinstance(arg, ast.Starred):
                continue
            if isinstance(arg, ast.Lambda):
                names = params_of(arg)
                self.nested(arg, {name: others for name in names})
                continue
            value = self.scope.value(arg)
            if isinstance(value, types.FunctionType) and user_code(value.__code__):
                count = value.__code__.co_argcount + value.__code__.co_kwonlyargcount
                self.scope.reader.function(value, Call([others] * count, spread=others))
            elif value is not MISSING and callable(value):
                module, fname = qualified(value)
                if WRITES_ARGUMENT.get((module, fname)) == 0:  # reduce(operator.iadd, rows)
                    self.write(others, f" (`{fname}`, passed to a call)", node)

    def method_call(
        self, name: str, receiver: Ref, call: Call, node: ast.Call, owner: Any = MISSING
    ) -> Ref:
        """A method the lookups did not resolve (``owner`` MISSING) or a library's, judged by its name.

        A method that changes its object by its name (``append``) writes the
        receiver. Otherwise the user's own methods of that name are read
        with the receiver as ``self``; a library object's method is trusted
        (an installed package's) or must be known to read only (the
        standard library's: ``owner``'s type); an unknown object's method
        must be one that only reads on every type that has it. Anything
        else may change the receiver, and is a write to it.
        """
        mine = NOTHING  # what the user's methods of that name return
        methods = []
        if owner is MISSING and self.record:
            methods = self.scope.reader.user_methods(self.scope.fn, name)
            for method in methods:
                mine = mine | self.scope.reader.function(method, call, None, receiver)
        if name in MUTATING_METHODS:
            self.write(receiver, f" (.{name}())", node)
        elif owner is not MISSING:
            library = isinstance(owner, types.ModuleType) or not stdlib_type(type(owner))
            if not library and not reads_only(name, type(owner)):
                self.write(receiver, f" (.{name}())", node)
        elif methods:
            return mine
        elif self.record and not reads_only(name):
            self.write(receiver, f" (.{name}(), a method it cannot see into)", node)
        if name in METHODS_WRITING_ARGUMENT and call.args:
            self.write(call.args[0], f" (.{name}())", node)
        if name in VIEW_METHODS or (name == "astype" and _no_copy(call)):
            return receiver | mine
        if name in ELEMENT_METHODS:
            return receiver.element() | mine
        if name in ITER_METHODS:
            return receiver.holding() | mine
        return mine

    def library_wrapper(self, callee: types.FunctionType, call: Call) -> Ref:
        """A library's function: the user's functions it wraps are read (``contextmanager``, ``singledispatch``).

        ``functools.wraps`` leaves the user's function as ``__wrapped__``;
        ``singledispatch`` keeps the implementations in ``registry``.
        """
        reader = self.scope.reader
        found = NOTHING
        wrapped = vars(callee).get("__wrapped__")
        registry = vars(callee).get("registry")
        inner = [wrapped] + (list(registry.values()) if isinstance(registry, Mapping) else [])
        for fn in inner:
            if isinstance(fn, types.FunctionType) and user_code(fn.__code__):
                found = found | reader.function(fn, call)
        return found | result_ref(callee, call)

    def construct(self, cls: type, call: Call) -> Ref:
        """``cls(...)``: a user's class's instance holds what its arguments refer to.

        Its ``__init__`` (and a dataclass's ``__post_init__``) is read with
        that instance as ``self``; a library's class gives what the tables
        say (``memoryview(buf)`` is ``buf``).
        """
        reader = self.scope.reader
        module = sys.modules.get(getattr(cls, "__module__", ""))
        if module is None or not user_module(module):
            init = inspect.getattr_static(cls, "__init__", None)
            if isinstance(init, types.FunctionType):
                reader.function(init, call, None, NOTHING)
            return result_ref(cls, call)
        instance = functools.reduce(Ref.__or__, [*call.args, *call.keywords.values()], call.spread)
        instance = instance.holding()
        for name in ("__init__", "__post_init__"):
            method = inspect.getattr_static(cls, name, None)
            if not isinstance(method, types.FunctionType):
                continue
            if dataclasses.is_dataclass(cls) and name == "__init__":
                continue  # generated: it stores its arguments in the instance
            reader.function(method, call if name == "__init__" else Call(), None, instance)
        return instance

    def known_call(self, callee: Any, call: Call, node: ast.Call) -> Ref:
        """A call of an object found by lookups: the tables, or its code read in turn."""
        reader = self.scope.reader
        if not self.record or is_declared(callee):
            return result_ref(callee, call)
        owner = getattr(callee, "__self__", None)
        self.table_effects(callee, call, node, owner)
        if isinstance(callee, types.MethodType) and isinstance(callee.__func__, types.FunctionType):
            # Called as `obj.method(...)`: what `obj` refers to. Reached any
            # other way (`run = S.run` at module level, `getattr(S, "run")`):
            # the object it is bound to, which other calls reach too.
            self_ref = (
                self.ref(node.func.value)
                if isinstance(node.func, ast.Attribute)
                else object_ref(owner, f"the object `{callee.__qualname__}` is bound to")
            )
            if not user_code(callee.__func__.__code__):
                # Not read (the standard library's, a package's): judged by its
                # name and its object's type (os.environ.update, log.addHandler).
                self.method_call(callee.__name__, self_ref, call, node, owner)
            return reader.function(
                callee.__func__, call, {first_param(callee.__func__): owner}, self_ref
            )
        if isinstance(callee, types.FunctionType):
            if not user_code(callee.__code__) and not is_declared(callee):
                return self.library_wrapper(callee, call)
            return reader.function(callee, call)
        if isinstance(callee, type) and callee is not type:
            return self.construct(callee, call)
        if isinstance(callee, functools.partial):
            bound = [object_ref(a, "an argument bound in the partial") for a in callee.args]
            inner = Call(bound + call.args, dict(call.keywords), call.spread)
            return self.known_call(callee.func, inner, node)
        wrapped = inspect.getattr_static(callee, "__wrapped__", None)
        if (
            isinstance(wrapped, types.FunctionType)
            and not isinstance(callee, types.FunctionType)
            and user_code(wrapped.__code__)
        ):
            reader.function(wrapped, call)  # the user's code in an lru_cache or kin
            # What a cache returns is the same object for every call that hits it.
            return root_ref(Root("shared", f"what the cached `{dotted(node.func)}` returns"))
        return self.object_call(callee, call, node, owner)

    def table_effects(self, callee: Any, call: Call, node: ast.Call, owner: Any) -> None:
        """Note what the tables know of ``callee``: global generators, effects, written arguments."""
        budget = self.scope.reader.budget
        where = self.where(node)
        name = dotted(node.func)
        generators = global_generators()
        if owner is not None and id(owner) in generators and not isinstance(owner, type):
            budget.add(
                "process",
                f"uses the process's global {generators[id(owner)]} generator (`{name}`)",
                where,
            )
        elif is_generator(owner) and isinstance(node.func, ast.Attribute):
            self.write(self.ref(node.func.value), f" (draws from it: `{name}`)", node)
        module, fname = qualified(callee)
        found = table_effect(callee, module, fname)
        if found is not None:
            budget.add(found[0], found[1], where)
        if callee is next and call.args:
            self.write(call.args[0], " (`next()` advances it)", node)
        position = WRITES_ARGUMENT.get((module, fname))
        if position is not None and position < len(call.args):
            self.write(call.args[position], f" (`{name}`)", node)

    def object_call(self, callee: Any, call: Call, node: ast.Call, owner: Any) -> Ref:
        """A call of a built-in, a ufunc, a descriptor or an object with a ``__call__``."""
        reader = self.scope.reader
        name = dotted(node.func)
        if is_ufunc(callee):
            nin = int(getattr(callee, "nin", 1))
            for out in call.args[nin:]:
                self.write(out, f" (`{name}` out)", node)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            # A built-in method bound at module level (`_add = _SEEN.add`).
            if id(owner) in global_generators() or is_ufunc(owner):
                return NOTHING
            receiver = object_ref(owner, f"the object `{name}` is bound to")
            return self.method_call(getattr(callee, "__name__", ""), receiver, call, node, owner)
        if isinstance(callee, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            changing = MUTATING_METHODS | _SETTING_DUNDERS
            if getattr(callee, "__name__", "") in changing and call.args:
                self.write(call.args[0], f" (`{name}`)", node)
            return NOTHING
        if (
            callable(callee)
            and not isinstance(callee, types.BuiltinFunctionType)
            and not is_ufunc(callee)
        ):
            call_method = inspect.getattr_static(type(callee), "__call__", None)
            if isinstance(call_method, types.FunctionType) and user_code(call_method.__code__):
                receiver = object_ref(callee, f"module-level `{name}`")
                return reader.function(
                    call_method, call, {first_param(call_method): callee}, receiver
                )
        module, fname = qualified(callee)
        if fname and module not in ("builtins",):
            reader.budget.trusted.setdefault(f"{module}.{fname}" if module else fname, None)
        return result_ref(callee, call)
