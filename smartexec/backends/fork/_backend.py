"""The fork backend: the :class:`ForkBackend` that owns the fork pools."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401 - its atexit hook must be registered before ours
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

from ... import _fingerprint, _initializer, _module_reads, _object_cache, trampoline, transport
from ..._blas import (
    threads_per_worker,
)
from ..._diagnose import (
    fail_on_pickling,
)
from ..._identity import WeakCallable, identity_key
from ..._remote import Call, ChunkResult, copy_calls
from ..._sender import Sender, quick_to_pickle
from ..._system import deferred_interrupts
from ...errors import InitializerError
from ...inspection import callable_name
from ...tuning import digest_pays
from .._base import Backend, check_open_files
from ._children import STOP_TIMEOUT_S
from ._parts import _LIVE_POOLS, _OWNER_LOCK, _QUIESCE_LOCK, _Task
from ._pool import _ForkPool

#: Shared callables that cannot be weakly referenced, kept for reuse at most.
MAX_STRONG_SHARED = 8

#: Pickled callables whose module-level reads a new pool records as it forks
#: (the most recent): maps of these alternating on one executor reuse a pool.
MAX_PLAIN_KNOWN = 32

#: Seconds under which a digest of what a callable reads is taken at each fork.
CHEAP_DIGEST_S = 0.001

#: Set once the exit hook (:func:`_shutdown_all_pools`) has begun: no new pool starts.
_EXITING = False


class _Prepared:
    """What :meth:`ForkBackend.prepare` returns for a call that must run on a current snapshot.

    Attributes:
        ref: what chunks carry: the trampoline reference of a shared
            callable, or the callable itself.
        fn: the user's callable (kept alive while the call runs).
        since: the backend's epoch when ``map``/``submit`` was called: only a
            pool born later holds a current snapshot; None when the current
            pool's snapshot was proven current.
        digest: a shared callable's state's digest at that moment (a
            submit), recorded by the pool forked for it; None when unknown.
        reads: the module-level values it reads at that moment
            (:mod:`smartexec._module_reads`), recorded by the pool forked
            for it, under ``key``.
    """

    __slots__ = ("ref", "fn", "since", "digest", "reads", "key", "pool", "_unbind", "__weakref__")

    def __init__(
        self,
        ref: Any,
        fn: Any,
        since: int | None,
        digest: bytes | None = None,
        reads: _module_reads.State | None = None,
    ):
        self.ref = ref
        self.fn = fn
        self.since = since
        self.digest = digest
        self.reads = reads
        self.key = identity_key(fn)
        self.pool: _ForkPool | None = None  # the pool whose snapshot this call runs on
        self._unbind: weakref.finalize[Any, Any] | None = None

    def bind(self, pool: _ForkPool) -> None:
        """Run this call's chunks on ``pool``, which stays up (retired or not) while it lives."""
        pool.pin()
        if self._unbind is not None:
            self._unbind()  # the old pool can no longer run chunks (broken, closed)
        self.pool = pool
        self._unbind = weakref.finalize(self, pool.unpin)


class _Entry:
    """A shared callable's trampoline token, and what a digest of its state last cost."""

    __slots__ = ("token", "handle", "digest_s")

    def __init__(self, token: int, handle: WeakCallable):
        self.token = token
        self.handle = handle
        self.digest_s: float | None = None  # seconds, this process


class _Known:
    """A pickled callable run lately, and what the digest of the values it reads last cost."""

    __slots__ = ("handle", "reads_s")

    def __init__(self, handle: WeakCallable):
        self.handle = handle
        self.reads_s: float | None = None  # seconds, this process (_module_reads)


class ForkBackend(Backend):
    """Runs chunks on worker processes forked from this process.

    Callables prepared with ``share=True`` reach workers by copy-on-write
    through :mod:`smartexec.trampoline` and are never pickled. Other callables
    and all arguments are pickled by :mod:`smartexec.transport` (cloudpickle,
    protocol 5): numpy buffers of 1 MiB or more, both ways, through shared
    memory; an argument object repeated across calls, once.

    Args:
        max_workers: worker processes (None: one per CPU).
        cpu_count: CPUs this process may use.
        initializer: run as ``initializer(*initargs)`` once in each worker
            process, after its fork and before its first chunk (replacement
            workers too); None runs nothing. It and ``initargs`` reach the
            workers by inheritance, never pickled. When it raises, the
            backend is broken (:attr:`broken`): pending and later chunks fail
            with :class:`~smartexec.errors.ProcessInitializerError`, a
            ``BrokenProcessPool``.
        initargs: the initializer's arguments (tuple).
        max_tasks_per_child: calls (not chunks) a worker process may run
            before it exits and is replaced (int >= 1); None: no limit.
    """

    name = "fork"
    pickles_closures = True
    copy_on_write = True
    takes_timeouts = True
    stops_tasks = True
    #: Asked for by name (multiprocessing.get_context("fork"), os.fork):
    #: never the interpreter's default, forkserver on Linux from Python 3.14.
    start_method = "fork"
    #: Source: benchmarks/bench_overheads.py (7 ms for 2 workers; 120-150 us
    #: per one-item chunk; 2-core machine, 2026-11-29).
    worker_startup_s = 0.004
    chunk_overhead_s = 150e-6

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_child: int | None = None,
    ):
        super().__init__(max_workers, cpu_count)
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self.max_tasks_per_child = _initializer.check_max_tasks(max_tasks_per_child)
        self._box = _initializer.Breakage()
        check_open_files(self.max_workers, self.name)
        self._cpu_count = cpu_count
        self._lock = threading.RLock()
        self._entries: dict[Hashable, _Entry] = {}
        self._plain_entries: dict[Hashable, _Known] = {}  # pickled callables, oldest first
        self._pool: _ForkPool | None = None
        self._retired: list[_ForkPool] = []
        self._closed = False
        self._cache = _object_cache.ObjectCache()  # big arguments seen twice: sent once
        #: Orders calls and forks: a pool born after a call's epoch forked
        #: after that call, so its snapshot is at least as new as the call.
        self._epochs = itertools.count(1)
        self._fork_s: float | None = None  # seconds the last new pool took to start, here
        self._sender = Sender(self.name)  # pickles what is not plain data, in order

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed in a worker, or None."""
        return self._box.error

    @classmethod
    def unavailable_reason(cls) -> str | None:
        from ..._system import current_platform

        if not current_platform().has_fork:
            return "start method 'fork' is not available (or not safe) on this platform"
        return None

    def prepare(self, fn: Any, share: bool) -> Any:
        """For a ``map``: run on a snapshot as new as this call, or one proven the same.

        A shared callable runs on a pool forked after this call: checking
        that an existing pool's snapshot is current would cost a digest of
        the whole state (40-80 ms per 100 MB); forking a new pool costs
        about a millisecond per 100 MB mapped. A pickled callable runs on
        the current pool while the module-level values it reads there are
        proven to be the ones it reads here (:meth:`_plain`); otherwise on a
        pool forked after this call. Either way its chunks all use one
        snapshot.
        """
        if not share:
            return self._plain(fn)
        with self._lock:
            token = self._token(fn)
            return _Prepared(trampoline.SharedRef(token, callable_name(fn)), fn, next(self._epochs))

    def _plain(self, fn: Any) -> Any:
        """``fn`` itself while the current pool reads what it reads here; else a :class:`_Prepared`.

        A function pickled by reference runs in a worker on the worker's
        copy of its module: a value the caller rebound or changed in place
        since that pool forked (``helpers.SCALE = 10``) would be read there
        as it was. The values it reads by name are compared with those the
        pool recorded before it forked (:mod:`smartexec._module_reads`:
        identity, and a digest of mutable ones while the digest costs less
        than a fork, :func:`smartexec.tuning.digest_pays`).
        """
        with self._lock:
            entry = self._plain_entry(fn)
            pool = self._pool
            busy = pool is not None and pool.usable and pool.bound_calls > 0
            digest = digest_pays(entry.reads_s, self._fork_s, busy)
        reads = _module_reads.state_of(fn, digest=digest)
        if not reads.reads:
            return fn
        if reads.digest_s:
            entry.reads_s = reads.digest_s
        with self._lock:
            pool = self._pool
            if pool is not None and pool.usable and reads.same_as(pool.reads):
                return fn
            return _Prepared(fn, fn, next(self._epochs), reads=reads)

    def _plain_entry(self, fn: Any) -> _Known:
        """Pickled callable ``fn``'s entry, made on first use (under the lock); the newest kept."""
        key = identity_key(fn)
        entry = self._plain_entries.pop(key, None)
        if entry is None or not entry.handle.matches(fn):
            entry = _Known(WeakCallable(fn))
        self._plain_entries[key] = entry  # last: the most recent
        while len(self._plain_entries) > MAX_PLAIN_KNOWN:
            del self._plain_entries[next(iter(self._plain_entries))]
        return entry

    def _reads_now(self, first: _Prepared | None) -> _module_reads.Record:
        """What the user's code binds now, for a pool about to fork (under the lock).

        Each binding whose object is its whole state
        (:func:`smartexec._module_reads.fork_record`), and all that the
        callables run lately read. Taken before the fork: a value changed in
        between leaves the pool newer than its record, which proves nothing
        stale. Mutable values are hashed only where their last digest took
        under a millisecond.
        """
        record = _module_reads.fork_record()
        for key, entry in list(self._plain_entries.items()):
            fn = entry.handle.get()
            if fn is None or (first is not None and key == first.key):
                continue
            cheap = entry.reads_s is not None and entry.reads_s < CHEAP_DIGEST_S
            record.update(_module_reads.state_of(fn, digest=cheap).record())
        if first is not None and first.reads is not None:
            record.update(first.reads.record())
        return record

    def prepare_call(self, fn: Any, share: bool) -> Any:
        """For a ``submit``: reuse the current pool when a digest proves its snapshot current.

        A loop of submits would otherwise fork a pool per call. The digest
        (:func:`smartexec._fingerprint.digest`) pickles the callable with its
        buffers out of band and hashes them in place; the pool forked for a
        submit records it. A state that cannot be pickled (one reason to
        share it) cannot be proven current: each such submit forks a new pool.
        Nor is a state whose last digest took longer than the last new pool
        took to start, while the current pool runs no call (a fresh pool is
        then the cheaper proof, and its workers replace, not join, the
        current ones: :func:`smartexec.tuning.digest_pays`).
        """
        if not share:
            return self._plain(fn)
        with self._lock:
            entry = self._entry(fn)
            pool = self._pool
            busy = pool is not None and pool.usable and pool.bound_calls > 0
            proves = digest_pays(entry.digest_s, self._fork_s, busy)
        digest: bytes | None = None
        if proves:
            start = time.perf_counter()
            try:
                digest = _fingerprint.digest(fn)
            except Exception:
                pass
            entry.digest_s = time.perf_counter() - start
        # Its code reads the worker's copy of its modules too.
        reads = _module_reads.state_of(fn, shared=True, digest=digest is not None)
        with self._lock:
            token = entry.token
            pool = self._pool
            since: int | None = next(self._epochs)
            if (
                digest is not None
                and pool is not None
                and pool.usable
                and token in pool.covered
                and pool.digests.get(token) == digest
                and (not reads.reads or reads.same_as(pool.reads))
            ):
                since = None
            ref = trampoline.SharedRef(token, callable_name(fn))
            return _Prepared(ref, fn, since, digest, reads if reads.reads else None)

    def _token(self, fn: Any) -> int:
        """The trampoline token of shared callable ``fn`` (under the lock)."""
        return self._entry(fn).token

    def _entry(self, fn: Any) -> _Entry:
        """Shared callable ``fn``'s entry, made on first use (under the lock)."""
        key = identity_key(fn)
        entry = self._entries.get(key)
        if entry is None or not entry.handle.matches(fn):
            entry = _Entry(trampoline.new_token(), WeakCallable(fn, lambda: self._forget(key)))
            self._entries[key] = entry
            if not entry.handle.weak:
                self._bound_strong_entries()
        return entry

    def refresh(self, fn: Any) -> bool:
        """Forget ``fn``'s trampoline token; its next chunks fork a new pool.

        Not needed for correctness: every ``map`` or ``submit`` already sees
        the state as it was when it was called (see :meth:`prepare`). Kept
        for explicit control, e.g. to drop a state a long-running map holds.

        Returns:
            True when ``fn`` was shared with this backend's workers.
        """
        with self._lock:
            return self._entries.pop(identity_key(fn), None) is not None

    def _bound_strong_entries(self) -> None:
        """Keep at most MAX_STRONG_SHARED callables that cannot be weakly referenced.

        They are held strongly (a list's method, a ``__slots__`` class without
        ``__weakref__``); the oldest are let go, so they cannot pile up. A let-go
        callable still running keeps itself alive through its tasks.
        """
        strong = [k for k, e in self._entries.items() if not e.handle.weak]
        for key in strong[: max(0, len(strong) - MAX_STRONG_SHARED)]:
            del self._entries[key]

    def _forget(self, key: Hashable) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.handle.get() is None:
                del self._entries[key]

    def _live_objects(self) -> dict[int, Any]:
        with self._lock:
            live = {}
            for entry in self._entries.values():
                obj = entry.handle.get()
                if obj is not None:
                    live[entry.token] = obj
            return live

    def _pool_covering(
        self,
        token: int | None,
        since: int | None = None,
        digest: bytes | None = None,
        first: _Task | None = None,
        prepared: _Prepared | None = None,
    ) -> _ForkPool:
        """The pool to run on: one that inherited ``token`` after epoch ``since``.

        Starts a new pool when the current one cannot serve (none, stopping,
        ``token`` not inherited, or forked before ``since``); the old one runs
        its queued chunks out. A new pool records ``digest`` for ``token``
        and what the callables run lately read (``prepared``'s too) as it
        forks (:meth:`_reads_now`), and may take ``first`` at its start
        (:attr:`_ForkPool.took_first`: then it must not be submitted).
        """
        with self._lock:
            self._box.raise_if_broken()
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pool = self._pool
            if _EXITING and (pool is None or not pool.usable):
                # The exit hook stops the pools: a pool forked now would
                # outlive it, and hold the exit until its workers end.
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            if (
                pool is None
                or not pool.usable
                or (token is not None and token not in pool.covered)
                or (since is not None and pool.born <= since)
            ):
                if pool is not None:
                    # Its queued chunks stay and run there: chunks of a call whose
                    # snapshot is that pool's must not run on a newer one (a
                    # submit queued before a change returned the changed state).
                    pool.retire()
                    self._retired = [p for p in self._retired if not p.done] + [pool]
                born = next(self._epochs)  # taken before the fork: no later call is older
                reads = self._reads_now(prepared)
                start = time.perf_counter()
                pool = self._pool = _ForkPool(
                    self.max_workers,
                    self._live_objects,
                    threads_per_worker(self._cpu_count, self.max_workers),
                    initializer=self._initializer,
                    initargs=self._initargs,
                    max_tasks_per_child=self.max_tasks_per_child,
                    box=self._box,
                    first=first,
                )
                pool.born = born
                pool.reads = reads
                self._fork_s = time.perf_counter() - start
                if token is not None and digest is not None:
                    pool.digests[token] = digest
            return pool

    def submit_chunk(
        self,
        fn: Any,
        chunk: Sequence[Call],
        budget_s: float | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Future[ChunkResult]:
        """Queue a chunk and return its future at once; with ``timeout_s``, a time limit.

        See :meth:`Backend.submit_chunk`. Never raises for a payload that
        cannot be pickled: the future fails with
        :class:`~smartexec.errors.PayloadPicklingError`. Plain data is pickled
        before this returns (microseconds); anything else on the sender
        thread (:mod:`smartexec._sender`). A chunk over ``timeout_s`` seconds
        (counted from when a worker takes it) fails with
        :class:`~smartexec.errors.TaskTimeoutError`; its worker is killed and
        replaced.
        """
        since: int | None = None
        digest: bytes | None = None
        if isinstance(fn, _Prepared) and isinstance(fn.ref, trampoline.SharedRef):
            target, keepalive, token = fn.ref, fn.fn, fn.ref.token
            name, since, digest, plain = fn.ref.name, fn.since, fn.digest, None
        elif isinstance(fn, _Prepared):  # pickled, on a snapshot as new as its call
            target, keepalive, token, name, plain = fn.fn, fn.fn, None, callable_name(fn.fn), fn.fn
            since = fn.since
        else:
            target, keepalive, token, name, plain = fn, None, None, callable_name(fn), fn
        calls = copy_calls(chunk)  # an OwnCalls chunk stays one
        task = _Task(Future(), None, keepalive, name, timeout_s, len(calls))
        blame = keepalive if keepalive is not None else fn
        inline = self._sender.idle() and quick_to_pickle(plain, calls)
        # Pickled before it is queued: one wake-up, nothing to wait for. A
        # Ctrl-C waits until the chunk's segments are its future's.
        with deferred_interrupts() if inline else contextlib.nullcontext():
            if inline:
                self._pickle(task, target, calls, budget_s, blame, inline=True)
                if task.future.done():
                    return task.future  # it could not be pickled
            self._queue_task(fn, task, token, since, digest, inline)
        if not inline:
            self._sender.put(lambda: self._pickle(task, target, calls, budget_s, blame))
        return task.future

    def _queue_task(
        self,
        fn: Any,
        task: _Task,
        token: Any,
        since: int | None,
        digest: bytes | None,
        inline: bool,
    ) -> None:
        """Hand ``task`` to the pool that covers its snapshot (forking it here if new)."""
        try:
            with self._lock:  # no other thread may retire the pool in between
                # In this thread: a new pool forks its zygote here, never in the sender.
                if isinstance(fn, _Prepared):
                    # Every chunk of one call (a map's, a retry) on one snapshot.
                    pool = fn.pool
                    if pool is None or not pool.takes_pinned:
                        pool = self._pool_covering(token, since, digest, task, fn)
                        fn.bind(pool)
                    if task.pool is None:  # not taken by a new pool at its start
                        pool.submit(task, pinned=True)
                else:
                    pool = self._pool_covering(token, since, digest, task)
                    if task.pool is None:
                        pool.submit(task)
        except BaseException:
            if inline:
                task.future.cancel()  # releases its lease
            raise

    def _pickle(
        self,
        task: _Task,
        target: Any,
        calls: list[Call],
        budget_s: float | None,
        blame: Any,
        inline: bool = False,
    ) -> None:
        """Pickle a queued task's request; on failure, fail its future with a clear error."""
        future = task.future
        if future.done():  # cancelled before its turn: nothing to pickle
            task.wake_pool()
            return
        try:
            payload, lease = transport.dumps_request(target, calls, budget_s, cache=self._cache)
        except BaseException as exc:
            fail_on_pickling(future, exc, blame, calls, self.name, from_sender=not inline)
            task.wake_pool()
            if inline and not isinstance(exc, Exception):
                raise  # Ctrl-C while pickling in the caller's thread: the caller's to handle
            return
        lease.release_when_done(future)  # its shared-memory segments live until then
        task.payload = payload
        task.wake_pool()

    def abort(self, futures: Sequence[Future[ChunkResult]]) -> None:
        """Cancel these chunks and kill the workers running any of them.

        See :meth:`Backend.abort`. Each killed worker is replaced; its chunk
        fails with :class:`~smartexec.errors.WorkerCrashedError`. Takes no
        lock (a generator's finalizer may call it in a thread holding one).
        """
        pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.abort(futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            self._sender.wait_idle()  # a cancelled task may still be pickling
            self._cache.close()
        elif self._sender.idle():
            self._cache.close()
        else:
            self._sender.put(self._cache.close)  # after the pickles queued before it

    def signal_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker of every pool; cancel what has not started.

        See :meth:`Backend.signal_workers`. No worker is replaced, and each
        pool's zygote (which forks the workers and runs no user code) is
        stopped as at shutdown once its workers are gone. Returns at once.
        """
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.signal_workers(signum)
        self.shutdown(wait=False, cancel_futures=True)  # the pickles and the cache

    def terminate(self) -> None:
        """Stop now: cancel queued chunks and kill the workers running chunks."""
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.terminate()


def _shutdown_all_pools() -> None:
    """At interpreter exit: stop every pool of this process.

    A pool whose executor called ``shutdown(wait=False)`` runs its queued
    chunks out first, as ``concurrent.futures`` does. Otherwise (the
    executor was never shut down) nothing can receive a result any more
    (every non-daemon thread has ended), so queued chunks are cancelled,
    running chunks get :data:`STOP_TIMEOUT_S` seconds, and workers still
    busy are then killed: a forgotten ``shutdown()`` never holds the exit.
    """
    global _EXITING
    _EXITING = True
    for pool in list(_LIVE_POOLS):
        if pool._pid != os.getpid():
            continue
        if pool._drain_at_exit:
            pool.shutdown(wait=True)  # shutdown(wait=False) was called: finish the queue
        else:
            pool.terminate(STOP_TIMEOUT_S)


def _after_fork_in_child() -> None:
    # A forked child must never drive its parent's pools.
    _LIVE_POOLS.clear()
    # A pool forks its zygote and workers holding _QUIESCE_LOCK (see
    # _quiesced), and another thread may hold _OWNER_LOCK at that instant: in
    # the child, which never returns to release them, a thread of its own
    # (a worker's thread starting a fork pool of its own) waited forever.
    _QUIESCE_LOCK._at_fork_reinit()  # type: ignore[attr-defined]
    _OWNER_LOCK._at_fork_reinit()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_after_fork_in_child)
# A plain atexit hook: it runs after non-daemon threads are joined, so a map
# still streaming in such a thread when the main thread ends can finish.
atexit.register(_shutdown_all_pools)
