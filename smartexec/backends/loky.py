"""The loky backend: chunks run on a loky process pool, pickled with cloudpickle.

loky starts workers with fork+exec (a clean interpreter, safe with threads)
and pickles calls with cloudpickle, so lambdas, closures, nested functions and
functions defined in ``__main__`` travel by value.

Each ``SmartExecutor`` owns its own ``loky.ProcessPoolExecutor`` rather than
sharing loky's process-wide reusable executor, so that ``shutdown()`` stops
exactly the workers this executor started and never another's.

When a loky worker dies, loky marks the whole pool broken and fails every
pending future with ``TerminatedWorkerError`` (a ``BrokenProcessPool``). The
backend then starts a fresh pool at the next submit, so the executor stays
usable; the chunks that were pending when the worker died are not retried.

Chunks are pickled by :mod:`smartexec.transport` in the submitting thread
(loky then only moves bytes): big numpy buffers go through shared memory both
ways, and a callable the policy marks ``share`` (big bound object, partial or
closure state), like an argument object repeated across calls, is sent once
to each worker and cached there, and reused only while proven unchanged.
Loky workers are started fresh, with no copy-on-write, so without this every
chunk would pickle the whole object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .. import _initializer, transport
from .._blas import thread_env, threads_per_worker
from .._diagnose import pickling_error
from .._futures import ChainedFuture
from .._remote import Call, ChunkResult
from .._system import WORKER_ENV
from ..errors import InitializerError, RemoteError
from ..inspection import callable_name
from ._base import Backend

__all__ = ["LokyBackend"]


class _ReplyFuture(ChainedFuture):
    """The chunk's future: completed from loky's future by unpickling the reply.

    Cancelling it cancels loky's future; the request's lease is released when
    loky's future is done, whatever happened.
    """

    def __init__(self, inner: Future[bytes], lease: transport.Lease, name: str):
        super().__init__(inner)
        self._name = name
        lease.release_when_done(inner)
        inner.add_done_callback(self._transfer)

    def _transfer(self, inner: Future[bytes]) -> None:
        self._inner = None
        if inner.cancelled():
            Future.cancel(self)
            self.set_running_or_notify_cancel()
            return
        if not self.set_running_or_notify_cancel():
            # Cancelled while loky ran it anyway: nobody reads this reply.
            if inner.exception() is None:
                transport.discard_reply(inner.result())
            return
        error = inner.exception()
        if error is not None:
            self.set_exception(error)
            return
        try:
            status, value = transport.loads_reply(inner.result())
        except BaseException as exc:
            self.set_exception(
                RemoteError(
                    type(exc).__qualname__,
                    f"the reply for {self._name} could not be unpickled in the parent: {exc}",
                )
            )
            return
        if status == "ok":
            self.set_result(value)
        else:
            self.set_exception(value)


class LokyBackend(Backend):
    """Runs chunks on a ``loky.ProcessPoolExecutor`` owned by this backend.

    A callable prepared with ``share=True`` is sent once to each worker and
    cached there (:class:`smartexec.transport.ObjectCache`), as is an argument
    object seen again within a few calls; big numpy buffers travel through
    shared memory.

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
        # loky's shutdown() has no cancel_futures: keep the pending ones to cancel.
        self._pending: set[Future[ChunkResult]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._cache = transport.ObjectCache()

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
        (:meth:`smartexec.transport.ObjectCache.callable_ref`), else sends
        the state again; the map's later chunks use that same copy.
        """
        return transport.CachedCallable(fn) if share else fn

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
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = self._new_pool()
            pool = self._pool
        user_fn = fn.fn if isinstance(fn, transport.CachedCallable) else fn
        try:
            payload, lease = transport.dumps_request(fn, chunk, budget_s, cache=self._cache)
        except Exception as exc:
            raise pickling_error(user_fn, chunk, exc, self.name) from exc
        try:
            try:
                inner = pool.submit(self._serve, payload)
            except BrokenProcessPool:
                # A worker died earlier and loky broke the pool: replace it once.
                broken = pool
                with self._lock:
                    if self._pool is broken:
                        self._pool = self._new_pool()
                    pool = self._pool
                broken.shutdown(wait=False, kill_workers=True)
                inner = pool.submit(self._serve, payload)
        except BaseException:
            lease.release()
            raise
        future = _ReplyFuture(inner, lease, callable_name(user_fn))
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[ChunkResult]) -> None:
        with self._lock:
            self._pending.discard(future)
        if self._initializer is not None and not future.cancelled():
            error = future.exception()
            if isinstance(error, InitializerError) and self._box.record(error):
                _initializer.log_failure(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pool = self._pool
            pending = list(self._pending) if cancel_futures else []
        for future in pending:
            future.cancel()
        if pool is not None:
            # kill_workers=False lets running chunks finish, as the stdlib does.
            pool.shutdown(wait=wait, kill_workers=False)
        self._cache.close()

    def terminate(self) -> None:
        """Stop now: cancel chunks not started and kill loky's workers."""
        with self._lock:
            self._closed = True
            pool = self._pool
            pending = list(self._pending)
        if pool is not None:
            # Kill first: cancelling loky's own futures while its manager thread
            # still runs makes it log an InvalidStateError.
            pool.shutdown(wait=True, kill_workers=True)
            # Named segments (the fallback) of replies the killed workers made
            # and nobody will read; anonymous memory died with them.
            transport.sweep_dead_workers()
        for future in pending:
            future.cancel()
        self._cache.close()
