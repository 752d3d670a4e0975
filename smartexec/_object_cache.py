"""Big objects sent once: :class:`ObjectCache` and the references requests carry.

An object that pickles to more than :data:`BIG_BUFFER_BYTES` and that a
backend without copy-on-write must send repeatedly (the bound object,
partial or closure of a callable the policy marked ``share``, or the same
argument object in several calls) is pickled once into segments; each request
carries a small :class:`CachedRef`. A worker unpickles a callable's state at
its first use and keeps it, keyed by the parent's entry, so each worker
receives it at most once and its array data stays in shared memory that all
workers map; an argument it unpickles afresh from the segments for each
request, so a task that changes its argument never changes the next task's.
The segments are unlinked when the object dies in the parent, or at
``shutdown``, once no chunk in flight still refers to them; each request
lists the entries still alive and workers drop the others.

**Never stale.** An ``id()`` is not a version: a cached entry is reused only
once :meth:`ObjectCache._unchanged` proves the object still pickles to
exactly the bytes that were sent (pickled again with big buffers out of band,
compared byte for byte with the entry's segments). An argument is checked
once per request; a callable once per ``map`` or ``submit`` (the first
request made with its :class:`CachedCallable`), so all chunks of one map see
the state as it was at its first chunk. Anything different is sent again as
a new entry. A worker's writes to a cached callable's state stay in that
worker for its later tasks, as on fork.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import sys
import threading
import types
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import _fingerprint, _memmap, _shm
from ._identity import WeakCallable, identity_key
from ._remote import Call
from ._wire import (
    _ATOMIC,
    BIG_BUFFER_BYTES,
    _encode,
    _Encoder,
    _is_argument,
    _split,
)

__all__ = ["CachedCallable", "CachedRef", "Lease", "ObjectCache"]


#: Cached objects held strongly (they cannot be weakly referenced: lists,
#: dicts, a ``__slots__`` class without ``__weakref__``), at most; the oldest
#: are let go. A let-go object's segments live while a chunk refers to them.
MAX_STRONG_ENTRIES = 8

#: Cached argument objects per backend, at most (oldest let go first).
MAX_ARGUMENT_ENTRIES = 16

#: An argument object is cached when it comes back within this many calls of
#: its last sighting: ``repeat(big)`` or ``submit(f, big, i)`` in a loop, but
#: not a second pass over a list of distinct big objects, which would keep a
#: shared copy of each alive for as long as the list lives.
RECENT_CALLS = 16

#: Argument identities remembered to notice a repeat.
SEEN_IDS = 4096


class Lease:
    """What one request keeps alive until its chunk is done.

    Holds the request's own segments and the cache entries it refers to.
    Release it once no worker can still need them: when the chunk's future is
    done, whatever the outcome (:meth:`release_when_done`).
    """

    __slots__ = ("segments", "entries", "_released", "__weakref__")

    def __init__(self) -> None:
        self.segments: list[str] = []
        self.entries: list[_Entry] = []
        self._released = False

    def release(self) -> None:
        """Unlink the segments and unpin the entries. Idempotent."""
        if self._released:
            return
        self._released = True
        for name in self.segments:
            _shm.unlink(name)
        for entry in self.entries:
            entry.cache._unpin(entry)
        self.segments = []
        self.entries = []

    def release_when_done(self, future: Future[Any]) -> None:
        """Release when ``future`` is done; sweep dead workers' segments if one died."""

        def done(f: Future[Any]) -> None:
            self.release()
            if not f.cancelled() and isinstance(f.exception(), BrokenProcessPool):
                _shm.sweep_dead_workers()

        future.add_done_callback(done)


#: (owner pid, cache id, key) -> object, in a worker.
_OBJECTS: dict[tuple[int, int, int], Any] = {}

_cache_ids = itertools.count(1)


def _prune(owner: int, cache: int, live: frozenset[int], max_key: int) -> None:
    """Forget, in a worker, the entries its parent has let go."""
    stale = [s for s in _OBJECTS if s[0] == owner and s[1] == cache and s[2] <= max_key]
    for slot in stale:
        if slot[2] not in live:
            del _OBJECTS[slot]


def _load_entry(stream: tuple[str, int], buffers: list[tuple[str, int]]) -> Any:
    view = _shm.attach(*stream, private=True)
    try:
        maps = [_shm.attach(name, nbytes, private=True) for name, nbytes in buffers]
        return pickle.loads(view, buffers=maps)
    finally:
        _release_views([view])


def _resolve(
    owner: int,
    cache: int,
    key: int,
    reuse: bool,
    stream: tuple[str, int],
    buffers: list[tuple[str, int]],
) -> Any:
    """Return the cached object (runs in the worker, when a request is unpickled)."""
    slot = (owner, cache, key)
    if reuse:
        found = _OBJECTS.get(slot, _OBJECTS)
        if found is not _OBJECTS:
            return found
    obj = _load_entry(stream, buffers)
    if reuse:
        _OBJECTS[slot] = obj
    return obj


class CachedRef:
    """What a request carries instead of a cached object: names, a few hundred bytes.

    Attributes:
        key: the entry's number in its cache.
        name: what the object is, for messages.
    """

    __slots__ = ("owner", "cache", "key", "reuse", "stream", "buffers", "name")

    def __init__(
        self,
        owner: int,
        cache: int,
        key: int,
        reuse: bool,
        stream: tuple[str, int],
        buffers: list[tuple[str, int]],
        name: str,
    ):
        self.owner = owner
        self.cache = cache
        self.key = key
        self.reuse = reuse
        self.stream = stream
        self.buffers = buffers
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return _resolve, (self.owner, self.cache, self.key, self.reuse, self.stream, self.buffers)

    def __repr__(self) -> str:
        return f"CachedRef({self.key}, {self.name!r})"


class CachedCallable:
    """What a backend's ``prepare`` returns for a callable to send once per worker.

    :func:`smartexec.transport.dumps_request` replaces it by its cache's :class:`CachedRef`.
    ``prepare`` makes one per ``map`` and per ``submit``: the first request
    made with it proves the cached copy unchanged (or sends the state
    again), and the later requests of that ``map`` use the same copy, so a
    map's chunks all see the state as it was at its first chunk.

    Attributes:
        fn: the user's callable.
    """

    __slots__ = ("fn", "entry")

    def __init__(self, fn: Any):
        self.fn = fn
        self.entry: _Entry | None = None  # set by the first request


class _Entry:
    __slots__ = (
        "cache",
        "key",
        "handle",
        "ref",
        "segments",
        "pins",
        "retired",
        "pickle_len",
        "views",
    )

    def __init__(
        self, cache: ObjectCache, key: int, handle: WeakCallable, ref: CachedRef, pickle_len: int
    ):
        self.cache = cache
        self.key = key
        self.handle = handle
        self.ref = ref
        self.segments = [ref.stream[0], *(name for name, _ in ref.buffers)]
        self.pins = 0
        self.retired = False
        #: Bytes of the pickle stream at the start of the stream segment
        #: (what follows is the wire format's header).
        self.pickle_len = pickle_len
        #: Read-only maps of what was sent (stream, then buffers), made by the
        #: first proof and kept until the segments are freed: mapping 20 MiB
        #: afresh at each proof cost its page faults again (~2 of its ~3 ms).
        self.views: list[memoryview] | None = None

    def sent_views(self) -> list[memoryview]:
        """Maps of the segments' bytes as sent, stream first; attached once, then kept.

        Raises:
            OSError, ValueError: a segment is gone (see :func:`smartexec._shm.attach`).
        """
        if self.views is None:
            views: list[memoryview] = []
            try:
                for name, nbytes in [(self.ref.stream[0], self.pickle_len), *self.ref.buffers]:
                    if nbytes:
                        views.append(_shm.attach(name, nbytes, private=True))
                    else:
                        views.append(memoryview(b""))
            except BaseException:
                _release_views(views)
                raise
            self.views = views
        return self.views

    def release_views(self) -> None:
        """Unmap what :meth:`sent_views` mapped."""
        views, self.views = self.views, None
        if views is not None:
            _release_views(views)


def _release_views(views: list[memoryview]) -> None:
    """Release each view and close the mapping under it (one :func:`smartexec._shm.attach` made)."""
    for view in views:
        mapping = view.obj
        view.release()
        close = getattr(mapping, "close", None)
        if close is not None:
            close()


def _describe(obj: Any) -> str:
    from .inspection import callable_name

    return callable_name(obj) if callable(obj) else type(obj).__qualname__


class ObjectCache:
    """Big objects a process backend sends once to each of its workers.

    Thread-safe. One per backend instance, closed by its ``shutdown``.

    Args:
        threshold_bytes: an argument object that pickles to more than this
            many bytes, seen in two calls, is cached (int, bytes).
    """

    def __init__(self, threshold_bytes: int = BIG_BUFFER_BYTES):
        self.threshold_bytes = threshold_bytes
        self.id = next(_cache_ids)
        self._owner = os.getpid()
        self._lock = threading.RLock()  # weakref callbacks may run while it is held
        self._entries: collections.OrderedDict[Hashable, _Entry] = collections.OrderedDict()
        self._live: dict[int, _Entry] = {}  # key -> entry whose segments exist
        #: id -> call number of its last sighting, or -1 when known to be small
        self._seen: dict[int, int] = {}
        self._argument_ids: dict[int, _Entry] = {}  # id -> entry of a cached argument
        self._calls = 0
        self._keys = itertools.count(1)
        self._max_key = 0
        self._closed = False

    # -- what requests use -----------------------------------------------------

    def callable_ref(self, fn: Any, lease: Lease) -> Any:
        """What a request carries for callable ``fn``: a reference to a copy proven current.

        A bound method is cached as its ``__self__`` (every method of one
        object shares the entry); the request carries the function by
        reference and the object by :class:`CachedRef`.

        A cached copy is reused only when :meth:`_unchanged` proves the
        object has not changed since it was sent; otherwise its state is
        sent again. With a :class:`CachedCallable` (one per ``map`` or
        ``submit``), that proof is made at its first request; its later
        requests (the map's other chunks) use the same copy.

        Args:
            fn: the callable, or a :class:`CachedCallable` holding it.
            lease: the request's lease, which pins the entry.

        Raises:
            Exception: whatever pickling ``fn`` raises.
        """
        memo = fn if isinstance(fn, CachedCallable) else None
        if memo is not None:
            fn = memo.fn
        owner = _bound_owner(fn)
        with self._lock:
            entry = memo.entry if memo is not None else None
            if entry is not None and not entry.retired:
                self._pin(entry, lease)
            else:
                if owner is None:
                    entry = self._ref(fn, identity_key(fn), True, lease)
                else:
                    entry = self._ref(owner, ("s", id(owner)), True, lease)
                if memo is not None:
                    memo.entry = entry
        if owner is not None:
            return _BoundRef(fn.__func__, entry.ref)
        return entry.ref

    def substitute(self, calls: Sequence[Call], lease: Lease) -> Sequence[Call]:
        """Return ``calls`` with each cached (or now cacheable) argument replaced by its ref.

        Only arguments that may be big (:func:`_may_be_big`) are looked at.
        A long chunk is scanned in full only when its first
        :data:`SHORT_CHUNK` calls hold such an argument or this cache holds
        arguments already: a map of small items pays a few microseconds per
        chunk, not per item. Missing a repeat only costs sending it again.
        """
        n = len(calls)
        base = self._calls
        self._calls += n
        np = sys.modules.get("numpy")
        found = self._candidates(calls[:SHORT_CHUNK], 0, np)
        if n > SHORT_CHUNK and (found or self._argument_ids):
            found += self._candidates(calls[SHORT_CHUNK:], SHORT_CHUNK, np)
        if not found:
            return calls
        # An object passed twice within this chunk is a repeat from its first call on.
        counts = collections.Counter(id(obj) for _, _, obj in found)
        # One decision (and one proof of a cached copy) per object per request.
        decided: dict[int, Any] = {}
        out = list(calls)
        for index, position, obj in found:
            ref = decided.get(id(obj), decided)
            if ref is decided:
                ref = decided[id(obj)] = self._argument(
                    obj, lease, base + index, counts[id(obj)] > 1
                )
            if ref is obj:
                continue
            args, kwargs = out[index]
            if isinstance(position, int):
                args = (*args[:position], ref, *args[position + 1 :])
            else:
                kwargs = {**kwargs, position: ref}
            out[index] = (args, kwargs)
        return out

    def _candidates(self, calls: Sequence[Call], start: int, np: Any) -> list[tuple[int, Any, Any]]:
        """``(call index, position or keyword, object)`` of each argument that may be big."""
        threshold = self.threshold_bytes
        atomic = _ATOMIC
        found: list[tuple[int, Any, Any]] = []
        for index, (args, kwargs) in enumerate(calls, start):
            for position, arg in enumerate(args):
                if type(arg) not in atomic and _may_be_big(arg, threshold, np):
                    found.append((index, position, arg))
            if kwargs:
                for key, arg in kwargs.items():
                    if type(arg) not in atomic and _may_be_big(arg, threshold, np):
                        found.append((index, key, arg))
        return found

    def prune_info(self) -> tuple[int, int, frozenset[int], int] | None:
        """What workers need to drop let-go entries, or None if nothing was ever cached."""
        with self._lock:
            if not self._max_key:
                return None
            return (self._owner, self.id, frozenset(self._live), self._max_key)

    def refresh(self, fn: Any) -> bool:
        """Let go of callable ``fn``'s entry: its next chunk sends its current state.

        Returns:
            True when ``fn`` was cached.
        """
        owner = _bound_owner(fn)
        target, ident = (fn, identity_key(fn)) if owner is None else (owner, ("s", id(owner)))
        with self._lock:
            entry = self._entries.get(ident)
            if entry is None or not entry.handle.matches(target):
                return False
            self._retire(entry)
            return True

    def close(self) -> None:
        """Let go of every entry (segments still used by a chunk in flight wait for it)."""
        with self._lock:
            self._closed = True
            for entry in list(self._entries.values()):
                self._retire(entry)
            self._seen.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- internals ---------------------------------------------------------------

    def _argument(self, obj: Any, lease: Lease, call: int, repeated: bool) -> Any:
        """The ref for argument ``obj`` of call number ``call``, or ``obj`` itself.

        A cached copy is reused only once proven unchanged (:meth:`_unchanged`),
        else sent again. Workers never keep an argument across requests: each
        request unpickles a fresh copy from the segments (a task that changes
        its argument must not change the next task's), as a pickled argument
        would be.
        """
        ident = ("a", id(obj))
        entry = self._entries.get(ident)
        if entry is not None and entry.handle.matches(obj):
            with self._lock:
                if not self._closed:
                    return self._ref(obj, ident, False, lease).ref
        seen = self._seen
        last = seen.get(id(obj))
        if last is not None and last < 0:  # known to be small
            return obj
        if not repeated and (last is None or call - last > RECENT_CALLS):
            # First (recent) sighting: remember the identity only. An id reused
            # by a new object at worst caches that one. No lock: a race only
            # blurs this heuristic.
            if len(seen) >= SEEN_IDS:
                seen.clear()
            seen[id(obj)] = call
            return obj
        if not self._is_big(obj):
            seen[id(obj)] = -1
            return obj
        with self._lock:
            if self._closed:
                return obj
            return self._ref(obj, ident, False, lease).ref

    def _is_big(self, obj: Any) -> bool:
        np = sys.modules.get("numpy")
        if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject:
            return bool(obj.nbytes > self.threshold_bytes)
        from .inspection import payload_size

        size = payload_size(obj, cap_bytes=self.threshold_bytes)
        return size.error is None and (size.capped or size.nbytes > self.threshold_bytes)

    def _ref(self, obj: Any, ident: Hashable, reuse: bool, lease: Lease) -> _Entry:
        """The entry for ``obj``, pinned by ``lease``: the cached one if proven current, else new."""
        with self._lock:
            entry = self._entries.get(ident)
            if entry is None or not entry.handle.matches(obj) or not self._unchanged(entry, obj):
                if entry is not None:
                    self._retire(entry)
                entry = self._new_entry(obj, ident, reuse)
            else:
                self._entries.move_to_end(ident)
            self._pin(entry, lease)
            return entry

    def _unchanged(self, entry: _Entry, obj: Any) -> bool:
        """Prove that ``obj`` still pickles to exactly what ``entry`` sent.

        An exact proof, not a digest: ``obj`` is pickled again with its big
        buffers out of band (not copied), and the stream and each buffer are
        compared byte for byte with the entry's segments, which hold what the
        workers read. Costs one pickling of the in-band state plus reading
        both copies of the buffers (~3 GB/s), against a copy into shared
        memory (~1 GB/s with page faults) and an unpickling in each worker to
        send it again. The segments stay mapped here from the first proof on
        (:meth:`_Entry.sent_views`), so later proofs fault no pages in. Any
        doubt (pickling fails or differs, a segment is gone) answers False:
        the state is sent again.
        """
        try:
            stream, buffers = _fingerprint.split(obj, BIG_BUFFER_BYTES)
        except Exception:
            return False
        if len(stream) != entry.pickle_len or [b.nbytes for b in buffers] != [
            nbytes for _, nbytes in entry.ref.buffers
        ]:
            return False
        try:
            views = entry.sent_views()
        except (OSError, ValueError):
            return False
        for view, mine in zip(views, [memoryview(stream), *buffers]):
            if view.nbytes and not _fingerprint.same_bytes(view, mine):
                return False
        return True

    def _new_entry(self, obj: Any, ident: Hashable, reuse: bool) -> _Entry:
        encoder = _Encoder(owner=None)
        stream = _encode(obj, encoder)
        try:
            name = _shm.create(memoryview(stream))
        except BaseException:
            encoder.abort()
            raise
        key = next(self._keys)
        self._max_key = key
        ref = CachedRef(
            self._owner,
            self.id,
            key,
            reuse,
            (name, len(stream)),
            list(encoder.segments),
            _describe(obj),
        )
        cache = self  # the callback holds the cache, never the object

        def on_death() -> None:
            cache._forget(ident, key)

        entry = _Entry(self, key, WeakCallable(obj, on_death), ref, len(_split(stream)[0]))
        self._entries[ident] = entry
        if _is_argument(ident):
            self._argument_ids[id(obj)] = entry
        self._live[key] = entry
        self._bound()
        return entry

    def _bound(self) -> None:
        strong = [e for e in self._entries.values() if not e.handle.weak]
        for entry in strong[: max(0, len(strong) - MAX_STRONG_ENTRIES)]:
            self._retire(entry)
        arguments = [e for k, e in self._entries.items() if _is_argument(k)]
        for entry in arguments[: max(0, len(arguments) - MAX_ARGUMENT_ENTRIES)]:
            self._retire(entry)

    def _forget(self, ident: Hashable, key: int) -> None:
        with self._lock:
            entry = self._entries.get(ident)
            if entry is not None and entry.key == key:
                self._retire(entry)

    def _retire(self, entry: _Entry) -> None:
        for ident, current in list(self._entries.items()):
            if current is entry:
                del self._entries[ident]
                if _is_argument(ident):
                    self._argument_ids.pop(ident[1], None)  # type: ignore[index]
        entry.retired = True
        if entry.pins == 0:
            self._free(entry)

    def _pin(self, entry: _Entry, lease: Lease) -> None:
        entry.pins += 1
        lease.entries.append(entry)

    def _unpin(self, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.retired and entry.pins == 0:
                self._free(entry)

    def _free(self, entry: _Entry) -> None:
        entry.release_views()
        if self._live.pop(entry.key, None) is None:
            return
        for name in entry.segments:
            _shm.unlink(name)


#: Calls of a chunk always scanned for arguments worth caching.
SHORT_CHUNK = 16

#: A container with fewer items than this is not worth caching by itself (its
#: big arrays, if any, still go through shared memory with each chunk).
MIN_CONTAINER_ITEMS = 1024

_CONTAINERS = frozenset({tuple, list, dict, set, frozenset})

#: A container up to this long is looked into by :func:`_may_be_big`.
_SHORT_CONTAINER = 64


def _may_be_big(obj: Any, threshold: int, np: Any, depth: int = 2) -> bool:
    """A cheap guess: could ``obj`` pickle to ``threshold`` bytes or more?

    Exact for strings, bytes and numpy arrays (a memmap of a file is small:
    it is sent by reference); a container is big when it has
    many items or, looking ``depth`` levels into a short one, holds something
    that may be big (``{"rows": big_list}``); any other object may be.
    """
    kind = type(obj)
    if kind is str or kind is bytes or kind is bytearray:
        return len(obj) >= threshold
    if kind in _CONTAINERS:
        if len(obj) >= MIN_CONTAINER_ITEMS:
            return True
        if depth <= 0 or len(obj) > _SHORT_CONTAINER:
            return False
        items = obj.values() if kind is dict else obj
        return any(
            type(item) not in _ATOMIC and _may_be_big(item, threshold, np, depth - 1)
            for item in items
        )
    if np is not None:
        if kind is np.ndarray:
            return bool(obj.nbytes >= threshold)
        if isinstance(obj, np.generic):
            return False
        if isinstance(obj, np.memmap) and _memmap.reduce(obj) is not None:
            return False  # sent as a reference to its file: a few hundred bytes
    return True


def _bound_owner(fn: Any) -> Any:
    """The instance a Python method is bound to, or None (classmethods, functions)."""
    if isinstance(fn, types.MethodType) and not isinstance(fn.__self__, type):
        return fn.__self__
    return None


def _bind(func: Any, obj: Any) -> Any:
    return types.MethodType(func, obj)


class _BoundRef:
    """A bound method whose instance travels as a :class:`CachedRef`."""

    __slots__ = ("func", "ref")

    def __init__(self, func: Any, ref: CachedRef):
        self.func = func
        self.ref = ref

    def __reduce__(self) -> tuple[Any, ...]:
        return _bind, (self.func, self.ref)
