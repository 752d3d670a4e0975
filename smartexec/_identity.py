"""Identity of callables across calls, without keeping them alive.

``obj.method`` builds a new bound-method object at every attribute access, so
caches key a callable by what it is made of (``__self__`` and ``__func__``)
and hold it through weak references, so that a cache never keeps a user's
object alive (CPython's executor tests check exactly that).
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

__all__ = ["identity_key", "WeakCallable", "WeakRecords"]


def identity_key(fn: Any) -> Hashable:
    """Return a key equal for the same callable seen twice.

    Bound methods compare by ``(id(__self__), id(__func__))``; builtin methods
    bound to an object by ``(id(__self__), __name__)``, each a tuple;
    anything else by ``id(fn)``, a bare int, so that a hot path can look a
    plain function up by ``id(fn)`` without calling this (submit's
    shortcut). Pair the key with a :class:`WeakCallable` to detect reuse of
    an id after the object died.
    """
    if type(fn) is types.FunctionType:
        return id(fn)  # the common case first
    if isinstance(fn, types.MethodType):
        return ("m", id(fn.__self__), id(fn.__func__))
    if isinstance(fn, types.BuiltinMethodType):
        owner = fn.__self__
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            return ("b", id(owner), fn.__name__)
    return id(fn)


def _once(on_death: Callable[[], object]) -> Callable[[Any], None]:
    """A weak-reference callback that calls ``on_death()`` the first time either reference dies."""
    fired: list[None] = []

    def callback(_ref: Any) -> None:
        if not fired:
            fired.append(None)
            on_death()

    return callback


def _bound(func: Any, owner: Any) -> Any:
    """``func`` bound to ``owner`` again, or None when either has died."""
    if func is None or owner is None:
        return None
    return types.MethodType(func, owner)


class WeakCallable:
    """A weak handle to a callable that rebuilds bound methods on demand.

    Args:
        fn: the callable.
        on_death: called with no arguments when the object dies (not called
            for objects that cannot be weakly referenced, which are held
            strongly instead: lists, dicts, methods bound to them or to an
            instance of a ``__slots__`` class without ``__weakref__``).

    Attributes:
        weak: False when ``fn`` could not be weakly referenced and is held
            strongly.
        ref: ``ref()`` is what :meth:`get` returns (a weak reference itself
            for a plain function: ``handle.ref() is fn`` is the cheapest
            check that the handle still refers to that function).
    """

    __slots__ = ("ref", "weak", "__weakref__")

    def __init__(self, fn: Any, on_death: Callable[[], object] | None = None):
        callback = _once(on_death) if on_death is not None else None
        self.weak = True
        if isinstance(fn, types.MethodType):
            # Not weakref.WeakMethod: its callbacks reach the WeakMethod
            # through a weak reference of their own, and at exit, when the
            # function dies after its WeakMethod, CPython printed "Exception
            # ignored in: <function WeakMethod.__new__.<locals>._cb>" for
            # every script that had mapped a big object's method.
            owner, func = fn.__self__, fn.__func__
            try:
                owner_ref = weakref.ref(owner, callback)
            except TypeError:
                # Bound to an object without a weak-reference slot (a
                # ``__slots__`` class that does not list ``__weakref__``).
                self.weak = False
                self.ref: Callable[[], Any] = lambda: fn
                return
            try:
                func_ref: Callable[[], Any] = weakref.ref(func, callback)
            except TypeError:  # a callable object bound as a method: kept
                func_ref = lambda: func  # noqa: E731
            self.ref = lambda: _bound(func_ref(), owner_ref())
            return
        if isinstance(fn, types.BuiltinMethodType):
            owner, name = fn.__self__, fn.__name__
            if owner is not None and not isinstance(owner, (types.ModuleType, type)):
                try:
                    owner_ref = weakref.ref(owner, callback)
                except TypeError:
                    # A list's or dict's method: the bound-method object is a
                    # temporary, so a weak reference to it would die at once.
                    self.weak = False
                    self.ref = lambda: fn
                    return
                else:
                    self.ref = lambda: None if (o := owner_ref()) is None else getattr(o, name)
                    return
        try:
            self.ref = weakref.ref(fn, callback)
        except TypeError:
            self.weak = False
            self.ref = lambda: fn

    def get(self) -> Any:
        """Return the callable, or None when it has died."""
        return self.ref()

    def matches(self, fn: Any) -> bool:
        """Return True when this handle still refers to ``fn``."""
        live = self.ref()
        if live is fn:
            return True  # the same object: no method to compare (submit's hot path)
        if live is None:
            return False
        if isinstance(fn, (types.MethodType, types.BuiltinMethodType)) and hasattr(fn, "__self__"):
            return live.__self__ is fn.__self__ and live == fn
        return live is fn


class _Record(Protocol):
    handle: WeakCallable


R = TypeVar("R", bound=_Record)


class WeakRecords(dict[Hashable, R]):
    """What is known of each callable, by :func:`identity_key`: one record each, behind its own weak handle.

    A record (any object with a ``handle`` attribute, set by :meth:`keep`)
    goes when its callable dies, and a callable that cannot be weakly
    referenced gets none: a cache must never keep a user's object alive.
    It is a plain dict besides (look-ups by key, ``clear``, iteration):
    single dict calls are atomic; a caller that reads and then writes holds
    its own lock. The weak-reference callback takes no lock (it may run in
    the garbage collector while a thread holds one).
    """

    def find(self, fn: Any, key: Hashable | None = None) -> R | None:
        """``fn``'s record, or None (none kept, or the key's callable died and its id came back).

        ``key``: ``identity_key(fn)``, when the caller has it already.
        """
        record = self.get(identity_key(fn) if key is None else key)
        if record is None or not record.handle.matches(fn):
            return None
        return record

    def keep(self, fn: Any, record: R, key: Hashable | None = None) -> bool:
        """Keep ``record`` as ``fn``'s while ``fn`` lives; False (nothing kept) when it cannot be weakly referenced."""
        key = identity_key(fn) if key is None else key

        def forget() -> None:  # not another callable's record under a reused id
            if self.get(key) is record:
                self.pop(key, None)

        record.handle = WeakCallable(fn, forget)
        if not record.handle.weak:
            return False
        self[key] = record
        return True
