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

A loky worker imports the user's modules afresh instead, and reads each
value as the module's own code sets it, as a spawned ``ProcessPoolExecutor``
does: sending the caller's values there was tried and undone what the
worker's initializer, its caches and its random generators hold.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import sys
import time
import types
import weakref
from collections.abc import Iterator, Mapping
from dis import get_instructions
from typing import Any, NamedTuple

from . import _fingerprint
from .effects._bytecode import codes
from .effects._tables import IMMUTABLE, user_module
from .inspection import attribute, pickles_by_reference

__all__ = ["Record", "State", "state_of", "fork_record", "MAX_FUNCTIONS"]

#: Most functions followed from one callable; past it nothing is proven current.
MAX_FUNCTIONS = 256

#: Items of a module-level dict, list or tuple followed (functions kept in a table).
MAX_ITEMS = 64

#: Names through which code reaches its own module's names by string.
_REFLECTION = frozenset({"globals", "vars", "__name__", "sys"})

#: What calling a class runs.
_CONSTRUCTION = frozenset({"__new__", "__init__", "__post_init__"})

#: Most bytes of mutable values a proof hashes (~3 ms at 1.4 GB/s); past it a
#: map of the callable forks a fresh pool, as a shared callable's map does.
DIGEST_BYTES = 4 << 20

#: Values whose identity is their whole state: a rebinding is the only change.
_FIXED = (
    *IMMUTABLE,  # the effects reader's: numbers, strings, bytes, None, ranges
    tuple,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    type,
    property,
    staticmethod,
    classmethod,
)

_MISSING = object()


class _Names(NamedTuple):
    """What a code object (and code nested in it) names."""

    loads: frozenset[str]  # module-level names it loads
    attrs: frozenset[str]  # attributes it loads, names it imports, strings it holds
    stores: frozenset[str]  # module-level names it rebinds
    imports: frozenset[str]  # modules it imports


#: By code object (see :func:`_names`).
_NAMES: dict[types.CodeType, _Names] = {}
_NAMES_KEPT = 2048


def _names(code: types.CodeType) -> _Names:
    """What ``code`` names, read once from its bytecode."""
    known = _NAMES.get(code)
    if known is not None:
        return known
    names: set[str] = set()
    attrs: set[str] = set()
    stores: set[str] = set()
    imports: set[str] = set()
    for sub in codes(code):
        for ins in get_instructions(sub):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                names.add(ins.argval)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
                attrs.add(ins.argval)
            elif ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                stores.add(ins.argval)
            elif ins.opname == "IMPORT_NAME":
                imports.add(ins.argval)
            elif ins.opname == "IMPORT_FROM":
                attrs.add(ins.argval)
        # getattr(module, "NAME") and globals()["NAME"]: a name as a string.
        attrs.update(c for c in sub.co_consts if isinstance(c, str) and c.isidentifier())
    if len(_NAMES) >= _NAMES_KEPT:
        _NAMES.clear()
    known = _NAMES[code] = _Names(
        frozenset(names), frozenset(attrs), frozenset(stores), frozenset(imports)
    )
    return known


class _Walk:
    """Follows a callable's code to the bindings it reads by name in a worker."""

    def __init__(self, shared: bool) -> None:
        self.shared = shared  # reaches workers by copy-on-write: nothing is sent by value
        #: (id of namespace, name) -> (namespace, name): a module's dict, or a class.
        self.bindings: dict[tuple[int, str], tuple[Any, str]] = {}
        self.seen: set[int] = set()
        self.rebound: set[tuple[int, str]] = set()  # bindings the code itself rebinds
        self.entered: set[tuple[Any, ...]] = set()
        self.complete = True  # False: over MAX_FUNCTIONS, nothing proven
        self.sent = True  # all that reached this point goes by value (cloudpickle)

    @contextlib.contextmanager
    def within(self, sent: bool) -> Iterator[None]:
        """Walk on with ``sent`` as :attr:`sent`, then restore it."""
        saved, self.sent = self.sent, sent
        try:
            yield
        finally:
            self.sent = saved

    def bind(self, holder: Any, name: str) -> Any:
        self.bindings.setdefault((id(holder), name), (holder, name))
        return _value(holder, name)

    def callable(self, fn: Any) -> None:
        while isinstance(fn, functools.partial):
            for arg in (*fn.args, *fn.keywords.values()):
                if callable(arg):  # pickled by reference: runs on the worker's modules
                    self.callable(arg)
            fn = fn.func
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            self.function(fn.__func__)  # its object travels as it is; its class by name
            owner = fn.__self__ if isinstance(fn.__self__, type) else type(fn.__self__)
            self.enter(owner, _names(fn.__func__.__code__).attrs)
        elif isinstance(fn, (staticmethod, classmethod)):
            self.callable(fn.__func__)
        elif isinstance(fn, types.FunctionType):
            self.function(fn)
            with self.within(self.sent and not pickles_by_reference(fn)):
                inner = attribute(fn, "__wrapped__")  # under a decorator of a package's
                if inner is not None and inner is not fn:
                    self.callable(inner)
                registry = attribute(fn, "registry")  # functools.singledispatch
                if isinstance(registry, Mapping):
                    for impl in itertools.islice(registry.values(), MAX_ITEMS):
                        self.callable(impl)
        elif isinstance(fn, type):  # a class called to make each result
            module = sys.modules.get(fn.__module__)
            if module is not None and pickles_by_reference(fn):
                self.bind(module.__dict__, fn.__qualname__.split(".")[0])
            self.klass(fn, _CONSTRUCTION)
        elif not isinstance(fn, _FIXED):
            # A callable instance: its class's __call__, found as Python finds it.
            call = next(
                (vars(k)["__call__"] for k in type(fn).__mro__ if "__call__" in vars(k)), None
            )
            if isinstance(call, types.FunctionType):
                self.function(call)
            inner = attribute(fn, "__wrapped__")  # a wrapper's (smartexec's own too)
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
        # Sent by value (its globals with it) only when all that reached it was.
        by_reference = self.shared or not self.sent or pickles_by_reference(fn)
        if pickles_by_reference(fn):  # the worker looks it up by name: a rebinding runs other code
            self.bind(module.__dict__, fn.__qualname__.split(".")[0])
        with self.within(not by_reference):
            self.code(fn, module, by_reference)

    def code(self, fn: types.FunctionType, module: types.ModuleType, by_reference: bool) -> None:
        """Follow what ``fn``'s code names: globals, imports, cells, default values."""
        names, attrs, stores, imports = _names(fn.__code__)
        self.rebound.update((id(fn.__globals__), name) for name in stores)
        for imported in sorted(imports):  # an import in its body: the worker's module
            if imported in sys.modules:
                self.enter(sys.modules[imported], attrs)
        if _REFLECTION & names:  # its own module reached as a whole: globals(), __name__
            self.enter(module, attrs)
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
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if by_reference:  # its cells are the worker's copies too
                self.bind(cell, "cell_contents")
            self.enter(contents, attrs)
        defaults = (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())
        if by_reference:  # so are its default argument values
            for name in ("__defaults__", "__kwdefaults__"):
                if getattr(fn, name):
                    self.bind(fn, name)
        for value in defaults:  # a function given as a default (rule=check) runs too
            if callable(value):
                self.enter(value, attrs)

    def enter(self, value: Any, attrs: frozenset[str]) -> None:
        """Follow ``value``, reached by a function loading ``attrs``, to what it names."""
        if (id(value), attrs) in self.entered:
            return
        self.entered.add((id(value), attrs))
        if isinstance(value, types.ModuleType):
            if user_module(value) and not _ours(value.__name__):
                with self.within(False):  # a module is imported by name
                    for attr in sorted(attrs & value.__dict__.keys()):
                        self.enter(self.bind(value.__dict__, attr), attrs)
        elif isinstance(value, type):
            self.klass(value, attrs)
        elif isinstance(value, types.FunctionType) and value.__dict__:
            for attr in sorted(attrs & value.__dict__.keys()):  # a function's own attributes
                self.bind(value.__dict__, attr)
            self.callable(value)
        elif isinstance(value, (dict, list, tuple)):  # functions kept in a table
            items = value.values() if isinstance(value, dict) else value
            for item in itertools.islice(items, MAX_ITEMS):
                if callable(item):
                    self.enter(item, attrs)
        else:
            self.callable(value)
            if not _fixed(value):  # an instance: its class's attributes and methods
                self.klass(type(value), attrs)

    def klass(self, cls: type, attrs: frozenset[str]) -> None:
        """Follow the attributes named ``attrs`` of ``cls`` and its bases (the user's, by name)."""
        if ("class", id(cls), attrs) in self.entered:
            return
        self.entered.add(("class", id(cls), attrs))
        for base in cls.__mro__:
            module = sys.modules.get(base.__module__)
            if module is None or not user_module(module) or _ours(base.__module__):
                continue
            if not pickles_by_reference(base):
                continue
            for attr in sorted(attrs & vars(base).keys()):
                value = self.bind(base, attr)
                if isinstance(value, property):
                    value = value.fget
                with self.within(False):  # a class is imported by name
                    self.callable(value)
                if isinstance(value, types.FunctionType):  # its self.<name> reads
                    self.klass(cls, _names(value.__code__).attrs)


def _ours(module: str) -> bool:
    """Whether ``module`` is smartexec's own (not the user's, wherever it is installed)."""
    return module == "smartexec" or module.startswith("smartexec.")


def _value(holder: Any, name: str) -> Any:
    """``name`` in a module's dict, a class's own namespace, or an attribute of a cell or function."""
    if isinstance(holder, dict):
        return holder.get(name, _MISSING)
    if isinstance(holder, type):
        return vars(holder).get(name, _MISSING)
    try:
        return getattr(holder, name)
    except Exception:  # noqa: BLE001 - an empty cell
        return _MISSING


def _fixed(value: Any, depth: int = 0) -> bool:
    """Whether ``value``'s identity is its whole state (no change in place).

    By ``type()``, which no object can fake (a lazy proxy's ``__class__``
    property may raise). A tuple or frozenset is fixed when its first
    :data:`MAX_ITEMS` items are, two levels down; past that it is taken
    as fixed: reading two million items at each map costs more than the
    change in place of a list inside a long tuple is likely.
    """
    kind = type(value)
    if issubclass(kind, (tuple, frozenset)):
        if depth >= 2 or len(value) > MAX_ITEMS:
            return True
        return all(_fixed(item, depth + 1) for item in value)
    return issubclass(kind, _FIXED)


def _proof(value: Any, depth: int = 0) -> bytes:
    """A digest of ``value``'s pickled state; where it cannot be pickled, of its parts, else its identity.

    A lock, a weak dictionary or a generator cannot be pickled: nothing it
    holds can reach a worker but by the fork itself, and its identity is
    all that can be compared. A dict holding one is proven item by item.
    """
    try:
        return _fingerprint.digest(value)
    except Exception:  # noqa: BLE001 - cannot be pickled
        pass
    if type(value) is dict and depth < 2 and len(value) <= MAX_ITEMS:
        h = hashlib.sha1()
        for key, item in list(value.items()):
            h.update(repr(key).encode() + b"\0" + _proof(item, depth + 1))
        return h.digest()
    return b"id:%d" % id(value)  # its holder keeps it alive: the id is its own


def _size(value: Any, depth: int = 0) -> int:
    """Bytes a digest of ``value`` would read, roughly: a buffer's, a container's length, an object's attributes'."""
    nbytes = attribute(value, "nbytes")
    if type(nbytes) is int:
        return nbytes
    kind = type(value)
    try:
        if issubclass(kind, (bytearray, memoryview)):
            return len(value)
        if issubclass(kind, (dict, list, set)):
            return 64 * len(value)
        if depth == 0:  # an object holding an array, one level down
            space = attribute(value, "__dict__")
            if type(space) is dict:
                return sum(_size(item, 1) for item in itertools.islice(space.values(), MAX_ITEMS))
    except Exception:  # noqa: BLE001 - a __len__ that raises: as big as can be
        return DIGEST_BYTES + 1
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

    A value over :data:`DIGEST_BYTES` that the callable's own code rebinds
    (a cache it fills: ``global _T; if _T is None: _T = build()``) is taken
    for its worker's own: only a rebinding by the caller counts, not a
    change in place.

    Attributes:
        digest_s: seconds the digests of its mutable values took.
        proven: False when it cannot prove a pool current: a value was too
            big to hash in well under a fork's time (:data:`DIGEST_BYTES`),
            or the code was too big or too odd to follow.
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
            big = _size(value) > DIGEST_BYTES
            if _fixed(value) or (key in walk.rebound and (big or not digest)):
                self._by_identity.add(key)  # (a big cache the callable fills: its own)
                continue
            if not digest or big:
                self.proven = False
                continue
            self._digests[key] = _proof(value)
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
    return State(_walked(fn, shared), digest)


def _walked(fn: Any, shared: bool) -> _Walk:
    """The walk from ``fn``; one that met an object that raised is incomplete (proves nothing)."""
    walk = _Walk(shared)
    try:
        walk.callable(fn)
    except Exception:  # noqa: BLE001 - an odd object (a raising __getattr__, a cycle)
        walk.complete = False
    return walk


def fork_record() -> Record:
    """Every module-level and class-level binding of the user's own code whose object is its whole state, now.

    Taken as a fork pool forks, so that a callable first seen after it is
    proven current when all it reads is such a binding (a function, a class,
    a number, a string): a ``submit`` of another function waits for the
    pool's workers instead of forking a second pool beside them. Mutable
    values need a digest, which is taken only for the callables run lately
    (the backend's own record). About a microsecond per 10 bindings.
    """
    record: Record = {}
    for name, module in list(sys.modules.items()):
        try:
            if not isinstance(module, types.ModuleType) or _ours(name) or not user_module(module):
                continue
            _record_module(record, name, module.__dict__)
        except Exception:  # noqa: BLE001 - an odd module: its bindings stay unproven
            continue
    return record


def _record_module(record: Record, name: str, space: dict[str, Any]) -> None:
    for key, value in list(space.items()):
        if not _fixed(value):
            continue
        record[(id(space), key)] = _Seen(value, None)
        if issubclass(type(value), type) and vars(value).get("__module__") == name:
            for attr, member in list(vars(value).items()):
                if _fixed(member):
                    record[(id(value), attr)] = _Seen(member, None)
