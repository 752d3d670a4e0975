"""A map that starts on its route's workers at once and may move once, on their evidence.

:class:`RoutedMap` is the map's observer: the stream calls
:meth:`RoutedMap.on_result` with each chunk's reply (time, CPU, the
workers' GIL watch); the figures go into an
:class:`~smartexec._rerouting.Evidence`, and once it suffices the executor's
``_settle`` decides whether the rest moves (:func:`~smartexec._rerouting.reroute`).
On threads it also reads the pool threads' CPU and scheduler clocks
(:meth:`RoutedMap.read_threads`), and it says which chunks need their CPU
seconds (:meth:`RoutedMap.clocked`).

The stream, held by the map's results, holds this object: it holds the
executor only weakly, so that dropping the executor shuts its backends down.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from . import _profiles, _threads
from ._chunk_stream import ChunkStream, StreamPlan, default_buffersize
from ._context import in_caller
from ._diagnose import explain_pickling
from ._inputs import PICKLE_SAMPLE, measure_pickling
from ._mapping import InlineStream, Relay, stream_values
from ._remote import _NO_KWARGS, Call, ChunkResult, own_calls
from ._rerouting import CHEAP_ITEM_S, CHEAP_ITEMS, THREADS_MIN_WALL_S, Evidence, Reroute, reroute
from ._sender import send_chunk
from ._system import IDLE_TICK_S
from .backends._base import Backend
from .backends._widener import waiting_limit
from .backends.thread import ThreadBackend
from .gil import GilProfile, remember
from .inspection import callable_name
from .policy import Decision, alternatives, permits
from .registry import get_backend_class
from .tuning import Estimate, waiting_width
from .tuning import chunksize as tuned_chunksize

if TYPE_CHECKING:
    from .executor import SmartExecutor

__all__ = [
    "CLOCK_EVERY",
    "THREADS_MUST_BE_SAFE",
    "THREADS_READ_EVERY_S",
    "RoutedMap",
    "starts_in_loop",
]

#: Said when a map moves from processes to threads part-way.
THREADS_MUST_BE_SAFE = (
    "threads run it in this process, several at once: it must be thread-safe "
    '(prefer="processes" keeps a function that is not on processes)'
)


def starts_in_loop(ended: str | None, per_item_s: float) -> bool:
    """Whether a map that ended on ``ended`` (``"inline"``: a loop here) starts the next one in a loop.

    Only items under :data:`~smartexec._rerouting.CHEAP_ITEM_S` seconds,
    too cheap for any worker to gain on: a dearer map that a loop won for
    its sending costs starts the next on threads, which measure again.
    """
    return ended == "inline" and per_item_s < CHEAP_ITEM_S


#: A map measured on threads reads its pool threads' CPU and scheduler
#: clocks at its first result, then at most once per this many seconds
#: (each reading waits for the GIL once per pool thread); its figures need
#: :data:`~smartexec._rerouting.THREADS_MIN_WALL_S` between two readings.
THREADS_READ_EVERY_S = 0.004

#: While a map on threads measures, one chunk in this many (after each
#: worker's first) reads its thread's CPU clock: two reads an item took 64
#: numpy items from 0.064 to 0.073 s under a competing process.
CLOCK_EVERY = 3


class RoutedMap:
    """One map on ``backend`` from its first chunk, watched until it settles.

    Args:
        ex: the executor (held weakly).
        fn, decision, estimate, backend: the map's callable, decision,
            per-item estimate and backend.
        inputs: the argument tuples, not read yet.
        end_time: ``map``'s deadline (``time.monotonic()``) or None.
        buffersize: the user's buffersize or None.
        dear: each item carries big arguments of its own
            (:func:`~smartexec._inputs.dear_to_send`): one item per worker
            goes at a time until the figures give a verdict, so that a map
            they move to threads has not copied a window of them first.
    """

    def __init__(
        self,
        ex: SmartExecutor,
        fn: Callable[..., Any],
        decision: Decision,
        estimate: Estimate,
        backend: Backend,
        inputs: Iterator[tuple[Any, ...]],
        end_time: float | None,
        buffersize: int | None,
        dear: bool,
    ):
        self.owner = weakref.ref(ex)  # the stream (held by map's results) must not hold ex
        self.fn, self.decision, self.estimate, self.backend = fn, decision, estimate, backend
        self.inputs, self.end_time, self.buffersize, self.dear = inputs, end_time, buffersize, dear
        self.evidence = Evidence(backend.max_workers)
        self.settled = False
        self.timed = 0  # items in the biggest chunk whose pickling was timed
        self.sent = 0  # chunks sent (see clocked)
        # On threads: the pool threads' CPU seconds (each chunk's cpu_s), the
        # seconds they were runnable (on a CPU or queued: a busy machine does
        # not hide threads that release the GIL), the seconds they had
        # chunks, and whether the machine had cores to spare meanwhile. Not
        # the process's CPU: other threads (a BLAS pool still spinning, the
        # program's own) would count.
        self.clocks = backend.pool_clocks()
        # (time, the pool threads' CPU, time, runnable s, busy s, idle s) at the first reading
        self.started_at: list[Any] = []
        self.read_at = 0.0  # perf_counter() of the last reading of the pool threads' clocks
        self.evidence.on_threads = backend.shares_memory and self.clocks is not None
        self.stream: ChunkStream | None = None
        self.relay: Relay | None = None

    def start(self, remaining: int | None, ordered: bool) -> Iterator[Any]:
        """Open the stream (first chunks of one item each) and return the map's results."""
        ex, backend, estimate = self.owner(), self.backend, self.estimate
        assert ex is not None  # the caller holds it
        plan = StreamPlan(
            self.fn,
            self.decision,
            estimate,
            backend,
            buffersize=self.buffersize,
            end_time=self.end_time,
            measuring=self.measuring,
            on_result=self.on_result,
            probe=self.probe(),
            on_send=None if backend.shares_memory else self.evidence.add_send,
            clocked=self.clocked,
        )
        stream = open_stream(ex, plan, self.inputs, remaining)
        self.stream, self.relay = stream, Relay(stream)
        started = (
            f"started on {backend.name} at once: its first chunks, run in the workers, "
            f"measure the items (time, CPU, the GIL) and may move the rest of the map"
            + (
                f"; per item so far: {estimate}"
                if estimate.per_item_s and not estimate.earlier_run
                else ""  # an earlier run's figures have their own reason
            )
        )
        ex._router.note(self.decision, estimate, backend.name, (started,))  # no chunksize yet
        # The profile its verdict saved is written once its results end (see
        # smartexec._profiles.save), not while its chunks run.
        return stream_values([], self.relay, ordered, on_end=self.ended)

    def ended(self) -> None:
        """The map's results ended: keep its figures if it ended before a verdict, then write the store.

        A map too short for its figures to decide (48 cheap items: under
        the :data:`~smartexec._rerouting.CHEAP_ITEMS` that settle without a
        GIL kind, in chunks too short to watch the GIL) kept nothing, and
        its next run started from nothing again. It keeps its time per
        item and cost to send, with no GIL kind: the next run sizes its
        chunks from them and measures the GIL again (a stored profile never
        routes a callable into this process by itself).
        """
        evidence, ex = self.evidence, self.owner()
        if (
            not self.settled
            and not evidence.stay_noted
            and (evidence.per_item or evidence.lone_firsts)
            and ex is not None
            and ex._options.prefer is None  # prefer= skips the measurement: nothing is learned
        ):
            self._keep(self.backend.name, None)
        _profiles.flush()

    def _keep(self, where: str, gil: GilProfile | None) -> None:
        """Save this map's figures to the profile store: ran ``where``, with the GIL use ``gil``."""
        evidence = self.evidence
        profile = _profiles.StoredProfile(
            where,
            evidence.per_item_s,
            gil,
            self.estimate.pickle_parent_s,
            evidence.items,
            time.time(),
        )
        _profiles.save(self.fn, profile)

    def probe(self) -> tuple[int, int] | None:
        """The first chunks before the full window: (chunks, items each), or None."""
        backend, per_item_s = self.backend, self.estimate.per_item_s
        if per_item_s is not None and per_item_s < CHEAP_ITEM_S:
            # Measured too cheap to send before (a map, or an earlier run):
            # sized from that figure, a window of big chunks would be under
            # way before the figures move the rest (a map of 30,000 4 us
            # items sent 20,000 to fork before it moved to a loop). Two small
            # chunks first; the full window only if the map stays.
            return (max(1, min(2, backend.max_workers)), CHEAP_ITEMS)
        if self.dear:  # (only ever for a process route)
            # Sending is most of the cost of such items (a 16 MiB array: ~5
            # ms each, 24-50 ms under load), and the window would send six
            # before the first figures: the 64-array einsum map sent 7 to
            # fork (0.26 s of sending, loaded machine) before it moved to threads.
            return (max(1, backend.max_workers), 1)
        return None

    def measuring(self) -> bool:
        """Whether the chunks sent now still decide where the map runs (no verdict yet)."""
        return not self.settled and not self.evidence.stay_noted

    def clocked(self) -> bool:
        """Whether the chunk sent now needs its CPU seconds.

        On threads, reading a thread's CPU clock costs it its turn under
        load (ThreadBackend.unclocked): until the verdict, each worker's
        first chunk and every third after it give their CPU seconds; none
        after (nothing reads them). Process backends always do.
        """
        if self.settled:
            return False
        self.sent += 1
        return self.sent <= self.backend.max_workers or self.sent % CLOCK_EVERY == 0

    def on_result(self, result: ChunkResult, calls: list[Call]) -> None:
        """A chunk's reply: its figures into the evidence; settle once it suffices."""
        if self.settled:
            return
        n = min(len(calls), PICKLE_SAMPLE)
        if n > self.timed and (not self.timed or n >= 8):
            # Timed on the biggest chunk so far, in one pickler as a chunk is
            # sent (a one-item sample reads ~20x too dear, see
            # measure_pickling); at once, so no result is kept here.
            outcomes = result.outcomes[:n]
            measure_pickling(self.estimate, [c[0] for c in calls[:n]], [v for _, v in outcomes])
            del outcomes
            self.timed = n
        evidence = self.evidence
        evidence.add(
            len(result.outcomes),
            result.compute_s,
            result.cpu_s,
            result.gil,
            result.first,
            result.receive_s,
        )
        if evidence.on_threads and self.reading_due(time.perf_counter()):
            self.read_threads()
        if evidence.ready() and self.relay is not None:  # (None: the stream is opening)
            ex = self.owner()  # None: collected, its backends shut down
            self.settled = ex is None or self.settle(ex)
        if self.dear and not self.settled and not evidence.stay_noted:
            # No verdict yet: one more item per worker, not the window (whose
            # chunks, sized by the time per item, would hold ~15 of them: a
            # first map under load sent 49 16 MiB arrays to fork before its
            # figures moved the rest to threads).
            if self.stream is not None:
                self.stream.probe_again()

    def reading_due(self, now: float) -> bool:
        """Whether to read the pool threads' clocks at this result.

        Not at every result: each reading lets go of the GIL once per pool
        thread and waits behind them to get it back (6-10 ms over 16
        results of 64 numpy items, a fifth of the map). Read at the first
        result, at the first one THREADS_MIN_WALL_S later (the first
        figures), then at most every THREADS_READ_EVERY_S.
        """
        if not self.started_at:
            return True
        return now - self.started_at[0] >= THREADS_MIN_WALL_S and (
            self.evidence.process_cores is None or now - self.read_at >= THREADS_READ_EVERY_S
        )

    def read_threads(self) -> None:
        """Read the pool threads' CPU, runnable and busy seconds and the machine's idle time."""
        evidence, started_at = self.evidence, self.started_at
        self.read_at = time.perf_counter()
        clocks = self.clocks
        assert clocks is not None
        cpu = clocks.threads_cpu_s()  # the CPU clocks: read with the GIL held throughout
        now = time.perf_counter()
        # The runnable seconds come from /proc reads that let go of the GIL:
        # getting it back waits behind threads that hold it (5 ms a switch),
        # so they get a clock of their own. Timed after them, the CPU seconds
        # of 6 GIL-holding threads read 1.4 cores (it moved such a map to
        # threads' verdict "releases").
        wanted, busy = clocks.threads_wanted_s(), clocks.threads_busy_s()
        # In ticks of 10 ms: read no more often (each read lets go of the GIL).
        idle = None
        if not started_at or (
            started_at[5] is not None and now - started_at[2] - evidence.idle_wall_s >= IDLE_TICK_S
        ):
            idle = clocks.machine_idle_s()
        wanted_now = time.perf_counter()
        if cpu is None:
            return  # no pool threads alive just now: read it at the next result
        if not started_at:
            started_at[:] = (now, cpu, wanted_now, wanted, busy, idle)
            return
        if min(now - started_at[0], wanted_now - started_at[2]) < THREADS_MIN_WALL_S:
            return
        evidence.process_cores = (cpu - started_at[1]) / (now - started_at[0])
        if wanted is not None and started_at[3] is not None:
            wall = wanted_now - started_at[2]
            evidence.wanted_cores = (wanted - started_at[3]) / wall
            if busy is not None and started_at[4] is not None:
                evidence.busy_threads = (busy - started_at[4]) / wall
            if idle is not None and started_at[5] is not None:
                evidence.idle_cores = (idle - started_at[5]) / wall
                evidence.idle_wall_s = wall

    # -- settle: act on the evidence

    def settle(self, ex: SmartExecutor) -> bool:
        """Act on the evidence: move the rest of the map, or not; route its next maps.

        The stream the rest moves to keeps the map's ``buffersize``.

        Returns:
            True when the map is decided; False when a verdict to stay was
            noted but may still become a move at a later result
            (:meth:`Evidence.recheck_stay`).
        """
        assert self.relay is not None
        stream = self.relay.streams[-1]
        assert isinstance(stream, ChunkStream)
        evidence = self.evidence
        kind_found_late, refresh_only = self.look()
        if refresh_only and not stream.input_read and evidence.recheck_stay():
            # Dear items keep their route at a later look; their figures are
            # taken again at the last one only (a look costs ~0.2 ms of this
            # thread, which the workers' cores share).
            return False
        if self.backend.name not in ("fork", "loky", "thread"):
            # A plugin's or a cluster's backend (dask): the user chose to
            # run there; the figures are kept, the route is not changed.
            said = (evidence.describe(),)
            ex._router.note(self.decision, self.estimate, self.backend.name, said, measured=True)
            return True
        gil = evidence.profile()
        candidates, alternative = self.candidates(ex, gil)
        verdict = reroute(
            evidence,
            current=self.backend.name,
            candidates=candidates,
            send_s=self.send_cost(stream),
            rest=stream.remaining,
            cpus=ex._platform.cpu_count,
            prior=self.decision.gil.kind if self.decision.gil is not None else None,
            may_move=not refresh_only,
            in_flight=stream.in_flight,
        )
        # A stay from the first chunks is noted now (a map that ends early
        # still leaves its profile) and taken again until MAX_SAMPLES chunks
        # are in or all is sent: items under CHEAP_ITEM_S may still move
        # then; a stay again only replaces the first one's figures (workers'
        # first calls, which pay for imports and cold caches, weigh less by then).
        keep_watching = verdict.target is None and not stream.input_read and evidence.recheck_stay()
        replaces = None
        if verdict.target is None and evidence.stay_noted:
            if keep_watching:
                return False
            replaces = evidence.stay_note
        # A last look with the input all sent, or with fewer items left than
        # measured, predicts for a tail (chunks shrink there, a per-chunk cost
        # weighs more): the first look's words stay, unless they had no GIL
        # kind to price the items on and this look has one; its figures
        # still go to the profile.
        before_the_tail = not stream.input_read and (
            stream.remaining is None or stream.remaining >= evidence.items
        )
        reworded = replaces is None or kind_found_late or before_the_tail
        self.estimate.loop_here = starts_in_loop(verdict.target, evidence.per_item_s)
        ended = self.move(ex, verdict, alternative, stream, gil)
        stays = verdict.target is None or (verdict.target != "inline" and alternative is None)
        if stays and reworded:
            evidence.stay_note = ex._router.note(
                self.decision,
                self.estimate,
                self.backend.name,
                (verdict.reason,),
                measured=True,
                replaces=replaces,
            )
        self.record(ex, verdict, ended, gil, reworded)
        if keep_watching:
            if not evidence.stay_noted:
                evidence.noted_kind = evidence.kind
            evidence.stay_noted = True
            return False
        return True

    def look(self) -> tuple[bool, bool]:
        """``(kind_found_late, refresh_only)`` for this look at the evidence.

        A later look at items over CHEAP_ITEM_S refreshes figures, moves
        nothing; unless the stay was noted with no GIL kind to price the
        items on and the chunks agree on one now (a map on threads whose
        first chunks came back before the pool's clocks could be read): the
        first look that could price it decides.
        """
        evidence = self.evidence
        kind_found_late = (
            evidence.stay_noted and evidence.noted_kind is None and evidence.kind is not None
        )
        refresh_only = (
            evidence.stay_noted and evidence.per_item_s >= CHEAP_ITEM_S and not kind_found_late
        )
        return kind_found_late, refresh_only

    def candidates(
        self, ex: SmartExecutor, gil: GilProfile | None
    ) -> tuple[dict[str, tuple[int, float]], Decision | None]:
        """Where the rest of the map could run: ``{route: (workers, start-up s)}``, and its decision.

        Only where the callable's effects allow it (threads, a loop here) and
        the user's ``prefer`` does not rule it out. From threads, the process
        route is the policy's answer for a callable that holds the GIL.
        """
        decision, backend, options = self.decision, self.backend, ex._options
        profile = decision.profile
        cpus = ex._platform.cpu_count
        # Threads for waiting calls are priced at the width their pool grows
        # to (Little's law on the calls' CPU share), not the width it starts at.
        share = statistics.median(self.evidence.cpu_share) if self.evidence.cpu_share else None
        width = (
            backend.grows_to(share) if isinstance(backend, ThreadBackend) else backend.max_workers
        )
        candidates = {backend.name: (width, 0.0)}
        alternative: Decision | None = None
        off_processes = backend.name in ("fork", "loky") and options.prefer != "processes"
        if off_processes and permits(profile, "thread", options):
            given = ex._widths.for_backend("thread")
            workers = given or ThreadBackend.default_workers(cpus)
            if given is None and ex._workers_setup.initializer is None and share is not None:
                workers = max(workers, waiting_width(share, waiting_limit()))
            candidates["thread"] = (workers, 0.0)
            alternative = dataclasses.replace(decision, backend="thread", share=False)
        if off_processes and permits(profile, "inline", options):
            candidates["inline"] = (1, 0.0)
        if backend.name == "thread" and gil is not None:
            assert profile is not None
            # This map's own chunks run on the pool's threads now: they do
            # not count (the move sends the rest of this very map elsewhere).
            others = len(_threads.census(own_user_code=False).running)
            found = alternatives(profile, ex._platform, options, others)
            target = next((d for r, d in found.items() if r in ("fork", "loky")), None)
            if target is not None:
                factory = _backend_class(target.backend)
                workers = ex._max_workers or factory.default_workers(cpus)
                started = target.backend in ex._started
                candidates[target.backend] = (
                    workers,
                    0.0 if started else factory.worker_startup_s * workers,
                )
                alternative = target
        if backend.name == "thread" and permits(profile, "inline", options):
            candidates["inline"] = (1, 0.0)
        if backend.name == "thread":
            alternative = alternative or decision
        return candidates, alternative

    def send_cost(self, stream: ChunkStream) -> float:
        """Seconds per item the parent spends sending the rest (0 on threads: not pickled).

        A cost paid once per chunk (a repeated big argument, proven
        unchanged once per chunk) makes the rest's chunks grow until it is a
        small share of their work, and is priced at that size.
        """
        estimate, evidence, backend = self.estimate, self.evidence, self.backend
        if backend.shares_memory:
            return estimate.pickle_parent_s
        send_s = evidence.send_s(estimate.pickle_parent_s)
        # Seconds once per chunk, then per item: from the sends (one-item
        # chunks against bigger ones), else from the pickling estimate.
        per_chunk = evidence.per_chunk_send(estimate.pickle_parent_s + estimate.send_per_chunk_s)
        if per_chunk is None and estimate.send_per_chunk_s > 0:
            per_chunk = (estimate.send_per_chunk_s, estimate.pickle_parent_s)
        if per_chunk is not None:
            overhead_s = backend.chunk_overhead_s + per_chunk[0]
            size = tuned_chunksize(
                evidence.per_item_s, backend.max_workers, overhead_s, stream.remaining
            )
            send_s = per_chunk[1] + per_chunk[0] / size
            stream.chunk_overhead_s = overhead_s
        return send_s

    # -- move: the one place a map changes its backend

    def move(
        self,
        ex: SmartExecutor,
        verdict: Reroute,
        alternative: Decision | None,
        stream: ChunkStream,
        gil: GilProfile | None,
    ) -> Decision:
        """Move the rest of the map where ``verdict`` says; return the decision it ended on.

        The invariant: every input item is either unread or in exactly one
        stream's chunk. The stream the map leaves stops reading its input
        (``detach``: what it sent finishes where it is) before the next
        stream reads the same iterator; should opening the next fail, the
        first reads on (``reattach``) and nothing moves.
        """
        decision, estimate, backend = self.decision, self.estimate, self.backend
        assert self.relay is not None
        if verdict.target == "inline":
            stream.detach()
            self._take_back(stream)
            profile = decision.profile
            here = in_caller(self.fn, None if profile is None else profile.effects)
            self.relay.append(InlineStream(here, self.inputs, ex._stats.inline))
            # The process route's reasons no longer hold for its next maps,
            # and a GIL use measured now replaces one from an earlier run.
            ended = dataclasses.replace(
                decision,
                backend="thread",
                share=False,
                gil=gil if gil is not None else decision.gil,
                reasons=(decision.reasons[0], _inline_next(estimate.loop_here)),
            )
            ex._router.note(ended, estimate, "inline", (verdict.reason,), measured=True)
            return ended
        if verdict.target is None or alternative is None:
            return decision
        stream.detach()
        left = self._take_back(stream)
        try:
            with ex._lock:
                ex._ensure_open()
                target_backend = ex._backend(verdict.target)
            moved = dataclasses.replace(alternative, backend=verdict.target)
            # An error of the input (or in sending an item) while the new
            # stream reads its first window belongs to the map at its place:
            # kept by the stream, raised after every result before it.
            plan = StreamPlan(
                self.fn,
                moved,
                estimate,
                target_backend,
                buffersize=self.buffersize,
                end_time=self.end_time,
                keep_first_error=True,
            )
            new = open_stream(ex, plan, self.inputs, left)
        except Exception as exc:  # e.g. shut down meanwhile: stay
            stream.reattach(_as_calls(self.inputs))
            said = (f"{verdict.reason}; the move failed: {exc}",)
            ex._router.note(decision, estimate, backend.name, said, measured=True)
            return decision
        self.relay.append(new)
        reasons: tuple[str, ...] = (verdict.reason,)
        if verdict.target == "thread" and backend.name in ("fork", "loky"):
            reasons += (THREADS_MUST_BE_SAFE,)
        ex._router.note(moved, estimate, verdict.target, reasons, new, measured=True)
        return moved

    def _take_back(self, stream: ChunkStream) -> int | None:
        """Put the calls of ``stream``'s chunks no worker started in front of the input; the items left."""
        back = stream.take_back()
        if back:
            self.inputs = itertools.chain([args for args, _ in back], self.inputs)
        return stream.remaining

    # -- record: what the callable's next maps start from

    def record(
        self,
        ex: SmartExecutor,
        verdict: Reroute,
        ended: Decision,
        gil: GilProfile | None,
        reworded: bool,
    ) -> None:
        """Keep the figures (the GIL use, the store's profile) and route the next maps."""
        if ex._options.prefer is None:  # prefer= skips the measurement: nothing is learned
            if gil is not None:
                remember(self.fn, gil)
            self._keep("inline" if verdict.target == "inline" else ended.backend, gil)
        if reworded:
            ex._route_next(self.fn, ended, verdict.reason)


def _backend_class(name: str) -> type[Backend]:
    """The class registered as backend ``name`` (its class-level figures)."""
    return get_backend_class(name)  # type: ignore[return-value]


def _inline_next(loop_here: bool) -> str:
    if loop_here:
        return (
            "its items cost less than sending them: its next maps start in a loop in the "
            "calling thread, whose batches re-check that (the rest goes to workers should "
            "the items turn slow)"
        )
    return (
        "its items cost less than sending them: its next maps start on threads, whose "
        "figures (the sending measured afresh) may move them"
    )


def open_stream(
    ex: SmartExecutor, plan: StreamPlan, inputs: Iterator[tuple[Any, ...]], remaining: int | None
) -> ChunkStream:
    """Start sending ``inputs`` (``remaining`` of them, None: unknown) to ``ex``'s backend as ``plan`` says.

    The stream is counted among the maps ``ex``'s shutdown finishes, then
    its first window goes, outside ``ex``'s lock (the input is the user's
    code).
    """
    fn, decision, estimate, backend = plan.fn, plan.decision, plan.estimate, plan.backend
    chunksize, buffersize, clocked = plan.chunksize, plan.buffersize, plan.clocked
    on_send, task_timeout = plan.on_send, plan.task_timeout
    with ex._lock:
        ex._ensure_open()
        target = backend.prepare(fn, decision.share)
        plain = backend.unclocked(target)
        ex._started.add(backend.name)
        # max_tasks_per_child: a chunk holds at most that many calls, so a
        # fresh worker can always take it (the stream re-sends the rest,
        # as it does for a chunk stopped by its budget).
        cap = backend.max_tasks_per_child
        stats = ex._stats  # the stream (held by map's results) must not hold self
        executor = weakref.ref(ex)
        profile = decision.profile
        own = not backend.shares_memory and profile is not None and profile.effects.owns_calls()
        snapshots = own and profile is not None and profile.effects.keeps_writes()

        def send(calls: list[Call], budget_s: float | None) -> Future[ChunkResult]:
            if cap is not None:
                calls = calls[:cap]
            if own:  # each call gets arguments (and results) of its own in the worker
                calls = own_calls(calls, snapshots)
            # This thread's CPU time, not the wall clock: a send that waits
            # (for the GIL, for a core the workers hold) costs the map nothing
            # the workers do not already pay. Timed by the wall clock, a late
            # look at 20,000 JSON documents read 5-14 us an item to send where
            # it costs ~1-3 us, and moved the last 4,000 to a loop.
            start = time.thread_time()
            try:
                future = send_chunk(
                    backend,
                    target if clocked is not None and clocked() else plain,
                    calls,
                    budget_s,
                    chunk_timeout(task_timeout, len(calls), estimate.per_item_s),
                    stats,
                )
            except RuntimeError as exc:
                owner = executor()
                if owner is None:
                    raise RuntimeError(_SENT_AFTER_COLLECTED) from exc
                if owner._shutdown:
                    raise RuntimeError(_SENT_AFTER_SHUTDOWN) from exc
                raise
            if on_send is not None:
                on_send(len(calls), time.thread_time() - start)
            return future

        def explain_error(exc: BaseException, calls: list[Call]) -> BaseException:
            return explain_pickling(fn, calls, exc, backend.name)

        stream = ChunkStream(
            send=send,
            calls=_as_calls(inputs),
            remaining=remaining,
            n_workers=backend.max_workers,
            overhead_s=backend.chunk_overhead_s,
            estimate=None if chunksize is not None else estimate,
            fixed_chunksize=chunksize,
            buffersize=buffersize or default_buffersize(backend.max_workers),
            end_time=plan.end_time,
            on_chunk_error=explain_error,
            in_process=backend.shares_memory,
            max_retries=ex._max_retries,
            measuring=plan.measuring if chunksize is None else None,
            abort=backend.abort,
            on_result=plan.on_result,
            probe=plan.probe if chunksize is None else None,
            keep_first_error=plan.keep_first_error,
            start=False,
            width=None if buffersize is not None else lambda: backend.max_workers,
        )
        ex._open_maps.add(
            stream,
            send_rest=buffersize is None and remaining is not None,
            unknown_length=callable_name(fn) if buffersize is None and remaining is None else None,
        )
    # Not under the executor's lock: reading the input runs the user's code
    # (a generator that may wait for a thread submitting to this executor).
    stream.start()
    return stream


#: Why a map read after its executor's shutdown cannot go on.
_SENT_AFTER_SHUTDOWN = (
    "cannot schedule new futures after shutdown: this map sends its items as its results "
    "are read, and the executor shut down before they were all read (a map over an input "
    "of unknown length, or given a buffersize, is not read on at shutdown). Read a map's "
    "results before the executor shuts down (inside its with block), or pass a list"
)


#: The same, when the executor was dropped (garbage-collected) unshut.
_SENT_AFTER_COLLECTED = (
    "cannot schedule new futures after shutdown: this map sends its items as its results "
    "are read, and its executor was garbage-collected before they were all read (nothing "
    "else referred to it). Keep a reference to the executor, or use it in a with block, "
    "until its maps are read, or pass a list"
)


def _as_calls(inputs: Iterator[tuple[Any, ...]]) -> Iterator[Call]:
    """A map's argument tuples as the stream's calls: ``(args, no keyword arguments)``."""
    return zip(inputs, itertools.repeat(_NO_KWARGS))


def chunk_timeout(
    task_timeout: float | None, n_items: int, per_item_s: float | None
) -> float | None:
    """The time limit of a chunk of ``n_items`` when each task has ``task_timeout``.

    One item may take the whole ``task_timeout``; the others get what they
    are measured to take (``per_item_s``), or ``task_timeout`` each before
    anything is measured. A chunk over it is stopped and its items are sent
    again one per chunk, each with ``task_timeout``.
    """
    if task_timeout is None or n_items <= 1:
        return task_timeout
    other = task_timeout if per_item_s is None else 2 * per_item_s
    return task_timeout + (n_items - 1) * other
