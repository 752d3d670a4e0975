"""Decide a map's route from its first chunks, measured where they ran.

A map starts at once on the backend the policy chose from what the callable
is (:func:`smartexec.policy.decide`): no item waits in the calling thread
while smartexec makes up its mind. Its first chunks are real work, run on
every worker, and each reply says how long its calls took, how much CPU
their thread used and, for a callable's first ~30 ms of work in each
process, whether they held the GIL (:func:`smartexec._remote.run_chunk`).
:class:`Evidence` gathers those replies; once it is enough
(:meth:`Evidence.ready`), :func:`reroute` predicts the rest of the map on
each route it may take and names a better one, or none.

Decisions must not flip between identical runs, nor on one noisy sample:

* the per-item time is the median over chunks (one stalled chunk, 100x
  slower than the rest, moves it by at most one rank);
* a GIL kind counts only when every watch long enough to see the GIL
  (:data:`~smartexec.gil.MIN_WATCH_S`) agrees on it;
* a map changes route at most once, only to a route predicted at least
  :data:`SWITCH_GAIN` times faster, and by at least :data:`SWITCH_MIN_S`
  seconds: a near-tie stays where it is, on every run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ._system import IDLE_TICK_S
from .gil import MIN_WATCH_S, GilKind, GilProfile, classify
from .inspection import format_seconds
from .tuning import predict_s

__all__ = [
    "THREADS_MIN_WALL_S",
    "Evidence",
    "Reroute",
    "reroute",
    "predict_s",
    "SWITCH_GAIN",
    "SWITCH_MIN_S",
]

#: A route must be predicted this many times faster than the running one.
SWITCH_GAIN = 1.3

#: ... and this many seconds faster over the rest of the map.
SWITCH_MIN_S = 0.005

#: Items on threads of this process: under this many cores of process CPU
#: they wait; from THREADS_RELEASE_CORES on they compute without the GIL.
THREADS_WAIT_CORES = 0.3
THREADS_RELEASE_CORES = 1.3
#: Pool threads that must have had chunks, on average, for the cores they
#: wanted to tell taking turns on the GIL (about one core between them) from
#: releasing it (about one core each).
MIN_BUSY_THREADS = 1.5
#: ... and threads that release it want at least this many cores: two
#: threads taking turns under load wanted 1.5 while 1.6 had chunks.
RELEASE_MIN_WANTED = 1.8
#: ... and only while the machine had at least this many cores to spare
#: (idle, or used by the pool, beyond one: see Evidence.spare_cores). With
#: none to spare, waiters for the GIL queue for a CPU at each wake-up, and
#: threads that release it stall behind a GIL holder the machine took off
#: its CPU: under one or two competing processes (2-core machine), six
#: threads taking turns wanted 1.4-3.4 cores, six running einsum 2.3-4.1.
#: Only threads that wanted under BUSY_MACHINE_HOLDS_WANTED cores (or
#: under halfway, if less) read as taking turns there.
SPARE_MIN_CORES = 0.5
BUSY_MACHINE_HOLDS_WANTED = 1.6
#: ... read over this many seconds at most while the idle time's rounding
#: leaves it unsure (see :meth:`Evidence.spare_cores`).
IDLE_SETTLE_S = 0.25
#: A watch on a thread whose GIL share is at least this saw other threads
#: hold the GIL: its thread's low CPU share is waiting for its turn.
GIL_HELD_BY_OTHERS = 0.25
#: ... counted once the items have run this many seconds (before, the
#: threads' start and the first calls' imports dominate the figure).
THREADS_MIN_WALL_S = 0.02

#: Items measured at under CHEAP_ITEM_S seconds each that settle a map
#: without a GIL kind (see :meth:`Evidence.ready`).
CHEAP_ITEMS = 64
#: Chunks from which the per-item figure is a trimmed mean (see Evidence.per_item_s) ...
TRIM_MIN_CHUNKS = 10
#: ... cutting this share of the items' weight at each end.
TRIM = 0.1
CHEAP_ITEM_S = 50e-6

#: Chunks whose CPU seconds per item exceed this multiple of the median are
#: left out of the mean (a first call that imports a big module); lognormal
#: items of sigma 1 lose ~10 % of their mean to it.
OUTLIER_FACTOR = 10.0

#: Items in the larger chunks, as a multiple of the smallest, for
#: :meth:`Evidence.per_chunk_send` to compare sending costs.
PER_CHUNK_MIN_RATIO = 8

#: Chunks after which the evidence is used as it stands, agreed or not.
MAX_SAMPLES = 16


@dataclass
class Evidence:
    """What the first chunks of one map measured.

    Attributes:
        per_item: per chunk, the seconds of work per item (its CPU time when
            it computed half the time or more, else its wall time).
        cpu_share: per chunk, CPU seconds over wall seconds (0..1).
        watches: the GIL watches (``GilProfile``) of at least
            :data:`~smartexec.gil.MIN_WATCH_S` seconds.
        items: items measured.
        n_workers: workers of the backend that ran them.
        on_threads: the items ran on threads of this process.
        process_cores: for items run on threads of this process, the CPU
            seconds their own threads used per second since the map began,
            once :data:`THREADS_MIN_WALL_S` passed (None before, and for
            process workers). Each thread's own CPU share cannot tell
            waiting for I/O from waiting for the GIL; the process's can:
            about 0 when the items wait, about 1 core when they take turns
            on the GIL, up to the CPU count when they release it.
        sent: per chunk sent to a process backend, ``(items, seconds)`` the
            caller spent sending it (pickling, shared memory); see
            :meth:`send_s` and :meth:`per_chunk_send`.
        cpu_total_s: CPU seconds of every chunk measured.
        wall_chunks: chunks whose figure is their wall time (they computed
            less than half of it), which a stall can inflate.
        wanted_cores: as ``process_cores``, but the seconds those threads
            were runnable (on a CPU or queued for one, Linux's schedstat),
            or None where that cannot be read. A machine short of CPUs
            lowers ``process_cores`` of threads that release the GIL to
            what they got (one core reads as taking turns); their runnable
            time stays about one core per busy thread.
        busy_threads: over the same time as ``wanted_cores``, how many pool
            threads ran a chunk (or a call), on average; None where not read.
            A pool fed fewer chunks than it has threads (the first chunks,
            a caller kept off a CPU) has fewer threads to be runnable.
        idle_cores: over the same time, how many of the machine's cores
            sat idle, give or take :attr:`idle_error`, measured over
            ``idle_wall_s`` seconds; None where not read.
            Under :data:`SPARE_MIN_CORES`, ``wanted_cores`` decides nothing
            (see :meth:`spare_cores`).
    """

    n_workers: int
    per_item: list[float] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    cpu_share: list[float] = field(default_factory=list)
    watches: list[GilProfile] = field(default_factory=list)
    items: int = 0
    on_threads: bool = False
    process_cores: float | None = None
    wanted_cores: float | None = None
    busy_threads: float | None = None
    idle_cores: float | None = None
    idle_wall_s: float = 0.0
    #: Replies left out because their CPU seconds were not read.
    unclocked: int = 0
    sent: list[tuple[int, float]] = field(default_factory=list)
    #: Per chunk whose request was big, a worker's seconds per item to take
    #: it in (:attr:`~smartexec._remote.ChunkResult.receive_s`).
    received: list[float] = field(default_factory=list)
    #: Seconds a worker's first call took beyond the chunk's others, left out
    #: of :attr:`per_item` (see :meth:`add`); one per worker at most.
    warm_ups: list[float] = field(default_factory=list)
    #: A worker's first call alone in its chunk, its seconds of work, held
    #: out of :attr:`per_item` until a later chunk tells whether it was a
    #: warm-up (see :meth:`add`).
    lone_firsts: list[float] = field(default_factory=list)
    wall_chunks: int = 0
    cpu_total_s: float = 0.0
    #: A verdict to stay was acted on (noted, saved) while :meth:`recheck_stay`
    #: still wanted more chunks: a move may follow, or the stay's last look.
    stay_noted: bool = False
    #: The executor's log entry for that stay, which its last look replaces.
    stay_note: Any = None
    #: The GIL kind the chunks agreed on when that stay was noted (None: none).
    noted_kind: GilKind | None = None

    def add(
        self,
        n_items: int,
        compute_s: float,
        cpu_s: float,
        gil: Any,
        first: tuple[float, float] | None = None,
        receive_s: float = 0.0,
    ) -> None:
        """Record one chunk's reply (its item count, wall and CPU seconds, GIL watch, first call).

        ``receive_s``: the seconds its worker took to take in a big request
        (see :meth:`send_s`), 0.0 when not measured.

        A chunk whose CPU seconds were not read (``cpu_s`` < 0, see
        :meth:`~smartexec.backends.thread.ThreadBackend.unclocked`) is no
        evidence: it is left out. A first call (``first``, its ``(wall,
        CPU)`` seconds) is the worker process's first call of the callable
        (:attr:`~smartexec._remote.ChunkResult.first`): what it took beyond
        the steady calls is that process's warm-up (imports, caches, the
        pages it copies after the fork), paid once, and counted so
        (:attr:`warm_ups`, :attr:`warm_up_s`), never as work per item. Its
        chunk's other calls are the steady figure: a fresh fork worker's
        first numpy call took 270 us against 2.4 us for the next 63, and
        the chunk read 6.7 us an item (a loop, priced at that, was
        predicted at 2.8x its time); a first seeded 2 MiB noise array and
        sort took 18 ms against 6.5 ms, read as 12 ms an item, and fork
        was predicted at 1.6x its time. A first call alone in its chunk is
        held apart until a later chunk is in, then judged against the
        chunks' weighted median (:meth:`_judge_lone_firsts`). One first
        call per worker at most: past that, workers are being replaced
        (``max_tasks_per_child``), and a first call counts as its chunk's.
        """
        if n_items <= 0:
            return
        if receive_s > 0 and len(self.received) < MAX_SAMPLES:
            self.received.append(receive_s / n_items)
        if cpu_s < 0:
            self.unclocked += 1  # counts toward MAX_SAMPLES: a verdict still comes
            return
        self.items += n_items
        self.cpu_total_s += max(cpu_s, 0.0)
        # A computing chunk's CPU time is its work: its wall time also holds
        # the time its worker waited for a core (the parent, other workers, a
        # busy machine), which a loop here, or threads, would not wait.
        computing = compute_s > 0 and cpu_s >= 0.5 * compute_s
        work = max(cpu_s if computing else compute_s, 0.0)
        if not computing:
            self.wall_chunks += 1
        per_item = work / n_items
        if first is not None and len(self.warm_ups) + len(self.lone_firsts) >= self.n_workers:
            # More first calls than workers: the route replaces its workers
            # (max_tasks_per_child), and its chunks pay their warm-ups. With
            # one chunk per worker, every chunk was a first call alone, and
            # no map ever had a steady figure to decide on.
            first = None
        if first is not None and n_items == 1:
            self.lone_firsts.append(per_item)  # judged once a steady figure is in
        else:
            if first is not None:  # the steady figure is the chunk's other calls
                first_s = first[1] if computing else first[0]
                per_item = max(work - first_s, 0.0) / (n_items - 1)
                self.warm_ups.append(max(first_s - per_item, 0.0))
            self.per_item.append(per_item)
            self.weights.append(n_items)
            self._judge_lone_firsts()
        if compute_s > 0:
            self.cpu_share.append(min(1.0, max(cpu_s, 0.0) / compute_s))
        if isinstance(gil, GilProfile) and gil.telling:
            self.watches.append(gil)

    def _judge_lone_firsts(self) -> None:
        """Count the first calls held apart (:attr:`lone_firsts`) as warm-ups beside the chunks' figure now.

        What each took beyond the weighted median of the chunks is its
        process's warm-up (:attr:`warm_ups`), as a longer chunk's first
        call's excess over its other calls is.
        """
        if not self.lone_firsts or not self.per_item:
            return
        steady = self._weighted_median(sorted(zip(self.per_item, self.weights)), sum(self.weights))
        self.warm_ups.extend(max(seconds - steady, 0.0) for seconds in self.lone_firsts)
        self.lone_firsts.clear()

    def ready(self) -> bool:
        """Whether the evidence suffices to decide.

        True after :data:`MAX_SAMPLES` replies (those whose CPU seconds were
        not read count too, once one was); or, from two chunks on, once
        the watches agree on a GIL kind (see :attr:`kind`), or once
        :data:`CHEAP_ITEMS` items measure under :data:`CHEAP_ITEM_S` each:
        whether such items are worth sending to a process depends on their
        cost against pickling them, not on the GIL (their chunks are too
        short to watch it anyway).
        """
        if self.per_item and len(self.per_item) + self.unclocked >= MAX_SAMPLES:
            return True
        if len(self.per_item) < min(2, self.n_workers):
            return False
        if self.items >= CHEAP_ITEMS and self.per_item_s < CHEAP_ITEM_S:
            return True
        return self.kind is not None

    def recheck_stay(self) -> bool:
        """Whether a verdict to stay, reached now, should be taken again at later chunks.

        Every map decides early (see :meth:`ready`), from chunks that are
        each worker's first, and a fresh worker's first calls pay for what
        later ones do not: cold caches and the pages it copies after the
        fork (2-15x the steady figure: 252 calls of a 0.4 us function read
        2-15 us each, 2-core machine), the imports and module-level set-up
        the callable does on first use (sha256 of a 4 MiB block a worker
        builds at its first call read 20 ms an item, 2.35 ms steady:
        explain() predicted 2.4 s for a 0.3 s map). So a stay is noted
        (the profile saved, the next maps routed) and taken again at each
        result until :data:`MAX_SAMPLES` chunks are in (bigger, later ones,
        which weigh more). Items under :data:`CHEAP_ITEM_S` may still move
        then (a near-tie of cheap items priced by cold workers, against a
        loop here); dearer ones keep their route, and the later figures
        replace the first ones (see :func:`reroute`'s ``may_move``). A move
        is acted on at once. A map moves at most once.

        On threads, the GIL kind comes from the pool's clocks read
        :data:`THREADS_MIN_WALL_S` apart: a map whose first chunks all came
        back sooner (64 numpy items of 1 ms) is taken again until they have
        been read, or its last look priced it as holding the GIL (3x off);
        so is one whose figures wait on the machine's idle time (see
        :meth:`spare_cores`).
        """
        if len(self.per_item) + self.unclocked < MAX_SAMPLES:
            return True
        if not self.on_threads:
            return False
        return self.process_cores is None or (self.kind is None and self.spare_cores() is None)

    def add_send(self, n_items: int, seconds: float) -> None:
        """Record that sending a chunk of ``n_items`` took the caller ``seconds``."""
        if n_items > 0 and len(self.sent) < MAX_SAMPLES:
            self.sent.append((n_items, seconds))

    def send_s(self, estimated: float) -> float:
        """Seconds per item to send: the warm sends' own (low median), if dearer than ``estimated``.

        The estimate pickles a sample into nothing and prices big buffers
        at a shared-memory write rate measured on a quiet machine; the
        sends themselves also pay for allocating the segments' pages. The
        first send to each worker pays for the pool's start and the worker's
        first reads (a probe's two chunks of 64 JSON documents took this
        thread 11-14 ms and 1.0-1.2 ms, later chunks of 1,000 0.2-0.6 ms):
        once a later send is in, only those count. Until then the first
        ones bound the cost from above (their low median: the pool's start
        is left out from two sends on), which errs toward a loop for items
        that cost less than sending them (30,000 numpy calls of 4 us: 128
        items on fork, then a loop; priced from the pickling estimate
        instead, 12,000-17,000 went to fork first, 1.3x slower).

        Big ``bytes`` and ``str`` travel in the pickle stream, which the
        estimate prices at its pickling into nothing (2 MiB ``bytes``: 40
        us) and a send off the caller's thread does not cost the caller;
        copying them through a pipe and out of it costs each end about 1.5
        ms (fork, 2-core machine): a map of 6 hashes per 2 MiB blob was
        predicted at a tie between fork and threads, and threads ran 1.33x
        faster. Where workers timed taking in big requests, the low median
        of their seconds per item counts as this end's too.
        """
        sends = self.warm_sends or self.sent
        send_s = estimated
        if sends:
            send_s = max(send_s, statistics.median_low(t / n for n, t in sends))
        if self.received:
            send_s = max(send_s, statistics.median_low(self.received))
        return send_s

    @property
    def warm_sends(self) -> list[tuple[int, float]]:
        """The sends recorded after each worker's first: ``(items, seconds)`` each."""
        return self.sent[self.n_workers :]

    def per_chunk_send(self, estimated: float) -> tuple[float, float] | None:
        """``(seconds per chunk, seconds per item)`` to send, when the cost is mostly per chunk; else None.

        The same big argument in every call (one 20 MiB array) is proven
        unchanged once per chunk by the send-once cache (pickle's memo does
        the same within one pickle), so a chunk of 75 items costs the caller
        about what a chunk of one does, while :meth:`send_s` and the
        estimate price each item as a separate send. Told apart by the
        sends themselves: one-item chunks that paid at least half the
        estimate, and chunks of :data:`PER_CHUNK_MIN_RATIO` times as many
        items that cost under a quarter of that per item. Otherwise (equal
        chunks, or sends pickled off the caller's thread, which cost the
        caller the same microseconds whatever they carry) None.
        """
        sent = self.warm_sends
        if len(sent) < 2:
            return None
        small = min(n for n, _ in sent)
        large = max(n for n, _ in sent)
        if large < PER_CHUNK_MIN_RATIO * small:
            return None
        few = statistics.median(t for n, t in sent if n == small)
        many = statistics.median(t for n, t in sent if n * 2 >= large)
        if few / small < 0.5 * estimated or many / large >= 0.25 * few / small:
            return None
        per_item = max(0.0, (many - few) / (large - small))
        return max(0.0, few - per_item * small), per_item

    @property
    def per_item_basis(self) -> str:
        """How :attr:`per_item_s` is taken from the chunks now, in a word or two."""
        if not self.wall_chunks:
            return "mean"
        return "trimmed mean" if len(self.per_item) >= TRIM_MIN_CHUNKS else "median"

    @property
    def warm_up_s(self) -> float:
        """Seconds a route not running yet pays once for its first call (the median warm-up, 0.0 for none)."""
        return statistics.median(self.warm_ups) if self.warm_ups else 0.0

    @property
    def cpu_per_item_s(self) -> float:
        """CPU seconds per item over every chunk measured (0.0 before any)."""
        return self.cpu_total_s / self.items if self.items else 0.0

    @property
    def per_item_s(self) -> float:
        """Seconds of work per item: a trimmed mean, each chunk weighted by its items (0.0 before any).

        Weighted: the first one-item chunks (a worker's first call pays for
        cold caches) count as one item each, not as much as a chunk of 600.
        From :data:`TRIM_MIN_CHUNKS` chunks on, the mean of the middle 80 %
        of the items (a tenth cut at each end): one stalled chunk among ten
        or more is cut off, and heavy-tailed durations are priced near their
        mean (lognormal items' median is ~0.6 of it: the predicted time of
        the rest read 1.85x short). Fewer chunks: the weighted median.
        While every chunk computed (its figure is its CPU time, which a
        stall, a worker waiting for a core, does not enter), the weighted
        mean of the chunks within :data:`OUTLIER_FACTOR` times the weighted
        median: the decision comes after a few chunks, where a median of
        heavy-tailed items read 1.9x short of the whole map, while a first
        call that imports a big module is still left out. Such chunks are
        left out only while there are no more of them than workers (one
        first call each); more are slow items, and all count.
        """
        if not self.per_item:
            # Only first calls so far: they are all there is to go by.
            return statistics.median(self.lone_firsts) if self.lone_firsts else 0.0
        total = sum(self.weights)
        pairs = sorted(zip(self.per_item, self.weights))
        if not self.wall_chunks:
            bound = OUTLIER_FACTOR * self._weighted_median(pairs, total)
            inside = [(s, w) for s, w in pairs if s <= bound]
            if len(pairs) - len(inside) > self.n_workers:
                inside = pairs  # more than a first call per worker: the items are slow
            return sum(s * w for s, w in inside) / sum(w for _, w in inside)
        if len(pairs) >= TRIM_MIN_CHUNKS:
            low, high = total * TRIM, total * (1 - TRIM)
            seen = 0.0
            kept = weighted = 0.0
            for seconds, weight in pairs:
                lo, hi = max(seen, low), min(seen + weight, high)
                if hi > lo:
                    kept += (hi - lo) * seconds
                    weighted += hi - lo
                seen += weight
            if weighted > 0:
                return kept / weighted
        return self._weighted_median(pairs, total)

    @staticmethod
    def _weighted_median(pairs: list[tuple[float, int]], total: int) -> float:
        """The weighted median of sorted ``(seconds, weight)`` pairs whose weights sum to ``total``."""
        half = total / 2
        seen = 0
        for seconds, weight in pairs:
            seen += weight
            if seen >= half:
                return seconds
        return pairs[-1][0]  # pragma: no cover - the loop always returns

    @property
    def kind(self) -> GilKind | None:
        """The GIL kind the watches agree on, or None (too few, or they disagree).

        The kind of the watches' median CPU and GIL shares, when at least
        two watches and two thirds of them are of that kind (one watch
        disturbed by a busy machine is outvoted, not averaged in); or one
        watch of at least four times :data:`~smartexec.gil.MIN_WATCH_S` (20 ms). With no watch, a
        callable whose chunks used under a fifth of a CPU (median) waits:
        under a competing process, computing chunks still get about half a
        CPU each, and unwatched figures are not corrected for time queued.
        """
        watches = self.watches
        if self.on_threads:
            if self.process_cores is None:
                return None
            return self._kind_on_threads(self.process_cores)
        if not watches:
            if self.cpu_share and statistics.median(self.cpu_share) < 0.2:
                return "waits"
            return None
        kind = classify(
            statistics.median(w.cpu_share for w in watches),
            statistics.median(w.gil_share for w in watches),
        )
        agree = sum(w.kind == kind for w in watches)
        if len(watches) == 1:
            return kind if watches[0].wall_s >= 4 * MIN_WATCH_S else None
        return kind if agree >= 2 and 3 * agree >= 2 * len(watches) else None

    def _kind_on_threads(self, cores: float) -> GilKind | None:
        """The kind of items run on threads here, from the process's CPU use and the watches.

        Items whose own CPU share (median) times the threads is under
        :data:`THREADS_WAIT_CORES` wait (items that take turns on the GIL
        keep about one core busy between them); so do items under that many
        cores of the pool's threads, unless each computed while it ran (the
        pool then waited for chunks: undecided); from
        :data:`THREADS_RELEASE_CORES` on they release the GIL (threads that
        hold it cannot use much more than one core together, whatever a
        watch disturbed by a saturated machine says). The pool's figure is
        the cores its threads wanted (:attr:`wanted_cores`) where Linux
        tells, else the cores they used. In between, computing items whose
        threads wanted about one core took turns on the GIL; without
        ``wanted_cores`` they hold it only when two watches or more
        (median) saw it held half the time or more (the threads' CPU alone
        is not enough: their first calls' imports and BLAS set-up read as
        work); else undecided (None), as before two chunks.
        """
        if len(self.per_item) < 2:
            return None
        held = [w.gil_share for w in self.watches]
        # Each item's own thread barely on a CPU, and no sign of the GIL held
        # by others meanwhile: it waits, even if starting the threads (their
        # first calls' imports, BLAS set-up) kept the process busy.
        share = statistics.median(self.cpu_share) if self.cpu_share else None
        idle = share is not None and share < 0.05
        # Items that take turns on the GIL keep one core busy between them:
        # each of n threads computes about 1/n of its time. Far under that,
        # summed over every thread, the items wait, whatever a watch says
        # (on threads it also sees the caller and the threads' start hold
        # the GIL, and a busy machine's late wake-ups).
        items_cores = share * self.n_workers if share is not None else None
        if (items_cores is not None and items_cores < THREADS_WAIT_CORES) or (
            idle and (not held or statistics.median(held) < GIL_HELD_BY_OTHERS)
        ):
            return "waits"
        wanted = self.wanted_cores
        if wanted is not None and self.n_workers >= 2:
            return self._kind_from_wanted(cores, wanted, share)
        if cores < THREADS_WAIT_CORES:
            # The pool's threads were mostly idle, but its items computed
            # while they ran: the threads waited for chunks (a caller that
            # cannot feed them, items too cheap to send), not the items for
            # I/O. That says nothing of the GIL: undecided.
            return "waits" if share is None or share < THREADS_WAIT_CORES else None
        if cores >= THREADS_RELEASE_CORES:
            return "releases"  # threads that hold the GIL cannot use much over one core
        gil_held = len(held) >= 2 and statistics.median(held) >= 0.5
        if gil_held:
            return "holds"
        # Between the two, with no watch seeing the GIL held: the threads'
        # first calls (imports, BLAS set-up) may be in the figure. Undecided.
        return None

    @property
    def idle_error(self) -> float:
        """How far :attr:`idle_cores` may be off, in cores.

        The machine's idle time is counted in whole ticks of
        :data:`~smartexec._system.IDLE_TICK_S`: its idle and I/O-wait parts are
        each rounded once, at either end of ``idle_wall_s``.
        """
        return 2 * IDLE_TICK_S / self.idle_wall_s if self.idle_wall_s > 0 else 0.0

    def spare_cores(self) -> bool | None:
        """Whether the machine had cores to spare while the threads ran: True, False, or None (not yet known).

        The pool could have had the cores it used and those that sat idle;
        beyond the one core threads taking turns on the GIL use, at least
        :data:`SPARE_MIN_CORES` of them are to spare. Threads that use about
        one core while others sit idle wait for each other; on a machine
        with no core to spare they may only be short of CPUs. True where
        the idle time is not read; None while that figure, give or take the
        ticks' rounding, straddles :data:`SPARE_MIN_CORES` over less than
        :data:`IDLE_SETTLE_S` (a 20 ms window is off by up to one core);
        after that, the figure as read decides.
        """
        if self.idle_cores is None:
            return True
        # The cores the pool could have had: those it used and those idle.
        spare = self.idle_cores + (self.process_cores or 0.0) - 1.0
        if spare - self.idle_error >= SPARE_MIN_CORES:
            return True
        if spare + self.idle_error < SPARE_MIN_CORES:
            return False
        return None if self.idle_wall_s < IDLE_SETTLE_S else spare >= SPARE_MIN_CORES

    def _kind_from_wanted(self, used: float, wanted: float, share: float | None) -> GilKind | None:
        """The kind of computing items on threads from the cores their threads wanted.

        Threads that release the GIL are runnable all the time: about one
        core each, whatever a busy machine lets them use. Threads that take
        turns want about one core between them, plus their timed waits for
        the GIL (one each switch interval), queued for a CPU on a busy
        machine: 1.5 cores for six of them under load. Halfway between the
        two, ``(1 + busy) / 2``, tells them apart, where ``busy`` is how
        many threads had a chunk (:attr:`busy_threads`, else every
        worker): 64 numpy items whose pool was fed 3 chunks at a time
        under load wanted 3.1 cores of 6 threads, and read as taking turns
        (the rest moved to a loop, 1.4x slower). Fewer than
        :data:`MIN_BUSY_THREADS` busy threads cannot tell (one thread alone
        is runnable either way), unless they used more than one core; and
        over halfway but under :data:`RELEASE_MIN_WANTED` cores wanted
        cannot tell either; nor can any figure but one under
        :data:`BUSY_MACHINE_HOLDS_WANTED` while fewer than
        :data:`SPARE_MIN_CORES` cores were to spare (a machine busy with
        other work, see :meth:`spare_cores`). Under :data:`THREADS_WAIT_CORES` of both the pool waited for chunks
        (undecided, unless the items barely computed).
        """
        busy = (
            self.n_workers if self.busy_threads is None else min(self.busy_threads, self.n_workers)
        )
        if used >= THREADS_RELEASE_CORES:
            return "releases"
        if max(used, wanted) < THREADS_WAIT_CORES:
            return "waits" if share is None or share < THREADS_WAIT_CORES else None
        if busy < MIN_BUSY_THREADS:
            return None
        halfway = (1 + busy) / 2
        if wanted < min(halfway, BUSY_MACHINE_HOLDS_WANTED):
            return "holds"  # on any machine
        if not self.spare_cores():
            return None  # a machine with no core to spare (or not known yet)
        if wanted < halfway:
            return "holds"
        # Under RELEASE_MIN_WANTED, two threads releasing the GIL and two
        # taking turns under load look alike: cannot tell.
        return "releases" if wanted >= RELEASE_MIN_WANTED else None

    def profile(self) -> GilProfile | None:
        """One :class:`~smartexec.gil.GilProfile` for the agreed kind (to remember), or None."""
        kind = self.kind
        if kind is None:
            return None
        watches = [w for w in self.watches if w.kind == kind]
        if self.process_cores is not None:
            share = min(1.0, self.process_cores)
            held = 0.9 if kind == "holds" else 0.0
            return GilProfile(kind, self.items, 0.0, share, held, 0)
        if not watches:
            share = statistics.median(self.cpu_share)
            return GilProfile(kind, self.items, 0.0, share, 0.0, 0)
        cpu = statistics.median(w.cpu_share for w in watches)
        held = statistics.median(w.gil_share for w in watches)
        return GilProfile(
            kind,
            sum(w.items for w in watches),
            sum(w.wall_s for w in watches),
            cpu,
            held,
            sum(w.samples for w in watches),
            1,
            statistics.median(w.cores for w in watches),
        )

    def describe(self) -> str:
        """The figures, for ``explain()``: items, chunks, the time per item (and how it is taken), the watches' kind."""
        kind = self.kind
        n = len(self.watches)
        verdict = (
            ("agree" if n > 1 else "says") + f": {kind}"
            if kind is not None
            else "disagree on whether the GIL is held"
            if n > 1
            else "too short alone to tell whether the GIL is held"
        )
        watched = f"; {n} GIL watch{'es' if n != 1 else ''} {verdict}" if n else ""
        if not n and kind is not None and self.cpu_share:
            share = statistics.median(self.cpu_share)
            watched = f"; its chunks were on a CPU {share:.0%} of the time: it {kind}"
        busy = f" by {self.busy_threads:.1f} busy threads" if self.busy_threads is not None else ""
        idle = (
            f", while {self.idle_cores:.1f} +- {self.idle_error:.1f} of the machine's cores sat idle"
            if self.idle_cores is not None
            else ""
        )
        wanted = (
            f" and wanted {self.wanted_cores:.1f}{busy} (on a CPU or queued for one){idle}"
            if self.wanted_cores is not None
            else ""
        )
        on_threads = (
            f"; its threads used {self.process_cores:.1f} cores meanwhile{wanted} "
            + (f"(kind: {kind})" if kind is not None else "(kind: not settled yet)")
            if self.process_cores is not None
            else ""
        )
        return (
            f"measured in the workers: {self.items} items in {len(self.per_item)} chunks, "
            f"{self.per_item_basis} {format_seconds(self.per_item_s)} per item"
            f"{watched if on_threads == '' else ''}"
            f"{on_threads}"
        )


@dataclass(frozen=True)
class Reroute:
    """What :func:`reroute` found.

    Attributes:
        target: the route to move the rest of the map to, or None to stay.
        predicted: predicted seconds for the rest, per route considered.
        reason: one sentence with the figures.
    """

    target: str | None
    predicted: dict[str, float]
    reason: str


def reroute(
    evidence: Evidence,
    *,
    current: str,
    candidates: dict[str, tuple[int, float]],
    send_s: float,
    rest: int | None,
    cpus: int,
    prior: GilKind | None = None,
    may_move: bool = True,
    in_flight: int = 0,
) -> Reroute:
    """Whether the rest of a map should move from ``current`` to another route; pure.

    Args:
        evidence: the first chunks' figures (see :meth:`Evidence.ready`).
        current: the route running now (a backend name).
        candidates: routes it may move to (the current one included), each
            with its ``(workers, start-up seconds)``.
        send_s: seconds per item to send an item to a process and get its
            result back (measured on a sample).
        rest: items not yet sent, or None when the input's length is
            unknown (then counted as the items measured so far: a switch
            must pay for itself on no more than what was seen).
        cpus: usable CPUs.
        prior: the GIL kind measured before (an earlier map, an earlier
            run), for the figures only while these chunks agree on none: a
            map on threads whose own figures are not settled yet was priced
            as holding the GIL (1.5x a loop), 3x what it took.
        may_move: False at a stay's later looks (see
            :meth:`Evidence.recheck_stay`) for items over
            :data:`CHEAP_ITEM_S`: their figures are refreshed, their route
            kept. Near the end of a map, its chunks shrink, a cost paid per
            chunk weighs more, and a move there (the last 192 of 5,000
            items to a loop) would route the next run by its tail.
        in_flight: items sent to a process route ``current`` and not back
            yet: each route is predicted for them and the rest, to the
            map's end. They wait in its workers' queues: on ``current`` the
            rest follows them, and a move takes back those no worker has
            begun, which then go with the rest (most of them: a worker runs
            one chunk at a time). Left out, JSON documents on fork, ~6,000
            items in flight at the map's last look, were predicted at
            0.033 s for a rest that took 0.105 s; priced beside the new
            route instead of with it, a move to threads of 50 items on one
            fork worker took 12 of its 16 in flight along, and was predicted
            for 14. On threads (or a loop) chunks in flight already run side
            by side and end within a chunk's time: not counted.

    Returns:
        A :class:`Reroute`; ``target`` is None unless another route is
        predicted :data:`SWITCH_GAIN` times faster and :data:`SWITCH_MIN_S`
        seconds sooner, on a GIL kind the watches agree on (a loop in the
        calling thread, whose prediction needs no GIL kind, also without).
    """
    kind = evidence.kind
    priced = kind if kind is not None else prior  # the kind the figures are taken on
    left = evidence.items if rest is None else rest
    if current in ("thread", "inline"):
        in_flight = 0  # chunks on threads run side by side already: they end within a chunk
    per_item_s, cores = _priced_item(evidence, current, priced)
    predicted = {
        route: predict_s(
            route,
            kind=priced,
            per_item_s=per_item_s,
            send_s=send_s,
            rest=left + in_flight,
            cpus=cpus,
            workers=workers,
            startup_s=startup_s + (0.0 if route == current else evidence.warm_up_s),
            cores=cores,
        )
        for route, (workers, startup_s) in candidates.items()
    }
    figures = ", ".join(f"{route} {seconds:.3f} s" for route, seconds in predicted.items())
    if priced is not None and kind is None:
        figures += f" (on the GIL use measured before: {priced})"
    known = _known_predictions(evidence, current, predicted)
    best = min(known, key=lambda route: (known[route], route != current))
    items = (
        f"the {left} items not sent yet"
        if rest is not None
        else f"the next {left} items (the input's length is unknown: as many as measured)"
    )
    if in_flight > 0:
        items += f" and the {in_flight} in flight on {current}"
    what = f"{evidence.describe()}; predicted for {items}: {figures}"
    if best == current:
        return Reroute(
            None, predicted, f"{what} -> stays on {current} ({_why_stay(kind, current, known)})"
        )
    return _move_if_worth_it(what, current, best, predicted, may_move)


def _known_predictions(
    evidence: Evidence, current: str, predicted: dict[str, float]
) -> dict[str, float]:
    """The predictions :func:`reroute` may choose among: those its GIL kind allows.

    Only a loop's prediction, and a process route's, do not rest on the GIL
    kind: without one, a process route may still give way to a loop; so may
    threads running cheap items (under :data:`CHEAP_ITEM_S`: they gain
    nothing from threads, whatever the GIL).
    """
    if evidence.kind is not None:
        return predicted
    cheap = evidence.per_item_s < CHEAP_ITEM_S
    movable = ("inline",) if current != "thread" or cheap else ()
    return {route: s for route, s in predicted.items() if route == current or route in movable}


def _why_stay(kind: GilKind | None, current: str, known: dict[str, float]) -> str:
    """Why the current route stays, when it is (one of) the fastest ``known``."""
    if kind is None:
        return "its GIL use is not settled yet"
    here = known[current]
    if any(route != current and s <= here * 1.001 for route, s in known.items()):
        return "no route is predicted faster"
    return f"{current} is fastest"


def _priced_item(evidence: Evidence, current: str, priced: GilKind | None) -> tuple[float, float]:
    """The seconds per item and the cores one item keeps busy, as :func:`reroute` prices them."""
    cores = 1.0
    if evidence.watches and current != "thread":
        # Watched in a worker process, the process's CPU is the item's own
        # (its BLAS threads); on threads it is every worker thread's too.
        cores = statistics.median(w.cores for w in evidence.watches)
    per_item_s = evidence.per_item_s
    if evidence.on_threads and priced in ("releases", "holds") and evidence.cpu_per_item_s > 0:
        # Threads that release the GIL, more of them than cores: each
        # chunk's wall time holds its wait for a core (6 threads on 2 cores
        # read 3x, and explain() predicted 4.6x the run); threads that take
        # turns on the GIL, its wait for the GIL (sha256 of 7,733 small
        # files read 434 us an item on 5 threads, 36 us in a loop). Its CPU
        # is the work.
        per_item_s = min(per_item_s, evidence.cpu_per_item_s)
    return per_item_s, cores


def _move_if_worth_it(
    what: str, current: str, best: str, predicted: dict[str, float], may_move: bool
) -> Reroute:
    """Move to ``best`` only if it gains :data:`SWITCH_GAIN` times and :data:`SWITCH_MIN_S` seconds."""
    here = predicted[current]
    gain = here / max(predicted[best], 1e-9)
    saved = here - predicted[best]
    if gain < SWITCH_GAIN:
        why = f"{best} would gain only {gain:.2f}x"
    elif saved < SWITCH_MIN_S:
        why = (
            f"{best} would save only {saved * 1e3:.1f} ms; "
            f"a move must save {SWITCH_MIN_S * 1e3:.0f} ms"
        )
    elif not may_move:
        why = f"its route was decided on its first chunks; {best} would gain {gain:.1f}x"
    else:
        return Reroute(best, predicted, f"{what} -> the rest moves to {best} ({gain:.1f}x)")
    return Reroute(None, predicted, f"{what} -> stays on {current} ({why})")
