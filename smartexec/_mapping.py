"""The streaming map: lazy input, a bounded window of chunks, tuned chunksizes.

``SmartExecutor.map`` hands its work to :class:`ChunkStream`, which

* reads the input lazily, keeping ``buffersize`` chunks in flight beyond the
  results the caller took (one more while it waits, as Python 3.14's
  ``Executor.map``), so ``map`` over an endless generator yields results
  promptly in flat memory;
* sizes each chunk from the latest per-item estimate
  (:func:`smartexec.tuning.chunksize`), unless the caller fixed ``chunksize``;
* feeds every finished chunk's measured compute time back into the estimate;
* re-sends the items a worker left when it stopped a chunk at its time budget
  (items that got slower than the estimate said), before waiting on anything;
* yields results in input order, raising each item's exception at its own
  position (or, read with ``ordered=False``, chunk by chunk as the chunks
  complete: :func:`stream_values`), and cancels every chunk still pending
  when the iterator stops;
  when it stops by ``KeyboardInterrupt``, ``SystemExit`` or ``close()``, it
  also stops the chunks already running (``Backend.abort``).

Only the thread that iterates touches a stream, so it needs no lock.

It also holds the inline side of a map: :class:`InlineRun` (time-bounded
batches in the calling thread, measured), :func:`inline_batches` (the lazy
rest of an inline map, re-deciding as it goes) and the iterators that hand
results over without keeping them alive (:func:`drain`, :func:`stream_values`).
"""

from __future__ import annotations

import array
import collections
import concurrent.futures
import itertools
import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ._remote import Call, ChunkResult, run_chunk
from .errors import TaskTimeoutError, WorkerCrashedError
from .transport import BIG_BUFFER_BYTES, SHM_WRITE_S_PER_BYTE, estimate_send_s, send_parts

if TYPE_CHECKING:
    from .backends._base import Backend
    from .policy import Decision

from .tuning import (
    MAX_CHUNK_ITEMS,
    PROBE_S,
    Estimate,
    Verdict,
    chunk_budget_s,
    chunksize,
    default_chunksize,
)

T = TypeVar("T")

LOGGER = logging.getLogger("smartexec")

__all__ = [
    "StreamPlan",
    "ChunkStream",
    "InlineRun",
    "as_generator",
    "read_up_to",
    "default_buffersize",
    "common_length",
    "snapshot_inputs",
    "dear_to_send",
    "SendableChain",
    "count_at_end",
    "drain",
    "inline_batches",
    "lazy_inline",
    "measure_pickling",
    "stream_values",
    "then_raise",
]

Send = Callable[[list[Call], "float | None"], "Future[ChunkResult]"]
Abort = Callable[[Sequence["Future[ChunkResult]"]], None]


def default_buffersize(n_workers: int) -> int:
    """Chunks in flight when the caller gives no ``buffersize``.

    Two per worker keeps each worker's next chunk queued while it runs one,
    plus two so that a slow head chunk does not starve the others.
    """
    return 2 * max(1, n_workers) + 2


class _Slot:
    """Consecutive items sent as one chunk; part of it may be re-sent."""

    __slots__ = ("calls", "outcomes", "future", "retries", "spared", "error")

    def __init__(self, calls: list[Call], future: Future[ChunkResult], retries: int = 0):
        self.calls = calls  # the items with no outcome yet
        self.outcomes: list[tuple[bool, Any]] = []
        self.future = future
        self.retries = retries  # re-sends left after a worker death
        self.spared = False  # had its free re-run after another worker's death
        #: The error of ``calls`` met by :meth:`ChunkStream.finish`, raised
        #: where the stream is read.
        self.error: BaseException | None = None


#: From an input of unknown length, a chunk is sent once filling it has taken
#: this many seconds, full or not.
FILL_S = 0.05


@dataclass(frozen=True)
class StreamPlan:
    """What a map's :class:`ChunkStream` is opened from (:func:`smartexec._routed_map.open_stream`).

    Attributes:
        fn: the user's callable.
        decision: where it runs (``decision.share``: by copy-on-write).
        estimate: the per-item figures the chunks are sized from.
        backend: the backend the chunks go to.
        chunksize: the user's fixed chunk size, or None (tuned).
        buffersize: chunks on their way at most, or None (the default window).
        end_time: ``time.monotonic()`` deadline of the map, or None.
        task_timeout: seconds per call, or None.
        measure_first: chunks hold one item until an item is measured.
        on_result: sees each chunk's reply and its calls.
        probe: the first chunks' sizes before the full window (see :class:`ChunkStream`).
        on_send: hears ``(items, seconds)`` of each chunk's sending.
        keep_first_error: see :class:`ChunkStream`.
        clocked: whether the chunks sent now need their CPU seconds (a
            router reads them); None: no chunk does. A backend with an
            ``unclocked`` method (threads) then runs them without reading
            the thread's CPU clock, which costs a thread its turn under load.
    """

    fn: Any
    decision: Decision
    estimate: Estimate
    backend: Backend
    chunksize: int | None = None
    buffersize: int | None = None
    end_time: float | None = None
    task_timeout: float | None = None
    measure_first: bool = False
    on_result: Callable[[ChunkResult, list[Call]], None] | None = None
    probe: tuple[int, int] | None = None
    on_send: Callable[[int, float], None] | None = None
    keep_first_error: bool = False
    clocked: Callable[[], bool] | None = None


class ChunkStream:
    """Iterate the outcomes of a map sent to a backend chunk by chunk.

    Args:
        send: ``(calls, budget_s) -> Future[ChunkResult]``; sends one chunk.
        calls: the remaining ``(args, kwargs)`` items, consumed lazily.
        remaining: how many items ``calls`` holds, or None when unknown.
        n_workers: workers of the backend.
        overhead_s: the backend's cost per chunk, seconds; kept as the
            attribute ``chunk_overhead_s``, which a caller may raise when it
            measures a dearer one (a big argument proven once per chunk).
        estimate: per-item estimate to read and update; None when the caller
            fixed the chunksize.
        fixed_chunksize: the caller's chunksize, or None to tune.
        buffersize: most chunks in flight (int >= 1).
        end_time: ``time.monotonic()`` deadline for each wait, or None.
        on_chunk_error: maps a chunk-level exception (and the chunk's items)
            to the exception to raise, e.g. a clearer pickling error.
        in_process: the backend runs chunks in this process (threads): until
            an item is measured, chunks hold one item so results stream.
        max_retries: times an item is sent again after its worker died
            (:class:`~smartexec.errors.WorkerCrashedError`).
        measure_first: until an item is measured, chunks hold one item, so
            every worker starts at once and the first results (and the first
            per-item time, for the chunksize) come back soonest.
        abort: ``(futures) -> None``: stops those chunks, running ones too
            (:meth:`~smartexec.backends._base.Backend.abort`); called when
            the iteration ends by ``KeyboardInterrupt``, ``SystemExit`` or
            ``close()``. None: such chunks are only cancelled.
        keep_first_error: an error reading the input or sending the first
            window is kept, raised where the stream is read, as a later
            one is (for the rest of a map that moved: the results before
            it, on the other backend, come first); False raises it from
            here when no chunk was sent before it.
        probe: ``(chunks, items)``: until that many chunks' results are
            taken, only that many chunks of at most that many items each
            are sent, then the full window. For items measured too cheap to
            send (an earlier map moved them to a loop here): the router
            settles on the probe's figures before a window of big chunks is
            under way.
        on_result: ``(result, calls) -> None``, called with each chunk's
            :class:`~smartexec._remote.ChunkResult` as it is taken (before
            more input is read): the map's router reads the evidence there,
            and may :meth:`detach` this stream.

    When a chunk of several items fails as a whole — its worker died, or it
    ran past the ``task_timeout`` — the stream cannot tell which item was to
    blame, so it sends the chunk's items again one per chunk, whatever
    ``max_retries`` (those re-sends are charged to no item): the culprit
    then fails alone, at its own position, and the others get their results.
    Those items run twice, side effects included. Otherwise the chunk's
    error is raised at the position of its first item.

    The first window is sent by the constructor, so errors in sending (an
    argument that cannot be pickled) raise from ``map`` itself; an error of
    the input comes after the results of the items read before it, wherever
    it happens (from ``map`` itself only when no item came before it).
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
        in_process: bool = False,
        max_retries: int = 0,
        measure_first: bool = False,
        abort: Abort | None = None,
        on_result: Callable[[ChunkResult, list[Call]], None] | None = None,
        probe: tuple[int, int] | None = None,
        keep_first_error: bool = False,
    ):
        self._send = send
        self._calls = calls
        self._remaining = remaining
        self._length = remaining or 0  # the input's length when the map started
        self._workers = n_workers
        self.chunk_overhead_s = overhead_s
        self._estimate = estimate
        self._fixed = fixed_chunksize
        self._buffersize = buffersize
        self._end_time = end_time
        self._on_chunk_error = on_chunk_error
        self._in_process = in_process
        self._max_retries = max_retries
        self._measure_first = measure_first
        self._abort = abort
        self._on_result = on_result
        #: (chunks still to send, results still to take, items per chunk) while probing
        self._probe = [probe[0], probe[0], probe[1]] if probe is not None else None
        self._window: collections.deque[_Slot] = collections.deque()
        self._budgets = True  # chunks carry a time budget (see send_rest)
        self._exhausted = False
        self.sizes: list[int] = []  # every chunksize sent, for explain() and tests
        self._input_error: BaseException | None = None  # raised after the chunks before it
        # The reader's thread and shutdown's (send_rest, finish) may both read
        # the input and take chunks: one at a time.
        self._lock = threading.RLock()
        #: Called once the stream is cancelled or aborted (its map ended or was
        #: closed): an executor stops counting it among the maps to finish.
        self.on_cancel: Callable[[], None] | None = None
        try:
            self._refill()
        except Exception as exc:
            if not keep_first_error and (exc is not self._input_error or not self._window):
                self.cancel()
                raise
            # Raised by chunks() after the chunks sent before it (none, or
            # the window's): its place in the input.
            self._input_error = exc
            self._exhausted = True
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
            # Sized once, from the whole input, as multiprocessing.Pool.map does:
            # recomputed from what is left, the first window's chunks shrank.
            size = default_chunksize(self._length, self._workers, in_process=self._in_process)
            if self._measure_first:
                # One item per chunk until one is measured: every worker gets
                # work at once, and the first figures come back soonest.
                size = 1
            return min(size, MAX_CHUNK_ITEMS), None
        size = chunksize(
            per_item,
            self._workers,
            self.chunk_overhead_s,
            self._remaining,
            in_process=self._in_process,
        )
        return size, chunk_budget_s(per_item, size) if self._budgets else None

    def _take(self, size: int) -> tuple[list[Call], BaseException | None]:
        """Read up to ``size`` calls; the items read before an input error come too.

        From an input of unknown length, a chunk also ends once filling it has
        taken :data:`FILL_S` seconds: a slow producer (a socket, a queue) must
        not hold back the items it already gave.
        """
        calls = self._calls
        if self._remaining is not None:
            return read_up_to(calls, size)
        chunk: list[Call] = []
        deadline = time.monotonic() + FILL_S
        try:
            for call in calls:
                chunk.append(call)
                if len(chunk) >= size or time.monotonic() >= deadline:
                    return chunk, None
        except Exception as exc:
            return chunk, exc
        self._exhausted = True
        return chunk, None

    def _refill(self, extra: int = 0) -> None:
        """Send chunks until ``buffersize`` (plus ``extra``) are in flight, or the input ends."""
        while not self._exhausted and len(self._window) < self._buffersize + extra:
            if self._remaining is not None and self._remaining <= 0:
                # More items than its __len__ said: its length is unknown from
                # here (sized tail rules would send one-item chunks forever).
                self._remaining = None
            size, budget = self._next_size()
            probe = self._probe
            if probe is not None and probe[0] <= 0:
                if self._window:
                    return  # the probe's chunks are out: wait for their figures
                # None left in flight: never an empty window with input left
                # (the readers take an empty window for the end of the map).
                probe = self._probe = None
                size, budget = self._next_size()
            if probe is not None:
                probe[0] -= 1
                size = min(size, probe[2])
            chunk, error = self._take(size)
            if error is not None:
                self._exhausted = True
            elif not chunk:
                self._exhausted = True
                return
            elif len(chunk) < size and self._remaining is not None:
                self._exhausted = True
            if chunk:
                if self._remaining is not None:
                    self._remaining -= len(chunk)
                self._window.append(_Slot(chunk, self._send(chunk, budget), self._max_retries))
                self.sizes.append(len(chunk))
            if error is not None:
                self._input_error = error
                raise error

    def probe_again(self) -> None:
        """Send one one-item chunk per worker next, then wait for them, as the first probe did.

        For a map whose first figures gave no verdict yet, while sending is
        most of its items' cost (see ``dear`` in
        :meth:`~smartexec.SmartExecutor._routed_map`). Does nothing while a
        probe is under way, or once the input is read.
        """
        with self._lock:
            if self._probe is None and not self.input_read:
                self._probe = [self._workers, self._workers, 1]

    def _absorb(self, slot: _Slot) -> None:
        """Take a finished chunk's outcomes; re-send what the worker left."""
        future = slot.future
        try:
            result = future.result(timeout=0)
        except BaseException as exc:
            if future.cancelled():
                raise
            if self._recover(slot, exc):
                return
            error = self._on_chunk_error(exc, slot.calls)
            if error is exc:
                raise
            raise error from exc
        done = len(result.outcomes)
        probe = self._probe
        if probe is not None:
            probe[1] -= 1
            if probe[1] <= 0:
                self._probe = None  # measured: the full window from here
        calls = slot.calls[:done]
        slot.outcomes.extend(result.outcomes)
        slot.calls = slot.calls[done:]
        if slot.calls:
            per_item = result.compute_s / max(done, 1)
            slot.future = self._send(slot.calls, chunk_budget_s(per_item, len(slot.calls)))
        self._advise(result, calls)

    def _advise(self, result: ChunkResult, calls: list[Call]) -> None:
        """Feed a chunk's figures to the estimate and the router: advice, never an error.

        Runs after the chunk's outcomes are kept, so that a failure in the
        advice (the router, the stats, the profile store) loses no result: it
        is logged (logger ``smartexec``) and the map goes on where it is.
        """
        try:
            if self._estimate is not None:
                self._estimate.observe(len(calls), result.compute_s)
            if self._on_result is not None:
                self._on_result(result, calls)
        except Exception:  # noqa: BLE001 - advice is isolated from the results
            LOGGER.warning("smartexec: a map's routing advice failed; it stays put", exc_info=True)

    def _recover(self, slot: _Slot, exc: BaseException) -> bool:
        """Re-send a failed chunk's items where the failure allows; True if done so."""
        crashed = isinstance(exc, WorkerCrashedError)
        if not (crashed or isinstance(exc, TaskTimeoutError)):
            return False
        if len(slot.calls) > 1:
            # Which item was it? Send each alone, right after this slot. The
            # failure is charged to none of them: the culprit fails again alone
            # (and spends its own retries), the others give their results.
            singles = [_Slot([call], self._send([call], None), slot.retries) for call in slot.calls]
            slot.calls = []
            at = self._window.index(slot)  # the head, unless read in completion order
            for offset, single in enumerate(singles, start=1):
                self._window.insert(at + offset, single)
            return True
        if isinstance(exc, WorkerCrashedError) and exc.shared_fate and not slot.spared:
            # A backend whose one dead worker fails every chunk it holds (loky):
            # this item may have died of another's crash. One free re-run; the
            # culprit crashes again and fails.
            slot.spared = True
            slot.future = self._send(slot.calls, None)
            return True
        if crashed and slot.retries > 0:
            slot.retries -= 1
            slot.future = self._send(slot.calls, None)
            return True
        return False

    def _resend_partials(self) -> None:
        for slot in self._window:
            future = slot.future
            if (
                slot.calls
                and future.done()
                and not future.cancelled()
                and future.exception() is None
            ):
                self._absorb(slot)

    # -- receiving ---------------------------------------------------------------

    def _wait(self, slot: _Slot) -> list[tuple[bool, Any]]:
        while True:
            with self._lock:
                if slot.error is not None:
                    raise slot.error
                if slot.calls:
                    self._resend_partials()
                if not slot.calls:
                    return slot.outcomes
                future = slot.future
            # Not under the lock: a shutdown from the thread that completes
            # this future (a done-callback) takes the lock to send the rest.
            if self._end_time is None:
                future.exception()  # wait; errors are raised by _absorb
            else:
                future.exception(timeout=self._end_time - time.monotonic())
            with self._lock:
                if slot.future is future and slot.calls and slot.error is None:
                    self._absorb(slot)  # else finish() took it meanwhile

    def chunks(self) -> Iterator[list[tuple[bool, Any]]]:
        """Yield each chunk's outcomes, in input order; cancel the rest on exit.

        An error while reading the input or sending a later chunk (an argument
        that cannot be pickled) is raised after the results of every chunk
        already sent, which is its position in the input.
        """
        late_error = self._input_error  # the input failed within the first window
        try:
            while self._window or (late_error is None and not self._exhausted):
                if late_error is None:
                    # As Python 3.14's Executor.map: each result asked for sends
                    # one more chunk before the wait, so the workers have the
                    # next while the caller waits, and ``buffersize`` chunks
                    # are in flight while it holds a result (one more in the
                    # wait). At most one chunk is read here: a slow producer
                    # holds a ready result back by one chunk's filling at most.
                    try:
                        with self._lock:
                            self._refill(extra=1)
                    except Exception as exc:
                        late_error = exc
                        self._exhausted = True
                with self._lock:
                    if not self._window:
                        break  # the input ended as the refill read it
                    head = self._window[0]
                outcomes = self._wait(head)
                with self._lock:
                    if self._window and self._window[0] is head:
                        self._window.popleft()
                del head  # holds the outcomes: none may outlive its reading
                yield outcomes
                del outcomes
            if late_error is None:
                late_error = self._input_error  # met by send_rest() while this waited
            if late_error is not None:
                raise late_error
        except Exception:
            raise  # an error of the map (timeout, input): cancel what has not started
        except BaseException:
            # Ctrl-C, SystemExit, or the consumer closed the iterator (GeneratorExit):
            # nobody will read the chunks running now either.
            self.abort()
            raise
        finally:
            self.cancel()

    # -- receiving in completion order (read by _as_completed) ---------------------

    def next_done(self) -> list[tuple[bool, Any]] | None:
        """Take one finished chunk, whichever it is; return the outcomes it brought.

        Waits for nothing. A chunk its worker stopped part-way brings the
        outcomes of its finished items and stays in the window, re-sent for
        the rest; a failed chunk is re-sent where :meth:`_recover` allows
        (bringing ``[]``), else its error is raised. Reads no input: call
        :meth:`top_up` after handing the outcomes out.

        Returns:
            The outcomes, in the chunk's order; None when no chunk has finished.
        """
        with self._lock:
            return self._next_done()

    def _next_done(self) -> list[tuple[bool, Any]] | None:
        for slot in self._window:
            # not slot.calls: taken whole by finish(), its future already read
            if not slot.calls or slot.error is not None or slot.future.done():
                break
        else:
            return None
        if slot.error is not None:
            raise slot.error
        if slot.calls:
            self._absorb(slot)
        outcomes, slot.outcomes = slot.outcomes, []
        if not slot.calls:
            self._window.remove(slot)
        return outcomes

    def top_up(self) -> None:
        """Send chunks until ``buffersize`` are in flight again, as input allows.

        An error of the input, or in sending, ends the input and is kept for
        :attr:`late_error`, as :meth:`chunks` keeps it.
        """
        try:
            with self._lock:
                self._refill()
        except Exception as exc:
            self._input_error = exc
            self._exhausted = True

    def pending(self) -> list[Future[ChunkResult]]:
        """The futures of the chunks in flight (each chunk's latest send)."""
        return [slot.future for slot in self._window]

    @property
    def late_error(self) -> BaseException | None:
        """The input's (or a send's) error, once every chunk sent before it is done; else None."""
        return None if self._window else self._input_error

    @property
    def end_time(self) -> float | None:
        """The map's ``time.monotonic()`` deadline, or None."""
        return self._end_time

    @property
    def remaining(self) -> int | None:
        """Items of the input not read yet, or None when its length is unknown."""
        return self._remaining

    @property
    def input_read(self) -> bool:
        """Whether no more of the input will be read (all of it was, or the stream was detached)."""
        return self._exhausted or self._remaining == 0

    def detach(self) -> int | None:
        """Read no more input; the chunks sent still run and their outcomes come.

        Returns:
            The items of the input not read, or None when its length is unknown.
        """
        self._exhausted = True
        return self._remaining

    def reattach(self) -> None:
        """Undo :meth:`detach`: read the input again (the move it was for failed)."""
        self._exhausted = False
        self._refill()

    def send_rest(self, budgets: bool = True) -> None:
        """Send every item of the input not read yet now, whatever ``buffersize``.

        What :meth:`~smartexec.SmartExecutor.shutdown` does for a map it must
        finish: the stdlib's ``map`` submits every item when called, so its
        items all run, and its results can be read after the shutdown. An
        error of the input is kept, raised where the stream is read, after
        the results before it. ``budgets=False`` sends the chunks with no
        time budget: workers run them whole (nobody may be there to send a
        stopped chunk's rest again).
        """
        with self._lock:
            if self.input_read:
                return
            # Unmeasured, chunks are sized as multiprocessing.Pool.map sizes
            # them, not one item each: nobody waits for a first result now.
            self._probe = None
            self._measure_first = False
            self._budgets = budgets
            try:
                self._refill(extra=sys.maxsize)
            except Exception as exc:
                self._input_error = exc
                self._exhausted = True

    def finish(self) -> None:
        """Wait for every chunk sent, re-sending what workers left, and keep the outcomes.

        What :meth:`~smartexec.SmartExecutor.shutdown` does after
        :meth:`send_rest`, while the backends still take chunks: the rest of
        a chunk its worker stopped at its time budget, and the items of a
        chunk whose worker died, are sent again only as the stream is read,
        and read after the shutdown they could not be. Each chunk's outcomes
        (or its error, raised at its place) wait in the window for the
        reader. Waits with no timeout, as a shutdown does.
        """
        while True:
            with self._lock:
                # The first chunk with items left: each round takes outcomes,
                # re-sends, or keeps an error. A reader may take chunks
                # meanwhile, and _recover inserts the items of one it splits.
                slot = next((s for s in self._window if s.calls and s.error is None), None)
                if slot is None:
                    return
                future = slot.future
            try:
                future.exception()  # wait, not under the lock (see _wait)
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    raise
            with self._lock:
                if slot.future is future and slot.calls and slot.error is None:
                    try:
                        self._absorb(slot)
                    except Exception as exc:
                        slot.error = exc

    @property
    def settled(self) -> bool:
        """Whether nothing is left to send: the input read, no chunk to re-send.

        True once every chunk in the window finished whole (a chunk its
        worker stopped part-way, or one that failed, may need re-sending);
        a stream :meth:`finish` need not wait for. Waits for nothing.
        """
        if not self.input_read:
            return False
        for slot in list(self._window):
            future = slot.future
            if slot.error is not None or not slot.calls:
                continue
            if not future.done() or future.cancelled() or future.exception() is not None:
                return False
            if len(future.result().outcomes) < len(slot.calls):
                return False
        return True

    def cancel(self) -> None:
        """Cancel every chunk not yet running; mark the input exhausted."""
        self._exhausted = True
        for slot in self._window:
            slot.future.cancel()
        self._window.clear()
        self._cancelled()

    def _cancelled(self) -> None:
        hook, self.on_cancel = self.on_cancel, None
        if hook is not None:
            hook()

    def abort(self) -> None:
        """Stop every chunk of this map, running ones too; mark the input exhausted.

        Hands the chunks' futures to the ``abort`` callback (the backend kills
        the process workers running them); without one, only cancels.
        """
        futures = [slot.future for slot in self._window]
        self._exhausted = True
        self._window.clear()
        self._cancelled()
        if self._abort is None:
            for future in futures:
                future.cancel()
        else:
            self._abort(futures)


#: Below this many seconds per item, batches run through ``itertools.starmap``
#: (no per-item timing: the clock would cost as much as the item).
TINY_ITEM_S = 1e-6
#: Items per starmap batch between two looks at the clock.
TINY_BATCH = 1024
#: A loop's batches of tiny items keep growing (fourfold, up to 16 times
#: ``TINY_BATCH``) while one takes under this many seconds: each look at the
#: clock and the estimate costs ~20 us, a fifth of a 1,024-item batch of
#: 0.1 us items. Should the items turn slow mid-batch, the batch costs what a
#: plain loop of them costs.
TINY_BATCH_S = 0.001
#: A C-level batch shorter than this (seconds) does not enter the estimate:
#: its time is mostly its first calls' cold caches and the look at the
#: clock. The loop's first batch, 16 items of 0.1 us, read over 1 us each,
#: which sent the next 10 ms of items one by one past the clock (a stored
#: loop took 29-38 ms where a plain loop took 18-20 ms).
MIN_OBSERVED_S = 1e-4


class InlineRun:
    """Runs a map's items in the calling thread in time-bounded batches.

    Each batch lasts about ``seconds`` and updates ``estimate``, so the
    caller can re-decide between batches whether to keep going inline or to
    hand the rest to workers. The first batch (``per_item_s`` unknown) grows
    from one item, doubling, so a slow first item is not run many times over.

    Args:
        fn: the callable.
        inputs: the items, consumed lazily: argument tuples when ``star``,
            else single arguments (a one-iterable map skips building tuples).
        estimate: the callable's per-item estimate, updated after each batch.
        star: whether each input is a tuple of arguments.

    Attributes:
        exhausted: True once ``inputs`` ran out.
        error: the first exception an item raised (the run stops there, as a
            loop would), or None.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Iterator[Any],
        estimate: Estimate,
        star: bool,
        on_batch: Callable[[int, float], None] | None = None,
    ):
        self.fn = fn
        self.inputs = inputs
        self.star = star
        self.estimate = estimate
        self.on_batch = on_batch  # (items, seconds) after each batch: for stats
        self.exhausted = False
        self.error: BaseException | None = None
        self.items = 0
        self.elapsed_s = 0.0

    def batch(self, seconds: float, max_items: int) -> list[Any]:
        """Run items for about ``seconds`` (at most ``max_items``); return results."""
        results: list[Any] = []
        fn, inputs = self.fn, self.inputs
        apply = itertools.starmap if self.star else map
        per_item = self.estimate.per_item_s
        start = time.perf_counter()
        if per_item is None or per_item < TINY_ITEM_S:
            size = 1 if per_item is None else TINY_BATCH
            while True:
                before = len(results)
                try:
                    results.extend(apply(fn, itertools.islice(inputs, size)))
                except Exception as exc:  # KeyboardInterrupt and SystemExit propagate
                    self.error = exc
                    break
                if len(results) - before < size:
                    self.exhausted = True
                    break
                elapsed = time.perf_counter() - start
                if elapsed >= seconds or len(results) >= max_items:
                    break
                size = min(2 * size, TINY_BATCH * 8, max_items - len(results))
                if elapsed + elapsed / len(results) * size > 1.5 * seconds:
                    break  # the next batch would overshoot: slow items, measured enough
        else:
            deadline = start + seconds
            append = results.append
            while True:
                try:
                    item = next(inputs)
                except StopIteration:
                    self.exhausted = True
                    break
                except Exception as exc:  # the input itself failed: at this position
                    self.error = exc
                    break
                try:
                    append(fn(*item) if self.star else fn(item))
                except Exception as exc:
                    self.error = exc
                    break
                if time.perf_counter() >= deadline or len(results) >= max_items:
                    break
        elapsed = time.perf_counter() - start
        self.estimate.observe(len(results) + (self.error is not None), elapsed)
        self.items += len(results)
        self.elapsed_s += elapsed
        if self.on_batch is not None:
            self.on_batch(len(results) + (self.error is not None), elapsed)
        return results


def read_up_to(items: Iterator[T], n: int) -> tuple[list[T], Exception | None]:
    """Read up to ``n`` items at C speed; an input error comes back with what came before it.

    Returns:
        ``(items read, None)``, fewer than ``n`` at the end of the input; or
        ``(items read before the error, the error)`` when reading raised an
        ``Exception`` (anything else propagates).
    """
    taken: list[T] = []
    try:
        taken.extend(itertools.islice(items, n))  # extend keeps what it appended
    except Exception as exc:
        return taken, exc
    return taken, None


def _copy(iterable: Any) -> Any:
    """A same-size copy of a built-in mutable container; anything else as it is."""
    kind = type(iterable)
    if kind is list or kind is collections.deque or kind is set or kind is dict:
        return list(iterable)  # one reference per item (a dict or set: its keys)
    if kind is bytearray:
        return bytes(iterable)  # one byte per item, as the original
    if kind is array.array:
        return array.array(iterable.typecode, iterable)  # its own item size
    return iterable


def snapshot_inputs(iterables: tuple[Iterable[Any], ...]) -> tuple[Iterable[Any], ...]:
    """Copies of the inputs that are built-in mutable containers; the rest as given.

    ``concurrent.futures.Executor.map`` reads its whole input when called
    (without ``buffersize``), so a list cleared, grown or changed after
    ``map()`` returns does not change its results. smartexec reads its
    input lazily (endless inputs stream), so it copies a ``list``, ``dict``,
    ``set``, ``deque``, ``bytearray`` or ``array.array`` (exact types) when
    ``map()`` is called, never the items themselves: a list of references
    (~1 ms per million items) for the first four, a copy of the same size
    for the last two (a ``bytearray`` of 100 MB read as a list of ints took
    880 MB). Without it, clearing the list truncated the results, and an
    item replaced after the call ran instead of the one checked then. Other
    iterables (generators, ranges, tuples, numpy arrays, user sequences) are
    read as they come; so is every input of a map given ``buffersize``, as
    Python 3.14 reads it then (the caller does not call this).
    """
    return tuple(_copy(iterable) for iterable in iterables)


def common_length(iterables: tuple[Iterable[Any], ...]) -> int | None:
    """The number of items ``zip(*iterables)`` yields, when all have a length."""
    lengths = []
    for iterable in iterables:
        try:
            lengths.append(len(iterable))  # type: ignore[arg-type]
        except Exception:  # no length, or one too big for an index (range(10**20))
            return None
    return min(lengths) if lengths else 0


#: Arguments and results pickled to measure the parent's per-item pickling cost.
PICKLE_SAMPLE = 64


#: measure_pickling stops sampling once this many seconds were spent: enough
#: to time a copy, and no more (64 items of 4 MiB bytes took 60 ms in one go).
PICKLE_SAMPLE_S = 0.005


def dear_to_send(iterables: tuple[Iterable[Any], ...]) -> bool:
    """Whether a map's items carry big arguments of their own (each item sends its own copy).

    Looks at the first item of inputs that are lists or tuples (others
    cannot be looked at without reading them): True when one of its
    arguments pickles to :data:`~smartexec.transport.BIG_BUFFER_BYTES` or
    more and is not the very object the second item holds there (the same
    array in every call goes to each worker once, see
    :class:`~smartexec.transport.ObjectCache`). Sizing counts a numpy
    array's bytes without copying them; an argument that cannot be pickled
    answers False (sending it will raise the clear error).

    Args:
        iterables: ``map``'s iterables, as given (one per argument).

    Returns:
        True when the items are dear to send, as above; never raises.
    """
    from .inspection import payload_size

    firsts: list[Any] = []
    seconds: list[Any] = []
    for iterable in iterables:
        if not isinstance(iterable, (list, tuple)) or not iterable:
            return False
        firsts.append(iterable[0])
        seconds.append(iterable[1] if len(iterable) > 1 else None)
    for first, second in zip(firsts, seconds):
        if first is second:
            continue
        size = payload_size(first, cap_bytes=BIG_BUFFER_BYTES)
        if size.error is None and (size.capped or size.nbytes >= BIG_BUFFER_BYTES):
            return True
    return False


def measure_pickling(estimate: Estimate, args: list[Any], results: list[Any]) -> None:
    """Time sending a sample of arguments and results; store the per-item cost.

    When pickling the first item shows that the whole sample pickles within
    :data:`PICKLE_SAMPLE_S`, the sample is pickled in one go, as a chunk is
    sent: one pickler's set-up (a few microseconds) is shared by its items,
    as in a chunk, instead of being charged to each (small items read ~20x
    too dear, and maps of 5 us items that a process pool wins stayed
    inline), and a big argument that every item holds counts once, as a
    chunk sends it once. The price of such shared buffers is stored apart,
    as ``estimate.send_per_chunk_s`` (the same 20 MiB array in 5,000 calls
    was priced 7 ms an item, and such maps ran as a loop that a process
    pool's big chunks beat by 1.24x). Otherwise item by item, until
    :data:`PICKLE_SAMPLE_S` seconds were spent. Big buffers are not pickled
    but counted at the cost of putting them in shared memory, as
    :mod:`smartexec.transport` will (so a sample of 16 MB arrays costs
    microseconds to measure, not a 16 MB pickle each).
    """
    seconds = 0.0
    items = 0
    pairs = list(zip(args, results))
    n = len(pairs)
    try:
        if n > 1:
            first: dict[int, tuple[int, Any]] = {}
            pickling_s, big = send_parts(pairs[0], first)
            # As many items as pickle within the budget, at the first one's pace.
            n = min(n, int(PICKLE_SAMPLE_S / max(pickling_s, 1e-9)))
            if n > 1:
                # The others in one go, as a chunk sends them. A big buffer
                # of the first item that they hold too (the same array in
                # every call) is sent once per chunk: priced apart, once.
                others: dict[int, tuple[int, Any]] = {}
                rest_s, rest_big = send_parts(pairs[1:n], others)
                shared = sum(nbytes for key, (nbytes, _) in first.items() if key in others)
                del first, others
                estimate.send_per_chunk_s = shared * SHM_WRITE_S_PER_BYTE
                estimate.pickle_parent_s = (
                    2 * (pickling_s + rest_s) + (big + rest_big - 2 * shared) * SHM_WRITE_S_PER_BYTE
                ) / n
                return
        for item in pairs:
            seconds += estimate_send_s(item)
            items += 1
            if seconds >= PICKLE_SAMPLE_S:
                break
    except Exception:
        return  # sending will raise a clear error later
    if items:
        estimate.pickle_parent_s = seconds / items
        estimate.send_per_chunk_s = 0.0


def drain(results: list[Any]) -> Iterator[Any]:
    """Iterate ``results`` in order, dropping each one as it is handed out.

    A list iterator would keep every result alive until the end (CPython's
    test_free_reference checks that a result dies once the caller drops it).
    Popping from the reversed list through ``starmap`` does it at C speed.
    """
    results.reverse()
    return itertools.starmap(results.pop, itertools.repeat((), len(results)))


def then_raise(results: list[Any], error: BaseException) -> Iterator[Any]:
    """Yield ``results``, then raise ``error`` (an item's, at its position)."""
    yield from drain(results)
    raise error


def lazy_inline(
    fn: Callable[..., Any],
    inputs: Iterator[tuple[Any, ...]],
    on_end: Callable[[int, float], None] | None = None,
) -> Iterator[Any]:
    """Run a map in the calling thread as it is iterated (the inline backend).

    ``on_end(items, seconds)`` is called when the iteration stops, however.
    """
    items = 0
    start = time.perf_counter()
    try:
        for args in inputs:
            items += 1
            yield fn(*args)
    finally:
        if on_end is not None:
            on_end(items, time.perf_counter() - start)


def count_at_end(n_items: int, start: float, on_end: Callable[[int, float], None]) -> Iterator[Any]:
    """Yield nothing; report ``n_items`` and the seconds since ``start`` when reached.

    Chained after a C-level map, it counts a run that was iterated to the end
    without a per-item cost.
    """
    on_end(n_items, time.perf_counter() - start)
    yield from ()


def inline_batches(
    prefix: list[Any],
    run: InlineRun,
    verdict: Callable[[], Verdict],
    switch: Callable[[str], ChunkStream],
    ordered: bool = True,
) -> Iterator[Iterable[Any]]:
    """Yield lazy batches of inline results, re-deciding between batches.

    Items under ``TINY_ITEM_S`` go in C-level ``map`` batches that start at 16
    items and grow fourfold up to ``TINY_BATCH``, and on to 16 times that
    while a batch takes under ``TINY_BATCH_S`` (the estimate may be an older
    map's): the caller pulls results straight through them, with no per-item
    Python code. Slower items go one by one with a look at the
    clock after each, so a batch never runs much past ``PROBE_S`` however
    slow its items turn. Either way an item's exception surfaces at its
    position. Between batches the estimate is updated from the time the batch
    took (the caller's own per-item work included) and the verdict re-checked;
    when items got slow enough, in that batch and the next (one stalled
    batch moves nothing), the rest goes to the workers (``switch``),
    read in input order or, with ``ordered=False``, as its chunks complete.
    """
    yield drain(prefix)
    apply = itertools.starmap if run.star else map
    inputs, estimate = run.inputs, run.estimate
    slow = _SlowerItems(verdict)
    size = 0
    elapsed = 0.0
    tiny = 16  # C-level batches start small: the estimate may come from an older map
    tiny_batch = False
    start = time.perf_counter()
    while True:
        if size:
            before = estimate.per_item_s or 0.0
            elapsed = time.perf_counter() - start
            if elapsed >= MIN_OBSERVED_S or not tiny_batch:
                estimate.observe(size, elapsed)
            run.items += size
            if run.on_batch is not None:
                run.on_batch(size, elapsed)
            move = slow.move(before, estimate.per_item_s or 0.0, elapsed / size)
            if move is not None:
                yield stream_values([], switch(move.reason), ordered)
                return
        start = time.perf_counter()
        tiny_batch = (estimate.per_item_s or PROBE_S) < TINY_ITEM_S
        if not tiny_batch:
            timed = _TimedItems(run, PROBE_S)
            yield timed
            size = timed.count
            if size == 0:
                return
            continue
        # Taken as a list (up to TINY_BATCH references, read at C speed) so the
        # batch's size is exact for the estimate and stats. The end is where
        # the iteration ends, even for a sized input whose __len__ is wrong.
        # An input that fails keeps what it gave: those items run, as a loop
        # would run them, and the error comes at its position.
        batch, error = read_up_to(inputs, tiny)
        if error is not None:
            if run.on_batch is not None and batch:
                run.on_batch(len(batch), 0.0)
            yield apply(run.fn, batch)
            yield then_raise([], error)
            return
        if not batch:
            return
        size = len(batch)
        limit = TINY_BATCH if not elapsed or elapsed >= TINY_BATCH_S else 16 * TINY_BATCH
        tiny = min(limit, 4 * tiny)
        yield apply(run.fn, batch)


class _SlowerItems:
    """When a loop's items got slower: the verdict that moves it, confirmed by a second batch.

    A loop can only start losing when items get slower: the verdict is
    re-checked then, and the loop moves only when the next batch is slow by
    itself too (one stalled batch, a garbage collection or the machine busy
    elsewhere, sent a loop of 0.1 us items to threads after 336 items).
    """

    def __init__(self, verdict: Callable[[], Verdict]) -> None:
        self._verdict = verdict
        self._since: float | None = None  # the figure before a batch that read slow

    def move(self, before: float, estimate: float, own: float) -> Verdict | None:
        """After a batch: the verdict to move on, or None to stay.

        Args:
            before: the per-item estimate before the batch (seconds).
            estimate: the estimate after it (seconds).
            own: the batch's own seconds per item.
        """
        if self._since is not None:
            since, self._since = self._since, None
            if own > 1.2 * since:
                now = self._verdict()
                if not now.inline:
                    return now
            return None
        if estimate > 1.2 * before and not self._verdict().inline:
            self._since = before
        return None


class _TimedItems:
    """Run items one by one until ``seconds`` have passed; count them."""

    def __init__(self, run: InlineRun, seconds: float):
        self._run = run
        self._deadline = time.perf_counter() + seconds
        self.count = 0

    def __iter__(self) -> Iterator[Any]:
        fn, star = self._run.fn, self._run.star
        for item in self._run.inputs:
            self.count += 1
            yield fn(*item) if star else fn(item)
            if time.perf_counter() >= self._deadline:
                return


class InlineStream:
    """The rest of a map run in the calling thread, batch by batch, as it is read.

    Offers what :class:`Relay` reads of a :class:`ChunkStream`: each batch's
    outcomes (an item's exception is kept at its position, as in a chunk),
    nothing to cancel. ``on_end(items, seconds)`` is called once the
    iteration stops, however it stops.
    """

    BATCH = 256

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Iterator[tuple[Any, ...]],
        on_end: Callable[[int, float], None] | None = None,
    ):
        self._fn = fn
        self._inputs = inputs
        self._on_end = on_end
        self.sizes: list[int] = []

    def values(self) -> Iterator[Any]:
        """Each item's result, run as it is read; an item's exception is raised in place.

        The fast way to read this stream (what :func:`stream_values` does):
        no outcome tuple per item, as in a plain loop.
        """
        return lazy_inline(self._fn, self._inputs, self._on_end)

    def chunks(self) -> Iterator[list[tuple[bool, Any]]]:
        """Run and yield the outcomes of up to :attr:`BATCH` items at a time."""
        items = 0
        seconds = 0.0
        try:
            while True:
                batch: list[Call] = [
                    (args, {}) for args in itertools.islice(self._inputs, self.BATCH)
                ]
                if not batch:
                    return
                result = run_chunk(self._fn, batch)
                items += len(batch)
                seconds += result.compute_s
                yield result.outcomes
        finally:
            if self._on_end is not None:
                self._on_end(items, seconds)

    def cancel(self) -> None:
        """Nothing runs ahead of the reader: nothing to cancel."""

    def abort(self) -> None:
        """Nothing runs ahead of the reader: nothing to stop."""


class Relay:
    """Several :class:`ChunkStream` of one map, read one after the other.

    A map that moves to another backend part-way keeps its first stream
    (detached: it reads no more input, its chunks finish) and appends the
    new one, which reads the rest of the input: results stay in input order,
    and the new backend starts working before the old one's chunks end.
    Offers the part of :class:`ChunkStream`'s interface that
    :func:`stream_values` uses.
    """

    def __init__(self, first: ChunkStream):
        self.streams: list[ChunkStream | InlineStream] = [first]

    def append(self, stream: ChunkStream | InlineStream) -> None:
        """Read ``stream`` after the ones already here."""
        self.streams.append(stream)

    @property
    def sizes(self) -> list[int]:
        """Every chunksize sent, over all the streams."""
        return [size for stream in self.streams for size in stream.sizes]

    def parts(self) -> Iterator[ChunkStream | InlineStream]:
        """The streams in turn; one appended while the last is read comes too."""
        index = 0
        while index < len(self.streams):
            yield self.streams[index]
            index += 1

    def chunks(self) -> Iterator[list[tuple[bool, Any]]]:
        """Each stream's chunks in turn (see :meth:`ChunkStream.chunks`)."""
        for part in self.parts():
            yield from part.chunks()

    def cancel(self) -> None:
        """Cancel every stream's chunks not yet running."""
        for stream in list(self.streams):
            stream.cancel()

    def abort(self) -> None:
        """Stop every stream's chunks, running ones too."""
        for stream in list(self.streams):
            stream.abort()


def stream_values(
    prefix: list[Any],
    stream: ChunkStream | Relay,
    ordered: bool = True,
    on_end: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """Yield the probe's results, then each streamed outcome; raise at its position.

    ``on_end()`` is called once the results end (read to the end, raised,
    or closed), after the stream is cancelled.

    An item's exception cancels the chunks not started and lets running ones
    finish, as the stdlib's ``map`` does; closing this generator, or
    ``KeyboardInterrupt`` / ``SystemExit`` while it waits, stops running
    chunks too (:meth:`ChunkStream.abort`).

    With ``ordered=False`` the streamed results come chunk by chunk as the
    chunks complete, whichever stream of a :class:`Relay` sent them
    (:func:`_as_completed`); within a chunk, in input order. An item's
    exception is raised when its chunk completes and its turn comes.
    """
    try:
        yield from _closing(drain(prefix))  # send(x) acts as next(), as in the stdlib
        if not ordered:
            yield from _as_completed(stream if isinstance(stream, Relay) else Relay(stream))
            return
        for part in stream.parts() if isinstance(stream, Relay) else (stream,):
            if isinstance(part, InlineStream):
                # A loop here: no outcome tuples; send(x) acts as next() in it too.
                yield from part.values()
                continue
            for outcomes in part.chunks():
                outcomes.reverse()
                while outcomes:
                    if not outcomes[-1][0]:
                        stream.cancel()  # before the chunks generator is closed (an abort)
                        raise outcomes.pop()[1]
                    yield outcomes.pop()[1]
    finally:
        stream.cancel()
        if on_end is not None:
            on_end()


#: Read in completion order, a map that moved to a loop in this thread runs
#: its items in batches of about this many seconds between two looks at the
#: chunks still running elsewhere (one item at a time cost ~2 us per 0.4 us item).
INLINE_LOOK_S = 0.001


def _as_completed(relay: Relay) -> Iterator[Any]:
    """Yield a map's results chunk by chunk, in the order the chunks complete.

    Every stream of ``relay`` is read at once: a map that moved keeps
    handing out the old backend's chunks as they finish while the new one
    works. A stream's window is topped up after each of its chunks is
    handed out, so at most ``buffersize`` chunks per stream are in flight
    and the input is read lazily, as in input order. When the map moved to
    a loop in this thread (an :class:`InlineStream`), its items run in
    batches of about :data:`INLINE_LOOK_S` with a look at the old chunks
    between them, then as a plain loop once those are all done. ``timeout``
    (the streams' ``end_time``) bounds each wait for the next chunk, as it
    bounds each wait in input order.
    """
    inline: Iterator[Any] | None = None  # the loop's results, once the map moved to one
    inline_done = False
    size = 1  # items of the loop between two looks at the chunks
    try:
        while True:
            streams = [part for part in relay.streams if isinstance(part, ChunkStream)]
            took = False
            for stream in streams:
                outcomes = stream.next_done()
                while outcomes is not None:
                    took = True
                    outcomes.reverse()
                    while outcomes:
                        if not outcomes[-1][0]:
                            relay.cancel()  # before an abort (a BaseException) can stop them
                            raise outcomes.pop()[1]
                        yield outcomes.pop()[1]
                    stream.top_up()  # results first, then read more input
                    outcomes = stream.next_done()
                error = stream.late_error
                if error is not None and not any(
                    other.pending() for other in streams if other is not stream
                ):
                    # After every chunk sent before it, whichever stream sent it
                    # (a map that moved: the old backend's chunks come first).
                    raise error
            if took:
                continue  # a move may have added a stream meanwhile
            busy = any(stream.pending() for stream in streams)
            if inline is None and not inline_done:
                loop = next((p for p in relay.streams if isinstance(p, InlineStream)), None)
                if loop is not None:
                    inline = loop.values()
            if inline is not None and not inline_done:
                if not busy:
                    yield from inline  # nothing else to look at: a plain loop
                    return
                # A batch of about INLINE_LOOK_S, then a look at the chunks.
                start = time.perf_counter()
                batch, error = read_up_to(inline, size)
                ran = len(batch)
                elapsed = time.perf_counter() - start
                size = min(2 * size, TINY_BATCH) if elapsed < INLINE_LOOK_S else max(1, size // 2)
                yield from drain(batch)  # held by nothing here once handed out
                if error is not None:
                    relay.cancel()
                    raise error
                if ran:
                    continue
                inline_done = True
            if not busy:
                return
            _wait_for_one(streams)
    except Exception:
        raise  # an error of the map (timeout, input, an item): cancel what has not started
    except BaseException:
        # Ctrl-C, SystemExit, or the consumer closed the iterator (GeneratorExit).
        relay.abort()
        raise
    finally:
        relay.cancel()
        close = getattr(inline, "close", None)
        if close is not None:
            close()  # the loop reports its items and time (InlineStream's on_end)


#: Longest single wait of :func:`_wait_for_one` before it looks again: a future
#: cancelled without its waiters being told (``concurrent.futures.wait`` only
#: hears of a cancellation once the executor acknowledges it) must not hang it.
WAIT_POLL_S = 0.25


def _wait_for_one(streams: list[ChunkStream]) -> None:
    """Wait until a chunk of ``streams`` is done; raise ``TimeoutError`` at their deadline.

    A function of its own so that no future (nor the results it holds) stays
    referenced from the reading generator once its chunk is handed out.
    """
    ends = [stream.end_time for stream in streams if stream.end_time is not None]
    end = min(ends) if ends else None
    pending = [future for stream in streams for future in stream.pending()]
    while True:
        left = None if end is None else max(0.0, end - time.monotonic())
        poll = WAIT_POLL_S if left is None else min(left, WAIT_POLL_S)
        done, _ = concurrent.futures.wait(
            pending, timeout=poll, return_when=concurrent.futures.FIRST_COMPLETED
        )
        if done or any(future.done() for future in pending):
            return
        if left is not None and left <= poll:
            raise concurrent.futures.TimeoutError()


def as_generator(results: Iterator[T]) -> Generator[T, None, None]:
    """``results`` as a generator: ``close()``, ``send()`` and ``throw()`` exist.

    A generator is returned as it is. Otherwise the returned generator
    yields from ``results`` and closes it (when it has ``close()``) once it
    stops, however it stops. ``send(value)`` acts as ``next()``; ``throw``
    raises the exception at the current position.
    """
    if isinstance(results, types.GeneratorType):
        return results
    return _closing(results)


class SendableChain(itertools.chain):  # type: ignore[type-arg]
    """``itertools.chain`` with ``send(value)`` meaning ``next()``.

    A generator that ``yield from``-s it hands each item out at C speed (one
    frame resume per item, ~40 ns, against ~100 ns for a loop of
    ``next()`` calls), keeps no reference to an item once handed out
    (CPython's ``test_free_reference``), and passes a ``send(x)`` on as
    ``next()``, as the stdlib's ``Executor.map`` generator does. It has no
    ``throw``: a thrown exception is raised in the generator, at its
    ``yield from``.
    """

    def send(self, value: object) -> Any:
        return next(self)


def _closing(results: Iterator[T]) -> Generator[T, None, None]:
    try:
        yield from results if isinstance(results, SendableChain) else SendableChain(results)
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()
