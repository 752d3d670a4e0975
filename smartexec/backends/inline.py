"""The inline backend: run each chunk in the calling thread, at once.

Chosen when parallelism would cost more than it saves, or forced with
``backend="inline"`` (handy under a debugger: breakpoints and tracebacks are
those of a plain loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from .._remote import Call, ChunkResult, run_chunk
from ._base import Backend

__all__ = ["InlineBackend"]


class InlineBackend(Backend):
    """Runs chunks synchronously in the submitting thread."""

    name = "inline"
    shares_memory = True
    pickles_closures = True
    synchronous = True

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        return 1

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        future: Future[ChunkResult] = Future()
        future.set_running_or_notify_cancel()
        future.set_result(run_chunk(fn, chunk, False, budget_s))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None
