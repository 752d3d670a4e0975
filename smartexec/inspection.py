"""What a callable is, whether its code pickles by reference, and its payload.

The routing policy needs three facts about a callable, all computed here
without running it:

* its *kind* (module-level function, builtin, numpy ufunc, bound method,
  callable instance, ``functools.partial``, lambda, closure, nested function,
  function defined in ``__main__``);
* whether its code can be pickled *by reference* (the worker imports it by
  module and qualified name) or must be sent *by value* (cloudpickle);
* its *payload*: how many bytes it, or the call's arguments, would pickle to.

Payloads are measured with pickle protocol 5: numpy arrays are counted by
``nbytes`` and other PEP 574 buffers through ``buffer_callback``, so a 100 MB
array is sized without copying a byte, and pickling stops as soon as the count
passes a cap, so sizing a huge Python structure costs at most ``cap_bytes`` of
serialisation work.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ._code_hint import code_hint, operator_hint
from ._display import with_article as _a
from .effects import Effects, effects_of

__all__ = [
    "CallableProfile",
    "PayloadSize",
    "inspect_callable",
    "payload_size",
    "pickles_by_reference",
    "callable_name",
    "locate_unpicklable",
    "DEFAULT_CAP_BYTES",
    "format_bytes",
    "format_seconds",
]

#: Sizing stops once this many bytes are counted. 64 MiB is far above any
#: routing threshold yet bounds the cost of sizing a huge pure-Python object.
DEFAULT_CAP_BYTES = 64 << 20

# Modules whose functions release the GIL around their heavy loop: OpenSSL and
# builtin hash objects release it for buffers over 2 KiB, zlib / bz2 / lzma
# while (de)compressing, time.sleep and select while waiting.
_GIL_RELEASING_MODULES = {
    "_hashlib": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "hashlib": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_sha2": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_sha256": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_sha512": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_sha1": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_sha3": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_md5": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "_blake2": "hashlib releases the GIL while hashing buffers over 2 KiB",
    "zlib": "zlib releases the GIL while compressing and decompressing",
    "bz2": "bz2 releases the GIL while compressing and decompressing",
    "_bz2": "bz2 releases the GIL while compressing and decompressing",
    "lzma": "lzma releases the GIL while compressing and decompressing",
    "_lzma": "lzma releases the GIL while compressing and decompressing",
    "select": "select waits for I/O without the GIL",
}
_GIL_RELEASING_FUNCTIONS = {
    ("time", "sleep"): "time.sleep waits without the GIL",
    ("posix", "read"): "os.read waits for I/O without the GIL",
    ("posix", "write"): "os.write waits for I/O without the GIL",
    ("subprocess", "run"): "subprocess.run waits for a child process without the GIL",
    ("subprocess", "check_output"): "subprocess.check_output waits without the GIL",
    ("urllib.request", "urlopen"): "urllib.request.urlopen waits for the network without the GIL",
}

#: Of :data:`_GIL_RELEASING_MODULES`, those whose calls wait (for I/O)
#: whatever their arguments; every call of :data:`_GIL_RELEASING_FUNCTIONS`
#: waits (a sleep, I/O, the network, a child process). The others release
#: the GIL only on big enough data (hashlib over 2 KiB).
_WAITING_MODULES = frozenset({"select"})


def _waits_when_called(fn: Any) -> bool:
    """Whether calling ``fn`` waits without the GIL whatever its arguments.

    Args:
        fn: any object (read by dictionary lookups, never called).

    Returns:
        True for the functions of :data:`_GIL_RELEASING_FUNCTIONS` and the
        modules of :data:`_WAITING_MODULES`. Never raises.
    """
    module_name = attribute(fn, "__module__")
    return (module_name, attribute(fn, "__name__")) in _GIL_RELEASING_FUNCTIONS or (
        module_name in _WAITING_MODULES
    )


#: The kinds :func:`inspect_callable` reports.
KINDS = (
    "function",  # importable module-level function
    "builtin",  # C function or method descriptor, importable
    "ufunc",  # numpy universal function
    "class",  # a class: calling it constructs an instance
    "bound_method",  # method bound to an instance (Python or builtin)
    "callable_instance",  # an object with __call__
    "partial",  # functools.partial
    "lambda",
    "closure",  # function with free variables
    "nested",  # function defined inside another function, no free variables
    "main",  # function defined in the __main__ module
)

# Kinds whose state travels with the callable and may be big.
STATEFUL_KINDS = frozenset(
    {"bound_method", "callable_instance", "partial", "lambda", "closure", "nested", "main"}
)


@dataclass(frozen=True)
class PayloadSize:
    """Bytes an object would pickle to, measured without copying buffers.

    Attributes:
        nbytes: bytes counted (stream plus out-of-band buffers); a lower bound
            when ``capped`` is True.
        capped: True when counting stopped at the cap.
        error: why pickling failed, or None when it did not.
    """

    nbytes: int
    capped: bool = False
    error: str | None = None

    def __str__(self) -> str:
        if self.error is not None:
            return f"unpicklable ({self.error})"
        return (">" if self.capped else "") + format_bytes(self.nbytes)


@dataclass(frozen=True)
class CallableProfile:
    """What :func:`inspect_callable` learnt about a callable.

    Attributes:
        kind: one of :data:`KINDS`.
        name: readable name, e.g. ``"Index.query"`` or ``"main.<locals>.<lambda>"``.
        by_reference: True when the code pickles by reference (importable by
            module and qualified name, outside ``__main__``).
        state: size of the state that travels with the callable (bound
            ``__self__``, instance, partial arguments, closure cells and
            globals of a by-value function); zero bytes for importable
            functions.
        state_holder: what holds that state, for messages, e.g.
            ``"__self__ (an Index)"`` or ``"cells 'table', 'n'"``.
        gil_hint: why the callable is known to release the GIL, or None.
        code_hint: why what it runs suggests threads serve it, or None: its
            Python code calls a GIL-releasing function
            (:func:`smartexec._code_hint.code_hint`), or it is an
            ``operator`` function (:func:`smartexec._code_hint.operator_hint`).
            Weaker than ``gil_hint``: a measurement of the callable
            overrides it.
        in_process: why its calls must run in this process, or None: it is
            a method of an object this process's threads share (a queue, a
            lock, an event) or a built-in method of a mutable built-in
            object (``results.append``), which a worker process would run
            on a copy (:attr:`smartexec.effects.Effects.in_process`).
        effects: what its code may change besides its result, and so which
            routes compute what worker processes would
            (:func:`smartexec.effects.effects_of`).
    """

    kind: str
    name: str
    by_reference: bool
    state: PayloadSize
    state_holder: str = ""
    gil_hint: str | None = None
    code_hint: str | None = None
    in_process: str | None = None
    effects: Effects = field(default_factory=Effects, compare=False)

    @property
    def state_bytes(self) -> int:
        """Bytes of state counted (a lower bound when ``state.capped``)."""
        return self.state.nbytes


def format_seconds(seconds: float) -> str:
    """Format a duration for people: ``0.0021`` -> ``"2.1 ms"``, ``2e-5`` -> ``"20.0 us"``."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_bytes(n: float) -> str:
    """Format a byte count for people: ``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


class _CapReached(Exception):
    pass


class _CountingSink:
    """A write-only file that counts bytes and gives up past ``cap``."""

    __slots__ = ("nbytes", "cap")

    def __init__(self, cap: int):
        self.nbytes = 0
        self.cap = cap

    def add(self, n: int) -> None:
        self.nbytes += n
        if self.nbytes > self.cap:
            raise _CapReached

    def count_buffer(self, buffer: pickle.PickleBuffer) -> None:
        self.add(memoryview(buffer).nbytes)
        return None  # falsy: keep the buffer out of band, never copied

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.add(n)
        return n


def _empty() -> None:
    return None


class _SizingPickler(cloudpickle.Pickler):
    """cloudpickle's pickler, counting numpy arrays by ``nbytes``."""

    def __init__(self, sink: _CountingSink):
        # The callback is the sink's method, not ours: a pickler that refers
        # to itself would keep the sized object alive until the next GC pass.
        super().__init__(sink, protocol=5, buffer_callback=sink.count_buffer)
        self._sink = sink

    def reducer_override(self, obj: Any) -> Any:
        np = sys.modules.get("numpy")
        if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
            self._sink.add(obj.nbytes + 128)
            return (_empty, ())
        return super().reducer_override(obj)


def payload_size(obj: Any, *, cap_bytes: int = DEFAULT_CAP_BYTES) -> PayloadSize:
    """Count the bytes ``obj`` would pickle to, without copying big buffers.

    Pickles with cloudpickle at protocol 5 into a counting sink: numpy arrays
    count their ``nbytes``, PEP 574 buffers are counted out of band, and the
    walk stops once ``cap_bytes`` is passed.

    Args:
        obj: any object.
        cap_bytes: stop counting past this many bytes (int, bytes).

    Returns:
        A :class:`PayloadSize`; ``error`` is set, and nothing raised, when the
        object cannot be pickled.
    """
    sink = _CountingSink(cap_bytes)
    pickler = _SizingPickler(sink)
    try:
        pickler.dump(obj)
    except _CapReached:
        return PayloadSize(sink.nbytes, capped=True)
    except RecursionError:
        return PayloadSize(sink.nbytes, error="too deeply nested to pickle (RecursionError)")
    except Exception as exc:
        return PayloadSize(sink.nbytes, error=f"{type(exc).__name__}: {exc}")
    finally:
        pickler.clear_memo()  # the memo holds every object it visited
    return PayloadSize(sink.nbytes)


def _lookup(module_name: str, qualname: str) -> Any:
    module = sys.modules.get(module_name)
    if module is None:
        return None
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def pickles_by_reference(obj: Any) -> bool:
    """Return True when pickle can send ``obj`` by module and qualified name.

    That holds when ``obj.__module__`` is imported, is not ``__main__`` (a
    spawned worker has a different ``__main__``), and looking up
    ``obj.__qualname__`` in it yields ``obj`` itself. Otherwise the object must
    travel by value, which cloudpickle does (lambdas, closures, nested
    functions, functions replaced by a decorator of the same name).
    """
    module_name = attribute(obj, "__module__")
    qualname = attribute(obj, "__qualname__")
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        return False
    if module_name == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        return False
    return _lookup(module_name, qualname) is obj


def attribute(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)``, also None when a ``__getattr__`` raises something else.

    A dict-backed object whose ``__getattr__`` raises ``KeyError`` for an
    unknown name is a fine callable (``ThreadPoolExecutor`` runs it); looking
    up its ``__qualname__`` must not fail the call.
    """
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def callable_name(fn: Any) -> str:
    """Return a readable name for ``fn``, e.g. ``"Index.query"``."""
    if isinstance(fn, functools.partial):
        return f"partial({callable_name(fn.func)})"
    name = attribute(fn, "__qualname__") or attribute(fn, "__name__")
    if isinstance(name, str):
        return name
    return f"{type(fn).__qualname__} instance"


def _gil_hint(fn: Any) -> str | None:
    module_name = attribute(fn, "__module__")
    name = attribute(fn, "__name__")
    hint = _GIL_RELEASING_FUNCTIONS.get((module_name, name))
    if hint is not None:
        return hint
    if isinstance(module_name, str):
        return _GIL_RELEASING_MODULES.get(module_name)
    return None


def inspect_callable(
    fn: Callable[..., Any], *, cap_bytes: int = DEFAULT_CAP_BYTES
) -> CallableProfile:
    """Profile a callable without calling it.

    Args:
        fn: the callable to be sent to workers.
        cap_bytes: stop sizing its state past this many bytes.

    Returns:
        A :class:`CallableProfile`.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    effects = effects_of(fn)
    return dataclasses.replace(
        _inspect(fn, cap_bytes), in_process=effects.in_process, effects=effects
    )


def _inspect(fn: Callable[..., Any], cap_bytes: int) -> CallableProfile:
    """:func:`inspect_callable` but for ``in_process`` (same arguments)."""
    if not callable(fn):
        raise TypeError(
            f"{fn!r} ({type(fn).__qualname__}) is not callable; pass a function, e.g. "
            f"executor.submit(work, item) rather than executor.submit(work(item))"
        )
    name = callable_name(fn)
    np = sys.modules.get("numpy")
    none = PayloadSize(0)

    if isinstance(fn, functools.partial):
        inner = inspect_callable(fn.func, cap_bytes=cap_bytes)
        state = payload_size(fn, cap_bytes=cap_bytes)
        return CallableProfile(
            "partial",
            name,
            inner.by_reference,
            state,
            "the partial's arguments",
            inner.gil_hint,
            inner.code_hint,
        )
    if np is not None and isinstance(fn, np.ufunc):
        return CallableProfile(
            "ufunc", name, True, none, gil_hint="numpy ufuncs release the GIL on arrays"
        )
    if isinstance(fn, type):
        return CallableProfile("class", name, pickles_by_reference(fn), none)
    if isinstance(fn, (types.MethodType, types.BuiltinFunctionType)):
        return _inspect_method(fn, name, cap_bytes)
    if isinstance(fn, types.FunctionType):
        return _inspect_function(fn, name, cap_bytes)
    if isinstance(
        fn,
        (
            types.MethodDescriptorType,
            types.WrapperDescriptorType,
            types.MethodWrapperType,
            types.ClassMethodDescriptorType,
        ),
    ):
        return CallableProfile("builtin", name, True, payload_size(fn, cap_bytes=cap_bytes))
    # A callable object that is itself a module global, found by its own
    # name (numpy's array-function dispatchers: np.sort, np.mean): pickle
    # sends its name, as for a function, and nothing of its state.
    if pickles_by_reference(fn):
        return CallableProfile("function", name, True, none, gil_hint=_gil_hint(fn))
    # Any other object with __call__.
    return CallableProfile(
        "callable_instance",
        name,
        pickles_by_reference(type(fn)),
        payload_size(fn, cap_bytes=cap_bytes),
        f"the {type(fn).__qualname__} instance",
        _gil_hint(type(fn)),
    )


def _inspect_method(fn: Any, name: str, cap_bytes: int) -> CallableProfile:
    """A bound method (Python or builtin), a classmethod, or a module-level builtin."""
    none = PayloadSize(0)
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        if isinstance(owner, type):  # classmethod: the class pickles by reference
            return CallableProfile("bound_method", name, pickles_by_reference(owner), none)
        state = payload_size(owner, cap_bytes=cap_bytes)
        return CallableProfile(
            "bound_method",
            name,
            pickles_by_reference(fn.__func__),
            state,
            f"__self__ ({_a(owner)})",
            _gil_hint(type(owner)),
            code_hint(fn.__func__),
        )
    # a builtin function or method
    owner = fn.__self__
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return CallableProfile(
            "builtin", name, True, none, gil_hint=_gil_hint(fn), code_hint=operator_hint(fn)
        )
    state = payload_size(owner, cap_bytes=cap_bytes)
    return CallableProfile(
        "bound_method", name, True, state, f"__self__ ({_a(owner)})", _gil_hint(type(owner))
    )


def _inspect_function(fn: types.FunctionType, name: str, cap_bytes: int) -> CallableProfile:
    """A Python function: by reference when importable, else by value (lambda, closure, ...)."""
    none = PayloadSize(0)
    by_reference = pickles_by_reference(fn)
    if by_reference:
        return CallableProfile(
            "function", name, True, none, gil_hint=_gil_hint(fn), code_hint=code_hint(fn)
        )
    if fn.__name__ == "<lambda>":
        kind = "lambda"
    elif fn.__closure__:
        kind = "closure"
    elif fn.__module__ == "__main__" and "<locals>" not in fn.__qualname__:
        kind = "main"
    else:
        kind = "nested"
    cells = fn.__code__.co_freevars
    holder = (
        "cells " + ", ".join(repr(c) for c in cells)
        if cells
        else "its code and the globals it uses"
    )
    return CallableProfile(
        kind,
        name,
        False,
        payload_size(fn, cap_bytes=cap_bytes),
        holder,
        code_hint=code_hint(fn),
    )


def _parts(obj: Any) -> Iterable[tuple[str, Any]]:
    """The named parts of ``obj`` that a pickler would visit first."""
    if isinstance(obj, functools.partial):
        yield "the partial's function", obj.func
        for i, arg in enumerate(obj.args):
            yield f"partial argument {i + 1}", arg
        for key, arg in obj.keywords.items():
            yield f"partial keyword {key!r}", arg
    elif isinstance(obj, types.MethodType):
        yield "__self__", obj.__self__
    elif isinstance(obj, types.FunctionType):
        for cell_name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                yield f"cell {cell_name!r}", cell.cell_contents
            except ValueError:  # empty cell
                continue
        for global_name in obj.__code__.co_names:
            if global_name in obj.__globals__:
                yield f"global {global_name!r}", obj.__globals__[global_name]
    elif isinstance(obj, dict):
        for key, value in list(obj.items())[:1000]:
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(list(obj)[:1000]):
            yield f"[{i}]", value
    else:
        state = attribute(obj, "__dict__")
        if isinstance(state, dict):
            for key, value in state.items():
                yield f"attribute {key!r}", value


def locate_unpicklable(obj: Any, where: str, *, depth: int = 4) -> tuple[str, Any, str] | None:
    """Find the innermost part of ``obj`` that cannot be pickled.

    Walks partial arguments, ``__self__``, closure cells, globals used by a
    by-value function, container items and instance attributes, ``depth``
    levels deep.

    Args:
        obj: the object that failed to pickle.
        where: how to name ``obj`` in the result, e.g. ``"argument 1"``.
        depth: how many levels to descend.

    Returns:
        ``(path, part, reason)`` naming the failing part, or None when ``obj``
        pickles.
    """
    size = payload_size(obj, cap_bytes=sys.maxsize)
    if size.error is None:
        return None
    if depth > 0:
        for label, part in _parts(obj):
            if part is obj or isinstance(part, types.ModuleType):
                continue
            found = locate_unpicklable(part, f"{where}, {label}", depth=depth - 1)
            if found is not None:
                return found
    return where, obj, size.error
