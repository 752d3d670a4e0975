"""The loky backend: chunks run on a loky process pool, pickled with cloudpickle.

loky starts workers with fork+exec (a clean interpreter, safe with threads)
and pickles calls with cloudpickle, so lambdas, closures, nested functions and
functions defined in ``__main__`` travel by value.

Each ``SmartExecutor`` owns its own ``loky.ProcessPoolExecutor`` rather than
sharing loky's process-wide reusable executor, so that ``shutdown()`` stops
exactly the workers this executor started and never another's.

Chunks wait in this backend's own queue, and loky gets at most one chunk per
worker at a time (the next when one finishes): loky marks a call running as
soon as it enters its call queue, ahead of free workers, so a chunk handed to
loky early could no longer be cancelled. Here a chunk's future stays
cancellable until a worker is free to take it.

When a loky worker dies, loky marks the whole pool broken and fails the
chunks it holds with ``TerminatedWorkerError`` (a ``BrokenProcessPool``). The
backend then starts a fresh pool for the chunks still queued here, so the
executor stays usable; the chunks loky held are not retried.

Chunks are pickled by :mod:`smartexec.transport` (loky then only moves
bytes), in the submitting thread when they are plain data, otherwise on the
backend's sender thread (:mod:`smartexec._sender`), so ``submit_chunk``
returns at once and a pickling error fails the chunk's future. Big numpy buffers go through shared memory both
ways, and a callable the policy marks ``share`` (big bound object, partial or
closure state), like an argument object repeated across calls, is sent once
to each worker and cached there, and reused only while proven unchanged.
Loky workers are started fresh, with no copy-on-write, so without this every
chunk would pickle the whole object.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .. import _initializer, _object_cache, transport
from .._blas import thread_env, threads_per_worker
from .._diagnose import (
    detach_traceback,
    fail_on_pickling,
)
from .._futures import ChainedFuture
from .._remote import Call, ChunkResult, copy_calls
from .._sender import Sender, quick_to_pickle
from .._system import WORKER_ENV, deferred_interrupts
from ..errors import InitializerError, WorkerCrashedError
from ..inspection import callable_name
from ._base import Backend, check_open_files, forced_by, next_ready

__all__ = ["LokyBackend"]

#: Backends whose ``shutdown(wait=False)`` left chunks queued here, not yet
#: handed to loky: :func:`_hand_over_at_exit` waits for them.
_DRAINING: weakref.WeakSet[LokyBackend] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def _hand_over_at_exit() -> None:
    """At interpreter exit: hand loky every chunk a ``shutdown(wait=False)`` left queued.

    ``concurrent.futures`` runs the work queued before ``shutdown(wait=False)``
    even at interpreter exit; loky does too for what it was given, but this
    backend hands loky one chunk per idle worker and keeps the rest, so only
    the chunks running at exit ran (2 of 6). A threading exit hook, registered
    after loky's own (which stops loky taking chunks): hooks run last
    registered first, so this one runs while loky still takes them, and
    loky's then waits for them to finish.
    """
    for backend in list(_DRAINING):
        backend._wait_drained()


def _register_exit_hook() -> None:
    """Register :func:`_hand_over_at_exit` once, after loky's exit hook (see there)."""
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        _exit_hook_registered = True
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting already
            register(_hand_over_at_exit)


#: Seconds to wait for each signalled loky worker to exit (signal_workers).
JOIN_S = 5.0


class _ReplyFuture(ChainedFuture):
    """The chunk's future: queued here, then completed from loky's future.

    Pending (and cancellable) while the chunk waits in the backend's queue;
    running from when it is handed to loky (:meth:`_chain`); completed by
    unpickling the reply. The request's lease is released when it is done,
    whatever happened.
    """

    def __init__(self, name: str = "a chunk"):
        super().__init__()
        self._name = name
        self._payload: bytes | None = None  # set once pickled; dropped once handed on

    def cancel(self) -> bool:
        if Future.running(self):
            return False  # handed to loky: as good as started
        return super().cancel()

    def _follow(self, inner: Future[bytes]) -> None:
        self._chain(inner)
        inner.add_done_callback(self._transfer)

    def _transfer(self, inner: Future[bytes]) -> None:
        self._inner = None
        if self.done():  # failed by abort() already: nobody reads this reply
            if not inner.cancelled() and inner.exception() is None:
                transport.discard_reply(inner.result())
            return
        if inner.cancelled():
            self.set_exception(CancelledError(f"loky cancelled the chunk of {self._name}()"))
            return
        error = inner.exception()
        if error is not None:
            self.set_exception(_crash_error(error, self._name))
            return
        ok, value = transport.read_reply(inner.result(), self._name, "loky")
        if ok:
            self.set_result(value)
        else:
            self.set_exception(value)


def _crash_error(error: BaseException, name: str) -> BaseException:
    """A dead loky worker as :class:`~smartexec.errors.WorkerCrashedError`; other errors as they are.

    loky fails every chunk it held with its ``TerminatedWorkerError`` when one
    worker dies. As a ``WorkerCrashedError`` (a ``BrokenProcessPool`` too) the
    map re-sends such a chunk one item per chunk, as it does on fork, so the
    item that kills its worker fails alone and the others get their results.
    """
    from loky.process_executor import TerminatedWorkerError

    if not isinstance(error, TerminatedWorkerError):
        return error
    crash = WorkerCrashedError(
        f"a loky worker process died while running {name} (loky: {error}). The "
        f"backend starts a fresh pool; a map sends that chunk's items again, one "
        f"per chunk, so only the item that kills its worker fails.",
        shared_fate=True,
    )
    crash.__cause__ = error
    return crash


class LokyBackend(Backend):
    """Runs chunks on a ``loky.ProcessPoolExecutor`` owned by this backend.

    A callable prepared with ``share=True`` is sent once to each worker and
    cached there (:class:`smartexec._object_cache.ObjectCache`), as is an argument
    object seen again within a few calls; big numpy buffers travel through
    shared memory. loky holds at most ``max_workers`` chunks at a time; the
    others wait, cancellable, in this backend's queue.

    Args:
        max_workers: worker processes (None: one per CPU).
        cpu_count: CPUs this process may use.
        initializer: run as ``initializer(*initargs)`` once in each loky
            worker before its first chunk (loky's own ``initializer``; both
            are pickled with cloudpickle). When it raises, the backend is
            broken (:attr:`broken`): the chunks that reach that worker, and
            later ones, fail with
            :class:`~smartexec.errors.ProcessInitializerError`.
        initargs: the initializer's arguments (tuple).

    loky cannot retire one worker after a number of tasks, so this backend
    takes no ``max_tasks_per_child`` (the executor sends such work to fork).
    """

    name = "loky"
    pickles_closures = True
    #: loky's own context: fork+exec, a fresh interpreter (as spawn), whatever
    #: multiprocessing's default.
    start_method = "loky"
    #: Source: benchmarks/bench_overheads.py (2 workers start in ~0.2 s with
    #: their imports; 240-290 us per one-item chunk; 2-core machine, 2026-11-29).
    worker_startup_s = 0.1
    chunk_overhead_s = 250e-6

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ):
        super().__init__(max_workers, cpu_count)
        check_open_files(self.max_workers, self.name)
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self._box = _initializer.Breakage()
        # What a worker runs per chunk: with an initializer, a wrapper that
        # fails the chunk when the worker's initializer failed.
        self._serve: Callable[[bytes], bytes] = (
            transport.serve_request if initializer is None else _initializer.serve_loky
        )
        self._blas_threads = threads_per_worker(cpu_count, self.max_workers)
        self._pool: Any = None  # created at the first chunk: a map may run inline
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._queue: collections.deque[_ReplyFuture] = collections.deque()
        self._in_loky: set[_ReplyFuture] = set()
        self._closed = False
        self._stop_when_drained = False  # shutdown(wait=False) came with chunks queued
        self._cache = _object_cache.ObjectCache()
        self._sender = Sender(self.name)

    def _new_pool(self) -> Any:
        from loky import ProcessPoolExecutor

        # loky sets the environment before the worker imports anything.
        init: dict[str, Any] = {}
        if self._initializer is not None:
            init = {
                "initializer": _initializer.start_loky_worker,
                "initargs": (self._initializer, self._initargs),
            }
        return ProcessPoolExecutor(
            max_workers=self.max_workers,
            env={**thread_env(self._blas_threads), WORKER_ENV: "1"},
            **init,
        )

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed in a worker, or None."""
        return self._box.error

    def prepare(self, fn: Any, share: bool) -> Any:
        """Return ``fn``, or, with ``share``, a marker that sends it once per worker.

        One marker per ``map`` or ``submit``: its first chunk reuses the
        workers' cached copy only once it is proven byte for byte unchanged
        (:meth:`smartexec._object_cache.ObjectCache.callable_ref`), else sends
        the state again; the map's later chunks use that same copy.
        """
        return _object_cache.CachedCallable(fn) if share else fn

    def refresh(self, fn: Any) -> bool:
        """Make the next chunks of ``fn`` send its state as it is now.

        Not needed for correct results (each map and submit proves the
        cached copy current); it drops the cached copy at once.

        Returns:
            True when ``fn`` was cached for this backend's workers.
        """
        return self._cache.refresh(fn)

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        """Queue a chunk and return its future at once.

        See :meth:`Backend.submit_chunk`. Never raises for a payload that
        cannot be pickled: the future fails with
        :class:`~smartexec.errors.PayloadPicklingError`. The future can be
        cancelled until a loky worker is free for the chunk.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        user_fn = fn.fn if isinstance(fn, _object_cache.CachedCallable) else fn
        calls = copy_calls(chunk)  # an OwnCalls chunk stays one
        future = _ReplyFuture(callable_name(user_fn))
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = self._new_pool()
        if not (self._sender.idle() and quick_to_pickle(fn, calls)):
            with self._lock:
                self._queue.append(future)
            self._sender.put(lambda: self._pickle(future, fn, user_fn, calls, budget_s))
            return future
        # Pickled before it is queued; a Ctrl-C waits until the chunk's
        # segments are its future's and the future is queued (or failed).
        with deferred_interrupts():
            self._pickle(future, fn, user_fn, calls, budget_s, inline=True)
            if future.done():
                return future  # it could not be pickled
            with self._lock:
                self._queue.append(future)
        self._feed()
        return future

    def _pickle(
        self,
        future: _ReplyFuture,
        fn: Any,
        user_fn: Any,
        calls: list[Call],
        budget_s: float | None,
        inline: bool = False,
    ) -> None:
        """Pickle a queued chunk, then hand loky what it has room for."""
        if not future.done():  # else cancelled before its turn: nothing to pickle
            try:
                payload, lease = transport.dumps_request(fn, calls, budget_s, cache=self._cache)
            except BaseException as exc:
                fail_on_pickling(future, exc, user_fn, calls, self.name, from_sender=not inline)
                if not inline:
                    self._feed()
                if inline and not isinstance(exc, Exception):
                    raise  # Ctrl-C while pickling in the caller's thread
                return
            lease.release_when_done(future)  # its shared-memory segments live until then
            future._payload = payload
        if not inline:  # else submit_chunk queues it, then feeds
            self._feed()

    def _feed(self) -> None:
        """Hand loky the queue's first chunks, in order, while it has an idle worker."""
        while True:
            with self._lock:
                future = self._next_chunk()
                if future is None:
                    self._drained.notify_all()
                    stop = self._stop_when_drained and not self._queue
                    if stop:
                        self._stop_when_drained = False
                    pool = self._pool if stop else None
                    break
                payload, future._payload = future._payload, None
                assert payload is not None  # _next_chunk returns pickled chunks only
                self._in_loky.add(future)
                pool = self._pool
            try:
                inner = self._hand(pool, payload)
            except BaseException as exc:  # loky refused it (shut down at exit)
                with self._lock:
                    self._in_loky.discard(future)
                with contextlib.suppress(InvalidStateError):  # failed by signal_workers()
                    future.set_exception(detach_traceback(exc))
                continue
            future._follow(inner)
            future.add_done_callback(self._finished)
        if pool is not None:  # shutdown(wait=False) was waiting for the queue
            pool.shutdown(wait=False, kill_workers=False)
            self._cache.close()

    def _next_chunk(self) -> _ReplyFuture | None:
        # Under the lock. The first queued chunk when loky has an idle worker
        # and it is pickled (_pickle feeds again once it is); running from here on.
        if len(self._in_loky) >= self.max_workers:
            return None
        return next_ready(self._queue, _itself, _pickled)

    def _wait_drained(self) -> None:
        """Wait until every queued chunk was handed to loky (or failed, or was cancelled)."""
        with self._drained:
            self._drained.wait_for(lambda: not self._queue)

    def _hand(self, pool: Any, payload: bytes) -> Future[bytes]:
        inner = self._submit(pool, payload)
        if not _exit_hook_registered:
            # loky registers its own exit hook as its first chunk is given:
            # this one must come after it (see _hand_over_at_exit).
            _register_exit_hook()
        return inner

    def _submit(self, pool: Any, payload: bytes) -> Future[bytes]:
        try:
            return pool.submit(self._serve, payload)  # type: ignore[no-any-return]
        except BrokenProcessPool as exc:
            # A worker died earlier and loky broke the pool: replace it once.
            # loky raises the error it set on the futures it failed: drop the
            # frames this raise added (they hold the broken pool alive).
            exc.__traceback__ = None
            del exc
            with self._lock:
                if self._pool is pool:
                    self._pool = self._new_pool()
                fresh = self._pool
            # Not here: this may be the broken pool's own thread (in a done-callback).
            self._sender.put(lambda: pool.shutdown(wait=True, kill_workers=True))
            return fresh.submit(self._serve, payload)  # type: ignore[no-any-return]

    def _finished(self, future: Future[ChunkResult]) -> None:
        with self._lock:
            self._in_loky.discard(future)
        if self._initializer is not None and not future.cancelled():
            error = future.exception()
            if isinstance(error, InitializerError) and self._box.record(error):
                _initializer.log_failure(error)
        self._feed()

    def abort(self, futures: Sequence[Future[ChunkResult]]) -> None:
        """Cancel these chunks; kill loky's workers if some of them already run.

        See :meth:`Backend.abort`. loky cannot kill one worker, so its pool
        is killed (and a fresh one starts at the next chunk) only when every
        chunk still pending on it is one of ``futures``: another map's
        running chunks are never killed for this one (then the running
        chunks of this map run to their end, as they would without).
        """
        started = [future for future in futures if not future.cancel() and not future.done()]
        if not started:
            return
        # A bounded wait: a generator's finalizer may call this in a thread that
        # holds the lock (then the chunks are only cancelled).
        if not self._lock.acquire(timeout=0.5):
            return
        try:
            pool = self._pool
            others = self._in_loky.union(self._queue).difference(futures)
            if pool is None or any(not future.done() for future in others):
                return
            self._pool = None
        finally:
            self._lock.release()
        # Killed before the futures fail: loky fails them itself (nobody reads them).
        pool.shutdown(wait=True, kill_workers=True)
        # Named segments (the fallback) of replies the killed workers made.
        transport.sweep_dead_workers()
        for future in started:
            # loky may leave a killed chunk's future pending: fail it here, so
            # its request's shared memory is let go now, not at shutdown.
            try:
                future.set_exception(
                    WorkerCrashedError(
                        "the worker process running this chunk was killed: its map was "
                        "interrupted or closed",
                        shared_fate=True,
                    )
                )
            except InvalidStateError:
                pass  # loky failed it first

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            cancelled = list(self._queue) if cancel_futures else []
        for future in cancelled:
            future.cancel()
        self._feed()  # drops the cancelled ones
        if wait and type(threading.current_thread()).__name__ == "_ExecutorManagerThread":
            # From a done-callback, run by loky's thread: what is queued here
            # is handed over by that thread's callbacks, and loky cannot join
            # itself. It waits for nothing (as a fork pool's dispatcher does).
            wait = False
        if wait:
            self._sender.wait_idle()
            with self._drained:
                # Every queued chunk handed to loky (or failed, or cancelled).
                self._drained.wait_for(lambda: not self._queue)
                pool = self._pool
            if pool is not None:
                # kill_workers=False lets running chunks finish, as the stdlib does.
                pool.shutdown(wait=True, kill_workers=False)
            self._sender.wait_idle()  # broken pools replaced meanwhile are shut down there
            self._cache.close()
            return
        with self._lock:
            pool = self._pool if not self._queue else None
            self._stop_when_drained = bool(self._queue)
        if self._stop_when_drained:
            _DRAINING.add(self)
        if pool is not None:
            pool.shutdown(wait=False, kill_workers=False)
            self._cache.close()

    def signal_workers(self, signum: int) -> None:
        """Send ``signum`` to loky's workers; cancel what has not started.

        See :meth:`Backend.signal_workers`. ``SIGKILL`` goes through loky's
        public ``shutdown(kill_workers=True)``, which also kills the workers'
        own children; any other signal is sent as ``SIGTERM``, for which
        loky has no public way: its worker
        processes (``ProcessPoolExecutor._processes``) are each sent it, and
        where that attribute is gone (a later loky), they are killed
        instead. Once one worker dies loky breaks its pool and kills the
        others, so the chunks loky runs fail here at once with
        ``BrokenProcessPool``. With ``SIGKILL`` it returns once loky's
        workers are gone (milliseconds); otherwise at once, and the pool is
        joined on the backend's own thread.
        """
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            queued = list(self._queue)
            self._queue.clear()
            running = list(self._in_loky)
            self._drained.notify_all()
        for future in queued:
            if future.cancel():
                future.set_running_or_notify_cancel()
        if pool is None:
            self._cache.close()
            return
        kill = signum == getattr(signal, "SIGKILL", None)
        found = getattr(pool, "_processes", None)
        processes = list(found.values()) if isinstance(found, dict) else []
        if not isinstance(found, dict):
            kill = True
        for future in running:  # before loky fails them with its own words
            with contextlib.suppress(InvalidStateError):
                future.set_exception(
                    BrokenProcessPool(
                        f"{future._name} did not finish: {forced_by(signum)} signalled "
                        f"the loky worker processes"
                    )
                )
        if not kill:
            for process in processes:
                # As the stdlib's: Process.terminate() signals only a process
                # not reaped yet (never a reused pid).
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    if process.is_alive():
                        process.terminate()

        def join() -> None:
            # One shutdown call, with wait: after shutdown(wait=False) loky
            # keeps its manager thread (and its queues' named semaphores)
            # until the interpreter exits.
            pool.shutdown(wait=True, kill_workers=kill)
            for process in processes:  # loky kills them without waiting for them
                with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
                    process.join(JOIN_S)
            # Named segments (the fallback) of replies the workers made and
            # nobody will read; anonymous memory died with them.
            transport.sweep_dead_workers()
            self._cache.close()

        if kill:
            join()  # SIGKILL: over in milliseconds, as terminate() is
        else:
            self._sender.put(join)  # a worker may outlive SIGTERM: not here

    def terminate(self) -> None:
        """Stop now: cancel chunks not started and kill loky's workers."""
        with self._lock:
            self._closed = True
            pool = self._pool
            queued = list(self._queue)
            self._queue.clear()
            self._drained.notify_all()
        for future in queued:
            if future.cancel():
                future.set_running_or_notify_cancel()
        if pool is not None:
            pool.shutdown(wait=True, kill_workers=True)
            # Named segments (the fallback) of replies the killed workers made
            # and nobody will read; anonymous memory died with them.
            transport.sweep_dead_workers()
        self._cache.close()


def _itself(future: _ReplyFuture) -> _ReplyFuture:
    return future


def _pickled(future: _ReplyFuture) -> bool:
    return future._payload is not None
