"""How chunks and results cross a process boundary: big buffers by shared memory, big objects once.

Process backends (fork, loky) send a chunk with :func:`dumps_request` and the
worker reads it with :func:`loads_request`; the worker answers with
:func:`dumps_reply`, read in the parent by :func:`loads_reply`. Underneath is
cloudpickle at pickle protocol 5, plus two things:

**Big buffers out of band.** Protocol 5 (PEP 574) lets an object hand its
memory to the pickler as a :class:`pickle.PickleBuffer` instead of bytes in
the stream; numpy arrays do so when they are C- or Fortran-contiguous and not
of object dtype. Each such buffer of :data:`BIG_BUFFER_BYTES` or more is
copied once into a shared-memory segment (:mod:`smartexec._shm`) and only the
segment's name crosses the pipe; the receiver maps the segment and hands it to
``pickle.loads(..., buffers=...)``, which rebuilds the array on that memory.
The bytes are never pickled and never copied through a pipe. Smaller buffers
stay in the stream, where copying is cheaper than a segment.

What a worker may do with an array it received: **anything it could do with
a pickled copy.** It is writable exactly when the caller's array was, and
the segment is mapped copy-on-write, so a write copies only the page it
touches and stays private to that task: the caller and other tasks never see
it (to send changes back, return the array). Contrast joblib, whose workers
get read-only memmaps and fail with "assignment destination is read-only".
Results come back the same way and arrive in the parent as ordinary writable
arrays on a segment that is already unlinked: memory is freed when the array
dies. When ``/dev/shm`` is full, a buffer goes through the pipe as before;
so does a fork worker's result where only named segments could hold it (see
:func:`serve_request`).

**Big objects sent once** (:class:`ObjectCache`, one per process backend).
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

Who unlinks what, so that nothing is left in ``/dev/shm``: a request's
segments belong to its :class:`Lease`, released when the chunk's future is
done (result, error, cancellation or dead worker); a reply's segments are
unlinked by the parent as soon as it has mapped them; see :mod:`smartexec._shm`
for worker deaths and interpreter exit.

Wire format: the pickle stream, then, only when segments or cache entries are
involved, a small pickled header, its length (8 bytes) and a 4-byte marker.
A pickle stream always ends with the STOP opcode ``b"."``, so the marker
cannot be mistaken for one.
"""

from __future__ import annotations

import collections
import errno
import io
import itertools
import os
import pickle
import struct
import sys
import threading
import time
import types
import warnings
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import cloudpickle

from . import _fingerprint, _memmap, _remote, _shm
from ._identity import WeakCallable, identity_key
from ._remote import (
    PROTOCOL,
    Call,
    ChunkResult,
    OwnCalls,
    _Pickler,
    own_arguments,
    pack_calls,
    remote_exception,
    run_chunk,
    separate_outcomes,
    unpack_calls,
)
from ._system import WORKER_ENV

__all__ = [
    "BIG_BUFFER_BYTES",
    "CachedCallable",
    "CachedRef",
    "Lease",
    "ObjectCache",
    "dumps_request",
    "loads_request",
    "dumps_reply",
    "loads_reply",
    "discard_reply",
    "sweep_dead_workers",
    "serve_request",
    "estimate_send_s",
    "send_parts",
]

#: Buffers of this many bytes or more travel through shared memory, and
#: objects pickling to more are sent once per worker. Below it, a pipe copy
#: costs less than making, mapping and unlinking a segment (about 30-60 us).
#: Source: joblib's default ``max_nbytes="1M"`` for its memmaps, and
#: benchmarks/bench_payloads.py (2-core machine, 2026-12).
BIG_BUFFER_BYTES = 1 << 20

#: Seconds per byte to put a buffer into a segment (os.write into tmpfs,
#: pages allocated as it goes), for the inline verdict's cost model.
#: Source: benchmarks/bench_payloads.py, 16 MiB arrays (2-core machine, 2026-12).
SHM_WRITE_S_PER_BYTE = 1 / 3.0e9

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

_MAGIC = b"SMX\x05"
_LENGTH = struct.Struct("<Q")
_TAIL = _LENGTH.size + len(_MAGIC)

#: Argument types never worth caching: small and cheap to pickle.
_ATOMIC = frozenset({int, float, complex, bool, type(None), range, slice})


# -- buffers through shared memory -------------------------------------------


_full_warned = False


def _warn_full(exc: OSError) -> None:
    global _full_warned
    if not _full_warned:
        _full_warned = True
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            advice = (
                f"This process may open {_open_files_limit()} files (ulimit -n): raise it, "
                f"e.g. ulimit -n 4096, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)"
            )
        else:
            advice = (
                f"If {_shm.SHM_DIR} is small (Docker gives 64 MiB), enlarge it, e.g. "
                f"docker run --shm-size=2g"
            )
        warnings.warn(
            f"smartexec could not put a big buffer in shared memory ({exc}); sending it "
            f"through the pipe instead. {advice}",
            ResourceWarning,
            stacklevel=4,
        )


def _open_files_limit() -> str:
    """This process's soft ``RLIMIT_NOFILE``, as text ("?" where unknown)."""
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return "?"


class _Encoder:
    """The pickler's ``buffer_callback``: big buffers go to new segments.

    Args:
        owner: as for :func:`smartexec._shm.create`.
        threshold: buffers of this many bytes or more go out of band.
        named_ok: False keeps big buffers in band where only a named segment
            could hold them (a fork worker's replies, see :func:`serve_request`).
    """

    __slots__ = ("owner", "threshold", "segments", "named_ok")

    def __init__(
        self, owner: int | None, threshold: int = BIG_BUFFER_BYTES, *, named_ok: bool = True
    ):
        self.owner = owner
        self.threshold = threshold
        self.named_ok = named_ok
        self.segments: list[tuple[str, int]] = []

    def offer(self, buffer: pickle.PickleBuffer) -> bool:
        """Return False (out of band) for a buffer put in a segment, else True."""
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        if raw.nbytes < self.threshold or not _shm.available():
            return True
        if not self.named_ok and not _shm.anonymous():
            return True
        try:
            name = _shm.create(raw, owner=self.owner, named=self.named_ok)
        except OSError as exc:
            _warn_full(exc)
            return True
        self.segments.append((name, raw.nbytes))
        return False

    def abort(self) -> None:
        for name, _ in self.segments:
            _shm.unlink(name)
        self.segments = []


def _encode(obj: Any, encoder: _Encoder, prune: Any = None, named: bool = False) -> bytes:
    """Pickle ``obj``, big buffers through ``encoder``; then the header, if any.

    The header lists the segments, ``prune`` (a request's cache entries still
    alive) and ``named`` (the sender uses named segments only, and so must
    its workers: :func:`smartexec._shm.use_named`).
    """
    out = io.BytesIO()
    try:
        _Pickler(out, protocol=PROTOCOL, buffer_callback=encoder.offer).dump(obj)
    except BaseException:
        encoder.abort()
        raise
    if encoder.segments or prune is not None or named:
        header = pickle.dumps((encoder.segments, prune, named), protocol=PROTOCOL)
        out.write(header)
        out.write(_LENGTH.pack(len(header)))
        out.write(_MAGIC)
    return out.getvalue()


def _is_argument(ident: Hashable) -> bool:
    """Whether a cache key names an argument (``("a", id)``), not a callable.

    A callable's key is :func:`~smartexec._identity.identity_key`'s: a tuple
    for a bound method, a bare int for anything else.
    """
    return type(ident) is tuple and ident[0] == "a"


def _split(data: bytes) -> tuple[memoryview, list[tuple[str, int]], Any, bool]:
    """``(pickle stream, segments, prune, named)`` of what :func:`_encode` made."""
    view = memoryview(data)
    if len(view) <= _TAIL or view[-len(_MAGIC) :] != _MAGIC:
        return view, [], None, False
    (length,) = _LENGTH.unpack(view[-_TAIL : -len(_MAGIC)])
    end = len(view) - _TAIL - length
    segments, prune, named = pickle.loads(view[end:-_TAIL])
    return view[:end], segments, prune, named


def _decode(data: bytes, *, private: bool, adopt: bool) -> Any:
    """Unpickle what :func:`_encode` made, mapping its segments.

    With ``adopt`` (a reply), each segment is let go of once mapped, and
    one that was not (the mapping failed) is discarded: its maker may free it.
    """
    stream, segments, prune, named = _split(data)
    if named:
        _shm.use_named()
    if not segments and prune is None:
        return cloudpickle.loads(stream)
    buffers: list[memoryview] = []
    try:
        if prune is not None:
            _prune(*prune)
        for name, nbytes in segments:
            buffers.append(_shm.attach(name, nbytes, private=private))
        return pickle.loads(stream, buffers=buffers)
    finally:
        if adopt:
            for index, (name, nbytes) in enumerate(segments):
                if index < len(buffers):
                    _shm.unlink(name)
                else:
                    _discard(name, nbytes)


def _discard(name: str, nbytes: int) -> None:
    try:
        _shm.discard(name, nbytes)
    except OSError:
        pass


# -- requests and replies ------------------------------------------------------


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


def dumps_request(
    fn: Any,
    chunk: Sequence[Call],
    budget_s: float | None,
    *,
    cache: ObjectCache | None = None,
) -> tuple[bytes, Lease]:
    """Pickle a chunk for a worker: big buffers to shared memory, big objects by reference.

    Args:
        fn: the callable, or a :class:`CachedCallable` to send once per worker
            through ``cache``.
        chunk: the ``(args, kwargs)`` calls.
        budget_s: passed through to :func:`smartexec._remote.run_chunk`.
        cache: the backend's :class:`ObjectCache`, or None to cache nothing.

    Returns:
        ``(data, lease)``: the bytes for the worker, which
        :func:`loads_request` turns into ``(fn, calls, budget_s)``, and the
        :class:`Lease` to release once the chunk is done.

    Raises:
        Exception: whatever pickling ``fn`` or an argument raised (nothing is
            left in shared memory).
    """
    lease = Lease()
    try:
        prune = None
        calls: Sequence[Call] = chunk
        if cache is not None:
            if isinstance(fn, CachedCallable):
                fn = cache.callable_ref(fn, lease)
            calls = cache.substitute(chunk, lease)
            if isinstance(chunk, OwnCalls) and not isinstance(calls, OwnCalls):
                calls = OwnCalls(calls)  # (substitute copies it)
            prune = cache.prune_info()
        elif isinstance(fn, CachedCallable):
            fn = fn.fn
        encoder = _Encoder(owner=None)
        data = _encode((fn, pack_calls(calls), budget_s), encoder, prune, _shm.denied())
        lease.segments.extend(name for name, _ in encoder.segments)
    except BaseException:
        lease.release()
        raise
    return data, lease


def loads_request(data: bytes) -> Any:
    """Unpickle a request in the worker; arrays map their segments copy-on-write.

    Returns ``(fn, calls, budget_s)``, the calls as ``(args, kwargs)`` pairs
    (they travel packed, :class:`~smartexec._remote.PackedCalls`).
    """
    fn, calls, budget_s = _decode(data, private=True, adopt=False)
    return fn, unpack_calls(calls), budget_s


def dumps_reply(reply: Any, owner: int | None = None, *, named_ok: bool = True) -> bytes:
    """Pickle a worker's reply for its parent; big buffers go to new segments.

    Args:
        reply: what to send.
        owner: the pid the segments are made for (default: the parent,
            ``os.getppid()``; a fork worker's parent is its pool's zygote,
            so the fork backend passes the executor's pid), which unlinks
            them in :func:`loads_reply`.
        named_ok: False sends big buffers in band where anonymous memory
            cannot be used, rather than in named segments.

    Returns:
        The bytes for :func:`loads_reply`.
    """
    encoder = _Encoder(owner=os.getppid() if owner is None else owner, named_ok=named_ok)
    return _encode(reply, encoder)


def loads_reply(data: bytes) -> Any:
    """Unpickle a reply in the parent; its segments are mapped, then unlinked.

    A worker that could not open this process's memory (its request failed
    with :class:`~smartexec._shm.PeerAccessError`) switches this process to
    named segments (:func:`smartexec._shm.use_named`): only that call failed.
    """
    reply = _decode(data, private=False, adopt=True)
    if type(reply) is tuple and reply[:1] == ("error",) and len(reply) == 2:
        if _caused_by(reply[1], _shm.PeerAccessError):
            _shm.use_named()
    return reply


def _caused_by(exc: Any, kind: type[BaseException]) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a ``kind``."""
    for _ in range(4):
        if isinstance(exc, kind):
            return True
        if not isinstance(exc, BaseException):
            return False
        exc = exc.__cause__ or exc.__context__
    return False


def sweep_dead_workers() -> None:
    """Unlink the named reply segments of this process's dead workers (see :mod:`smartexec._shm`)."""
    _shm.sweep_dead_workers()


def discard_reply(data: bytes) -> None:
    """Let go of a reply's shared memory without unpickling it (its chunk was cancelled)."""
    try:
        segments = _split(data)[1]
    except Exception:  # not ours to judge: there is nothing to free then
        return
    for name, nbytes in segments:
        try:
            _shm.discard(name, nbytes)
        except OSError:
            pass


class _Discard:
    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


def _dump_without_copy(value: Any) -> None:
    """Pickle ``value`` into nothing, big buffers out of band: raises if it cannot."""
    _Pickler(_Discard(), protocol=PROTOCOL, buffer_callback=lambda _: False).dump(value)


def picklable_outcomes(result: ChunkResult) -> ChunkResult:
    """:func:`smartexec._remote.picklable_outcomes`, copying no big buffer to check."""
    return _remote.picklable_outcomes(result, _dump_without_copy)


#: The parent a loky worker served its first request for (None before it).
_served_for: int | None = None


def _check_parent(owner: int | None) -> None:
    """Exit this worker at once if the process it works for is gone.

    An orphaned worker (its parent was killed) would otherwise run the rest
    of its queue and make shared memory for replies nobody reads: named
    segments that nobody would unlink. ``owner`` is the fork backend's
    executor pid; for loky (None), the parent the worker first served.
    Before it exits, it unlinks the named result segments that parent never
    read (:func:`smartexec._shm.release_orphans`).
    """
    global _served_for
    if owner is None:
        if _served_for is None:
            _served_for = os.getppid()
            if os.environ.get(WORKER_ENV) == "1" and _served_for != 1:
                _watch_parent(_served_for)
        owner = _served_for
        gone = owner != 1 and os.getppid() != owner
    else:
        try:  # one system call (reading /proc/<pid>/stat costs 20 us a chunk)
            os.kill(owner, 0)
            gone = False
        except ProcessLookupError:
            gone = True
        except OSError:  # EPERM: it exists
            gone = False
    if gone:
        _shm.release_orphans()
        os._exit(0)


#: Seconds between an idle loky worker's checks that its parent is alive.
PARENT_CHECK_S = 1.0


def _watch_parent(parent: int) -> None:
    """Exit this loky worker within :data:`PARENT_CHECK_S` once ``parent`` is gone.

    An idle loky worker waits on its call queue for ever when the parent is
    killed (and keeps loky's resource tracker alive); fork workers check
    their parent the same way.
    """

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:
                _shm.release_orphans()
                os._exit(0)

    threading.Thread(target=watch, name="smartexec-parent-watch", daemon=True).start()


def serve_request(data: bytes, owner: int | None = None) -> bytes:
    """Run one request in a worker and return the reply's bytes.

    The reply unpickles (:func:`loads_reply`) to ``("ok", ChunkResult)`` or
    ``("error", exception)`` when the request itself could not be unpickled.
    Used by the loky backend and the fork backend's worker loop.

    Args:
        data: the request's bytes (:func:`dumps_request`).
        owner: the executor's pid, given by the fork backend (its workers'
            parent is the pool's zygote); None for loky (the parent). A
            fork worker leaves through ``os._exit`` as soon as its parent
            dies, with no chance to unlink a named segment its dead parent
            never read, so where anonymous memory cannot be used its big
            results travel in band, as with ``ProcessPoolExecutor``.

    Returns:
        The reply's bytes.
    """
    _check_parent(owner)
    _shm.release_acknowledged()  # the parent has mapped our last replies by now
    result: ChunkResult | None = None
    try:
        fn, chunk, budget_s = _decode(data, private=True, adopt=False)  # calls still packed
    except BaseException as exc:
        reply: tuple[str, Any] = ("error", remote_exception(exc))
    else:
        del data
        # Each call gets its own arguments and gives back its own result, as
        # one pickled per call would (ProcessPoolExecutor, chunksize=1).
        result = separate_outcomes(run_chunk(fn, own_arguments(chunk), True, budget_s))
        reply = ("ok", result)
        del fn, chunk
    _check_parent(owner)
    named_ok = owner is None
    try:
        return dumps_reply(reply, owner, named_ok=named_ok)
    except BaseException:
        assert result is not None
        return dumps_reply(("ok", picklable_outcomes(result)), owner, named_ok=named_ok)


def estimate_send_s(obj: Any) -> float:
    """Seconds the parent spends on ``obj`` in a round trip to a worker.

    Pickles ``obj`` into nothing with big buffers out of band (not copied),
    counts the stream twice (pickled on one side, unpickled on the other)
    and big buffers once, at :data:`SHM_WRITE_S_PER_BYTE`: they are written
    into shared memory once and mapped, not copied, on the other side. A
    buffer that ``obj`` holds twice (the same array in every call of a
    chunk) counts once, as pickle's memo and the send-once cache send it.

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    pickling_s, big = send_parts(obj)
    return 2 * pickling_s + big * SHM_WRITE_S_PER_BYTE


def send_parts(obj: Any, buffers: dict[int, tuple[int, Any]] | None = None) -> tuple[float, int]:
    """``(seconds to pickle obj, bytes of its big buffers)``: what :func:`estimate_send_s` prices.

    The seconds are those just spent pickling it into nothing (big buffers
    out of band, not copied): what measuring it costs. A buffer ``obj``
    holds twice counts once (pickle's memo).

    Args:
        obj: what to price.
        buffers: when given, filled with ``id(exporter) -> (bytes,
            exporter)`` of each big buffer: the array or bytes object that
            exports it, held so that its id stays its own (a Fortran-ordered
            array exports through a temporary transpose, whose id the next
            one would reuse).

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    big = 0

    def offer(buffer: pickle.PickleBuffer) -> bool:
        nonlocal big
        try:
            raw = buffer.raw()
        except BufferError:
            return True
        nbytes = raw.nbytes
        if nbytes >= BIG_BUFFER_BYTES and _shm.available():
            big += nbytes
            if buffers is not None:
                buffers[id(raw.obj)] = (nbytes, raw.obj)
            return False
        return True

    start = time.perf_counter()
    _Pickler(_Discard(), protocol=PROTOCOL, buffer_callback=offer).dump(obj)
    return time.perf_counter() - start, big


# -- objects sent once -----------------------------------------------------------


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

    :func:`dumps_request` replaces it by its cache's :class:`CachedRef`.
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


def _after_fork_in_child() -> None:
    # The objects a forked worker inherited belong to its parent's requests.
    global _served_for
    _OBJECTS.clear()
    _served_for = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
