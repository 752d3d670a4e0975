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

**Big objects sent once** (:class:`~smartexec._object_cache.ObjectCache`,
one per process backend): see :mod:`smartexec._object_cache`.

Who unlinks what, so that nothing is left in ``/dev/shm``: a request's
segments belong to its :class:`Lease`, released when the chunk's future is
done (result, error, cancellation or dead worker); a reply's segments are
unlinked by the parent as soon as it has mapped them; see :mod:`smartexec._shm`
for worker deaths and interpreter exit.

Wire format: see :mod:`smartexec._wire`.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Sequence
from typing import Any

import cloudpickle

from . import _remote, _shm
from ._diagnose import reply_unpickling_error, task_unpickling_error
from ._object_cache import _OBJECTS, CachedCallable, Lease, ObjectCache, _prune
from ._remote import (
    BIG_REQUEST_BYTES,
    Call,
    ChunkResult,
    OwnCalls,
    own_arguments,
    own_calls,
    pack_calls,
    remote_exception,
    run_chunk,
    separate_outcomes,
    unpack_calls,
)
from ._system import WORKER_ENV
from ._threads import own_thread
from ._wire import (
    _discard,
    _dump_without_copy,
    _encode,
    _Encoder,
    _split,
)

__all__ = [
    "discard_reply",
    "dumps_reply",
    "dumps_request",
    "loads_reply",
    "loads_request",
    "read_reply",
    "REPLY_MEMORY",
    "serve_request",
    "sweep_dead_workers",
]


# -- buffers through shared memory -------------------------------------------


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


# -- requests and replies ------------------------------------------------------


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
                calls = own_calls(calls, chunk.snapshots)  # (substitute copies it)
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


#: Where a reply's big buffers may go: ``"shared"`` (shared memory, named or
#: anonymous), ``"anonymous"`` (anonymous memory only, else in band: a fork
#: worker's, see :func:`serve_request`), ``"none"`` (in band: a worker on
#: another machine, dask's or a plugin's).
REPLY_MEMORY = ("shared", "anonymous", "none")


def dumps_reply(
    result: ChunkResult | None,
    error: BaseException | None = None,
    *,
    owner: int | None = None,
    memory: str = "none",
) -> bytes:
    """Pickle a worker's reply for :func:`loads_reply`: a chunk's result, or why it could not run.

    The one reply format of every process backend (fork, loky, dask, a
    plugin's).

    Args:
        result: the chunk's outcomes (from :func:`~smartexec._remote.run_chunk`
            with ``remote=True``), or None when ``error`` is given.
        error: an exception raised *around* the chunk (its request could not
            be unpickled in the worker), or None.
        owner: the pid big buffers' segments are made for (default: the
            parent, ``os.getppid()``; a fork worker's parent is its pool's
            zygote, so the fork backend passes the executor's pid), which
            unlinks them in :func:`loads_reply`.
        memory: where big buffers may go, one of :data:`REPLY_MEMORY`;
            the default, ``"none"``, suits a worker on any machine.

    Returns:
        The bytes; a result that cannot be pickled as a whole is sent with
        each unpicklable value replaced
        (:func:`~smartexec._remote.picklable_outcomes`).
    """
    if error is not None:
        return _reply_bytes(("error", remote_exception(error)), owner, memory)
    assert result is not None
    try:
        return _reply_bytes(("ok", result), owner, memory)
    except BaseException:
        return _reply_bytes(("ok", picklable_outcomes(result)), owner, memory)


def _reply_bytes(reply: tuple[str, Any], owner: int | None, memory: str) -> bytes:
    if memory == "none":
        encoder = _Encoder(owner=None, threshold=1 << 62)
    else:
        owner = os.getppid() if owner is None else owner
        encoder = _Encoder(owner=owner, named_ok=memory == "shared")
    return _encode(reply, encoder)


def read_reply(data: bytes, name: str = "a chunk", backend: str = "a") -> tuple[bool, Any]:
    """Unpickle a reply from :func:`dumps_reply`; its segments are mapped, then unlinked.

    Never raises: the errors are returned, their tracebacks free of this
    process's frames (a future that holds one must not keep a pool alive).
    A worker that could not open this process's memory (its request failed
    with :class:`~smartexec._shm.PeerAccessError`) switches this process to
    named segments (:func:`smartexec._shm.use_named`): only that call failed.

    Args:
        data: the reply's bytes.
        name: what ran, for the messages, e.g. ``"Index.query()"``.
        backend: the backend's name, for the messages, e.g. ``"fork"``.

    Returns:
        ``(True, ChunkResult)``, or ``(False, error)``: a
        :class:`~smartexec.errors.WorkerProtocolError` with ``stage ==
        "task"`` (the worker could not unpickle the request) or ``"reply"``
        (this process could not unpickle the reply), the original error as
        its ``__cause__``.
    """
    try:
        status, value = _decode(data, private=False, adopt=True)
    except BaseException as exc:  # SystemExit from a __reduce__ included
        return False, reply_unpickling_error(name, exc, backend)
    if status == "ok":
        return True, value
    if _caused_by(value, _shm.PeerAccessError):
        _shm.use_named()
    return False, task_unpickling_error(name, value, backend)


def loads_reply(data: bytes, name: str = "a chunk", backend: str = "a") -> ChunkResult:
    """:func:`read_reply`'s result, or its error raised.

    Raises:
        WorkerProtocolError: see :func:`read_reply`.
    """
    ok, value = read_reply(data, name, backend)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


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


#: Seconds between an idle worker's checks that its parent is alive (loky's
#: and fork's; one ``getppid()`` or ``kill(pid, 0)`` a check).
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

    own_thread(watch, "smartexec-parent-watch").start()


def serve_request(data: bytes, owner: int | None = None, received_s: float = 0.0) -> bytes:
    """Run one request in a worker and return the reply's bytes.

    The reply (:func:`dumps_reply`) carries the chunk's result, or the
    error that kept the request from being unpickled.
    Used by the loky backend and the fork backend's worker loop.

    Args:
        data: the request's bytes (:func:`dumps_request`).
        owner: the executor's pid, given by the fork backend (its workers'
            parent is the pool's zygote); None for loky (the parent).
        received_s: seconds spent reading ``data`` from the pipe, where
            the caller timed it; with the unpickling, a big request's
            :attr:`~smartexec._remote.ChunkResult.receive_s`. A
            fork worker leaves through ``os._exit`` as soon as its parent
            dies, with no chance to unlink a named segment its dead parent
            never read, so where anonymous memory cannot be used its big
            results travel in band, as with ``ProcessPoolExecutor``.

    Returns:
        The reply's bytes.
    """
    _check_parent(owner)
    _shm.release_acknowledged()  # the parent has mapped our last replies by now
    memory = "shared" if owner is None else "anonymous"
    big = len(data) >= BIG_REQUEST_BYTES
    start = time.perf_counter()
    try:
        fn, chunk, budget_s = _decode(data, private=True, adopt=False)  # calls still packed
    except BaseException as exc:
        _check_parent(owner)
        return dumps_reply(None, exc, owner=owner, memory=memory)
    del data
    # Each call gets its own arguments and gives back its own result, as
    # one pickled per call would (ProcessPoolExecutor, chunksize=1).
    calls = own_arguments(chunk)
    receive_s = received_s + time.perf_counter() - start if big else 0.0
    result = separate_outcomes(run_chunk(fn, calls, True, budget_s))
    if receive_s:
        result = result._replace(receive_s=receive_s)
    del fn, chunk, calls
    _check_parent(owner)
    return dumps_reply(result, owner=owner, memory=memory)


# -- objects sent once -----------------------------------------------------------


def _after_fork_in_child() -> None:
    # The objects a forked worker inherited belong to its parent's requests.
    global _served_for
    _OBJECTS.clear()
    _served_for = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
