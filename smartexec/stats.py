"""Insights: where an executor's time went, per backend, and why workers idled.

:class:`StatsRecorder` is fed by :class:`~smartexec.executor.SmartExecutor`
as chunks are sent and finish; :meth:`SmartExecutor.stats` returns an
:class:`ExecutorStats` snapshot. For each backend it counts:

* **items** and **chunks** run, and the **chunksizes** used;
* **working**: seconds the workers spent in the user's calls (measured where
  they ran, :attr:`ChunkResult.compute_s`);
* **dispatching**: seconds the caller spent sending chunks (pickling,
  shared memory, queueing): what ``submit_chunk`` took;
* **active**: wall seconds during which the backend had at least one chunk
  in flight; ``active x workers - working`` is the workers' **waiting**.

When workers were busy under :data:`BUSY_WARN_BELOW` of the active time, the
snapshot carries a one-line warning with the likely cause, the way mpire's
insights flag pools that spend their time on overhead.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from . import _display

__all__ = ["BackendStats", "CallLog", "ExecutorStats", "StatsRecorder", "BUSY_WARN_BELOW"]

#: Below this share of their active time spent working, workers get a warning.
BUSY_WARN_BELOW = 0.8

#: Active for less than this many seconds, workers that idled for no reason
#: the figures name get no warning: a short map's start-up and its last
#: chunks (the others' workers done) are a large share of it by nature (a
#: healthy 50 ms map on 6 threads read 58-80 % busy).
SHORT_ACTIVE_S = 0.25


@dataclass(frozen=True, repr=False)
class BackendStats:
    """What one backend ran (a snapshot).

    Attributes:
        backend: the backend's name.
        workers: its worker count (int).
        items: calls run, failed ones included (int).
        chunks: chunks finished (int).
        failed_chunks: chunks that failed as a whole (a dead worker, a
            timeout, a pickling error) (int).
        working_s: seconds the workers spent in the calls.
        dispatching_s: seconds the caller spent sending chunks.
        active_s: wall seconds with at least one chunk in flight.
        chunksizes: chunksize -> how many chunks had it.
    """

    backend: str
    workers: int
    items: int
    chunks: int
    failed_chunks: int
    working_s: float
    dispatching_s: float
    active_s: float
    chunksizes: dict[int, int] = field(default_factory=dict)

    @property
    def waiting_s(self) -> float:
        """Worker-seconds of the active time not spent in calls (at least 0)."""
        return max(0.0, self.active_s * self.workers - self.working_s)

    @property
    def busy(self) -> float | None:
        """``working_s`` over ``active_s x workers`` (0..1), or None before any chunk."""
        capacity = self.active_s * self.workers
        return None if capacity <= 0 else min(1.0, self.working_s / capacity)

    def warning(self) -> str | None:
        """One line when the workers were busy under 80 % of the time, saying why."""
        busy = self.busy
        if busy is None or busy >= BUSY_WARN_BELOW or self.chunks == 0:
            return None
        per_chunk = self.working_s / self.chunks
        head = (
            f"{self.backend}: workers were busy {busy:.0%} of the time "
            f"({self.working_s:.3f} s of work in {self.active_s:.3f} s x {self.workers} workers)"
        )
        per_send = self.dispatching_s / self.chunks
        if self.failed_chunks * 2 >= self.chunks:
            why = (
                f"{self.failed_chunks} of {self.chunks} chunks failed (an error, a crashed "
                f"worker or a task_timeout): their time is not counted as work"
            )
        elif self.chunks < 2 * self.workers:
            why = (
                f"too few chunks ({self.chunks}) to keep {self.workers} workers busy; "
                f"starting the workers counts in the time too"
            )
        elif per_send > 0.001 and self.dispatching_s > 0.5 * self.working_s:
            if self.working_s < LITTLE_WORK_S:
                why = (
                    f"only {self.working_s * 1e3:.2f} ms of work in all, and the caller "
                    f"spent {self.dispatching_s:.3f} s sending chunks: starting the workers "
                    f"or the payload (arguments, or the callable's state) cost more than "
                    f"the work (a plain loop runs such a map faster)"
                )
            else:
                why = (
                    f"the caller spent {self.dispatching_s:.3f} s sending chunks, over half "
                    f"the {self.working_s:.3f} s of work they carried: starting the "
                    f"workers (forking this process) counts there, as does pickling each "
                    f"chunk's payload (its arguments, or the callable's state when it is "
                    f"sent); the work per item is small for what reaching a worker costs"
                )
        elif per_chunk < 0.002:
            why = (
                f"chunks are too small: {per_chunk * 1e3:.2f} ms of work each; a larger "
                f"chunksize (or none: smartexec tunes it) amortises the per-chunk cost "
                f"of a map, while each submit pays it for one call"
            )
        elif self.active_s < SHORT_ACTIVE_S:
            return None
        else:
            why = (
                "workers waited for chunks: worker start-up, or an input produced (or "
                "results consumed) more slowly than the workers ran"
            )
        return f"{head}: {why}"

    def __str__(self) -> str:
        busy = self.busy
        # The most used sizes, at most SIZES_SHOWN of them: an inline map's
        # timed batches come in hundreds of sizes.
        common = sorted(sorted(self.chunksizes.items(), key=lambda sc: -sc[1])[:SIZES_SHOWN])
        sizes = ", ".join(f"{size} x{count}" for size, count in common)
        if len(self.chunksizes) > SIZES_SHOWN:
            sizes += f" and {len(self.chunksizes) - SIZES_SHOWN} other sizes"
        return (
            f"{self.backend}: {self.items} items in {self.chunks} chunks "
            f"({self.failed_chunks} of them failed) on {self.workers} worker"
            f"{'s' if self.workers != 1 else ''}; working "
            f"{self.working_s:.3f} s, waiting {self.waiting_s:.3f} s, dispatching "
            f"{self.dispatching_s:.3f} s, active {self.active_s:.3f} s"
            + (f", busy {busy:.0%}" if busy is not None else "")
            + (f"; chunksizes {sizes}" if sizes else "")
        )

    def __repr__(self) -> str:
        return _display.backend_repr(self)


#: What ``str(ExecutorStats)`` says its figures are, once, under the backends.
LEGEND = (
    "  (working: seconds in the calls, every worker's summed; waiting: worker "
    "seconds with nothing to run while work was in flight; dispatching: this "
    "process sending chunks; active: wall seconds with work in flight; "
    "busy: working / (active x workers))"
)


@dataclass(frozen=True, repr=False)
class ExecutorStats:
    """A snapshot of :meth:`SmartExecutor.stats`.

    Attributes:
        backends: name -> :class:`BackendStats`, for each backend that ran work
            (``"inline"`` covers items run in the calling thread).
        decisions: the executor's routing decisions, oldest first (see
            :meth:`SmartExecutor.decisions`).
    """

    backends: dict[str, BackendStats]
    decisions: tuple[Any, ...] = ()

    @property
    def warnings(self) -> list[str]:
        """One line per backend whose workers were busy under 80 % of the time."""
        return [w for s in self.backends.values() if (w := s.warning()) is not None]

    def __str__(self) -> str:
        lines = [str(s) for s in self.backends.values()] or ["no work run yet"]
        if self.backends:
            lines.append(LEGEND)
        lines += [f"warning: {w}" for w in self.warnings]
        if self.decisions:
            # One line per decision, each once: the full reasons are in
            # SmartExecutor.decisions() (and explain()).
            lines.append("decisions (latest last; ex.decisions() has every reason):")
            lines += ["  " + line for line in _display.decision_lines(self.decisions)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return _display.stats_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text display (a notebook cell's last line): ``str()``."""
        _display.pretty(self, printer, cycle)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: a table per backend, the warnings, the decisions."""
        return _display.stats_html(self)


class CallLog:
    """Where pool threads count the calls they run with no chunk future (``submit``'s thread route).

    The thread that ran a call appends its ``(start, end)``
    (``time.perf_counter()`` seconds) to :attr:`calls`, then calls
    :meth:`fold` once :data:`CALLS_BATCH` or more wait there; calling the
    log does both. The append takes no lock and runs no Python frame: the
    thread backend does it inline, where a recorder function cost 0.3 us
    of a trivial submit's 10 us. Queued calls are counted by :meth:`fold`
    and by :meth:`StatsRecorder.snapshot`; their backend counts as active
    from the earliest start to the latest end of the calls that overlap.
    """

    __slots__ = ("calls", "_entry", "_lock")

    def __init__(self, entry: _Backend, lock: threading.Lock):
        #: The queue of ``(start, end)`` not counted yet (a deque: append
        #: and popleft are atomic, from any thread).
        self.calls = entry.calls
        self._entry = entry
        self._lock = lock

    def __call__(self, start: float, end: float) -> None:
        """Count one call that ran from ``start`` to ``end`` (``perf_counter()`` seconds)."""
        calls = self.calls
        calls.append((start, end))
        if len(calls) >= CALLS_BATCH:
            self.fold()

    def fold(self) -> None:
        """Count the queued calls now (takes the recorder's lock)."""
        with self._lock:
            _fold_calls(self._entry)


class _Backend:
    __slots__ = (
        "workers",
        "items",
        "chunks",
        "failed",
        "working",
        "dispatching",
        "active",
        "in_flight",
        "since",
        "calls_until",
        "calls",
        "sizes",
    )

    def __init__(self, workers: int):
        self.workers = workers
        self.items = 0
        self.chunks = 0
        self.failed = 0
        self.working = 0.0
        self.dispatching = 0.0
        self.active = 0.0
        self.in_flight = 0
        self.since = 0.0
        self.calls_until = 0.0  # the latest end of an active period counted
        self.calls: collections.deque[tuple[float, float]] = collections.deque()
        self.sizes: collections.Counter[int] = collections.Counter()


def _fold_calls(entry: _Backend) -> None:
    """Count ``entry``'s queued calls (see :meth:`StatsRecorder.call_recorder`); hold the lock."""
    calls = entry.calls
    batch = []
    while calls:
        try:
            batch.append(calls.popleft())
        except IndexError:  # pragma: no cover - emptied meanwhile
            break
    if not batch:
        return
    entry.sizes[1] += len(batch)
    entry.chunks += len(batch)
    entry.items += len(batch)
    entry.working += sum(end - start for start, end in batch)
    _add_active(entry, batch)


def _add_active(entry: _Backend, periods: list[tuple[float, float]]) -> None:
    """Count each ``(start, end)`` as active, but no second that an earlier one counted; hold the lock.

    Periods arrive as they end (calls run without a chunk, and spells with
    chunks in flight): only what lies past the latest end counted so far is
    added. A backend may get both at once: submits that moved to threads
    (chunks) while parked ones ran there as calls, and counted apart they
    read 2.67 s active in a 1.4 s with-block. Takes a batch: thousands of
    submits a second fold here (0.51 -> 0.20 us a call against one period
    at a time).
    """
    until, active = entry.calls_until, 0.0
    for start, end in periods:
        if start >= until:
            active += end - start
        elif end > until:
            active += end - until
        if end > until:
            until = end
    entry.active += active
    entry.calls_until = until


#: Under this many seconds of work in all, a backend's idle workers are put
#: down to the work being too little (not to the payload or the chunksize):
#: a 5-item map's first send also forks the pool.
LITTLE_WORK_S = 0.01

#: Calls queued by a :meth:`StatsRecorder.call_recorder` before they are counted.
CALLS_BATCH = 256

#: Chunksizes listed by ``str(BackendStats)``, the most used first chosen.
SIZES_SHOWN = 8


class StatsRecorder:
    """Collects what :class:`ExecutorStats` reports. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[str, _Backend] = {}
        # Chunks sent and not yet counted. A future wakes its waiters before it
        # runs its callbacks, so a caller holding every result may ask for
        # stats() first: snapshot() counts the finished ones itself.
        self._pending: dict[Future[Any], tuple[_Backend, int]] = {}

    def _get(self, name: str, workers: int) -> _Backend:
        entry = self._backends.get(name)
        if entry is None:
            entry = self._backends[name] = _Backend(workers)
        # A thread pool grows while calls wait: its widest counts (800 sleeps
        # read "on 6 workers, busy 100%" on a pool grown to 128).
        entry.workers = max(entry.workers, workers)
        return entry

    def track(
        self, name: str, workers: int, n_items: int, future: Future[Any], dispatch_s: float
    ) -> None:
        """Count a chunk of ``n_items`` just sent (in ``dispatch_s`` seconds) until it ends."""
        now = time.perf_counter()
        with self._lock:
            entry = self._get(name, workers)
            entry.dispatching += dispatch_s
            entry.sizes[n_items] += 1
            if entry.in_flight == 0:
                entry.since = now - dispatch_s
            entry.in_flight += 1
            self._pending[future] = (entry, n_items)
        future.add_done_callback(self._count)

    def _count(self, f: Future[Any]) -> None:
        """Count a finished chunk once (its callback, or a snapshot, whichever is first)."""
        end = time.perf_counter()
        result = None
        if not f.cancelled() and f.exception() is None:
            result = f.result()
        with self._lock:
            pending = self._pending.pop(f, None)
            if pending is None:
                return  # counted already
            entry, n_items = pending
            entry.in_flight -= 1
            if entry.in_flight == 0:
                _add_active(entry, [(entry.since, end)])
            if f.cancelled():
                # Never ran (a map closed early, a submit moved to threads):
                # not a chunksize used.
                entry.sizes[n_items] -= 1
                if entry.sizes[n_items] <= 0:
                    del entry.sizes[n_items]
                return
            entry.chunks += 1
            if result is None:
                entry.failed += 1
                entry.items += n_items
                return
            entry.items += len(result.outcomes)
            entry.working += result.compute_s

    def call_recorder(self, name: str, workers: int) -> CallLog:
        """Return the :class:`CallLog` of calls run on backend ``name`` with no chunk future (``submit``'s thread route).

        ``workers``: the backend's workers (int), for its figures. A call
        cancelled before it ran is not counted (it ran nothing).
        """
        with self._lock:
            entry = self._get(name, workers)
        return CallLog(entry, self._lock)

    def inline(self, n_items: int, seconds: float) -> None:
        """Count ``n_items`` run in the calling thread in ``seconds``."""
        if n_items <= 0:
            return
        with self._lock:
            entry = self._get("inline", 1)
            entry.items += n_items
            entry.chunks += 1
            entry.sizes[n_items] += 1
            entry.working += seconds
            entry.active += seconds

    def snapshot(
        self, decisions: tuple[Any, ...] = (), widths: dict[str, int] | None = None
    ) -> ExecutorStats:
        """Return the figures so far (chunks in flight count as active until now).

        ``widths``: each backend's worker count now (a grown thread pool's),
        where it exceeds what was recorded as its work began.
        """
        with self._lock:
            for entry in self._backends.values():
                _fold_calls(entry)
            finished = [f for f in self._pending if f.done()]
        for f in finished:
            self._count(f)
        now = time.perf_counter()
        with self._lock:
            backends = {
                name: BackendStats(
                    backend=name,
                    workers=max(e.workers, (widths or {}).get(name, 0)),
                    items=e.items,
                    chunks=e.chunks,
                    failed_chunks=e.failed,
                    working_s=e.working,
                    dispatching_s=e.dispatching,
                    active_s=e.active
                    + (max(0.0, now - max(e.since, e.calls_until)) if e.in_flight else 0.0),
                    chunksizes=dict(e.sizes),
                )
                for name, e in self._backends.items()
            }
        return ExecutorStats(backends, decisions)
