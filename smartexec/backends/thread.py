"""The thread backend: chunks run on a ``concurrent.futures.ThreadPoolExecutor``.

Right for work that releases the GIL (numpy kernels, hashing, compression,
I/O) and for any work on a free-threaded build: nothing is pickled and the
workers share the caller's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .._remote import Call, ChunkResult, run_chunk
from ._base import Backend

__all__ = ["ThreadBackend"]


class ThreadBackend(Backend):
    """Runs chunks on a thread pool owned by this backend."""

    name = "thread"
    shares_memory = True
    pickles_closures = True
    #: Source: benchmarks/bench_overheads.py (2-core machine, 2026-11-29).
    worker_startup_s = 0.0005
    chunk_overhead_s = 20e-6

    def __init__(self, max_workers: int | None, cpu_count: int):
        super().__init__(max_workers, cpu_count)
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="smartexec-thread")

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        """The stdlib's default, ``min(32, cpu_count + 4)``: room for I/O waits."""
        return min(32, cpu_count + 4)

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        return self._pool.submit(run_chunk, fn, chunk, False, budget_s)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
