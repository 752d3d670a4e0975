"""The module-level values a callable reads in a forked worker, and proof that the worker's copy is current.

A forked worker holds the caller's modules as they were when it forked. A
function pickled by reference (``helpers.scale``) runs there on that copy:
when the caller changes ``helpers.SCALE`` between two maps, workers forked
before the change still read the old value, while threads and a loop here
read the new one. A route may change how fast a map runs, never what it
computes, so a fork pool may serve a map only while what the callable reads
there is what it would read here.

:func:`state_of` finds what a callable reaches by name in a worker, without
running it: the module-level names its code loads, the attributes its code
loads of the user's own modules and classes, followed into the user's own
functions and methods it reaches that way, up to :data:`MAX_FUNCTIONS`
functions. Code that cloudpickle sends by value (a function of ``__main__``,
a closure, a lambda) takes the current values of the globals it names with
it; only what it reaches by reference (a module, an importable function or
class) is read in the worker. Code of installed packages and the standard
library is trusted not to be changed, as its source is not read either.

:class:`State` holds those bindings' values now: each one's identity (a
rebinding, ``helpers.SCALE = 10``, gives another object), and for each
mutable value (a dict, a list, an array, an instance) a digest of its
pickled state (:func:`smartexec._fingerprint.digest`), which also catches
a change in place (``helpers.CONFIG["k"] = 10``). Two states are the same
only when every identity and every digest is: then a pool that recorded one
serves a call that took the other.
"""

from __future__ import annotations

import functools
import importlib
import pickle
import sys
import time
import types
import weakref
from collections.abc import Iterator
from dis import get_instructions
from typing import Any

import cloudpickle

from . import _fingerprint
from .effects._tables import user_module
from .inspection import pickles_by_reference

__all__ = ["Record", "State", "state_of", "Sent", "sent_with_values", "MAX_FUNCTIONS"]

#: Most functions followed from one callable; past it nothing is proven current.
MAX_FUNCTIONS = 64

#: Most bytes of mutable values a proof hashes (~3 ms at 1.4 GB/s); past it a
#: map of the callable forks a fresh pool, as a shared callable's map does.
DIGEST_BYTES = 4 << 20

#: Values whose identity is their whole state: a rebinding is the only change.
_FIXED = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    type,
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    range,
    frozenset,
    tuple,
)

_MISSING = object()

_Names = tuple[frozenset[str], frozenset[str], frozenset[str]]

#: Names each code object loads and rebinds, by code (see :func:`_names`).
_NAMES: dict[types.CodeType, _Names] = {}
_NAMES_KEPT = 2048


def _names(code: types.CodeType) -> _Names:
    """The module-level names ``code`` (and code nested in it) loads, the attribute names it loads, the module-level names it rebinds."""
    known = _NAMES.get(code)
    if known is not None:
        return known
    names: set[str] = set()
    attrs: set[str] = set()
    stores: set[str] = set()
    for sub in _codes(code):
        for ins in get_instructions(sub):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.add(ins.argval)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
                attrs.add(ins.argval)
            elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                stores.add(ins.argval)
    if len(_NAMES) >= _NAMES_KEPT:
        _NAMES.clear()
    known = _NAMES[code] = (frozenset(names), frozenset(attrs), frozenset(stores))
    return known


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


class _Walk:
    """Follows a callable's code to the bindings it reads by name in a worker."""

    def __init__(self, shared: bool) -> None:
        self.shared = shared  # reaches workers by copy-on-write: nothing is sent by value
        #: (id of namespace, name) -> (namespace, name): a module's dict, or a class.
        self.bindings: dict[tuple[int, str], tuple[Any, str]] = {}
        self.seen: set[int] = set()
        self.rebound: set[tuple[int, str]] = set()  # bindings the code itself rebinds
        self.complete = True  # False: over MAX_FUNCTIONS, nothing proven

    def bind(self, holder: Any, name: str) -> Any:
        self.bindings.setdefault((id(holder), name), (holder, name))
        return _value(holder, name)

    def callable(self, fn: Any) -> None:
        while isinstance(fn, functools.partial):
            fn = fn.func
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            self.function(fn.__func__)  # its object travels as it is; its class by name
            owner = fn.__self__ if isinstance(fn.__self__, type) else type(fn.__self__)
            self.enter(owner, _names(fn.__func__.__code__)[1])
        elif isinstance(fn, (staticmethod, classmethod)):
            self.callable(fn.__func__)
        elif isinstance(fn, types.FunctionType):
            self.function(fn)
        elif not isinstance(fn, _FIXED):
            # A callable instance: its class's __call__, found as Python finds it.
            call = next(
                (vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None
            )
            if isinstance(call, types.FunctionType):
                self.function(call)
            inner = getattr(fn, "__wrapped__", None)  # a wrapper's (smartexec's own too)
            if inner is not None and inner is not fn:
                self.callable(inner)

    def function(self, fn: types.FunctionType) -> None:
        name = getattr(fn, "__module__", None) or ""
        module = sys.modules.get(name)
        if id(fn) in self.seen or module is None or not user_module(module) or _ours(name):
            return
        if len(self.seen) >= MAX_FUNCTIONS:
            self.complete = False
            return
        self.seen.add(id(fn))
        by_reference = self.shared or pickles_by_reference(fn)
        if pickles_by_reference(fn):  # the worker looks it up by name: a rebinding runs other code
            self.bind(module.__dict__, fn.__qualname__.split(".")[0])
        names, attrs, stores = _names(fn.__code__)
        self.rebound.update((id(fn.__globals__), name) for name in stores)
        for name in sorted(names):
            if name not in fn.__globals__:
                continue  # a builtin
            if by_reference:
                value = self.bind(fn.__globals__, name)
            else:
                value = fn.__globals__[name]  # sent with the function, as it is now
            self.enter(value, attrs)
        for cell in fn.__closure__ or ():
            try:
                self.enter(cell.cell_contents, attrs)
            except ValueError:  # an empty cell
                pass

    def enter(self, value: Any, attrs: frozenset[str]) -> None:
        """Follow ``value``, reached by a function loading ``attrs``, to what it names."""
        if isinstance(value, types.ModuleType):
            if user_module(value):
                for attr in sorted(attrs & value.__dict__.keys()):
                    self.enter(self.bind(value.__dict__, attr), attrs)
        elif isinstance(value, type):
            module = sys.modules.get(value.__module__)
            if module is not None and user_module(module) and pickles_by_reference(value):
                for attr in sorted(attrs & vars(value).keys()):
                    self.callable(self.bind(value, attr))
        else:
            self.callable(value)


def _ours(module: str) -> bool:
    """Whether ``module`` is smartexec's own (not the user's, wherever it is installed)."""
    return module == "smartexec" or module.startswith("smartexec.")


def _value(holder: Any, name: str) -> Any:
    space = holder if isinstance(holder, dict) else vars(holder)
    return space.get(name, _MISSING)


def _fixed(value: Any) -> bool:
    """Whether ``value``'s identity is its whole state (no change in place)."""
    if isinstance(value, (tuple, frozenset)):
        return all(_fixed(item) for item in value)
    return isinstance(value, _FIXED)


def _size(value: Any) -> int:
    """Bytes a digest of ``value`` would read, roughly (a buffer's, or a container's length)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (bytearray, memoryview, dict, list, set)):
        return 64 * len(value) if isinstance(value, (dict, list, set)) else len(value)
    return 0


class _Held:
    """One value by weak reference where it takes one (a replaced value is not kept alive)."""

    __slots__ = ("ref", "strong")

    def __init__(self, value: Any):
        try:
            self.ref: Any = weakref.ref(value)
            self.strong: Any = None
        except TypeError:
            self.ref, self.strong = None, value

    def holds(self, value: Any) -> bool:
        if self.ref is None:
            return self.strong is value
        return self.ref() is value


_Key = tuple[int, str]  # (id of the module's dict or the class, name)


class _Seen:
    """One binding's value as a pool forked: the object, and a digest when it is mutable."""

    __slots__ = ("held", "digest")

    def __init__(self, value: Any, digest: bytes | None):
        self.held = _Held(value)
        self.digest = digest


#: What a fork pool recorded as it forked: each binding's value.
Record = dict[_Key, _Seen]


class State:
    """The values of the bindings a callable reads in a worker, now.

    A value the callable's own code rebinds (a cache it fills: ``global
    _T; if _T is None: _T = build()``) is its worker's own: only a rebinding
    by the caller counts, not a change in place.

    Attributes:
        digest_s: seconds the digests of its mutable values took.
        proven: False when it cannot prove a pool current: a value could not
            be pickled for its digest, was too big to hash in well under a
            fork's time (:data:`DIGEST_BYTES`), or the code was too big to
            follow.
    """

    __slots__ = ("_values", "_digests", "_by_identity", "digest_s", "proven")

    def __init__(self, walk: _Walk, digest: bool = True):
        self._values: dict[_Key, Any] = {}
        self._digests: dict[_Key, bytes] = {}
        self._by_identity: set[_Key] = set()  # proven by the object alone
        self.proven = walk.complete
        start = time.perf_counter()
        for key, (holder, name) in walk.bindings.items():
            value = self._values[key] = _value(holder, name)
            if key in walk.rebound or _fixed(value):
                self._by_identity.add(key)
                continue
            if not digest or _size(value) > DIGEST_BYTES:
                self.proven = False
                continue
            try:
                self._digests[key] = _fingerprint.digest(value)
            except Exception:  # noqa: BLE001 - unpicklable: no proof of its content
                self.proven = False
        self.digest_s = time.perf_counter() - start

    @property
    def reads(self) -> bool:
        """Whether the callable reads anything by name that could change."""
        return bool(self._values) or not self.proven

    def record(self) -> Record:
        """What a pool forked now keeps: each value that can be proven, by weak reference where it can."""
        return {
            key: _Seen(value, self._digests.get(key))
            for key, value in self._values.items()
            if key in self._digests or key in self._by_identity
        }

    def same_as(self, record: Record | None) -> bool:
        """Whether a pool that recorded ``record`` reads what the callable reads now."""
        if record is None or not self.proven:
            return False
        for key, value in self._values.items():
            seen = record.get(key)
            if seen is None or seen.digest != self._digests.get(key) or not seen.held.holds(value):
                return False
        return True


def state_of(fn: Any, shared: bool = False, digest: bool = True) -> State:
    """The module-level values ``fn`` reads in a forked worker, as they are now.

    Args:
        fn: the user's callable (function, bound method, ``functools.partial``,
            callable instance).
        shared: ``fn`` reaches the workers by copy-on-write (the fork
            backend's trampoline), not pickled: the globals of its code are
            the worker's copies too.
        digest: also hash its mutable values (a few microseconds for a small
            dict; 40-80 ms per 100 MB); False leaves a state with any
            mutable value unproven.

    Returns:
        A :class:`State`; ``State.reads`` is False when nothing it reads by
        name could change (only the standard library's and installed
        packages' code, and values sent with it).
    """
    walk = _Walk(shared)
    walk.callable(fn)
    return State(walk, digest)


# -- for workers that import their modules afresh (loky) ----------------------


class Sent:
    """A callable sent with the module-level values it reads, installed where it is unpickled.

    A loky worker imports the user's modules afresh: it reads each value as
    the module's own code set it, not as the caller has it now. Unpickled,
    this sets each binding the callable reads by name to the caller's value
    at the ``map`` or ``submit``, and gives back the callable itself (no
    wrapper frame runs). Left out: modules (imported alike), bindings the
    callable's own code rebinds (a cache it fills in its worker), and values
    that cannot be pickled (the worker keeps its own, as before).

    Attributes:
        fn: the callable (or what stands for it in transit).
        values: ``(module name or class, name, pickled value)`` triples.
    """

    __slots__ = ("fn", "values")

    def __init__(self, fn: Any, values: tuple[tuple[Any, str, bytes], ...]):
        self.fn = fn
        self.values = values

    def __reduce__(self) -> tuple[Any, ...]:
        return (_install, (self.fn, self.values))


def _install(fn: Any, values: tuple[tuple[Any, str, bytes], ...]) -> Any:
    """In a worker: set the bindings ``values`` names, then return ``fn``."""
    for where, name, pickled in values:
        target = importlib.import_module(where) if isinstance(where, str) else where
        setattr(target, name, pickle.loads(pickled))
    return fn


def sent_with_values(fn: Any) -> Any:
    """``fn`` itself when it reads nothing by name that could differ in a fresh worker; else a :class:`Sent`.

    Args:
        fn: the user's callable, as a process backend is about to send it.

    Returns:
        ``fn``, or ``Sent(fn, values)`` holding the current values, pickled
        now (once per ``map`` or ``submit``; cloudpickle, each value alone,
        so one that cannot be pickled is left out).
    """
    walk = _Walk(shared=False)
    walk.callable(fn)
    values = []
    for key, (holder, name) in walk.bindings.items():
        value = _value(holder, name)
        if key in walk.rebound or value is _MISSING or isinstance(value, types.ModuleType):
            continue
        where = _module_name(holder) if isinstance(holder, dict) else holder
        if where is None:
            continue
        try:
            pickled = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - the worker keeps its own copy
            continue
        values.append((where, name, pickled))
    return Sent(fn, tuple(values)) if values else fn


def _module_name(namespace: dict[str, Any]) -> str | None:
    name = namespace.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or module.__dict__ is not namespace or name == "__main__":
        return None  # a worker's __main__ is not the caller's
    return name
