"""Measure whether a callable holds the GIL, waits, or computes without the GIL.

Nothing in a function's name says whether it releases the GIL: a module-level
function may loop in Python (threads take turns) or spend its time in numpy,
hashlib, zlib or a system call (threads run in parallel). So the first items
of a map are run in the calling thread while :class:`GilSampler` watches:

* **CPU share**: the CPU time of the thread running the items over the
  wall time, at most 1. An item that sleeps or waits for I/O uses little
  CPU. The process's CPU time (``time.process_time``, so the threads of a
  BLAS library count, less other Python threads) over the same time is the
  number of cores one item keeps busy (``GilProfile.cores``): ``A @ A`` on a
  multithreaded BLAS keeps them all busy already.
* **GIL share**: a helper thread sleeps :data:`SAMPLE_PERIOD_S` at a time.
  Waking up needs the GIL, so each wake-up is late by as long as the
  measured thread keeps the GIL (up to the switch interval, 5 ms by
  default). The late time summed over the wall time is the fraction of time
  the GIL was held. The helper mostly sleeps, so it takes no core from the
  measured work, and the items' results are real results, kept by the map.

Measurements are kept for the process's lifetime, per callable and weakly
(:func:`remember`, :func:`recall`), so a new executor or a
``@parallel_map`` call does not measure the same callable again; every
:data:`GIL_RECHECK_MAPS` maps it is measured afresh.

Measured on the 2-core machine this was written on (GIL share, 3 runs of
about 50 ms each, ``benchmarks/bench_gil.py`` workloads): a pure-Python loop
0.84-0.90, numpy on 100-element arrays 0.87, a 60 % Python / 40 %
``np.sort`` item 0.56-0.61; ``A @ A`` (600 x 600), ``np.sort`` of 1 M
floats, ``sha256`` of 4 MiB, ``zlib.compress`` of 4 MiB, reading a file
0.00-0.10; ``time.sleep`` has a CPU share of 0.00.

:func:`classify` turns the two shares into one of three kinds; the policy
(:func:`smartexec.policy.decide`) sends ``"waits"`` and ``"releases"`` to
threads and ``"holds"`` to processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ._identity import WeakCallable, WeakRecords, identity_key
from ._system import SchedReader, sched_times
from ._threads import foreign_thread_ids, is_ours, own_thread

__all__ = [
    "GilKind",
    "GilProfile",
    "GilSampler",
    "Watched",
    "watch",
    "classify",
    "sched_times",
    "SchedReader",
    "recall",
    "remember",
    "recheck_due",
    "forget",
    "CPU_SHARE_WAITS",
    "GIL_SHARE_HOLDS",
    "MANY_CORES",
    "MANY_CORES_OWN_SHARE",
    "GIL_PROBE_S",
    "GIL_DECIDED_S",
    "GIL_PROBE_MAX_ITEMS",
    "GIL_MIN_ITEM_S",
    "GIL_RECHECK_MAPS",
    "SAMPLE_PERIOD_S",
]

GilKind = Literal["waits", "releases", "holds"]

#: Below this CPU share an item mostly waits (sleep, I/O, a child process):
#: threads overlap the waiting, whatever the item does with the GIL.
CPU_SHARE_WAITS = 0.5

#: At or above this GIL share per thread running items, an item is said to
#: hold the GIL. Threads then reach at most ``1 / share`` cores' worth of
#: work (4 at 0.25) and take turns on every GIL hand-over (up to the 5 ms
#: switch interval), while processes scale with the cores. Measured shares
#: fall far from it on both sides (see the module docstring); a half-Python
#: item read 0.26-0.30 on a machine loaded by other jobs.
GIL_SHARE_HOLDS = 0.25

#: An item that keeps this many cores busy or more (its own threads: a
#: multithreaded BLAS) is said to be parallel already: threads running several
#: such items at once share the same cores (see :attr:`GilProfile.cores`).
MANY_CORES = 1.5

#: An item is said to keep several cores busy only when its own thread was
#: on the CPU at least this share of the time too (the calling thread of a
#: BLAS routine computes its part): an item that waits beside busy BLAS
#: threads of someone else (a pool still spinning after the program's last
#: call) keeps one core at most.
MANY_CORES_OWN_SHARE = 0.8

#: Seconds the first items of a map are watched before a verdict, when the
#: route depends on it. At 0.5 ms a sample this gives about 10 samples even
#: when the GIL is held throughout (each then waits a switch interval).
GIL_PROBE_S = 0.05

#: Seconds after which a watch may end early, once its figures are decisive
#: (:meth:`GilSampler.decisive`): a pure-Python loop, a sleep or a big
#: ``np.sort`` are plain after a few items; a half-Python item is watched for
#: the whole :data:`GIL_PROBE_S`.
GIL_DECIDED_S = 0.015

#: Items faster than this (seconds) are not measured: per item, a process
#: pool's pickling and pipes cost a few microseconds, so such maps mostly run
#: inline, and GIL-releasing work that small is rare.
GIL_MIN_ITEM_S = 20e-6

#: Most items run while watching (their results are held until the map
#: yields them): 50 ms of items of 2.5 us or more.
GIL_PROBE_MAX_ITEMS = 20_000

#: A measured callable is measured again on every this many maps of it, in
#: case its inputs changed (arrays that grew past numpy's GIL-release size,
#: buffers that shrank under hashlib's 2 KiB).
GIL_RECHECK_MAPS = 50

#: A watch shorter than this (seconds) cannot tell holding the GIL from
#: releasing it, for a map's chunk or a submitted call alike: the sampler
#: wakes every 0.5 ms, its start waits up to a switch interval (5 ms) behind
#: a thread holding the GIL, and its start and join count in the watch's
#: time (2 ms pure-Python calls in fork workers read 30-45 % on the CPU, or
#: "releases"). Such a watch's CPU share still counts; its kind does not.
MIN_WATCH_S = 0.005

#: Seconds the sampler sleeps between wake-ups.
SAMPLE_PERIOD_S = 0.0005

#: A wake-up later than this is the operating system's timer slack (about
#: 50-70 us on Linux), not the GIL: only the part beyond it is counted.
_SLACK_S = 0.0002

#: Seconds the sampling thread may take to start with the GIL free (thread
#: creation, two reads of ``/proc``: about 0.1-0.3 ms); only the part beyond
#: it is counted as GIL held.
_START_SLACK_S = 0.001


def classify(cpu_share: float, gil_share: float) -> GilKind:
    """Sort a measured callable into ``"waits"``, ``"releases"`` or ``"holds"``.

    Pure.

    Args:
        cpu_share: CPU time over the time the thread running items was
            not queued for a CPU (0..1).
        gil_share: the fraction of wall time the GIL was held (0..1).

    Returns:
        ``"waits"`` when the CPU share is under :data:`CPU_SHARE_WAITS`,
        else ``"holds"`` when the GIL share is at least
        :data:`GIL_SHARE_HOLDS`, else ``"releases"``.
    """
    if cpu_share < CPU_SHARE_WAITS:
        return "waits"
    if gil_share >= GIL_SHARE_HOLDS:
        return "holds"
    return "releases"


@dataclass(frozen=True)
class GilProfile:
    """What a measurement of a callable's first items found.

    Attributes:
        kind: ``"waits"``, ``"releases"`` or ``"holds"`` (see :func:`classify`).
        items: items measured (int).
        wall_s: seconds the measurement lasted.
        cpu_share: the CPU time of the threads that ran the items over the
            time they were not queued for a CPU, at most 1.
        gil_share: the fraction of ``wall_s`` the GIL was held (0..1).
        samples: wake-ups of the sampling thread (int).
        threads: threads that ran items while watched (int).
        cores: cores one item keeps busy: the process's CPU time (less
            that of other Python threads) over the time the threads running
            items were not queued, per such thread (float; above 1 when an
            item runs threads of its own, as a multithreaded BLAS does for
            ``A @ A``). At most 1 when threads of the program ran meanwhile
            (their BLAS pools' time cannot be told from the item's), when a
            thread Python does not know was on a CPU as the watch began (a
            BLAS pool still spinning after an earlier call), or when
            the item's own threads were on the CPU under
            :data:`MANY_CORES_OWN_SHARE` of the time.
    """

    kind: GilKind
    items: int
    wall_s: float
    cpu_share: float
    gil_share: float
    samples: int
    threads: int = 1
    cores: float = 1.0

    @property
    def telling(self) -> bool:
        """Whether the watch lasted long enough (:data:`MIN_WATCH_S`) for its kind to count."""
        return self.wall_s >= MIN_WATCH_S

    def at_once(self, cpus: int) -> int:
        """How many such items fit on ``cpus`` cores at once (int >= 1).

        ``cpus / cores``, rounded: ``cpus`` for an item of one core or less,
        1 for an item that keeps every core busy by itself.
        """
        return max(1, round(cpus / max(1.0, self.cores)))

    def __str__(self) -> str:
        on = f" on {self.threads} threads" if self.threads > 1 else ""
        # Kinds read on threads from the pool's clocks have no watch of their own: no duration.
        watched = f" ({self.wall_s * 1000:.0f} ms)" if self.wall_s > 0 else ""
        figures = (
            f"measured over {self.items} item{'s' if self.items != 1 else ''}{on}"
            f"{watched}: on the CPU {self.cpu_share:.0%} of the time, "
            f"the GIL held {self.gil_share:.0%} of it"
        )
        if self.cores >= MANY_CORES:
            figures += (
                f"; one item keeps {self.cores:.1f} cores busy (threads of its own: BLAS, OpenMP)"
            )
        meaning = {
            "waits": "it mostly waits (I/O, sleep, a child process)",
            "releases": "it computes without the GIL (numpy, hashlib, zlib ... on big data)",
            "holds": "it holds the GIL, so threads would take turns",
        }[self.kind]
        return f"{figures} -> {meaning}"


def _foreign_thread_running() -> bool:
    """Whether a thread Python does not know (a BLAS or OpenMP pool) is on a CPU now.

    Such pools keep their threads spinning after a call (OpenBLAS about
    0.1 s): a watch that starts while they spin would count their time as
    the item's, and a hashing item run right after the program's ``A @ A``
    would read as keeping every core busy (2.0 cores on 2). Reads the state
    letter of ``/proc/self/task/<tid>/stat`` (``R``: running or runnable) of
    each thread not in :func:`threading.enumerate`; about 10 us a thread.
    False where ``/proc`` cannot be read (not Linux).
    """
    for tid in foreign_thread_ids():
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it ended meanwhile
        # "pid (comm) S ...": comm may hold spaces and parentheses.
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
        if state == b"R":
            return True
    return False


def _others_cpu() -> dict[int, float] | None:
    """Seconds on a CPU of smartexec's other threads (dispatchers, workers), by native id.

    The process's CPU time counts every thread; smartexec's own are not the
    item's, and their time is taken out (with threads of the program
    running, ``GilProfile.cores`` claims one core at most anyway). Threads
    Python does not know (a BLAS pool) stay in: they work for the item. None
    where a thread's time cannot be read (not Linux).
    """
    me = threading.get_native_id()
    times: dict[int, float] = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or tid == me or not is_ours(thread):
            continue
        sched = sched_times(tid)
        if sched is None:
            if thread.is_alive():
                return None
            continue  # it ended meanwhile
        times[tid] = sched[0]
    return times


class GilSampler:
    """Watch the process's CPU share and the GIL between ``start`` and ``stop``.

    The work measured runs in the thread that calls ``start()`` and
    ``stop()``; ``stop()`` joins the sampling thread, so no thread of ours
    outlives a measurement (a fork started afterwards sees one thread).

    A busy machine makes threads wait for a CPU now and then, which would
    look like waiting (a lower CPU share) and like a held GIL (late
    wake-ups). On Linux the time each thread spent queued for a CPU is read
    from ``/proc/self/task/<tid>/schedstat`` and taken out of both figures:
    the CPU share is counted over the time the measured threads were not
    queued, and the sampler's own queueing is not counted as late.

    Attributes:
        items: set by the caller to the number of items run while watched.
    """

    def __init__(self, period_s: float = SAMPLE_PERIOD_S):
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._late_s = 0.0
        self._sampler_queued_s = 0.0
        self._samples = 0
        self._start_wall = 0.0
        self._start_cpu = 0.0
        self._start_sched: tuple[float, float] | None = None
        self._start_others: dict[int, float] | None = None
        self._not_alone = False
        self._start_own = 0.0
        self._result: GilProfile | None = None
        self._running: threading.Event | None = None
        self.items = 0

    def _sample(self) -> None:
        period, clock = self._period_s, time.perf_counter
        # Waiting on the stop event, not sleeping: stop() wakes this thread at
        # once instead of joining it up to a period later (0.5 ms a watched
        # chunk, on the worker's way to its reply).
        stopped = self._stop.wait
        first = sched_times()
        if self._running is not None:
            self._running.set()  # start(settle=True) begins the clocks now
        else:
            # Starting takes this thread several GIL hand-overs (up to a switch
            # interval each): a measured thread that holds the GIL delays the
            # first sample by 10-15 ms, and that delay is held GIL too.
            started = clock() - self._start_wall - _START_SLACK_S
            if started > 0.0:
                self._late_s += started
        while True:
            before = clock()
            if stopped(period):
                break
            late = clock() - before - period - _SLACK_S
            if late > 0.0:
                self._late_s += late
            self._samples += 1
        last = sched_times()
        if first is not None and last is not None:
            self._sampler_queued_s = last[1] - first[1]

    def start(self, settle: bool = False) -> None:
        """Start watching (starts the sampling thread).

        Args:
            settle: start the sampling thread first and the clocks once it
                runs (waits up to 20 ms for it), so a short watch is not
                dominated by the thread's start. For a watch of work that has
                not begun yet (a worker's chunk); False counts the start,
                delayed by a measured thread that holds the GIL, as held GIL.
        """
        self._thread = own_thread(self._sample, "smartexec-gil")
        if settle:
            self._running = threading.Event()
            self._thread.start()
            self._running.wait(0.02)
        self._start_others = _others_cpu()
        # Threads of the program may run BLAS too, on pool threads Python does
        # not know: their CPU time cannot be told from the item's.
        me = threading.current_thread()
        self._not_alone = (
            any(t is not me and not is_ours(t) for t in threading.enumerate())
            or _foreign_thread_running()
        )
        self._start_wall = time.perf_counter()
        self._start_cpu = time.process_time()
        self._start_own = time.thread_time()
        self._start_sched = sched_times()
        if not settle:
            self._thread.start()

    def elapsed_s(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self._start_wall

    def _item_cpu(self, cpu: float) -> float:
        """``cpu`` (process CPU seconds since :meth:`start`) less smartexec's other threads'.

        Read after the caller's clocks: reading ``/proc`` costs CPU that is
        not the item's.
        """
        start = self._start_others
        if start:
            now = _others_cpu() or {}
            cpu -= sum(max(0.0, now[tid] - t0) for tid, t0 in start.items() if tid in now)
        return max(cpu, 0.0)

    def decisive(self) -> bool:
        """Whether the figures so far are far enough from every threshold to stop.

        For watches with one thread running items (the calling thread):
        True when its CPU share (queueing taken out, as in :meth:`stop`) is
        at most 0.2 (it waits), or when it is at least 0.5 and the GIL share
        at least 0.6 over 3 wake-ups or more (it holds), or when it is at
        least 0.8 and the GIL share at most 0.08 over 10 wake-ups or more
        (it releases). Costs one read of ``/proc`` on Linux (~10 us).
        """
        wall = max(time.perf_counter() - self._start_wall, 1e-9)
        own = time.thread_time() - self._start_own
        now = sched_times()
        queued = 0.0
        if self._start_sched is not None and now is not None:
            queued = now[1] - self._start_sched[1]
        # A thread cannot compute longer than it was not queued: the two
        # clocks are read apart, and under load their difference is noisy.
        busy = max(wall - queued, own, wall * 0.05)
        cpu_share = min(1.0, own / busy)
        gil_share = self._late_s / busy
        samples = self._samples
        if cpu_share <= 0.2:
            return True
        if cpu_share >= 0.5 and gil_share >= 0.6 and samples >= 3:
            return True
        return cpu_share >= 0.8 and gil_share <= 0.08 and samples >= 10

    def stop(self) -> GilProfile:
        """Stop watching; join the sampling thread and return the figures.

        Idempotent: a second call joins nothing and returns the figures again.

        Returns:
            A :class:`GilProfile` for the items run since :meth:`start`.
        """
        if self._result is not None:
            return self._result
        wall = max(time.perf_counter() - self._start_wall, 1e-9)
        own = time.thread_time() - self._start_own
        process = time.process_time() - self._start_cpu
        end = sched_times()
        cpu = self._item_cpu(process)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        late = max(0.0, self._late_s - self._sampler_queued_s)
        queued = 0.0
        if self._start_sched is not None and end is not None:
            queued = end[1] - self._start_sched[1]
        busy = max(wall - queued, wall * 0.05, own)  # see decisive()
        cores = cpu / max(busy, 1e-9)
        # The thread running items: the process's time may hold other work
        # (a BLAS pool still spinning after the program's last call).
        own_share = own / max(busy, 1e-9)
        cpu_share = min(1.0, own_share)
        if self._not_alone or own_share < MANY_CORES_OWN_SHARE:
            # Other threads' work may be in it, or the item's thread mostly
            # waited (busy pool threads are then not its own): claim one core.
            cores = min(cores, 1.0)
        # Time the measured thread sat queued is time it may have held the
        # GIL without working: count the share over the time it was not queued.
        gil_share = min(1.0, late / max(wall - queued, wall * 0.05))
        self._result = GilProfile(
            classify(cpu_share, gil_share),
            self.items,
            wall,
            cpu_share,
            gil_share,
            self._samples,
            1,
            round(cores, 2),
        )
        return self._result


class _Measured:
    __slots__ = ("handle", "profile", "maps")

    def __init__(self, profile: GilProfile):
        self.handle: WeakCallable = None  # type: ignore[assignment]  # set by WeakRecords.keep
        self.profile = profile
        self.maps = 0


_measured: WeakRecords[_Measured] = WeakRecords()
_measured_lock = threading.Lock()


def remember(fn: Callable[..., Any], profile: GilProfile) -> None:
    """Keep ``profile`` as ``fn``'s measurement while ``fn`` lives.

    Callables that cannot be weakly referenced are not kept (a cache must
    never keep a user's object alive).
    """
    with _measured_lock:
        _measured.keep(fn, _Measured(profile))


def recall(fn: Callable[..., Any]) -> GilProfile | None:
    """Return ``fn``'s last measurement, or None."""
    entry = _measured.find(fn)
    return None if entry is None else entry.profile


def recheck_due(fn: Callable[..., Any]) -> bool:
    """Count one map of ``fn``; True on every :data:`GIL_RECHECK_MAPS`-th since its measurement."""
    with _measured_lock:
        entry = _measured.find(fn)
        if entry is None:
            return True
        entry.maps += 1
        return entry.maps >= GIL_RECHECK_MAPS


def forget(fn: Callable[..., Any] | None = None) -> None:
    """Drop ``fn``'s measurement (every measurement when ``fn`` is None).

    The next executor that routes ``fn`` measures it again on its first map.
    """
    with _measured_lock:
        if fn is None:
            _measured.clear()
        else:
            _measured.pop(identity_key(fn), None)


class Watched:
    """What :func:`watch` ran: results in input order, and the verdict.

    Attributes:
        results: the outcome of each item run, in input order, up to (not
            including) the first item that raised.
        error: the first exception an item raised (by input position), or None.
        exhausted: True when the input ran out.
        profile: the measurement (a :class:`GilProfile`).
    """

    __slots__ = ("results", "error", "exhausted", "profile")

    def __init__(
        self,
        results: list[Any],
        error: BaseException | None,
        exhausted: bool,
        profile: GilProfile,
    ):
        self.results = results
        self.error = error
        self.exhausted = exhausted
        self.profile = profile


class _Watch:
    """One :func:`watch`: its items run in order in the calling thread, their results, the sampler."""

    def __init__(self, fn: Callable[..., Any], inputs: Iterator[Any], star: bool, max_items: int):
        self.fn, self.inputs, self.star, self.max_items = fn, inputs, star, max_items
        self.results: list[Any] = []
        self.sampler = GilSampler()
        self.exhausted = False
        self.error: BaseException | None = None

    def run_items(self, seconds: float, early_s: float | None) -> None:
        """Run items until time is up, ``max_items`` ran, the input ends, an item raises, or the figures are decisive."""
        fn, star, results = self.fn, self.star, self.results
        clock = time.perf_counter
        deadline = clock() + seconds
        check_at = None if early_s is None else deadline - seconds + early_s
        while len(results) < self.max_items and (now := clock()) < deadline:
            if check_at is not None and now >= check_at:
                if self.sampler.decisive():
                    return
                check_at = now + 0.002
            try:
                item = next(self.inputs)
            except StopIteration:
                self.exhausted = True
                return
            except BaseException as exc:  # reading the input failed: at its position
                self.error = exc
                return
            try:
                results.append(fn(*item) if star else fn(item))
            except BaseException as exc:
                self.error = exc
                if not isinstance(exc, Exception):
                    raise
                return


def watch(
    fn: Callable[..., Any],
    inputs: Iterator[Any],
    star: bool,
    *,
    seconds: float = GIL_PROBE_S,
    max_items: int = 20_000,
    decided_s: float | None = GIL_DECIDED_S,
) -> Watched:
    """Run the first items of a map in the calling thread for ``seconds`` while sampling the GIL.

    Items run one after another until the time is up, ``max_items`` ran,
    the input runs out, or an item (or reading the input) raises. Every
    item before the first failing one has its result in
    ``Watched.results``; nothing taken from ``inputs`` is lost.

    Args:
        fn: the callable.
        inputs: the items, consumed lazily: argument tuples when ``star``,
            else single arguments.
        star: whether each input is a tuple of arguments.
        seconds: how long to keep taking items.
        max_items: most items to take.
        decided_s: seconds after which the watch ends as soon as its figures
            are decisive (:meth:`GilSampler.decisive`, checked at most every
            2 ms, between items); None: never early.

    Returns:
        A :class:`Watched`.

    Raises:
        BaseException: an item's exception that is not an ``Exception``
            (``KeyboardInterrupt``, ``SystemExit``), after the sampler stopped.
    """
    run = _Watch(fn, inputs, star, max_items)
    run.sampler.start()
    try:
        run.run_items(seconds, decided_s)
    finally:
        run.sampler.items = len(run.results)
        profile = run.sampler.stop()
    return Watched(run.results, run.error, run.exhausted, profile)
