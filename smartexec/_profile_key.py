"""Which callable, Python and machine a stored profile belongs to: :func:`profile_key`.

The key hashes the callable's module, qualified name and code (bytecode,
constants including nested code objects, global names), the Python and the
machine; see :mod:`smartexec._profiles` for what the store keeps under it.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable
from typing import Any

from ._system import current_platform
from .inspection import attribute

__all__ = ["FORMAT_VERSION", "profile_key"]


#: The version of the files' layout; a file of another version is ignored.
FORMAT_VERSION = 1


def _const_digest(value: Any) -> bytes:
    """A digest of one code constant, stable across interpreters of one Python."""
    h = hashlib.sha256()
    if isinstance(value, types.CodeType):
        h.update(b"code:" + _code_digest(value))
    elif isinstance(value, tuple):
        h.update(b"tuple:%d:" % len(value))
        for item in value:
            h.update(_const_digest(item))
    elif isinstance(value, frozenset):
        # Iteration order of a set of strings follows the per-process hash seed.
        h.update(b"frozenset:")
        for digest in sorted(_const_digest(item) for item in value):
            h.update(digest)
    else:
        h.update(f"{type(value).__qualname__}:{value!r}".encode("utf-8", "backslashreplace"))
    return h.digest()


def _code_digest(code: types.CodeType) -> bytes:
    """A digest of what a code object does: bytecode, constants (nested code too), names."""
    h = hashlib.sha256()
    h.update(code.co_code)  # deoptimised bytes: the same before and after the code ran
    h.update(b"\0names:" + "\0".join(code.co_names).encode("utf-8", "backslashreplace"))
    for const in code.co_consts:
        h.update(_const_digest(const))
    return h.digest()


#: Most code digests kept (the whole table is dropped when full).
_DIGESTS_KEPT = 4096

#: Code digests by ``id()`` of their code object, with a weak reference that
#: proves the id was not reused (code objects live as long as their functions).
_digests: dict[int, tuple[weakref.ref[types.CodeType], str]] = {}


def _cached_code_digest(code: types.CodeType) -> str:
    known = _digests.get(id(code))
    if known is not None and known[0]() is code:
        return known[1]
    digest = _code_digest(code).hex()[:32]
    if len(_digests) >= _DIGESTS_KEPT:
        _digests.clear()
    _digests[id(code)] = (weakref.ref(code), digest)  # dict calls are atomic: no lock
    return digest


def _function_part(fn: types.FunctionType) -> str:
    # Not the file name: a notebook's cells compile to a file named after the
    # kernel's pid (/tmp/ipykernel_<pid>/...), new at every start.
    return f"function {fn.__module__}:{fn.__qualname__} code={_cached_code_digest(fn.__code__)}"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _what(fn: Any, depth: int = 0) -> str | None:
    """The part of the key that names the callable itself, or None."""
    if depth > 8:  # a chain of wrappers or partials that long is no stable thing
        return None
    if isinstance(fn, types.FunctionType):
        part = _function_part(fn)
        # A decorator's wrapper has one code for every function it wraps:
        # the wrapped function's code tells them apart (functools.wraps).
        wrapped = fn.__dict__.get("__wrapped__")
        if wrapped is None:
            return part
        inner = _what(wrapped, depth + 1)
        return None if inner is None else f"{part} wrapping {inner}"
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        inner = _what(fn.__func__, depth + 1)
        if inner is None:
            return None
        cls = owner if isinstance(owner, type) else type(owner)
        return f"method of {_class_name(cls)}: {inner}"
    if isinstance(fn, functools.partial):
        inner = _what(fn.func, depth + 1)
        if inner is None:
            return None
        args = ",".join(_class_name(type(a)) for a in fn.args)
        kwargs = ",".join(f"{k}={_class_name(type(v))}" for k, v in sorted(fn.keywords.items()))
        return f"partial({args};{kwargs}) of {inner}"
    if isinstance(fn, types.BuiltinFunctionType):
        owner = fn.__self__
        if owner is None or isinstance(owner, types.ModuleType):
            module = fn.__module__ or getattr(owner, "__name__", None)
            return None if module is None else f"builtin {module}:{fn.__qualname__}"
        cls = owner if isinstance(owner, type) else type(owner)
        return f"builtin method of {_class_name(cls)}: {fn.__name__}"
    if isinstance(
        fn,
        (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType),
    ):
        return f"descriptor of {_class_name(fn.__objclass__)}: {fn.__name__}"
    if isinstance(fn, types.MethodWrapperType):
        return f"method wrapper of {_class_name(type(fn.__self__))}: {fn.__name__}"
    if isinstance(fn, type):
        parts = [f"class {_class_name(fn)}"]
        for name in ("__new__", "__init__"):
            method = fn.__dict__.get(name)
            if isinstance(method, staticmethod):
                method = method.__func__
            if isinstance(method, types.FunctionType):
                parts.append(f"{name}: {_function_part(method)}")
        return " ".join(parts)
    cls = type(fn)
    call = next((c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__), None)
    if isinstance(call, types.FunctionType):
        return f"instance of {_class_name(cls)}: {_function_part(call)}"
    # A C-level callable object: stable only when it is a named thing (a
    # numpy ufunc, a Cython function), not one built from arguments
    # (operator.itemgetter(1)).
    label: Any = attribute(fn, "__qualname__") or attribute(fn, "__name__")
    home: Any = attribute(fn, "__module__") or cls.__module__
    if not isinstance(label, str) or not isinstance(home, str):
        return None
    return f"named {_class_name(cls)}: {home}:{label}"


@functools.lru_cache(maxsize=1)
def _python() -> str:
    # sys.abiflags names a free-threaded build ("t") where it exists (POSIX);
    # sysconfig costs ~3 ms to load its build data, on the first map's path.
    flags = getattr(sys, "abiflags", None)
    if flags is None:
        flags = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    threaded = "t" if "t" in flags else ""
    gil = "" if current_platform().gil_enabled else " gil=off"
    major, minor = sys.version_info[:2]
    return f"{sys.implementation.name}-{major}.{minor}{threaded}{gil}"


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    return f"{platform.machine()} cpus={current_platform().cpu_count} node={platform.node()}"


def profile_key(fn: Callable[..., Any]) -> str | None:
    """Return what identifies ``fn`` as "the same callable" in a later run.

    A readable string: the callable's kind, module and qualified name, a
    hash of its code (for a bound method its function's code and its class;
    for a ``functools.partial`` its function's key and the types of its bound
    arguments; for a callable object its class's ``__call__``; a builtin by
    module and name), then the Python and the machine. Lambdas and closures
    are told apart by their code's hash.

    Args:
        fn: any callable.

    Returns:
        The key, or None when ``fn`` has no key stable across runs (a C-level
        callable object made from arguments, such as ``operator.itemgetter(1)``).
    """
    try:
        what = _what(fn)
    except Exception:  # an odd object's attributes: no key, never an error
        return None
    if what is None:
        return None
    return f"v{FORMAT_VERSION} | {what} | {_python()} | {_machine()}"
