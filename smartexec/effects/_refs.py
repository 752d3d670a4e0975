"""What an expression may refer to (an argument, a shared object, process state), and how a call passes it on."""

from __future__ import annotations

import ast
import contextvars
import functools
import inspect
import logging
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Literal

from ._source import FunctionNode, params_of
from ._tables import (
    CALLED_ONLY,
    DECIMAL_MODULES,
    HOLDING_BUILTINS,
    IMMUTABLE,
    PASS_THROUGH,
    PROCESS_OBJECTS,
    STREAMS,
    is_ufunc,
    user_module,
)

# --- what an expression may refer to ----------------------------------------


@dataclass(frozen=True)
class Root:
    """An object a function did not create: its argument, a shared object, or process state."""

    kind: Literal["argument", "shared", "process"]
    label: str


Roots = frozenset  # of Root


@dataclass(frozen=True)
class Ref:
    """What an expression's value may be, or hold: the objects a write through it reaches.

    ``direct``: objects the value may be (a write to it writes them).
    ``inner``: objects its elements or attributes may be.
    """

    direct: frozenset[Root] = frozenset()
    inner: frozenset[Root] = frozenset()

    def __or__(self, other: Ref) -> Ref:
        return Ref(self.direct | other.direct, self.inner | other.inner)

    def element(self) -> Ref:
        both = self.direct | self.inner
        return Ref(both, both)

    def holding(self) -> Ref:
        return Ref(frozenset(), self.direct | self.inner)


NOTHING = Ref()
MISSING = object()


def root_ref(root: Root) -> Ref:
    return Ref(frozenset({root}), frozenset({root}))


def object_ref(obj: Any, label: str) -> Ref:
    """The reference to a module-level object or closure value ``obj`` named ``label``."""
    if id(obj) in STREAMS or isinstance(obj, IMMUTABLE):
        return NOTHING
    if id(obj) in PROCESS_OBJECTS:
        return root_ref(Root("process", PROCESS_OBJECTS[id(obj)]))
    if isinstance(obj, threading.local):
        return NOTHING  # each thread's own, as each worker process's is
    if isinstance(obj, logging.Logger):
        return root_ref(Root("process", f"the logger `{obj.name}`"))
    if isinstance(obj, contextvars.ContextVar):
        # The caller's own value in a loop there; a worker's copy on processes.
        return root_ref(Root("process", f"the context variable `{obj.name}`"))
    if isinstance(obj, types.ModuleType):
        # A library's module attributes are settings of the whole process
        # (tempfile.tempdir); the user's own modules hold the user's state.
        kind: Literal["shared", "process"] = "shared" if user_module(obj) else "process"
        return root_ref(Root(kind, f"module `{obj.__name__}`"))
    if isinstance(obj, type):
        if obj.__module__ == "builtins":
            return NOTHING
        return root_ref(Root("shared", f"class `{obj.__qualname__}`"))
    if is_ufunc(obj) or isinstance(obj, CALLED_ONLY):
        return NOTHING  # called, not written; a write to its attributes is rare
    if isinstance(obj, tuple) and all(isinstance(x, IMMUTABLE) for x in obj):
        return NOTHING
    return root_ref(Root("shared", label))


@dataclass
class Call:
    """What a call passes: its positional and keyword arguments' references."""

    args: list[Ref] = field(default_factory=list)
    keywords: dict[str, Ref] = field(default_factory=dict)
    spread: Ref = NOTHING  # *args / **kwargs
    #: the map's own call: each parameter not bound otherwise is the caller's argument
    mapped: bool = False


def static_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` found without running code (no descriptors, no ``__getattr__``).

    Module attributes, a class's attributes, an instance's own attributes,
    and the Python methods of an instance's class (bound to it); a built-in
    method of an instance is not resolved (its call is judged by its name).
    """
    if isinstance(owner, types.ModuleType):
        found = vars(owner).get(name, MISSING)
        if found is MISSING:  # a submodule loaded lazily (numpy.random)
            found = sys.modules.get(f"{owner.__name__}.{name}", MISSING)
        return found
    if isinstance(owner, type):
        try:
            found = inspect.getattr_static(owner, name)
        except (AttributeError, TypeError, ValueError):
            return MISSING
        if isinstance(found, (staticmethod, classmethod)):
            return found.__get__(None, owner)
        return found
    own = getattr(owner, "__dict__", None)
    if isinstance(own, dict) and name in own:
        return own[name]
    try:
        found = inspect.getattr_static(type(owner), name)
    except (AttributeError, TypeError, ValueError):
        return MISSING
    if isinstance(found, types.FunctionType):
        return types.MethodType(found, owner)
    if isinstance(found, staticmethod):
        return found.__func__
    if isinstance(found, classmethod):
        return types.MethodType(found.__func__, type(owner))
    return MISSING


def bind_call(
    fn: types.FunctionType, node: FunctionNode, call: Call, self_ref: Ref | None
) -> dict[str, Ref]:
    """Each parameter of ``node`` and what the call (or its default) passes it."""
    a = node.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    bound: dict[str, Ref] = {}
    if self_ref is not None and positional:
        bound[positional[0]] = self_ref
        positional = positional[1:]
    for name, ref in zip(positional, call.args):
        bound[name] = ref
    extra = call.args[len(positional) :]
    if a.vararg is not None:
        bound[a.vararg.arg] = functools.reduce(Ref.__or__, extra, call.spread).holding()
    for name, ref in call.keywords.items():
        if name in positional or name in (x.arg for x in a.kwonlyargs):
            bound[name] = bound.get(name, NOTHING) | ref
    if a.kwarg is not None:
        bound[a.kwarg.arg] = call.spread.holding()
    values = fn.__defaults__ or ()
    defaults = dict(zip(positional[len(positional) - len(values) :], values))
    defaults.update(fn.__kwdefaults__ or {})
    for name in params_of(node):
        if name in bound:
            continue
        ref = root_ref(Root("argument", f"`{name}`")) if call.mapped else call.spread
        if name in defaults:
            ref = ref | object_ref(defaults[name], f"the default value of `{name}`")
        bound[name] = ref
    return bound


def first_param(fn: types.FunctionType) -> str:
    code = fn.__code__
    return code.co_varnames[0] if code.co_argcount else ""


def result_ref(callee: Any, call: Call) -> Ref:
    """What the result of a known callable refers to: its first argument, for views and iterators."""
    name = getattr(callee, "__name__", "")
    if name in PASS_THROUGH and call.args:
        return call.args[0]
    if name == "array" and "copy" in call.keywords and call.args:
        return call.args[0]  # np.array(a, copy=False): may be ``a`` itself
    if name == "ndarray" and "buffer" in call.keywords:
        return call.keywords["buffer"]  # a view of the buffer
    if name == "getLogger" and getattr(callee, "__module__", "") == "logging":
        return root_ref(Root("process", "a logger (`logging.getLogger`)"))
    if name == "getcontext" and getattr(callee, "__module__", "") in DECIMAL_MODULES:
        return root_ref(Root("process", "the decimal context (`decimal.getcontext`)"))
    if name in HOLDING_BUILTINS:
        return functools.reduce(Ref.__or__, call.args, call.spread).holding()
    if name == "globals" and getattr(callee, "__module__", "") == "builtins":
        return root_ref(Root("shared", "its module's globals"))
    if callee is type and len(call.args) == 1:
        return root_ref(Root("shared", "a class's attributes (`type(...)`)"))
    if callee in (vars, getattr, next) and call.args:
        return call.args[0].element()  # its attributes, or the next of its elements
    return NOTHING


def dotted(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value)
        return f"{base}.{expr.attr}" if base else expr.attr
    return ""


def argument_ref() -> Ref:
    return root_ref(Root("argument", "(an item of the map)"))


def mapped_call() -> Call:
    """A call as ``map`` makes it: every argument is the caller's."""
    return Call(spread=argument_ref(), mapped=True)
