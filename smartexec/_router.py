"""Where each callable starts: the policy's decision, cached per callable, and what adjusts it.

:class:`Router` is one executor's routing. For a callable it asks
:func:`smartexec.policy.decide` (what the callable is, this host, the
user's options, a GIL measurement from this process or an earlier run's
stored profile, the user's threads running), adjusts the answer for where
its last map ended (:meth:`Router._where_it_ended`) and for a
``task_timeout`` (:meth:`Router.with_timeout`), and caches it weakly per
callable with its per-item :class:`~smartexec.tuning.Estimate`. A map's
figures replace the cached decision (:meth:`Router.measured`,
:meth:`Router.route_next`); ``explain()`` asks the same code without
logging (``record=False``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _profiles, _threads
from ._identity import WeakCallable, WeakRecords, identity_key
from ._reasons import (
    INITIALIZER_BY_VALUE,
    INITIALIZER_BY_VALUE_RULE,
    LAST_MAP_RULE,
    Reason,
    measured_reasons,
    reasons_off_processes,
    rule_of,
)
from ._routed_map import starts_in_loop
from ._system import Platform
from .backends._base import Backend
from .gil import GilProfile, recall, remember
from .inspection import callable_name, inspect_callable
from .policy import ELSEWHERE_THREADS, Decision, Options, alternatives, decide, permits, stoppable
from .registry import get_backend_class
from .tuning import Estimate

if TYPE_CHECKING:
    from ._chunk_stream import ChunkStream

__all__ = ["Router", "ROUTE_SETTLE_S", "other_threads"]


def _earlier(fn: Callable[..., Any]) -> tuple[GilProfile | None, _profiles.StoredProfile | None]:
    """``fn``'s GIL measurement in this process, else the profile an earlier run saved.

    Fresh evidence wins: a measurement made in this process is used as it
    is, and no stored profile is read for it.
    """
    measured = recall(fn)
    if measured is not None:
        return measured, None
    stored = _profiles.load(fn)
    if stored is None:
        return None, None
    if stored.from_this_process:
        return stored.gil, stored  # another executor's evidence, as fresh as recall's
    # An earlier run's figures may send a callable to processes, never by
    # themselves to this process: whether an item raises, crashes a worker
    # or kills the caller must not depend on what an earlier run stored. A
    # move to threads is re-earned from this run's own first chunks.
    gil = stored.gil if stored.gil is not None and stored.gil.kind == "holds" else None
    return gil, stored


def _from_earlier_run(decision: Decision, stored: _profiles.StoredProfile | None) -> Decision:
    """``decision`` with a reason saying it starts from ``stored``, when there is one."""
    if stored is None:
        return decision
    reason = _profiles.earlier_run_reason(stored, decision.backend)
    return dataclasses.replace(decision, reasons=(*decision.reasons, reason))


#: Seconds routing waits, at most, for busy library threads to go back to their
#: wait (IPython's history thread writes after each cell), so that the route
#: does not depend on the instant it was decided.
ROUTE_SETTLE_S = 0.05


def other_threads(own_user_code: bool = True) -> int:
    """The user's threads running besides the calling one (see :mod:`smartexec._threads`).

    smartexec's own (named ``smartexec-*``, paused or released around a fork)
    do not count, nor library threads found idle in a known wait (joblib's
    and loky's, tqdm's monitor, a Jupyter kernel's): forking cannot copy a
    lock they hold; but those of its threads running the user's code do,
    unless ``own_user_code`` is False.
    """
    return len(_threads.census(own_user_code=own_user_code).running)


def _with_thread_census(decision: Decision, found: _threads.ThreadCensus) -> Decision:
    """``decision`` with a reason naming the library threads left out, when it forks."""
    reason = found.reason()
    if reason is None or decision.backend != "fork" or found.running:
        return decision
    return dataclasses.replace(decision, reasons=(*decision.reasons, reason))


class _Routed:
    """What routing knows of one callable: its decision, its per-item estimate, and under what census.

    Kept in a :class:`~smartexec._identity.WeakRecords`: it goes with its callable.
    """

    __slots__ = ("handle", "decision", "estimate", "with_threads")

    def __init__(self, decision: Decision, estimate: Estimate, with_threads: bool):
        self.handle: WeakCallable = None  # type: ignore[assignment]  # set once made
        self.decision, self.estimate = decision, estimate
        #: Decided while threads of the user's ran (decided again when that changes).
        self.with_threads = with_threads


class Router:
    """One executor's routing: its decisions per callable, cached weakly, and their log.

    Args:
        platform: the host's facts.
        options: the user's options (replaced by :meth:`keep_stoppable`).
        log: the executor's decision log (``decisions()``), appended to.
        lock: the executor's lock, held while a cached decision is replaced.
        initializer: whether the executor has an initializer.
    """

    def __init__(
        self,
        platform: Platform,
        options: Options,
        log: collections.deque[Decision],
        lock: threading.RLock,
        initializer: bool,
    ):
        self.platform = platform
        self.options = options
        self._log = log
        self._lock = lock
        self._initializer = initializer
        #: identity key -> what routing knows of a callable (see _Routed).
        self._routes: WeakRecords[_Routed] = WeakRecords()

    def route(
        self, fn: Callable[..., Any], task_timeout: float | None = None, record: bool = True
    ) -> tuple[Decision, Estimate]:
        """Where ``fn`` runs, under ``task_timeout`` (seconds, or None), and its per-item estimate.

        The cached decision (:meth:`_cached`), moved where one task can be
        timed out when ``task_timeout`` is set (:meth:`with_timeout`; that
        part is not cached: a map may give its own). With ``record`` False
        (``explain()``, a dry run) nothing is logged in ``decisions()``.

        Raises:
            ValueError: the user forced a backend that cannot time out a task.
        """
        decision, estimate = self._cached(fn, record)
        return self.with_timeout(decision, task_timeout), estimate

    def _cached(self, fn: Callable[..., Any], record: bool) -> tuple[Decision, Estimate]:
        """The policy's decision for ``fn`` and its per-item estimate, cached weakly.

        Decided again when threads of the user's start or stop running (see
        :func:`smartexec.policy.decide`'s ``other_threads``). With
        ``record`` False the same decision is made and cached (map would
        make it alike) but not logged.
        """
        key = identity_key(fn)
        cached = self._routes.find(fn, key)
        if cached is not None:
            decision, estimate = cached.decision, cached.estimate
            if decision.backend == "thread" and not (
                self.options.initializer or self.options.stoppable
            ):
                # Other threads only ever move work off fork (or, with an
                # initializer or a task_timeout, onto it): not worth looking
                # at them at every submit (2-13 us).
                return decision, estimate
        found = _threads.census()
        if found.running and not (cached is not None and cached.with_threads):
            # Busy library threads only: wait a moment before routing off fork.
            found = _threads.census(ROUTE_SETTLE_S)
        threads = len(found.running)
        if cached is not None:
            if (threads > 0) == cached.with_threads:
                return cached.decision, cached.estimate
            assert cached.decision.profile is not None
            measured, stored = _earlier(fn)
            decision = decide(
                cached.decision.profile, self.platform, self.options, measured, threads
            )
            decision = _from_earlier_run(decision, stored)
            cached.decision = decision = _with_thread_census(decision, found)
            cached.with_threads = threads > 0
            if record:
                self._log.append(decision)
            return decision, cached.estimate
        measured, stored = _earlier(fn)
        # Sized only as far as the policy asks (over big_state_bytes or not):
        # pickling a dict of 1.5 M entries to the end took 0.84 s.
        profile = inspect_callable(fn, cap_bytes=self.options.big_state_bytes)
        decision = decide(profile, self.platform, self.options, measured, threads)
        decision = _from_earlier_run(decision, stored)
        if any(rule_of(r) == INITIALIZER_BY_VALUE_RULE for r in decision.reasons):
            warnings.warn(
                f"{callable_name(fn)}: {INITIALIZER_BY_VALUE}", RuntimeWarning, stacklevel=3
            )
        estimate = Estimate()
        if stored is not None:
            # A starting point only: the first chunks' figures move it (and
            # the GIL is watched again where this route measures it).
            estimate.seed(stored.per_item_s, stored.items, stored.send_s)
            if stored.from_this_process:
                # Only items too cheap for any worker to gain on start in a
                # loop: dearer ones that a loop won for their sending costs
                # start on threads, whose figures may send them to processes.
                estimate.loop_here = starts_in_loop(stored.backend, stored.per_item_s)
            decision = self._where_it_ended(decision, stored)
        decision = _with_thread_census(decision, found)
        self._routes.keep(fn, _Routed(decision, estimate, threads > 0), key)
        if record:
            self._log.append(decision)
        return decision, estimate

    def keep_stoppable(self) -> None:
        """Route as under a ``task_timeout``, with no deadline: keep work where a call can be stopped.

        For joblib's ``Parallel(timeout=)``, which stops a run itself (its
        ``abort_everything`` kills the workers): work bound for threads
        (by the policy, a measurement or an earlier run) or loky goes to
        fork, and no map or submit moves it to threads later
        (:func:`smartexec.policy.stoppable`). Call it before any work.
        """
        with self._lock:
            self.options = dataclasses.replace(self.options, stoppable=True)
            self._routes.clear()

    def nested_on_threads(self, backend: Backend, decision: Decision) -> Decision | None:
        """A map called from this executor's own thread, bound for those threads: run it here.

        A call on a pool thread that maps on the same executor waits for
        chunks queued behind calls like itself; once every thread waits so,
        nothing runs (a deadlock, as with a ``ThreadPoolExecutor`` a task
        submits to and waits on). smartexec may have put the outer calls on
        threads itself (they wait), where on processes the nested map ran
        inline (a worker process runs nested work inline): so it runs here,
        in the calling thread, as a loop. Returns the logged decision, or
        None when the map is not nested so (hold ``self._lock``).
        """
        if backend.name != "thread" or not backend.runs_this_thread():
            return None
        nested = dataclasses.replace(
            decision,
            backend="inline",
            share=False,
            measure=False,
            reasons=(
                *decision.reasons,
                "called from one of this executor's own threads: mapped on those threads, "
                "it would wait for chunks queued behind calls that wait like it (a "
                "deadlock once every thread waits), so it runs in the calling thread",
            ),
        )
        if not self._log or self._log[-1] != nested:  # once per run of nested maps
            self._log.append(nested)
        return nested

    def _where_it_ended(self, decision: Decision, stored: _profiles.StoredProfile) -> Decision:
        """Start where ``stored``'s last map or submits ended, within what may be trusted.

        An earlier run's figures only ever move a callable toward processes
        (see :func:`_earlier`): one whose last map ended on threads or in a
        loop here starts where the policy says, and its first chunks move
        it again. Another executor of this process is fresh evidence: its
        callable starts on threads where that one ended there (its effects
        permitting).
        """
        if (
            decision.share
            or self.options.backend is not None
            or self.options.prefer is not None
            or self._initializer
            or self.options.stoppable
        ):
            return decision
        if (
            stored.from_this_process
            and stored.backend in ("thread", "inline")
            and decision.backend in ("fork", "loky")
            and permits(decision.profile, "thread", self.options)
        ):
            why = (
                "its submits' figures moved it there"
                if stored.source == "submits"
                else "measured too cheap to send to processes"
                if stored.backend == "inline"
                or (stored.gil is not None and stored.gil.kind == "holds")
                else "no route was predicted faster there"
            )
            kept = reasons_off_processes(decision.reasons)
            return dataclasses.replace(
                decision,
                backend="thread",
                reasons=(
                    *kept,
                    f"{stored.last_work()} ended on {stored.backend} ({why}): this "
                    f"one starts on threads",
                ),
            )
        if stored.backend in ("fork", "loky") and decision.backend == "thread":
            # Its kind says threads, but its last map stayed on (or moved to)
            # processes on the figures: start there, or runs would alternate.
            assert decision.profile is not None
            found = alternatives(decision.profile, self.platform, self.options, other_threads())
            target = next((d for r, d in found.items() if r in ("fork", "loky")), None)
            if target is not None:
                # The threads reasons do not hold for this route, nor does
                # the alternative's own "off threads" reason (this one says why).
                kept = tuple(r for r in target.reasons[1:] if r is not ELSEWHERE_THREADS)
                return dataclasses.replace(
                    target,
                    gil=decision.gil,
                    reasons=(
                        decision.reasons[0],
                        f"{stored.last_work()} ended on {stored.backend} on its "
                        f"measured times (its GIL figures alone would send it to threads): "
                        f"this one starts on {target.backend}",
                        *kept,
                    ),
                )
        return decision

    def with_timeout(self, decision: Decision, task_timeout: float | None) -> Decision:
        """Move a decision to a backend that can time out one task, if needed.

        Raises:
            ValueError: the user forced a backend that cannot time out a task.
        """
        if task_timeout is None:
            return decision
        threads = other_threads()
        decision = stoppable(decision, self.platform, self.options, threads)
        # A registered factory may be a plain function: it says nothing, so False.
        if getattr(get_backend_class(decision.backend), "takes_timeouts", False):
            return decision
        if self.options.backend is not None:
            raise ValueError(
                f"backend {decision.backend!r} cannot time out one task; use "
                f'backend="fork" or backend="thread" for task_timeout'
            )
        fork_ok = self.platform.has_fork and self.options.start_method in (None, "fork")
        threads_ok = permits(decision.profile, "thread", self.options)
        # Fork while other threads run risks a lock copied held; threads would
        # compute something else for this callable (its effects): fork, then.
        target = "fork" if fork_ok and (not threads or not threads_ok) else "thread"
        return dataclasses.replace(
            decision,
            backend=target,
            share=decision.share and target == "fork",
            reasons=(
                *decision.reasons,
                f"task_timeout={task_timeout:g} s: {decision.backend} cannot time out one "
                f"task, {target} can",
            ),
        )

    def route_next(self, fn: Callable[..., Any], decision: Decision, why: str) -> None:
        """Start ``fn``'s next maps on ``decision``'s backend, saying why."""
        key = identity_key(fn)
        reason = Reason(LAST_MAP_RULE, f"its last map: {why}")
        with self._lock:
            cached = self._routes.find(fn, key)
            if cached is not None:
                kept = tuple(r for r in decision.reasons if rule_of(r) != LAST_MAP_RULE)
                if decision.backend in ("thread", "inline"):
                    kept = reasons_off_processes(kept)  # moved there on its figures
                else:
                    kept = measured_reasons(kept)  # measured: its figures follow
                next_decision = dataclasses.replace(decision, reasons=(*kept, reason))
                cached.decision = next_decision

    def measured(self, fn: Callable[..., Any], decision: Decision, gil: GilProfile) -> Decision:
        """Decide again for ``fn`` with a GIL measurement; cache and log the result."""
        assert decision.profile is not None
        new = decide(decision.profile, self.platform, self.options, gil, other_threads())
        remember(fn, gil)
        key = identity_key(fn)
        with self._lock:
            cached = self._routes.find(fn, key)
            if cached is not None:
                cached.decision = new
            self._log.append(new)
        return new

    def note(
        self,
        decision: Decision,
        estimate: Estimate,
        backend: str,
        reasons: tuple[str, ...],
        stream: ChunkStream | None = None,
        *,
        measured: bool = False,
        replaces: Decision | None = None,
    ) -> Decision:
        """Log what a map did, with its measured figures, before the policy's reasons.

        ``measured``: the figures come from the map's own items, so the
        policy's "not measured yet" is no longer true and is left out.
        ``replaces``: an entry this map logged before (a stay whose figures
        are now taken again), replaced in place rather than followed: a map
        keeps one entry. Returns the entry logged.
        """
        size = stream.sizes[0] if stream is not None and stream.sizes else None
        policy = measured_reasons(decision.reasons) if measured else decision.reasons
        if backend != decision.backend:
            # The policy's reasons argue for its route, not this one: said so
            # (an inline map listed "processes run it in parallel").
            head = f"before any item ran, the policy chose {decision.backend}"
            policy = (f"{head}:", *policy) if policy else (head,)
        done = dataclasses.replace(
            decision,
            backend=backend,
            reasons=(*reasons, *policy),
            share=decision.share and backend == decision.backend,
            chunksize=size,
            measure=False,
        )
        estimate.last_map = done
        log = self._log
        if replaces is not None:
            with self._lock:
                for i in range(len(log) - 1, -1, -1):
                    if log[i] is replaces:
                        log[i] = done
                        return done
        log.append(done)  # new, or the entry it replaces has left the log
        return done
