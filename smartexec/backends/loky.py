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
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .._blas import thread_env, threads_per_worker
from .._remote import Call, ChunkResult, run_chunk
from .._system import WORKER_ENV
from ._base import Backend

__all__ = ["LokyBackend"]


class LokyBackend(Backend):
    """Runs chunks on a ``loky.ProcessPoolExecutor`` owned by this backend."""

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

    def _new_pool(self) -> Any:
        from loky import ProcessPoolExecutor

        # loky sets the environment before the worker imports anything.
        return ProcessPoolExecutor(
            max_workers=self.max_workers, env={**thread_env(self._blas_threads), WORKER_ENV: "1"}
        )

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = self._new_pool()
            pool = self._pool
        future: Future[ChunkResult]
        try:
            future = pool.submit(run_chunk, fn, chunk, True, budget_s)
        except BrokenProcessPool:
            # A worker died earlier and loky broke the pool: replace it once.
            broken = pool
            with self._lock:
                if self._pool is broken:
                    self._pool = self._new_pool()
                pool = self._pool
            broken.shutdown(wait=False, kill_workers=True)
            future = pool.submit(run_chunk, fn, chunk, True, budget_s)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[ChunkResult]) -> None:
        with self._lock:
            self._pending.discard(future)

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

    def terminate(self) -> None:
        """Stop now: cancel chunks not started and kill loky's workers."""
        with self._lock:
            self._closed = True
            pool = self._pool
            pending = list(self._pending)
        for future in pending:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True, kill_workers=True)
