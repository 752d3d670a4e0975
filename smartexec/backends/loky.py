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
to each worker and cached there. Loky workers are started fresh, with no
copy-on-write, so without this every chunk would pickle the whole object.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .. import transport
from .._blas import thread_env, threads_per_worker
from .._diagnose import pickling_error
from .._futures import ChainedFuture
from .._remote import Call, ChunkResult
from .._system import WORKER_ENV
from ..errors import RemoteError
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
    """

    name = "loky"
    pickles_closures = True
    #: Source: benchmarks/bench_overheads.py (2 workers start in ~0.2 s with
    #: their imports; 240-290 us per one-item chunk; 2-core machine, 2026-11-29).
    worker_startup_s = 0.1
    chunk_overhead_s = 250e-6

    def __init__(self, max_workers: int | None, cpu_count: int):
        super().__init__(max_workers, cpu_count)
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
        return ProcessPoolExecutor(
            max_workers=self.max_workers, env={**thread_env(self._blas_threads), WORKER_ENV: "1"}
        )

    def prepare(self, fn: Any, share: bool) -> Any:
        """Return ``fn``, or, with ``share``, a marker that sends it once per worker."""
        return transport.CachedCallable(fn) if share else fn

    def refresh(self, fn: Any) -> bool:
        """Make the next chunks of ``fn`` send its state as it is now.

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
                inner = pool.submit(transport.serve_request, payload)
            except BrokenProcessPool:
                # A worker died earlier and loky broke the pool: replace it once.
                broken = pool
                with self._lock:
                    if self._pool is broken:
                        self._pool = self._new_pool()
                    pool = self._pool
                broken.shutdown(wait=False, kill_workers=True)
                inner = pool.submit(transport.serve_request, payload)
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
            others = self._pending.difference(futures)
            if pool is None or any(not future.done() for future in others):
                return
            self._pool = None
        finally:
            self._lock.release()
        # Killed before the futures fail: loky fails them itself (nobody reads them).
        pool.shutdown(wait=True, kill_workers=True)

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
        for future in pending:
            future.cancel()
        self._cache.close()
