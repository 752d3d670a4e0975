"""What completed submits measured in the workers, and when it moves later submits to threads.

``SmartExecutor.submit`` sends a callable that may hold the GIL to process
workers (fork or loky). Each completed call's
:class:`~smartexec._remote.ChunkResult` says how long the call ran, how much
of it its thread was on a CPU and, for its first ~30 ms of work in each
worker, how it used the GIL; the executor adds what sending it cost here.
:class:`SubmitLearner` keeps the last :data:`WINDOW` calls' figures per
callable (weakly) and gives a :class:`Learned` verdict once :data:`MIN_CALLS`
of them, :data:`AGREE` of them alike, say that threads serve it better:

* **waits**: on a CPU under :data:`~smartexec.gil.CPU_SHARE_WAITS` of the call,
  unless half the GIL watches say it holds the GIL (on a loaded machine a
  call queued for a core reads as waiting; the watches take that out);
* **releases**: at least :data:`MIN_WATCHES` watches, not ``"holds"``;
* **cheap**: it computes in under :data:`CHEAP_CALL_S`, or in less than this
  process spent sending it: a process round trip costs more than the call.

A *cheap* verdict gives way once the calls it put on threads contradict it
(:func:`contradiction`, every :data:`RECHECK_CALLS` calls, timed by the pool
threads in a :class:`ThreadCalls`); the others are not re-checked (a pool
thread's wall time cannot tell waiting from queueing for the GIL). Until a
callable's first calls complete, :func:`send_ahead` of them go to the
workers at once and later ones wait unsent (as ``ProcessPoolExecutor``
queues calls beyond ``max_workers + 1``), so a verdict moves them without
their ever being pickled. Which callables may move, and the figures behind
each rule: ``docs/routing.md``, "What submit() learns".
"""

from __future__ import annotations

import collections
import itertools
import statistics
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._identity import WeakCallable, WeakRecords, identity_key
from ._remote import ChunkResult
from .gil import CPU_SHARE_WAITS, GilProfile
from .stats import CALLS_BATCH, CallLog

__all__ = [
    "SubmitLearner",
    "Learned",
    "MIN_CALLS",
    "WINDOW",
    "AGREE",
    "CHEAP_CALL_S",
    "MIN_WATCHES",
    "SEND_AHEAD_PER_WORKER",
    "send_ahead",
    "RECHECK_CALLS",
    "DEAR_FACTOR",
    "contradiction",
    "ThreadCalls",
]

#: Completed calls needed before any verdict.
MIN_CALLS = 4

#: Calls per worker sent ahead of the first :data:`MIN_CALLS` completions:
#: one running and one queued keep a worker busy while the rest wait unsent.
SEND_AHEAD_PER_WORKER = 2


def send_ahead(workers: int) -> int:
    """Calls of a callable being learned that may be sent and not completed at once.

    Args:
        workers: the process backend's worker count (int >= 1).

    Returns:
        ``max(MIN_CALLS, SEND_AHEAD_PER_WORKER * workers)`` calls: enough for
        a verdict, and a queued call behind every running one.
    """
    return max(MIN_CALLS, SEND_AHEAD_PER_WORKER * workers)


#: Most recent calls whose figures are kept per callable.
WINDOW = 16

#: Share of the calls (or watches) that must agree on a verdict.
AGREE = 0.75

#: A call computing under this many seconds is cheaper than any process
#: round trip (fork ~150 us, loky ~250 us; a thread-route submit ~20 us).
CHEAP_CALL_S = 50e-6

#: GIL watches needed for a *releases* verdict.
MIN_WATCHES = 2

#: Calls on threads a *cheap* verdict is re-checked on: once this many more
#: have completed, the next submit takes the median of the newest this many.
#: The median of 8 outvotes 3 calls stretched by a GIL switch (a waiting
#: thread takes the GIL after the switch interval, 5 ms, even from a 5 us
#: call) or by the machine descheduling the thread. A re-check costs the
#: submitting thread 2-4 us (2 loaded cores): a loop that waits for each
#: result pays it every 8 submits (0.3-0.5 us a submit); a burst of 20,000
#: trivial submits re-checked 20-80 times (0.03-0.13 us a submit).
RECHECK_CALLS = 8

#: A *cheap* verdict gives way when its calls on threads cost over this many
#: times what it called cheap, ``max(CHEAP_CALL_S, send_s, compute_s)``: at
#: least 200 us, over a fork round trip (~150 us) and about a loky one
#: (~250 us), so processes now gain on the calls; a call measured at 40 us
#: in the workers and read at 100 us on a busy thread is not taken for a
#: dear one. A 30 ms GIL-holding call reads 30 ms or more on a thread,
#: however loaded the machine (its thread is on a CPU for all of it).
DEAR_FACTOR = 4.0

LearnedKind = Literal["waits", "releases", "cheap"]


@dataclass(frozen=True)
class Learned:
    """Why later submits of a callable run on threads.

    Attributes:
        kind: ``"waits"``, ``"releases"`` or ``"cheap"`` (see the module docstring).
        calls: completed calls the verdict rests on (int).
        compute_s: their median seconds per call, measured in the workers.
        cpu_share: their median share of the call on a CPU (0..1).
        send_s: the median seconds this process spent sending one call.
        backend: the process backend they ran on (``"fork"``, ``"loky"``).
    """

    kind: LearnedKind
    calls: int
    compute_s: float
    cpu_share: float
    send_s: float
    backend: str

    def reason(self) -> str:
        """One sentence for ``explain()``'s reasons."""
        figures = (
            f"after {self.calls} submits measured in {self.backend} workers: "
            f"{_format_s(self.compute_s)} per call (median), on the CPU "
            f"{self.cpu_share:.0%} of it, {_format_s(self.send_s)} to send"
        )
        why = {
            "waits": "it mostly waits, and threads overlap waits with no pickling",
            "releases": "it computes without the GIL, so threads run it in parallel",
            "cheap": "a call costs less than a process round trip",
        }[self.kind]
        return (
            f"{figures} -> {why}: later submits run on threads, in this process "
            f"(map() routes on its own measurements)"
        )

    def gave_way(self, median_s: float, calls: int) -> str:
        """One sentence for the decision that drops this verdict (see :func:`contradiction`)."""
        return (
            f"its submits moved to threads as cheap ({_format_s(self.compute_s)} per call "
            f"in {self.backend} workers), but its last {calls} calls on threads took "
            f"{_format_s(median_s)} (median), over {DEAR_FACTOR:g}x "
            f"{_format_s(_cheap_bound(self))}: later submits go back to processes and "
            f"are measured afresh"
        )


def _cheap_bound(learned: Learned) -> float:
    return max(CHEAP_CALL_S, learned.send_s, learned.compute_s)


def contradiction(learned: Learned, walls: Sequence[float]) -> float | None:
    """The median of ``walls`` when calls timed on threads contradict ``learned``, else None.

    Pure. Only a *cheap* verdict is re-checked (see the module docstring),
    on at least :data:`RECHECK_CALLS` calls: their median (seconds from a
    call's start to its end on a pool thread) over :data:`DEAR_FACTOR` times
    ``max(CHEAP_CALL_S, learned.send_s, learned.compute_s)``.

    Args:
        learned: the verdict that put the calls on threads.
        walls: the newest calls' seconds on threads, any order.
    """
    n = len(walls)
    if learned.kind != "cheap" or n < RECHECK_CALLS:
        return None
    limit = DEAR_FACTOR * _cheap_bound(learned)
    # A median over the limit needs half the calls over it: cheap calls
    # (the common case) are told by their sum, without sorting.
    if sum(walls) <= limit * (n // 2):
        return None
    median = statistics.median(walls)
    return median if median > limit else None


def _format_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1e3:.1f} ms"


class _Evidence:
    __slots__ = ("handle", "calls", "watches", "verdict")

    def __init__(self) -> None:
        self.handle: WeakCallable = None  # type: ignore[assignment]  # set by WeakRecords.keep
        # (compute_s, cpu_s, send_s) per call, the newest last.
        self.calls: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=WINDOW)
        self.watches: collections.deque[GilProfile] = collections.deque(maxlen=WINDOW)
        self.verdict: Learned | None = None


def _agreed(votes: int, total: int) -> bool:
    return total > 0 and votes >= AGREE * total


def judge(
    calls: list[tuple[float, float, float]], watches: list[GilProfile], backend: str
) -> Learned | None:
    """The verdict on ``calls`` (``(compute_s, cpu_s, send_s)`` each) and ``watches``, or None.

    Pure: see the module docstring for the rules.

    Args:
        calls: the figures of completed calls, any order.
        watches: GIL watches of those calls' chunks, of calls of at least
            :data:`~smartexec.gil.MIN_WATCH_S` (shorter ones are not kept).
        backend: the process backend the calls ran on (for the reason).

    Returns:
        A :class:`Learned` when threads serve the callable better, else None
        (too few calls, no agreement, or the calls compute holding the GIL).
    """
    n = len(calls)
    if n < MIN_CALLS:
        return None
    shares = [min(1.0, cpu / compute) if compute > 0 else 1.0 for compute, cpu, _ in calls]

    def learned(kind: LearnedKind) -> Learned:
        return Learned(
            kind,
            n,
            statistics.median(c for c, _, _ in calls),
            statistics.median(shares),
            statistics.median(s for _, _, s in calls),
            backend,
        )

    # A call's CPU share counts time it sat queued for a core as waiting; the
    # watches take that out (Linux schedstat): on a loaded machine they veto.
    holds = sum(w.kind == "holds" for w in watches)
    if _agreed(sum(share < CPU_SHARE_WAITS for share in shares), n) and not (
        watches and 2 * holds >= len(watches)
    ):
        return learned("waits")
    if len(watches) >= MIN_WATCHES and _agreed(
        sum(w.kind == "releases" for w in watches), len(watches)
    ):
        return learned("releases")
    if _agreed(sum(compute < max(CHEAP_CALL_S, send) for compute, _, send in calls), n):
        return learned("cheap")
    return None


class SubmitLearner:
    """Per-callable figures of completed submits and their verdicts. Thread-safe.

    Keyed like ``SmartExecutor``'s decision cache
    (:func:`~smartexec._identity.identity_key`, held by a
    :class:`~smartexec._identity.WeakCallable`); a callable that cannot be
    weakly referenced is not learned about (a cache must never keep a user's
    object alive).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._evidence: WeakRecords[_Evidence] = WeakRecords()

    def verdict(self, fn: Any, key: Hashable | None = None) -> Learned | None:
        """The verdict for ``fn``, or None (not enough agreeing evidence yet). Lock-free.

        ``key``: ``identity_key(fn)``, when the caller has it already.
        """
        entry = self._evidence.find(fn, key)
        return None if entry is None else entry.verdict

    def record(self, fn: Any, result: ChunkResult, send_s: float, backend: str) -> Learned | None:
        """Add one completed call's figures for ``fn``; return the verdict if this gives one.

        Args:
            fn: the user's callable.
            result: the call's one-call chunk, as the worker returned it.
            send_s: seconds this process spent sending the call.
            backend: the backend it ran on.

        Returns:
            The new verdict when this call completed the evidence for one,
            else None (also when a verdict was given before).
        """
        key = identity_key(fn)
        with self._lock:
            entry = self._evidence.find(fn, key)
            if entry is None:
                entry = _Evidence()
                if not self._evidence.keep(fn, entry, key):
                    return None
            if entry.verdict is not None:
                return None
            entry.calls.append((result.compute_s, result.cpu_s, send_s))
            if isinstance(result.gil, GilProfile) and result.gil.telling:
                entry.watches.append(result.gil)
            entry.verdict = judge(list(entry.calls), list(entry.watches), backend)
            return entry.verdict

    def forget(self, fn: Any, learned: Learned) -> bool:
        """Drop ``fn``'s verdict ``learned`` and the figures it rests on; False if it is gone already.

        Its next completed calls are judged afresh (:func:`contradiction`
        found the calls on threads contradict it).
        """
        with self._lock:
            entry = self._evidence.get(identity_key(fn))
            if entry is None or entry.verdict is not learned:
                return False
            entry.verdict = None
            entry.calls.clear()
            entry.watches.clear()
            return True


class ThreadCalls(CallLog):
    """Where pool threads log the calls of one callable a *cheap* verdict moved to threads.

    The thread backend's call loop appends each call's ``(start, end)`` to
    :attr:`calls` (a plain deque: no Python frame, no lock), as it does to
    the backend's shared :class:`~smartexec.stats.CallLog`; :meth:`fold`
    keeps the newest :data:`RECHECK_CALLS` calls' seconds in
    :attr:`recent` for :meth:`recheck` and passes the calls on to the shared
    log, which counts them in the stats. Thread-safe.
    """

    __slots__ = ("_shared", "recent")

    def __init__(self, shared: CallLog):
        # Not CallLog.__init__: its queue is the backend's; this one is the
        # callable's own, read by fold().
        self.calls: collections.deque[tuple[float, float]] = collections.deque()
        self._shared = shared
        #: The newest calls' seconds on a thread, the newest last.
        self.recent: collections.deque[float] = collections.deque(maxlen=RECHECK_CALLS)

    def fold(self) -> None:
        """Keep the queued calls' seconds and count the calls in the shared log."""
        calls = self.calls
        batch: collections.deque[tuple[float, float]] = collections.deque()
        try:
            # Pops in C (half the time of a loop). Pool threads only append;
            # another fold may have taken some: the rest are popped, kept.
            batch.extend(itertools.starmap(calls.popleft, itertools.repeat((), len(calls))))
        except IndexError:
            pass
        if not batch:
            return
        newest = itertools.islice(batch, max(0, len(batch) - RECHECK_CALLS), None)
        self.recent.extend([end - start for start, end in newest])
        shared = self._shared.calls
        shared.extend(batch)
        if len(shared) >= CALLS_BATCH:
            self._shared.fold()

    def recheck(self, learned: Learned) -> float | None:
        """Fold the queued calls; then :func:`contradiction` of ``learned`` by the newest."""
        self.fold()
        return contradiction(learned, tuple(self.recent))
