"""An example smartexec backend: chunks run on threads, and each one is logged.

Installed, it is found by name through the ``smartexec.backends`` entry point
that ``pyproject.toml`` declares::

    SmartExecutor(backend="logthreads", level=logging.DEBUG, on_chunk=print)

Everything it uses from smartexec is public (``smartexec.backends``), and it
implements exactly the interface the built-in backends do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from smartexec.backends import Backend, Call, ChunkResult, run_chunk

__all__ = ["LoggingThreadBackend", "ChunkRecord"]

log = logging.getLogger(__name__)


class ChunkRecord(NamedTuple):
    """What the hook receives for each finished chunk.

    Attributes:
        name: the callable's qualified name, e.g. ``"Index.query"``.
        items: how many items of the chunk ran (a prefix when the chunk
            stopped at its time budget).
        errors: how many of them raised.
        compute_s: seconds spent running them.
        thread: the name of the worker thread.
    """

    name: str
    items: int
    errors: int
    compute_s: float
    thread: str


class LoggingThreadBackend(Backend):
    """Runs chunks on a thread pool and logs each one.

    Args:
        max_workers: worker threads (int >= 1); None means
            ``min(32, cpu_count + 4)``, as ``ThreadPoolExecutor``.
        cpu_count: CPUs this process may use.
        level: the logging level of the per-chunk record (an int such as
            ``logging.INFO``).
        on_chunk: called with a :class:`ChunkRecord` in the worker thread
            after each chunk, or None. An exception it raises is logged and
            does not affect the chunk's results.

    Raises:
        TypeError: ``level`` is not an int, or ``on_chunk`` is not callable.
    """

    name = "logthreads"
    shares_memory = True  # threads of this process: nothing is pickled
    pickles_closures = True  # ... so lambdas and closures run as they are
    #: Source: the thread backend's figures (benchmarks/bench_overheads.py in
    #: smartexec), plus one log record per chunk.
    worker_startup_s = 0.0005
    chunk_overhead_s = 30e-6

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        level: int = logging.INFO,
        on_chunk: Callable[[ChunkRecord], Any] | None = None,
    ):
        super().__init__(max_workers, cpu_count)
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"level must be a logging level (int), got {level!r}")
        if on_chunk is not None and not callable(on_chunk):
            raise TypeError(f"on_chunk must be callable or None, got {on_chunk!r}")
        self._level = level
        self._on_chunk = on_chunk
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="logthreads")

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        return min(32, cpu_count + 4)

    def describe(self, fn: Callable[..., Any]) -> tuple[str, ...]:
        level = logging.getLevelName(self._level)
        hook = " and passed to on_chunk" if self._on_chunk is not None else ""
        return (f"{self.max_workers} threads; each chunk is logged at {level}{hook}",)

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        return self._pool.submit(self._run, fn, chunk, budget_s)

    def _run(self, fn: Any, chunk: Sequence[Call], budget_s: float | None) -> ChunkResult:
        result = run_chunk(fn, chunk, False, budget_s)
        record = ChunkRecord(
            name=getattr(fn, "__qualname__", type(fn).__qualname__),
            items=len(result.outcomes),
            errors=sum(1 for ok, _ in result.outcomes if not ok),
            compute_s=result.compute_s,
            thread=threading.current_thread().name,
        )
        log.log(
            self._level,
            "%s: %d of %d items in %.3f ms, %d errors (%s)",
            record.name,
            record.items,
            len(chunk),
            record.compute_s * 1000,
            record.errors,
            record.thread,
        )
        if self._on_chunk is not None:
            try:
                self._on_chunk(record)
            except Exception:
                log.exception("on_chunk hook failed for a chunk of %s", record.name)
        return result

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
