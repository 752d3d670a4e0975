"""One ``SmartExecutor.map`` from its call to its stream of results, in named stages.

:class:`MapRun` holds a map's state as attributes (the callable, its inputs,
the decision, the backend, the per-item estimate) and runs it through its
stages, each a method a reader can hold:

1. :meth:`MapRun.route` asks the executor's policy where the callable runs;
2. :meth:`MapRun.start` picks how the map starts from that and from the
   user's fixed settings: in the caller (a synchronous backend), straight
   to the workers (:class:`~smartexec._routed_map.RoutedMap`, measured there), a fixed stream
   (``chunksize=``, ``backend=`` ..., nothing to tune), or measured first;
3. :meth:`MapRun.probe` runs the first items in the caller (and, where the
   route rests on the GIL, the next ones watched for the GIL);
4. :meth:`MapRun.verdict` prices the rest in a loop against the route, by
   the one cost model (:func:`smartexec.tuning.inline_verdict`);
5. :meth:`MapRun.switch` moves the rest of a map that started in a loop to
   the route's workers.

Where each item goes is the executor's ChunkStream and Relay's (see
``_chunk_stream.py`` and ``_mapping.py``); this module only decides how a map starts.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import _profiles
from ._chunk_stream import ChunkStream, StreamPlan
from ._code_hint import ARITHMETIC_ONLY, arithmetic_only, small_numbers
from ._context import in_caller, on_threads
from ._inputs import (
    PICKLE_SAMPLE,
    common_length,
    dear_to_send,
    drain,
    measure_pickling,
    snapshot_inputs,
    then_raise,
)
from ._mapping import (
    TINY_ITEM_S,
    InlineRun,
    SendableChain,
    count_at_end,
    inline_batches,
    lazy_inline,
    stream_values,
)
from ._rerouting import CHEAP_ITEM_S
from ._routed_map import RoutedMap, open_stream
from .gil import (
    GIL_DECIDED_S,
    GIL_MIN_ITEM_S,
    GIL_PROBE_MAX_ITEMS,
    GIL_PROBE_S,
    MANY_CORES,
    recheck_due,
    watch,
)
from .policy import permits
from .tuning import PROBE_MAX_ITEMS, PROBE_S, Verdict, inline_verdict

if TYPE_CHECKING:
    from .backends._base import Backend
    from .executor import SmartExecutor
    from .policy import Decision
    from .tuning import Estimate

__all__ = ["MapRun", "check_task_timeout", "require_int"]


def require_int(name: str, value: Any, what: str) -> int:
    """``value`` as an int: an int or any integer type (``__index__``: numpy's too), not a bool.

    Raises:
        TypeError: anything else, e.g. ``2.5`` or ``"2"``, as the stdlib pools do.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__qualname__})")


def check_task_timeout(value: Any) -> float | None:
    """``value`` as seconds (float), or None.

    Raises:
        TypeError: not a number (a bool is not).
        ValueError: not finite and > 0.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"task_timeout must be a number of seconds or None, got {value!r} "
            f"({type(value).__qualname__})"
        )
    if not 0 < value < float("inf"):
        raise ValueError(
            f"task_timeout must be a finite number of seconds > 0, got {value!r}; "
            f"None means no limit"
        )
    return float(value)


def check_map_arguments(chunksize: Any, buffersize: Any) -> None:
    """Raise as ``Executor.map`` does (3.14's words for ``buffersize``)."""
    if chunksize is not None:
        require_int("chunksize", chunksize, "an int or None")
    if buffersize is not None:
        # Python 3.14's words, so code that matches them keeps working; a
        # bool is refused (3.14 takes True as 1), as for chunksize.
        require_int("buffersize", buffersize, "an integer or None")
    if chunksize is not None and chunksize < 1:
        raise ValueError("chunksize must be >= 1.")
    if buffersize is not None and buffersize < 1:
        raise ValueError(f"buffersize must be None or > 0, got {buffersize}")


def _recording(items: Iterator[Any], into: list[Any], limit: int, star: bool) -> Iterator[Any]:
    """Yield ``items``; keep the first ``limit`` of them in ``into`` (as argument tuples)."""
    for item in items:
        if len(into) < limit:
            into.append(item if star else (item,))
        else:
            yield item
            yield from items
            return
        yield item


#: Why a map with nothing to tune sends every item at once, first true wins.
_FIXED_BECAUSE = (
    ("chunksize", "chunksize given"),
    ("backend", "backend given"),
    ("timeout", "timeout given"),
    ("task_timeout", "task_timeout given"),
    ("initializer", "initializer given: every item runs in a worker that ran it"),
    ("copy_on_write", "shared by copy-on-write"),
    ("share", "sent once per worker"),
)


class MapRun:
    """One map's state and stages (see the module's docstring).

    Args:
        ex: the executor (its policy, backends, stats and decision log).
        fn: the callable.
        iterables: the map's iterables.
        timeout: ``map``'s ``timeout`` (seconds) or None.
        chunksize: the user's chunksize or None.
        buffersize: the user's buffersize or None.
        task_timeout: seconds a chunk may run, or None (the executor's then).
        ordered: results in input order.

    Raises:
        TypeError, ValueError: as ``Executor.map`` (see :func:`check_map_arguments`).
    """

    def __init__(
        self,
        ex: SmartExecutor,
        fn: Callable[..., Any],
        iterables: tuple[Iterable[Any], ...],
        timeout: float | None,
        chunksize: int | None,
        buffersize: int | None,
        task_timeout: float | None,
        ordered: bool,
    ):
        check_map_arguments(chunksize, buffersize)
        task_timeout = check_task_timeout(task_timeout)
        self.ex, self.fn, self.ordered = ex, fn, ordered
        self.timeout, self.chunksize, self.buffersize = timeout, chunksize, buffersize
        self.task_timeout = ex._task_timeout if task_timeout is None else task_timeout
        self.end_time = None if timeout is None else timeout + time.monotonic()
        if buffersize is None:
            iterables = snapshot_inputs(iterables)  # as the stdlib reads them: at the call
        self.iterables = iterables
        self.remaining = common_length(iterables)
        self.inputs = zip(*iterables)
        self.star = len(iterables) != 1

    # -- 1. route

    def route(self) -> None:
        """The decision, its estimate and the backend (inline for a map nested on threads)."""
        ex = self.ex
        with ex._lock:
            ex._ensure_open()
            self.decision, self.estimate = ex._router.route(self.fn, self.task_timeout)
            self.backend = ex._backend(self.decision.backend)
            self.nested = ex._router.nested_on_threads(self.backend, self.decision)
            if self.nested is not None:
                self.backend = ex._backend("inline")

    def in_caller(self) -> Callable[..., Any]:
        """The callable as a loop in this thread runs it (see :func:`smartexec._context.in_caller`)."""
        profile = self.decision.profile
        return in_caller(self.fn, None if profile is None else profile.effects)

    # -- 2. how it starts

    @property
    def tunable(self) -> bool:
        """Routing is the executor's to tune: the user fixed none of it.

        No chunksize, backend, deadline, initializer, nor a callable shared
        by copy-on-write (its writes must stay in the workers).
        """
        ex = self.ex
        return (
            self.chunksize is None
            and ex._options.backend is None
            and self.task_timeout is None
            and not ex._options.stoppable
            and not self.decision.share
            and not ex._options.initializer
        )

    def start(self) -> Iterator[Any]:
        """Route the map and start it; returns its results' iterator."""
        self.route()
        ex, backend = self.ex, self.backend
        if backend.synchronous:
            if self.nested is None:
                backend.initialize()  # backend="inline" runs the initializer in this thread
            return lazy_inline(self.in_caller(), self.inputs, ex._stats.inline)
        # Items of a callable whose effects would reach this thread's state
        # (process state, its arguments) never run here (policy.permits).
        self.here_ok = permits(self.decision.profile, "inline", ex._options)
        self.stored_loop = self._stored_loop()
        self.cheap_here = self._cheap_here()
        self.loop_here = self.stored_loop or self.cheap_here
        if self.tunable and not self.loop_here and not (ex._allow_inline and self.here_ok):
            return self._to_the_workers()
        self.gil_check = self._gil_check()
        if not self._measured_first():
            return self._fixed_stream()
        self.probe()
        return self.after_probe()

    def _stored_loop(self) -> bool:
        """Its last map moved to a loop here (too cheap to send, threads gained nothing).

        It starts there, in C-level batches re-checked as they go, with no
        thread started nor items sent to find it again.
        """
        return (
            self.tunable
            and self.here_ok
            and self.estimate.loop_here
            and self.backend.shares_memory
            and self.timeout is None
            and self.ex._options.prefer is None
        )

    def _cheap_here(self) -> bool:
        """Code that only does arithmetic on small numbers (``x * x`` over ints).

        Each item costs well under a microsecond, and nothing in it can
        crash or act on this process (every item is checked to be a plain
        number), so it need not be measured in a worker first. It starts in
        a loop here, its first items timed; the rest goes to the workers if
        they turn out slow (big numbers). Measured on fork, 200,000 such
        items took 3.5x the loop the first time (a fork pool started to find
        it out), and their next runs, started from that profile, another route.
        Figures that found its items cheap do not stop it: a map over a
        generator (whose length is unknown: it goes to the workers) saved
        1.1 us an item on fork, and the next run's map over ``range(100)``
        started a fork pool for 13 ms where the first run's took 0.1 ms.
        """
        per_item_s = self.estimate.per_item_s
        return (
            self.tunable
            and not self.stored_loop
            and not self.backend.shares_memory
            and self.timeout is None
            and self.ex._options.prefer is None
            and (per_item_s is None or per_item_s < CHEAP_ITEM_S or self.estimate.loop_here)
            and self.buffersize is None
            and arithmetic_only(self.fn)
            and small_numbers(self.iterables)
        )

    def _to_the_workers(self) -> Iterator[Any]:
        """Every item to the route's workers, measured there (:class:`~smartexec._routed_map.RoutedMap`)."""
        dear = (
            not self.backend.shares_memory
            and self.estimate.per_item_s is None
            and self.buffersize is None
            and self.end_time is None  # it pickles an item here: no deadline could hold
            and dear_to_send(self.iterables)
        )
        ex, decision, estimate, backend = self.ex, self.decision, self.estimate, self.backend
        gil = decision.gil
        if (
            backend.shares_memory
            and permits(decision.profile, "inline", ex._options)
            and gil is not None
            and gil.cores >= MANY_CORES
            and self.parallelism(backend, decision) <= 1
        ):
            # Measured to keep every core busy by itself (its own BLAS
            # threads): more at once would oversubscribe the cores.
            ex._router.note(
                decision,
                estimate,
                "inline",
                (f"one item keeps {gil.cores:.1f} cores busy: a loop in this thread",),
            )
            here = in_caller(
                self.fn, None if decision.profile is None else decision.profile.effects
            )
            return lazy_inline(here, self.inputs, ex._stats.inline)
        run = RoutedMap(
            ex,
            self.fn,
            decision,
            estimate,
            backend,
            self.inputs,
            self.end_time,
            self.buffersize,
            dear,
        )
        return run.start(self.remaining, self.ordered)

    def _gil_check(self) -> bool:
        """Whether the first items are watched for the GIL (in this thread, sampled by another).

        A route that rests on whether the callable holds the GIL is measured
        on its first map, and again every GIL_RECHECK_MAPS maps. Without
        allow_inline, no item of a process-routed callable runs here: a
        crash must fail its item, not kill this process; callables shared by
        copy-on-write never run here (their writes to their own state must
        stay in the workers).
        """
        ex, decision = self.ex, self.decision
        inline_ok = (ex._allow_inline or self.backend.shares_memory) and self.here_ok
        return (
            inline_ok
            and permits(decision.profile, "thread", ex._options)
            and (decision.measure or (decision.gil is not None and recheck_due(self.fn)))
        )

    def _measured_first(self) -> bool:
        """Whether the map measures its first items here before choosing (else a fixed stream).

        Threads start in microseconds and cost ~20 us a chunk, so measuring
        in this thread first buys little there, and would block map() on
        producer/consumer code (items that wait for the caller). An item
        that keeps the cores busy by itself (its own BLAS threads) is
        measured on threads too: a loop is then as fast, with no
        oversubscription.
        """
        decision, backend = self.decision, self.backend
        parallel_already = (
            self.here_ok
            and backend.shares_memory
            and decision.gil is not None
            and decision.gil.cores >= MANY_CORES
            and self.parallelism(backend, decision) <= 1
        )
        return (
            self.tunable
            and self.timeout is None
            and (self.gil_check or not backend.shares_memory or parallel_already or self.loop_here)
        )

    def open_stream(self, rest: Iterator[tuple[Any, ...]], left: int | None) -> ChunkStream:
        plan = StreamPlan(
            self.fn,
            self.decision,
            self.estimate,
            self.backend,
            self.chunksize,
            self.buffersize,
            self.end_time,
            self.task_timeout,
        )
        return open_stream(self.ex, plan, rest, left)

    def _fixed_stream(self) -> Iterator[Any]:
        """Every item sent as the user fixed it: nothing runs in this thread."""
        ex, decision = self.ex, self.decision
        stream = self.open_stream(self.inputs, self.remaining)
        facts = {
            "chunksize": self.chunksize is not None,
            "backend": ex._options.backend is not None,
            "timeout": self.timeout is not None,
            "task_timeout": self.task_timeout is not None,
            "initializer": ex._options.initializer,
            "copy_on_write": decision.share and self.backend.copy_on_write,
            "share": decision.share,
        }
        why = next(
            (text for key, text in _FIXED_BECAUSE if facts[key]),
            "threads: nothing to measure first",
        )
        ex._router.note(
            decision,
            self.estimate,
            decision.backend,
            (f"{why}: no items ran in this thread",),
            stream,
        )
        return stream_values([], stream, self.ordered)

    # -- 3. probe

    def probe(self) -> None:
        """Run the first items here (and watch the next for the GIL where it decides the route)."""
        ex = self.ex
        pickled = not self.backend.shares_memory
        items: Iterator[Any] = self.inputs if self.star else iter(self.iterables[0])
        head: list[Any] = []
        first = self.iterables[0]
        if pickled and not self.star and isinstance(first, (list, tuple, range)):
            head = [(x,) for x in first[:PICKLE_SAMPLE]]  # a sample, not consumed
        elif pickled:
            # Kept as the probe reads them: reading ahead would block map() on
            # a slow producer.
            items = _recording(items, head, PICKLE_SAMPLE, self.star)
        here = self.in_caller()
        self.run = run = InlineRun(here, items, self.estimate, self.star, ex._stats.inline)
        self.prefix: list[Any] = []
        self.measured_now = self.estimate.per_item_s is None
        if self.measured_now or self.gil_check:
            self.prefix = run.batch(PROBE_S, PROBE_MAX_ITEMS)
        if self.gil_check and self.worth_watching(run, self.estimate, self.backend, self.remaining):
            self._watch()
        if (
            self.measured_now
            and pickled
            and not self.backend.shares_memory
            and self.prefix
            and run.error is None
        ):
            measure_pickling(self.estimate, head[: len(self.prefix)], self.prefix[:PICKLE_SAMPLE])

    def _watch(self) -> None:
        """Run the next items here while sampling the GIL; decide again on it."""
        ex, run = self.ex, self.run
        # As on threads: in a copy of this thread's context.
        watched = watch(on_threads(self.fn), run.inputs, self.star, max_items=GIL_PROBE_MAX_ITEMS)
        self.prefix += watched.results
        ex._stats.inline(len(watched.results), watched.profile.wall_s)
        run.items += len(watched.results)
        run.elapsed_s += watched.profile.wall_s
        run.error, run.exhausted = watched.error, watched.exhausted
        # Too short a watch (the input ran out) is no evidence to keep; one
        # that stopped early stopped on decisive figures.
        wall_s = watched.profile.wall_s
        if run.error is None and (
            wall_s >= GIL_PROBE_S / 2 or (not watched.exhausted and wall_s >= GIL_DECIDED_S)
        ):
            self.decision = ex._router.measured(self.fn, self.decision, watched.profile)
            with ex._lock:
                ex._ensure_open()
                self.backend = ex._backend(self.decision.backend)

    # -- 4. verdict

    def rest(self) -> Iterator[tuple[Any, ...]]:
        """The items not read yet, as argument tuples."""
        return self.run.inputs if self.star else zip(self.run.inputs)

    def left(self) -> int | None:
        """Items not run yet; None once past the end its ``__len__`` gave (it was wrong)."""
        remaining, done = self.remaining, self.run.items
        return None if remaining is None or done > remaining else remaining - done

    def verdict(self) -> Verdict:
        """A loop here against the route, for the items left, by the one cost model."""
        ex, backend, estimate = self.ex, self.backend, self.estimate
        per_item_s = estimate.per_item_s or 0.0
        if self.loop_here and per_item_s < CHEAP_ITEM_S:
            # Its last map measured threads and processes against a loop:
            # items this cheap gain nothing there (reroute's finding).
            rest_s = per_item_s * (self.left() or 0)
            return Verdict(
                True,
                rest_s,
                rest_s,
                f"{per_item_s * 1e6:.2f} us per item, under the "
                f"{CHEAP_ITEM_S * 1e6:.0f} us that workers or threads could gain on",
            )
        started = backend.name in ex._started
        return inline_verdict(
            per_item_s=per_item_s,
            send_s=0.0 if backend.shares_memory else estimate.pickle_parent_s,
            remaining=self.left(),
            route="thread" if backend.shares_memory else backend.name,
            workers=self.parallelism(backend, self.decision),
            cpus=ex._platform.cpu_count,
            startup_s=0.0 if started else backend.worker_startup_s * backend.max_workers,
            overhead_s=backend.chunk_overhead_s
            + (0.0 if backend.shares_memory else estimate.send_per_chunk_s),
        )

    def after_probe(self) -> Iterator[Any]:
        """The rest of the map after its first items: raise, end, go on here, or send it."""
        ex, run, decision, estimate = self.ex, self.run, self.decision, self.estimate
        if run.error is not None:
            return then_raise(self.prefix, run.error)
        if run.exhausted:
            per_item_us = run.elapsed_s / max(run.items, 1) * 1e6
            ex._router.note(
                decision,
                estimate,
                "inline",
                (
                    f"the whole input ({run.items} items) ran in this thread while measuring "
                    f"it: {run.elapsed_s * 1000:.1f} ms, {per_item_us:.2f} us per item",
                ),
            )
            return drain(self.prefix)
        first = self.verdict()
        if not first.inline:
            estimate.loop_here = False
            stream = self.open_stream(self.rest(), self.left())
            ex._router.note(decision, estimate, decision.backend, (first.reason,), stream)
            return stream_values(self.prefix, stream, self.ordered)
        ex._router.note(decision, estimate, "inline", (*self._started_here(), first.reason))
        if self.cheap_here:
            estimate.loop_here = True  # its next maps here start in the loop too
        return self._in_a_loop()

    def _started_here(self) -> tuple[str, ...]:
        if self.stored_loop:
            return (
                "its last map moved to a loop here (too cheap to send, nothing gained on "
                "threads): this one starts in a loop, re-checked between batches",
            )
        if self.cheap_here:
            return (f"{ARITHMETIC_ONLY}: it starts in a loop here, its first items timed",)
        return ()

    def _in_a_loop(self) -> Iterator[Any]:
        """The rest in this thread, in batches re-checked by :meth:`verdict`."""
        run, estimate = self.run, self.estimate
        if (
            self.measured_now
            and self.remaining is not None
            and (estimate.per_item_s or 0.0) < TINY_ITEM_S
        ):
            # Sub-microsecond items of a sized input, just measured: the rest
            # runs as one C-level map, with no re-checks. Should the items turn
            # slow, the map costs what a plain loop costs (never more); the
            # batches below would cost 15-25 ns per item more on every tiny map.
            # (An estimate from an older map is re-checked: it may be stale.)
            n_rest = self.remaining - run.items
            return SendableChain(
                drain(self.prefix),
                (itertools.starmap if self.star else map)(self.fn, run.inputs),
                count_at_end(n_rest, time.perf_counter(), self.ex._stats.inline),
            )
        return SendableChain.from_iterable(
            inline_batches(self.prefix, run, self.verdict, self.switch, self.ordered)
        )

    # -- 5. switch

    def switch(self, reason: str) -> ChunkStream:
        """Send the rest of a map that started in a loop here to the route's workers."""
        ex, decision, estimate = self.ex, self.decision, self.estimate
        if self.cheap_here:
            estimate.loop_here = False
        if self.stored_loop:
            # Fresh evidence over the stored: its next maps, and a later
            # run's, measure in the workers again.
            estimate.loop_here = False
            _profiles.save(
                self.fn,
                _profiles.StoredProfile(
                    decision.backend,
                    estimate.per_item_s or 0.0,
                    decision.gil,
                    estimate.pickle_parent_s,
                    estimate.items,
                    time.time(),
                ),
            )
        stream = self.open_stream(self.rest(), self.left())
        ex._router.note(
            decision,
            estimate,
            decision.backend,
            (f"after {self.run.items} items inline: {reason}",),
            stream,
        )
        return stream

    def parallelism(self, backend: Backend, decision: Decision) -> int:
        """How many items ``backend`` can run at once for ``decision``'s callable.

        Threads beyond the CPU count only help calls that wait: a thread
        backend's ``min(32, cpus + 4)`` workers run computing calls (even
        GIL-releasing ones) on ``cpus`` cores; and an item measured to keep
        ``k`` cores busy (its own BLAS threads) leaves room for ``cpus / k``
        of them, so one that already uses every core is run inline.
        """
        gil = decision.gil
        if backend.shares_memory and (gil is None or gil.kind != "waits"):
            cpus = self.ex._platform.cpu_count
            return max(1, min(backend.max_workers, gil.at_once(cpus) if gil else cpus))
        return backend.max_workers

    def worth_watching(
        self, run: InlineRun, estimate: Estimate, backend: Backend, remaining: int | None
    ) -> bool:
        """Whether the first items of a map are worth a GIL measurement.

        Not when the probe ended the map (an error, the end of the input), nor
        for items under :data:`~smartexec.gil.GIL_MIN_ITEM_S` (a process pool
        seldom pays there, and they would mostly run inline), nor when the
        map will run inline anyway.
        """
        if run.error is not None or run.exhausted:
            return False
        if (estimate.per_item_s or 0.0) < GIL_MIN_ITEM_S:
            return False
        left = None if remaining is None else remaining - run.items
        return not inline_verdict(
            per_item_s=estimate.per_item_s or 0.0,
            send_s=0.0,
            remaining=left,
            route="thread",
            workers=min(backend.max_workers, self.ex._platform.cpu_count),
            cpus=self.ex._platform.cpu_count,
            startup_s=0.0,
            overhead_s=backend.chunk_overhead_s,
        ).inline
