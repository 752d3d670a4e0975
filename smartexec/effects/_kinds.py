"""The entry point: :func:`effects_of` reads each kind of callable (function, method, partial, callable object, class, built-in)."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

from ._found import Effects, is_declared
from ._in_process import process_local_reason
from ._reader import Reader
from ._refs import NOTHING, Call, Ref, argument_ref, first_param, mapped_call, object_ref
from ._tables import (
    METHODS_WRITING_ARGUMENT,
    MUTATING_METHODS,
    WRITES_ARGUMENT,
    global_generators,
    is_generator,
    is_ufunc,
    qualified,
    table_effect,
)

# --- the entry point ----------------------------------------------------------


def effects_of(fn: Callable[..., Any]) -> Effects:
    """What ``fn`` may change besides its return value, read from its code without running it.

    Args:
        fn: any callable: a function, lambda or closure, a bound method (its
            object is shared by every call), a ``functools.partial`` (its
            bound arguments are shared), a callable object, a class, a
            built-in.

    Returns:
        An :class:`Effects`; ``Effects(declared=True)`` for a callable
        declared with :func:`thread_safe`; for a callable whose whole effect
        is on an object of this process, only ``in_process`` (it belongs on
        threads, whatever it writes). Never raises: code that cannot be read
        is an ``"unread"`` effect.
    """
    in_process = process_local_reason(fn)
    if is_declared(fn) or in_process is not None:
        return Effects(declared=is_declared(fn), in_process=in_process)
    reader = Reader()
    try:
        read_callable(reader, fn, mapped_call(), 0)
    except RecursionError:
        reader.unread("code nested too deep to read")
    except Exception as exc:  # noqa: BLE001 - reading is advice: an odd object is unread
        reader.unread(f"its code could not be read ({type(exc).__name__})")
    found, trusted = reader.effects()
    return Effects(found, trusted)


def read_callable(reader: Reader, fn: Any, call: Call, depth: int) -> None:
    """Read any kind of callable, as called with ``call``'s (the map's) arguments."""
    if depth > 3:
        reader.unread(f"{type(fn).__name__} wraps too many layers to read")
        return
    if isinstance(fn, functools.partial):
        bound = [object_ref(a, "an argument bound in the partial") for a in fn.args]
        keywords = {
            k: object_ref(v, f"the partial's keyword `{k}`") for k, v in fn.keywords.items()
        }
        inner = Call(bound, keywords, argument_ref(), mapped=True)
        read_callable(reader, fn.func, inner, depth + 1)
        return
    if isinstance(fn, types.MethodType):
        read_method(reader, fn, call)
        return
    if isinstance(fn, types.FunctionType):
        reader.function(fn, call)
        return
    if isinstance(fn, type):
        init = inspect.getattr_static(fn, "__init__", None)
        if isinstance(init, types.FunctionType):
            reader.function(init, call, None, NOTHING)
        return
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)) or is_ufunc(fn):
        receiver = NOTHING
        if owner is not None and not isinstance(owner, types.ModuleType):
            receiver = object_ref(owner, f"the object it is bound to (a {type(owner).__name__})")
        read_builtin(reader, fn, owner, receiver)
        return
    wrapped = inspect.getattr_static(fn, "__wrapped__", None)
    if isinstance(wrapped, types.FunctionType):  # an lru_cache or kin around the user's code
        read_callable(reader, wrapped, call, depth + 1)
        return
    call_method = inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(call_method, types.FunctionType):
        receiver = object_ref(fn, f"the callable object (a {type(fn).__name__})")
        reader.function(call_method, call, {first_param(call_method): fn}, receiver)
        return
    read_builtin(reader, fn, owner, NOTHING)


def read_method(reader: Reader, fn: types.MethodType, call: Call) -> None:
    """A bound method: its object is shared by every call."""
    owner = fn.__self__
    if isinstance(owner, type):
        receiver = object_ref(owner, f"class `{owner.__qualname__}`")
    else:
        receiver = object_ref(owner, f"the object it is bound to (a {type(owner).__name__})")
    generators = global_generators()
    name = getattr(fn, "__name__", "")
    if id(owner) in generators:
        what = f"uses the process's global {generators[id(owner)]} generator (`{name}`)"
        reader.budget.add("process", what, "")
    elif is_generator(owner):
        reader.write(receiver, f" (draws from it: `{name}`)", "")
    if name in METHODS_WRITING_ARGUMENT and is_generator(owner):
        reader.write(argument_ref(), f" (`{name}`)", "")
    if isinstance(fn.__func__, types.FunctionType):
        reader.function(fn.__func__, call, {first_param(fn.__func__): owner}, receiver)
    else:
        read_builtin(reader, fn.__func__, owner, receiver)


def read_builtin(reader: Reader, fn: Any, owner: Any, receiver: Ref) -> None:
    """A native callable: the tables, else trusted."""
    module, name = qualified(fn)
    generators = global_generators()
    if owner is not None and id(owner) in generators:
        reader.budget.add(
            "process", f"uses the process's global {generators[id(owner)]} generator (`{name}`)", ""
        )
        return
    found = table_effect(fn, module, name)
    if found is not None:
        reader.budget.add(found[0], found[1], "")
    if (module, name) in WRITES_ARGUMENT or name in METHODS_WRITING_ARGUMENT and owner is not None:
        reader.write(argument_ref(), f" (`{name}`)", "")
    if name in MUTATING_METHODS and owner is not None and not isinstance(owner, types.ModuleType):
        reader.write(receiver, f" (.{name}())", "")
    elif name:
        reader.budget.trusted.setdefault(f"{module}.{name}" if module else name, None)
