"""Chunksize and the inline verdict, from per-item seconds measured where work runs.

A worker reports how long each chunk's calls took (``ChunkResult.compute_s``),
excluding dispatch. :class:`Estimate` keeps a running per-item figure for each
callable; :func:`chunksize` turns it into items per chunk, and
:func:`inline_verdict` predicts whether parallel execution can beat a plain
loop at all.

The cost model, per backend (see each backend's ``startup_s`` and
``chunk_overhead_s``):

* serial time  = items x per-item seconds;
* parallel time = start-up (unless the workers already run)
  + items x max(parent's pickling per item, (per-item + worker's pickling) / workers)
  + chunks x per-chunk overhead / workers.

Chunks aim at 200 times the backend's per-chunk cost on processes and 100
times on threads, within [:data:`MIN_TARGET_CHUNK_S`, :data:`TARGET_CHUNK_S`]
(:func:`chunk_target_s`): long enough that dispatch (about 150 us for fork,
250 us for loky, 20 us for threads on a quiet 2-core machine; this process's
share of a fork chunk costs 2-3 times that when the workers busy every core)
stays near 1 %, short enough that every worker gets several chunks and
results keep flowing. On threads that is about 2 ms: the items of a chunk run
one after another in one thread, so chunking items that wait (reads, sleeps)
gives up their overlap. Near the end of a map of known
length chunks shrink so that workers finish together, down to the items whose
work pays for one chunk's cost (a tail of tiny items is not cut up). Workers also stop a
chunk early once it has run :data:`CHUNK_BUDGET_FACTOR` times its target (the
rest of its items are sent again, sized by the newer estimate), so a fast
prefix followed by slow items cannot lock in huge slow chunks.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
from dataclasses import dataclass
from typing import Any

from .gil import CPU_SHARE_WAITS, MIN_WATCH_S

__all__ = [
    "digest_pays",
    "SATURATED_SLOWDOWN",
    "CHUNKS_PER_WORKER",
    "TARGET_CHUNK_S",
    "MIN_TARGET_CHUNK_S",
    "chunk_target_s",
    "CHUNK_BUDGET_FACTOR",
    "PROBE_S",
    "MAX_CHUNK_ITEMS",
    "Estimate",
    "chunksize",
    "chunk_budget_s",
    "default_chunksize",
    "inline_verdict",
    "Verdict",
    "MAX_WAITING_THREADS",
    "threads_for_waiting",
    "waiting_width",
]

#: Chunks per worker for a map of known length before anything is measured:
#: enough to balance uneven items at the end, few enough to amortise dispatch.
#: Source: multiprocessing.Pool.map's heuristic (CPython Lib/multiprocessing/pool.py).
CHUNKS_PER_WORKER = 4

#: The most seconds of work a chunk aims at once per-item time is known (see
#: :func:`chunk_target_s`).
TARGET_CHUNK_S = 0.04

#: How many times its backend's per-chunk cost a chunk's work aims at, on
#: process workers. The costs (``Backend.chunk_overhead_s``) come from a quiet
#: machine (benchmarks/bench_overheads.py: fork 118-152 us, loky 238-286 us,
#: threads 16-25 us per chunk; 2-core machine, 2026-11-29). With every core
#: running a worker, this process's share of a fork chunk read 300-450 us of
#: CPU (thread CPU clocks around sending, receiving and taking each chunk;
#: sha256 of 4 MiB an item, 2026-12-05), and it is taken from the workers'
#: cores: at 200x the quiet cost, dispatch stays near 1 % of the work.
#: (joblib's automatic batching aims higher still, at 0.2-2 s a batch.)
PROCESS_COST_MULTIPLE = 200

#: The same on threads, which run a chunk's items one after another in one
#: thread: chunking items that wait (reads, sleeps) gives up their overlap,
#: so their chunks stay short (2 ms).
THREAD_COST_MULTIPLE = 100

#: The most seconds of work a chunk aims at while its figures still decide
#: where the map runs: a GIL watch's kind counts from
#: :data:`~smartexec.gil.MIN_WATCH_S`, and two agreeing decide, so twice that
#: suffices; the route's own target (30 ms on fork) only delays the verdict and
#: leaves more behind when the map moves. 300 loopback GETs of ~13 ms, stored
#: as waiting: their first chunks on fork held 3 items (38 ms) before the move
#: to threads, now 1.
MEASURING_CHUNK_S = 2 * MIN_WATCH_S

#: The fewest seconds of work a chunk aims at, whatever the backend's cost.
MIN_TARGET_CHUNK_S = 0.001

#: A worker stops a chunk once it has run this many times its target; the
#: unfinished items go back to be re-chunked.
CHUNK_BUDGET_FACTOR = 4.0

#: Seconds of real work the first items of a map run in the calling thread to
#: measure them (their results are kept), when the policy chose the backend.
PROBE_S = 0.01

#: The probe stops after this many items even if they took under PROBE_S.
PROBE_MAX_ITEMS = 500

#: Never more items than this in one chunk: bounds the memory of the window.
#: At 10,000 items a 150 us chunk overhead costs 15 ns per item.
MAX_CHUNK_ITEMS = 10_000

#: Tail: once fewer items remain than this many chunks per worker would hold,
#: chunks shrink so that all workers finish together.
TAIL_CHUNKS_PER_WORKER = 2

#: Parallel must be predicted at least this much faster to beat a plain loop.
INLINE_MARGIN = 0.8


class Estimate:
    """A running per-item time for one callable, from chunks as they finish.

    The figure is the median of the per-item times of the last
    :data:`WINDOW` chunks: it follows items that get slower or faster within
    a few chunks, and one stalled chunk (the machine busy elsewhere for a
    moment, a 100x slower batch) does not move it, so neither the chunksize
    nor a route decision jumps on one sample. Thread-safe.

    Attributes:
        per_item_s: current estimate in seconds, or None before any sample.
        items: number of items measured so far.
        pickle_parent_s: seconds per item the parent spends pickling
            arguments and unpickling results (0 on in-process backends).
        send_per_chunk_s: seconds the parent spends once per chunk on top
            (a big argument every call shares, sent or proven unchanged once
            per chunk); 0 when none was found.
        last_map: what the callable's last ``map`` did (a
            :class:`~smartexec.policy.Decision`), or None.
        earlier_run: the figures came from a profile saved by an earlier run
            (see :mod:`smartexec._profiles`), not yet re-checked.
        loop_here: the callable's last map (in this process, or the earlier
            run's whose profile seeded this estimate) moved to a loop in the
            calling thread, measured too cheap to send: its next map starts
            there, re-checking the time per item between batches.
    """

    WINDOW = 9

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque(maxlen=self.WINDOW)
        self.per_item_s: float | None = None
        self.items = 0
        self.pickle_parent_s = 0.0
        self.send_per_chunk_s = 0.0
        self.last_map: Any = None
        self.earlier_run = False
        self.loop_here = False

    def observe(self, n_items: int, compute_s: float) -> None:
        """Record that ``n_items`` items took ``compute_s`` seconds of work."""
        if n_items <= 0:
            return
        sample = max(compute_s, 0.0) / n_items
        with self._lock:
            self._recent.append(sample)
            self.per_item_s = statistics.median(self._recent)
            self.items += n_items
            self.earlier_run = False

    def seed(self, per_item_s: float, items: int, pickle_parent_s: float) -> None:
        """Start from figures measured by an earlier run (replaced by the first chunk)."""
        with self._lock:
            if self.per_item_s is None:
                self.per_item_s = per_item_s
                self.items = items
                self.pickle_parent_s = pickle_parent_s
                self.earlier_run = True

    def __repr__(self) -> str:
        if self.per_item_s is None:
            return "Estimate(unmeasured)"
        return f"Estimate({self.per_item_s * 1e6:.1f} us per item over {self.items} items)"

    def __str__(self) -> str:
        if self.per_item_s is None:
            return "not measured yet"
        seconds = self.per_item_s
        figure = f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"
        source = " (from a stored profile)" if self.earlier_run else ""
        return f"{figure} per item over {self.items} items{source}"


def default_chunksize(n_items: int, n_workers: int, *, in_process: bool = False) -> int:
    """Return a chunksize before anything is measured.

    Args:
        n_items: items in the map (int >= 0).
        n_workers: workers that run chunks (int >= 1).
        in_process: thread backend: one item per chunk, so results stream.

    Returns:
        An int >= 1: about :data:`CHUNKS_PER_WORKER` chunks per worker.
    """
    if in_process or n_items <= 0:
        return 1
    return max(1, -(-n_items // (max(1, n_workers) * CHUNKS_PER_WORKER)))


def chunk_target_s(
    overhead_s: float, *, in_process: bool = False, measuring: bool = False
) -> float:
    """Seconds of work a chunk aims at on a backend costing ``overhead_s`` per chunk.

    :data:`PROCESS_COST_MULTIPLE` times the per-chunk cost on process
    workers, :data:`THREAD_COST_MULTIPLE` times on threads (``in_process``),
    within [:data:`MIN_TARGET_CHUNK_S`, :data:`TARGET_CHUNK_S`]; a backend
    costing more than 2 ms per chunk (a cluster) gets at least 20x its cost.
    Threads (20 us) aim at 2 ms, fork (150 us) at 30 ms, loky (250 us) at
    40 ms, Dask (3 ms) at 60 ms. While ``measuring`` (the chunks' figures
    still decide the map's route), at most :data:`MEASURING_CHUNK_S`.
    """
    multiple = THREAD_COST_MULTIPLE if in_process else PROCESS_COST_MULTIPLE
    target = min(TARGET_CHUNK_S, max(MIN_TARGET_CHUNK_S, multiple * overhead_s))
    if measuring:
        target = min(target, MEASURING_CHUNK_S)
    return max(20 * overhead_s, target)


def chunksize(
    per_item_s: float,
    n_workers: int,
    overhead_s: float,
    remaining: int | None = None,
    *,
    in_process: bool = False,
    measuring: bool = False,
) -> int:
    """Return items per chunk for a measured per-item time.

    Args:
        per_item_s: measured seconds per item (float >= 0).
        n_workers: workers running chunks (int >= 1).
        overhead_s: the backend's cost per chunk, seconds.
        remaining: items still to send, or None when the input's length is
            unknown (a generator).
        in_process: the workers are threads of this process (see
            :func:`chunk_target_s`).
        measuring: the chunks' figures still decide the map's route (see
            :func:`chunk_target_s`).

    Returns:
        An int in ``[1, MAX_CHUNK_ITEMS]``.
    """
    per_item_s = max(per_item_s, 1e-9)
    size = chunk_target_s(overhead_s, in_process=in_process, measuring=measuring) / per_item_s
    if remaining is not None:
        # Shrink the tail so workers finish together, but not below the items
        # whose work pays for one chunk's cost: tiny items gain nothing there.
        tail = remaining / (max(1, n_workers) * TAIL_CHUNKS_PER_WORKER)
        size = min(size, max(tail, overhead_s / per_item_s), max(1, remaining))
    return int(max(1, min(MAX_CHUNK_ITEMS, math.ceil(size))))


def chunk_budget_s(per_item_s: float, size: int) -> float:
    """Seconds after which a worker stops a chunk of ``size`` items early."""
    return CHUNK_BUDGET_FACTOR * max(TARGET_CHUNK_S, per_item_s * size)


@dataclass(frozen=True)
class Verdict:
    """Whether the rest of a map should run inline, and the figures behind it.

    Attributes:
        inline: True when a plain loop is predicted to be at least as fast.
        serial_s: predicted seconds for the rest as a loop.
        parallel_s: predicted seconds for the rest on the backend.
        reason: one sentence with the measured figures.
    """

    inline: bool
    serial_s: float
    parallel_s: float
    reason: str


def inline_verdict(
    *,
    per_item_s: float,
    send_s: float,
    remaining: int | None,
    route: str,
    workers: int,
    cpus: int,
    startup_s: float,
    overhead_s: float,
) -> Verdict:
    """Predict whether ``route`` beats a loop in the calling thread for the rest of a map.

    Both are priced by :func:`predict_s`, the one cost model. Pure: it reads
    only its arguments (all times in seconds).

    Args:
        per_item_s: measured compute per item.
        send_s: per item, the parent's pickling of arguments and results
            (0 for threads).
        remaining: items left, or None when unknown (then only the per-item
            economics decide: an endless input amortises any start-up).
        route: ``"thread"`` or a process backend's name. Threads are priced
            as work that does not wait for the GIL (the routes that reach
            here chose threads for that).
        workers: the route's workers.
        cpus: usable CPUs.
        startup_s: cost to start the workers (0 when running already).
        overhead_s: cost per chunk.

    Returns:
        A :class:`Verdict`.
    """
    kind = "waits" if route == "thread" else None
    items = 1_000_000 if remaining is None else remaining

    def parallel_s(startup: float) -> float:
        return predict_s(
            route,
            kind=kind,
            per_item_s=per_item_s,
            send_s=send_s,
            rest=items,
            cpus=cpus,
            workers=workers,
            startup_s=startup,
            overhead_s=overhead_s,
        )

    per_item_parallel = parallel_s(0.0) / max(1, items)
    figures = (
        f"measured {per_item_s * 1e6:.1f} us per item; in parallel about "
        f"{per_item_parallel * 1e6:.1f} us per item on {max(1, workers)} workers"
    )
    if remaining is None:
        inline = per_item_parallel >= per_item_s * INLINE_MARGIN
        return Verdict(
            inline,
            math.inf,
            math.inf,
            f"{figures} (input length unknown) -> "
            + ("a loop is faster per item" if inline else "parallel is faster per item"),
        )
    serial = predict_s(
        "inline", kind=kind, per_item_s=per_item_s, send_s=0.0, rest=items, cpus=cpus, workers=1
    )
    parallel = parallel_s(startup_s)
    inline = parallel >= serial * INLINE_MARGIN
    return Verdict(
        inline,
        serial,
        parallel,
        f"{figures}; for the {remaining} items left: loop {serial:.3f} s, "
        f"parallel {parallel:.3f} s including {startup_s:.3f} s start-up -> "
        + ("run them inline" if inline else "run them in parallel"),
    )


#: Threads running GIL-holding items take longer than a loop by this factor
#: (hand-overs, cache misses): 200,000 3.5 us items took 1.15 s on 6
#: threads against 0.70 s in a loop (2-core machine, under load); 5,000
#: items of 0-0.4 ms with a 20 MiB argument 1.22 s against 0.79 s.
THREAD_GIL_PENALTY = 1.5

#: Seconds per item the parent spends on a process route besides pickling:
#: reading the input, building and tracking chunks, handing out results.
#: 200,000 calls of ``x * x`` on fork: 1.3 s, 0.66 s of it in the workers,
#: 0.2 s of pickling (2-core machine under load, 2026-12-01).
PROCESS_ITEM_S = 2e-6


def predict_s(
    route: str,
    *,
    kind: str | None,
    per_item_s: float,
    send_s: float,
    rest: int,
    cpus: int,
    workers: int,
    startup_s: float = 0.0,
    cores: float = 1.0,
    overhead_s: float = 0.0,
) -> float:
    """Predicted seconds for ``rest`` items on ``route``; pure.

    Args:
        route: ``"thread"``, ``"inline"`` or a process backend (any other name).
        kind: the callable's GIL kind, or None when unknown (taken as ``"holds"``
            for threads: the safe guess for Python code).
        per_item_s: seconds of work per item (measured in workers).
        send_s: seconds per item the parent spends pickling arguments and
            results (process routes only; :data:`PROCESS_ITEM_S` is added).
        rest: items left (int >= 0).
        cpus: usable CPUs.
        workers: the route's workers.
        startup_s: seconds to start the route's workers (0 when running),
            and its first call's warm-up where it does not run yet.
        cores: cores one item keeps busy by itself (BLAS threads).
        overhead_s: the route's cost per chunk (seconds), its chunks sized
            by :func:`chunksize` from the same figures; 0 leaves it out.

    Returns:
        Seconds (float).

    A process route's workers share the CPUs with this process, whose
    sending (pickling, shared memory) takes as much CPU as they spend
    unpickling: its time is at least the items' CPU plus both ends'
    sending over the CPUs. Not counted so, 8 MiB arrays that sorted in
    56 ms and took 11 ms each to send read fork and threads as a tie (on 2
    cores), and threads ran 1.36x faster.
    """
    work = per_item_s * rest
    if route == "inline":
        return startup_s + work
    chunks_s = 0.0
    if overhead_s > 0 and rest > 0:
        size = chunksize(per_item_s, workers, overhead_s, rest, in_process=route == "thread")
        chunks_s = math.ceil(rest / size) * overhead_s / max(1, workers)
    at_once = max(1, min(workers, round(cpus / max(1.0, cores))))
    if route == "thread":
        if kind == "waits":
            return _waves_s(per_item_s, rest, workers) + chunks_s
        if kind == "releases":
            return _waves_s(per_item_s, rest, at_once) + chunks_s
        # Threads that hold the GIL take turns, and each hand-over costs:
        # a plain loop in the calling thread is faster.
        return work * THREAD_GIL_PENALTY + chunks_s
    sending = (send_s + PROCESS_ITEM_S) * rest
    cpu_s = (0.0 if kind == "waits" else work * max(1.0, cores)) + 2 * sending
    running = _waves_s(per_item_s, rest, at_once)
    return startup_s + max(running, sending, cpu_s / max(1, cpus)) + chunks_s


def _waves_s(per_item_s: float, rest: int, width: int) -> float:
    """Seconds for ``rest`` items of ``per_item_s`` run ``width`` at a time.

    In waves: a worker runs an item in no less than the item's time, so 7
    waiting items on a pool of 100 threads take one item's time (10 ms
    sleeps: explain() predicted 0.7 ms, and they took 9 ms), not a
    hundredth of their sum.
    """
    return math.ceil(rest / max(1, width)) * per_item_s


#: Most threads a thread pool grows to for work that waits (see
#: :func:`threads_for_waiting`): a loopback HTTP server answering in 20 ms
#: served 300 calls in 1.23 s on the stdlib's 6 threads (2-core machine),
#: 0.29 s on 32.
MAX_WAITING_THREADS = 128

#: Cores the threads of a pool grown for waiting work aim to keep runnable
#: together: one, as only one thread runs Python at a time. 400 calls of
#: ``time.sleep(0.01)`` took 0.15-0.28 s aiming at 0.8 cores (the pool grew
#: to ~40 threads: a call's own Python, ours included, costs ~170 us of
#: its 10 ms), 0.11-0.16 s aiming at one (~100 threads); 64 hand-sized
#: threads 0.08 s (2-core machine).
WAITING_TARGET_CORES = 1.0

#: A pool grows only while its threads keep under this many cores runnable
#: together: threads taking turns on the GIL keep about one, and are not
#: waiting work, however their figures wobble.
WAITING_GROWS_BELOW_CORES = 0.5


#: A pool stops growing once an item takes this many times as long as the
#: quickest the pool has measured: what its threads wait for (a server, a
#: disk, the GIL itself) is then saturated, and more threads only queue
#: there. 300 GETs of a loopback HTTP server answering in 10 ms (2-core
#: machine, the server on it too): 0.71 s on the stdlib's 6 threads, 1.5 s
#: on 64; a pool grown to ~100 took 2.5 s.
SATURATED_SLOWDOWN = 2.0


def threads_for_waiting(
    busy_threads: float,
    cores_used: float,
    limit: int,
    process_cores: float = 0.0,
    slowdown: float = 1.0,
) -> int:
    """How many threads waiting work wants, by Little's law; 0 when it does not wait. Pure.

    A pool whose busy threads are seldom runnable (they wait for I/O, a
    sleep, a child process) finishes ``busy_threads`` calls per call-time
    while using ``cores_used`` cores: more threads finish more, until they
    keep :data:`WAITING_TARGET_CORES` runnable. Threads that take turns on
    the GIL keep about one core runnable between them, and computing
    threads one each: neither is waiting work, and a pool grows only while
    its threads keep under :data:`WAITING_GROWS_BELOW_CORES`.

    Args:
        busy_threads: threads that had a call meanwhile, on average (float).
        cores_used: cores the pool's threads were runnable for meanwhile
            (on a CPU or queued for one), on average (float >= 0).
        limit: the most threads (int >= 1).
        process_cores: cores of CPU the whole process used meanwhile (float
            >= 0): threads waiting for a GIL another thread holds are not
            runnable, but the holder keeps the process on a core.
        slowdown: how long an item took meanwhile over the quickest the pool
            measured (float >= 1): Little's law holds while the wait does
            not grow with the threads.

    Returns:
        ``ceil(busy_threads * WAITING_TARGET_CORES / cores_used)`` within
        ``limit``; 0 when fewer than one thread was busy, or the threads
        were runnable :data:`~smartexec.gil.CPU_SHARE_WAITS` of the time or
        more each, or kept :data:`WAITING_GROWS_BELOW_CORES` runnable
        together, or the process used that many cores of CPU; 0 too at a
        ``slowdown`` of :data:`SATURATED_SLOWDOWN` or more.
    """
    if busy_threads < 1 or max(cores_used, process_cores) >= WAITING_GROWS_BELOW_CORES:
        return 0
    if slowdown >= SATURATED_SLOWDOWN:
        return 0
    if cores_used >= CPU_SHARE_WAITS * busy_threads:
        return 0
    return waiting_width(cores_used / busy_threads, limit)


def waiting_width(cpu_share: float, limit: int) -> int:
    """Threads that keep :data:`WAITING_TARGET_CORES` runnable when each is runnable ``cpu_share`` of its time; pure.

    Little's law, as :func:`threads_for_waiting` grows a pool by it; also
    the width a waiting map's rest is priced at on threads (see
    :func:`smartexec._rerouting.reroute`): priced at the pool's width
    before it grew, 72 sleeps of 10 ms were predicted at 0.12 s, and took
    0.02-0.03 s.

    Args:
        cpu_share: CPU seconds over wall seconds of one thread's calls (float >= 0).
        limit: the most threads (int >= 1).

    Returns:
        ``ceil(WAITING_TARGET_CORES / cpu_share)`` within 1 and ``limit``.
    """
    wanted = WAITING_TARGET_CORES / max(cpu_share, WAITING_TARGET_CORES / limit)
    return max(1, min(limit, math.ceil(wanted - 1e-9)))  # (not 81 for 80.00000000001)


def digest_pays(digest_s: float | None, fork_s: float | None, pool_busy: bool = False) -> bool:
    """Whether a submit should prove a fork pool's snapshot current by digest, or fork anew.

    A submit of a callable shared by copy-on-write runs on a snapshot no
    older than the call: either the current pool's, proven unchanged by a
    digest of the state (:func:`smartexec._fingerprint.digest`, which
    pickles it), or a new pool's, forked for it. Both are measured in this
    process: a digest of a 200 MiB array took ~140 ms here against ~13 ms
    for a fresh pool, and of a dict of 1.5 M entries ~0.8 s against ~37 ms;
    a few MiB digest in about a millisecond. A fresh pool replaces an idle
    one; beside a busy one it would exceed ``max_workers``.

    Args:
        digest_s: seconds the callable's last digest took (None: never taken).
        fork_s: seconds the last new pool took to start, here (None: none yet).
        pool_busy: the current pool still runs calls: a new pool's workers
            would run beside its workers, past ``max_workers`` (ten submits
            of a 0.2 s method with ``max_processes=1`` ran in ten processes).

    Returns:
        True (digest) while the pool is busy, or until both costs are known;
        then whether the digest cost less.
    """
    if pool_busy or digest_s is None or fork_s is None:
        return True
    return digest_s < fork_s
