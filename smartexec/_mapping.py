"""The streaming map: lazy input, a bounded window of chunks, tuned chunksizes.

``SmartExecutor.map`` hands its work to :class:`ChunkStream`, which

* reads the input lazily, keeping at most ``buffersize`` chunks in flight, so
  ``map`` over an endless generator yields results promptly in flat memory;
* sizes each chunk from the latest per-item estimate
  (:func:`smartexec.tuning.chunksize`), unless the caller fixed ``chunksize``;
* feeds every finished chunk's measured compute time back into the estimate;
* re-sends the items a worker left when it stopped a chunk at its time budget
  (items that got slower than the estimate said), before waiting on anything;
* yields results in input order, raising each item's exception at its own
  position, and cancels every chunk still pending when the iterator is closed.

Only the thread that iterates touches a stream, so it needs no lock.
"""

from __future__ import annotations

import collections
import itertools
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator

from ._remote import Call, ChunkResult
from .tuning import Estimate, chunk_budget_s, chunksize, default_chunksize

__all__ = ["ChunkStream", "default_buffersize"]

Send = Callable[[list[Call], "float | None"], "Future[ChunkResult]"]


def default_buffersize(n_workers: int) -> int:
    """Chunks in flight when the caller gives no ``buffersize``.

    Two per worker keeps each worker's next chunk queued while it runs one,
    plus two so that a slow head chunk does not starve the others.
    """
    return 2 * max(1, n_workers) + 2


class _Slot:
    """Consecutive items sent as one chunk; part of it may be re-sent."""

    __slots__ = ("calls", "outcomes", "future")

    def __init__(self, calls: list[Call], future: Future[ChunkResult]):
        self.calls = calls  # the items with no outcome yet
        self.outcomes: list[tuple[bool, Any]] = []
        self.future = future


class ChunkStream:
    """Iterate the outcomes of a map sent to a backend chunk by chunk.

    Args:
        send: ``(calls, budget_s) -> Future[ChunkResult]``; sends one chunk.
        calls: the remaining ``(args, kwargs)`` items, consumed lazily.
        remaining: how many items ``calls`` holds, or None when unknown.
        n_workers: workers of the backend.
        overhead_s: the backend's cost per chunk, seconds.
        estimate: per-item estimate to read and update; None when the caller
            fixed the chunksize.
        fixed_chunksize: the caller's chunksize, or None to tune.
        buffersize: most chunks in flight (int >= 1).
        end_time: ``time.monotonic()`` deadline for each wait, or None.
        on_chunk_error: maps a chunk-level exception (and the chunk's items)
            to the exception to raise, e.g. a clearer pickling error.

    The first window is sent by the constructor, so errors in sending (an
    argument that cannot be pickled) raise from ``map`` itself.
    """

    def __init__(
        self,
        *,
        send: Send,
        calls: Iterator[Call],
        remaining: int | None,
        n_workers: int,
        overhead_s: float,
        estimate: Estimate | None,
        fixed_chunksize: int | None,
        buffersize: int,
        end_time: float | None,
        on_chunk_error: Callable[[BaseException, list[Call]], BaseException],
    ):
        self._send = send
        self._calls = calls
        self._remaining = remaining
        self._workers = n_workers
        self._overhead_s = overhead_s
        self._estimate = estimate
        self._fixed = fixed_chunksize
        self._buffersize = buffersize
        self._end_time = end_time
        self._on_chunk_error = on_chunk_error
        self._window: collections.deque[_Slot] = collections.deque()
        self._exhausted = False
        self.sizes: list[int] = []  # every chunksize sent, for explain() and tests
        try:
            self._refill()
        except BaseException:
            self.cancel()
            raise

    # -- sending -----------------------------------------------------------------

    def _next_size(self) -> tuple[int, float | None]:
        if self._fixed is not None:
            return self._fixed, None
        per_item = self._estimate.per_item_s if self._estimate is not None else None
        if per_item is None:
            if self._remaining is None:
                return 1, None
            return default_chunksize(self._remaining, self._workers), None
        size = chunksize(per_item, self._workers, self._overhead_s, self._remaining)
        return size, chunk_budget_s(per_item, size)

    def _refill(self) -> None:
        while not self._exhausted and len(self._window) < self._buffersize:
            size, budget = self._next_size()
            chunk = list(itertools.islice(self._calls, size))
            if not chunk:
                self._exhausted = True
                return
            if len(chunk) < size:
                self._exhausted = True
            if self._remaining is not None:
                self._remaining -= len(chunk)
            self._window.append(_Slot(chunk, self._send(chunk, budget)))
            self.sizes.append(len(chunk))

    def _absorb(self, slot: _Slot) -> None:
        """Take a finished chunk's outcomes; re-send what the worker left."""
        future = slot.future
        try:
            result = future.result(timeout=0)
        except BaseException as exc:
            if future.cancelled():
                raise
            raise self._on_chunk_error(exc, slot.calls) from exc
        done = len(result.outcomes)
        if self._estimate is not None:
            self._estimate.observe(done, result.compute_s)
        slot.outcomes.extend(result.outcomes)
        slot.calls = slot.calls[done:]
        if slot.calls:
            per_item = result.compute_s / max(done, 1)
            slot.future = self._send(slot.calls, chunk_budget_s(per_item, len(slot.calls)))

    def _resend_partials(self) -> None:
        for slot in self._window:
            future = slot.future
            if slot.calls and future.done() and not future.cancelled() and future.exception() is None:
                self._absorb(slot)

    # -- receiving ---------------------------------------------------------------

    def _wait(self, slot: _Slot) -> list[tuple[bool, Any]]:
        while slot.calls:
            self._resend_partials()
            if not slot.calls:
                break
            if self._end_time is None:
                slot.future.exception()  # wait; errors are raised by _absorb
            else:
                slot.future.exception(timeout=self._end_time - time.monotonic())
            self._absorb(slot)
        return slot.outcomes

    def __iter__(self) -> Iterator[tuple[bool, Any]]:
        try:
            while self._window:
                outcomes = self._wait(self._window[0])
                self._window.popleft()
                self._refill()
                yield from outcomes
                del outcomes
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Cancel every chunk not yet running; mark the input exhausted."""
        self._exhausted = True
        for slot in self._window:
            slot.future.cancel()
        self._window.clear()
