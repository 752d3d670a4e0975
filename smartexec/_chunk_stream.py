"""A map's chunks on one backend: :class:`ChunkStream`, which

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
  position (or chunk by chunk as the chunks complete, read through
  :func:`smartexec._mapping.stream_values` with ``ordered=False``), and
  cancels every chunk still pending when the iterator stops; when it stops
  by ``KeyboardInterrupt``, ``SystemExit`` or ``close()``, it also stops the
  chunks already running (``Backend.abort``).

Only the thread that iterates touches a stream, so it needs no lock.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._inputs import read_up_to
from ._remote import Call, ChunkResult
from ._wire import estimate_send_s
from .errors import (
    PayloadPicklingError,
    ResultPicklingError,
    TaskTimeoutError,
    WorkerCrashedError,
)
from .tuning import MAX_CHUNK_ITEMS, Estimate, chunk_budget_s, chunksize, default_chunksize

if TYPE_CHECKING:
    from .backends._base import Backend
    from .policy import Decision

LOGGER = logging.getLogger("smartexec")

__all__ = ["ChunkStream", "StreamPlan", "default_buffersize"]


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

    __slots__ = ("calls", "outcomes", "future", "retries", "spared", "error", "__weakref__")

    def __init__(self, calls: list[Call], retries: int = 0):
        self.calls = calls  # the items with no outcome yet
        self.outcomes: list[tuple[bool, Any]] = []
        self.future: Future[ChunkResult]  # its latest send: ChunkStream._post
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
        measuring: whether the chunks' figures still decide the map's
            route (see :class:`ChunkStream`); None: they never do.
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
    measuring: Callable[[], bool] | None = None
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
        measuring: ``() -> bool``, read as each chunk is sized: whether the
            chunks' figures still decide where the map runs (its router has
            no verdict yet). Until an item is measured, chunks then hold one
            item, so every worker starts at once and the first figures come
            back soonest; after, they aim at
            :data:`~smartexec.tuning.MEASURING_CHUNK_S` of work, not the
            route's own target (see :func:`~smartexec.tuning.chunk_target_s`).
            None: they never do.
        abort: ``(futures) -> None``: stops those chunks, running ones too
            (:meth:`~smartexec.backends._base.Backend.abort`); called when
            the iteration ends by ``KeyboardInterrupt``, ``SystemExit`` or
            ``close()``. None: such chunks are only cancelled.
        keep_first_error: an error reading the input or sending the first
            window is kept, raised where the stream is read, as a later
            one is (for the rest of a map that moved: the results before
            it, on the other backend, come first); False raises it from
            here when no chunk was sent before it.
        start: read and send the first window now; False leaves it to
            :meth:`start`.
        width: the backend's workers now, read before each refill; where
            it grew, chunks are sized for the new width and the window
            (unless the caller fixed ``buffersize``) holds
            ``default_buffersize`` of it. None: ``n_workers`` stays.
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
        measuring: Callable[[], bool] | None = None,
        abort: Abort | None = None,
        on_result: Callable[[ChunkResult, list[Call]], None] | None = None,
        probe: tuple[int, int] | None = None,
        keep_first_error: bool = False,
        start: bool = True,
        width: Callable[[], int] | None = None,
    ):
        self._send = send
        self._width = width
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
        self._measuring = measuring
        self._abort = abort
        self._on_result = on_result
        #: (chunks still to send, results still to take, items per chunk) while probing
        self._probe = [probe[0], probe[0], probe[1]] if probe is not None else None
        self._window: collections.deque[_Slot] = collections.deque()
        #: The slot of each send as it ends (weakly: a result handed out must
        #: not live on here), in completion order: the reader takes what
        #: ended beyond the head from here, not by a scan of the window for
        #: every result (a window of 258 chunks on a wide thread pool cost
        #: more than the calls did).
        self._landed: collections.deque[weakref.ref[_Slot]] = collections.deque()
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
        self._keep_first_error = keep_first_error
        #: The first window is read and sent (see :meth:`start`).
        self.started = False
        if start:
            self.start()

    def start(self) -> None:
        """Read and send the first window (done by the constructor unless ``start=False``).

        A caller that must register the stream first (an executor's
        shutdown finishes its open maps) opens it with ``start=False`` and
        starts it once its own locks are released: reading the input runs
        the user's code (a generator), which may wait for a thread that
        submits to the same executor.

        Raises:
            Exception: reading the input or sending the first window failed
                before any chunk was sent, and ``keep_first_error`` is
                False (the stream is cancelled).
        """
        with self._lock:
            try:
                self._refill()
            except Exception as exc:
                if not self._keep_first_error and (
                    exc is not self._input_error or not self._window
                ):
                    self.cancel()
                    raise
                # Raised by chunks() after the chunks sent before it (none, or
                # the window's): its place in the input.
                self._input_error = exc
                self._exhausted = True
            except BaseException:
                self.cancel()
                raise
            self.started = True

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
            if self._measuring is not None and self._measuring():
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
            measuring=self._measuring is not None and self._measuring(),
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
        if self._width is not None and (workers := self._width()) > self._workers:
            # The backend grew (a thread pool whose threads wait): keep its
            # new threads fed.
            self._workers, self._buffersize = workers, default_buffersize(workers)
        while not self._exhausted and len(self._window) < self._buffersize + extra:
            past_its_length = self._remaining is not None and self._remaining <= 0
            if past_its_length:
                # More items than its __len__ said? Its length is unknown from
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
                if past_its_length:
                    self._remaining = 0  # its length was right: nothing is left
                return
            elif len(chunk) < size and self._remaining is not None:
                self._exhausted = True
            if chunk:
                if self._remaining is not None:
                    self._remaining -= len(chunk)
                self._window.append(self._post(_Slot(chunk, self._max_retries), budget))
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
            at = _first_unsendable(slot.calls) if _an_arguments(error) else None
            if at:
                # An argument could not be sent: the items before it give
                # their results and the error comes at its own item, as with
                # ProcessPoolExecutor, which sends each alone. Where nothing
                # can be sent any more (shut down), at the chunk's first.
                with contextlib.suppress(RuntimeError):
                    self._cut(slot, at, error)
                    return
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
            self._post(slot, chunk_budget_s(per_item, len(slot.calls)))
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

    def _cut(self, slot: _Slot, at: int, error: BaseException) -> None:
        """Send ``slot``'s calls before ``at`` again, and keep ``error`` for the rest, read at call ``at``.

        Raises:
            RuntimeError: nothing can be sent any more (the backend is shut
                down); ``slot`` is left as it was.
        """
        calls = slot.calls
        slot.calls = calls[:at]
        try:
            self._post(slot, None)
        except RuntimeError:
            slot.calls = calls
            raise
        rest = _Slot(calls[at:], slot.retries)
        rest.future, rest.error = slot.future, error  # never sent: it fails where it is read
        self._window.insert(self._window.index(slot) + 1, rest)

    def _recover(self, slot: _Slot, exc: BaseException) -> bool:
        """Re-send a failed chunk's items where the failure allows; True if done so."""
        crashed = isinstance(exc, WorkerCrashedError)
        if not (crashed or isinstance(exc, TaskTimeoutError)):
            return False
        if len(slot.calls) > 1:
            # Which item was it? Send each alone, right after this slot. The
            # failure is charged to none of them: the culprit fails again alone
            # (and spends its own retries), the others give their results.
            singles = [self._post(_Slot([call], slot.retries), None) for call in slot.calls]
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
            self._post(slot, None)
            return True
        if crashed and slot.retries > 0:
            slot.retries -= 1
            self._post(slot, None)
            return True
        return False

    def _post(self, slot: _Slot, budget: float | None) -> _Slot:
        """Send ``slot``'s calls (its ``future`` is the send's), heard in :attr:`_landed` as it ends."""
        slot.future = self._send(slot.calls, budget)
        landed, ref = self._landed, weakref.ref(slot)
        slot.future.add_done_callback(lambda _: landed.append(ref))
        return slot

    def _resend_partials(self) -> None:
        """Take every chunk that ended whole or part-way since the last look (not failed ones)."""
        landed = self._landed
        while landed:
            slot = landed.popleft()()
            if slot is None or not slot.calls or slot.error is not None:
                continue
            future = slot.future
            if future.done() and not future.cancelled() and future.exception() is None:
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
                    # Handed over: the slot, which _landed may still hold,
                    # keeps no result alive.
                    outcomes, slot.outcomes = slot.outcomes, []
                    return outcomes
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
        # Read in completion order, a chunk is taken when found done below, one
        # at a time: taking every landed one here at once (one may move the
        # map) lost a result of a map that moved as its input failed.
        self._landed.clear()
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
    def in_flight(self) -> int:
        """Items sent whose chunk has not ended yet (int)."""
        with self._lock:
            return sum(len(slot.calls) for slot in self._window if not slot.future.done())

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

    def reattach(self, calls: Iterator[Call] | None = None) -> None:
        """Undo :meth:`detach`: read the input again (the move it was for failed).

        ``calls``: the input to read from here, when the move put items
        :meth:`take_back` took in front of it.
        """
        if calls is not None:
            self._calls = calls
        self._exhausted = False
        self._refill()

    def take_back(self) -> list[Call]:
        """Cancel the chunks at the window's end that no worker started; return their calls, in order.

        For a map that moves (after :meth:`detach`): what the workers it
        leaves have not begun goes with the rest of the input, first, rather
        than waiting behind the chunks they run (a queue of one-item chunks
        of 16 ms on two fork workers held a move to threads back ~0.1 s).
        A chunk is taken only while its future can still be cancelled; the
        results of the chunks before it come from here, as before. That
        needs a future whose ``cancel()`` fails once its chunk may run: the
        backends a map moves from (fork, loky, threads) mark it running when
        they hand the chunk on. Nothing
        is taken once the input (or a send) failed: that error is raised
        here after this stream's chunks, at its place, and the items taken
        would come after it.
        """
        taken: list[list[Call]] = []
        with self._lock:
            while self._window and self._input_error is None:
                slot = self._window[-1]
                if slot.outcomes or slot.error is not None or not slot.future.cancel():
                    break
                self._window.pop()
                taken.append(slot.calls)
            for calls in taken:
                if self._remaining is not None:
                    self._remaining += len(calls)
        return [call for calls in reversed(taken) for call in calls]

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
            self._measuring = None
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


def _first_unsendable(calls: list[Call]) -> int | None:
    """The index of the first call whose arguments cannot be pickled (None: all can, now)."""
    for at, call in enumerate(calls):
        try:
            estimate_send_s(call)
        except Exception:  # noqa: BLE001 - any pickler's error marks the call
            return at
    return None


def _an_arguments(error: BaseException) -> bool:
    """Whether ``error`` says an argument of a call could not be pickled (not the callable, not a result)."""
    return (
        isinstance(error, PayloadPicklingError)
        and not isinstance(error, ResultPicklingError)
        and error.where.startswith(("argument ", "keyword argument "))
    )
