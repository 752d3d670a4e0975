"""Where ``SmartExecutor.submit`` sends a call, and how its callable's figures move later calls.

A submit is routed as a map is (:meth:`SmartExecutor._route`), then, on a
process route the policy guessed, learned from: each completed call's
figures go to a :class:`~smartexec._submit_learning.SubmitLearner`, whose
verdict moves the callable's later submits (and those still queued) to
threads. :class:`SubmitRoute` holds that state for one executor:

* the verdicts' decisions, and the calls sent or parked while a callable's
  first calls run (:class:`LearningCalls`; calls beyond its window wait
  unsent, as ``ProcessPoolExecutor`` queues calls beyond ``max_workers + 1``);
* the *fast* submits: a callable on threads for good (or until a map, or
  its calls' re-check, says otherwise) skips the routing and the lock;
* the moves under way, which ``shutdown`` waits for.

Lock order: the executor's lock, then :attr:`SubmitRoute.lock`; no
future's lock is taken under :attr:`SubmitRoute.lock` (a user's
``cancel()`` holds its future's lock while its done-callbacks run, and one
may submit). See ``docs/routing.md`` ("What submit() learns").
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import threading
import time
import types
import weakref
from collections.abc import Callable, Sized
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _profiles
from ._call_future import CallFuture
from ._context import on_threads
from ._diagnose import explain_pickling, is_pickling_failure
from ._identity import WeakRecords, identity_key
from ._reasons import reasons_off_processes
from ._remote import Call, ChunkResult
from ._sender import send_chunk
from ._submit_learning import (
    MIN_CALLS,
    RECHECK_CALLS,
    SubmitLearner,
    ThreadCalls,
    send_ahead,
)
from ._submit_records import LearningCalls, Parked, _Known
from ._system import interpreter_exiting
from ._threads import is_ours, own_thread
from .backends._base import Backend
from .policy import Decision, permits
from .stats import CallLog, StatsRecorder

if TYPE_CHECKING:
    from .executor import SmartExecutor

__all__ = ["SubmitRoute", "LearningCalls", "PARKED_WAIT_S"]

#: Seconds ``shutdown(wait=True)`` waits, at most, for submits parked while
#: their callable's first calls run to be routed by those calls' figures.
PARKED_WAIT_S = 30.0


def _call_done(ref: weakref.ref[SubmitRoute], entry: LearningCalls, future: Future[Any]) -> None:
    """A learning submit completed: let waiting calls go (a done-callback, any thread)."""
    route = ref()
    if route is not None:
        route.call_done(entry, future)


class SubmitRoute:
    """One executor's submits: their routes, what their figures taught, and the moves they make.

    Holds the executor's shared objects it needs (its decision log, its
    backends, its stats, its lock), never the executor itself: a call's
    done-callback reaches this object weakly, and a dropped executor lets
    its backends go at once.

    Args:
        executor: the executor whose submits these are.
        learns: whether completed submits' figures may move later ones
            (only where the process route is the policy's guess: no
            ``backend=``, ``prefer=``, initializer, ``task_timeout`` or
            ``max_tasks_per_child``).
    """

    def __init__(self, executor: SmartExecutor, learns: bool):
        self.learns = learns
        self.learner = SubmitLearner()
        self._router = executor._router  # its options: keep_stoppable replaces them
        self._log = executor._log
        self._backends = executor._backends
        self._stats: StatsRecorder = executor._stats
        self._started = executor._started
        self._executor_lock = executor._lock
        self._max_retries = executor._max_retries
        self._plain = not executor._options.initializer
        #: identity key -> what its submits know of the callable (one record each).
        self.known: WeakRecords[_Known] = WeakRecords()
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)
        self.movers: list[int] = []  # the threads moving calls now (see shutdown)
        self.closers: list[int] = []  # shutdowns sending parked calls now
        self.closing_cancels = False  # a shutdown that cancels pending work began
        self.closed = False
        self._recorders: dict[str, Any] = {}

    # -- submit

    def fast_path(self, fn: Any, shut: bool) -> tuple[Any, ...] | None:
        """``fn``'s fast-submit entry when its next call may skip the routing, else None.

        A plain function's key is its id (:func:`identity_key`), looked up
        without calling it. Every :data:`RECHECK_CALLS` completed calls of a
        cheap verdict's, the next submit re-checks it (:meth:`upheld`).
        """
        known = self.known.get(id(fn))
        if known is None and type(fn) is not types.FunctionType:
            known = self.known.get(identity_key(fn))
        fast = None if known is None else known.fast
        if (
            fast is not None
            and not shut
            and (fast[0].ref() is fn or fast[0].matches(fn))
            and (len(fast[4]) < RECHECK_CALLS or self.upheld(fn, fast))
        ):
            return fast
        return None

    def submit(
        self, ex: SmartExecutor, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Submitted:
        """Route and send one call of ``fn``; see ``SmartExecutor.submit``. Hold the executor's lock.

        Returns:
            A :class:`Submitted`: the call's future, whether it waits unsent
            (parked) while ``fn``'s first calls run, and a synchronous
            backend's call, not run yet, for the caller to run once it has
            released its lock.
        """
        moved = self.learned_route(fn) if self.learns else None
        if moved is not None:
            decision, learning = moved, False
        else:
            decision, _ = ex._router.route(fn, ex._task_timeout)
            decision, learning = self.decision(fn, decision)
        backend = ex._backend(decision.backend)
        timeout_s = ex._task_timeout
        if backend.calls_directly and timeout_s is None:
            run_call = backend.submit_call
            # The thread route: the pool's own future is the caller's, as
            # from a ThreadPoolExecutor (no chunk, no chain).
            record = self.call_recorder(backend)
            future: Future[Any] = run_call(fn, args, kwargs, record)
            self._started.add(backend.name)
            self.remember_fast(fn, run_call, record, moved is not None)
            return Submitted(future)
        if learning:
            ex._backend("thread")  # made here, under the lock, for a verdict's move
        return self._to_processes(fn, (args, kwargs), decision, backend, timeout_s, learning)

    def _to_processes(
        self,
        fn: Any,
        call: Call,
        decision: Decision,
        backend: Backend,
        timeout_s: float | None,
        learning: bool,
    ) -> Submitted:
        """Send ``call`` on its process route, or park it while ``fn``'s first calls run."""
        stats = self._stats
        profile = decision.profile
        # A shared callable that may write to its object gets a snapshot of
        # its own, as a map does: a worker an earlier call wrote to must not
        # run it (a digest proves only this process's copy unchanged).
        fresh = decision.share and (profile is None or profile.effects.keeps_writes())
        prepare = backend.prepare if fresh else backend.prepare_call
        try:
            target = prepare(fn, decision.share)

            def send() -> Future[ChunkResult]:
                return send_chunk(backend, target, [call], None, timeout_s, stats)

            parked = self.park(fn, decision, call, backend, send) if learning else None
            if parked is not None:
                self._started.add(backend.name)
                return Submitted(parked, parked=True)
            start = time.perf_counter()
            inner = send() if not backend.synchronous else _Deferred(send)
        except Exception as exc:
            # As the stdlib: a call that cannot be sent fails its future,
            # submit() itself does not raise (the built-in process
            # backends never raise here; a plugin backend may).
            if not is_pickling_failure(exc):
                raise
            failed: CallFuture = CallFuture()
            failed.set_exception(explain_pickling(fn, [call], exc, backend.name))
            return Submitted(failed)
        self._started.add(backend.name)
        learn = None
        if learning:
            learn = functools.partial(
                self.learn_from, fn, send_s=time.perf_counter() - start, backend=backend.name
            )
        outer = CallFuture(inner, fn, call, backend.name, send, self._max_retries, learn)
        if learning:
            self.note_sent(fn, decision, outer, backend.max_workers)
        return Submitted(outer, run_here=inner if isinstance(inner, _Deferred) else None)

    def decision(self, fn: Any, decision: Decision) -> tuple[Decision, bool]:
        """``decision`` for a submit of ``fn``, moved to threads where its submits' figures say so.

        Returns:
            The decision, and whether this call's figures are to be learned
            from (a process route that completed submits may still move).
        """
        if not self.learns or decision.share or decision.backend not in ("fork", "loky"):
            return decision, False
        if not permits(decision.profile, "thread", self._router.options):
            return decision, False  # its effects keep it off threads: nothing to learn
        learned = self.learner.verdict(fn)
        if learned is None:
            return decision, True
        key = identity_key(fn)
        with self.lock:  # a completed submit's thread may make it too
            known = self._known(fn, key)
            cached = None if known is None else known.moved
            if cached is not None and cached[0] is learned and cached[1] is decision:
                return cached[2], False
            policy_reasons = reasons_off_processes(decision.reasons)
            moved = dataclasses.replace(
                decision,
                backend="thread",
                share=False,
                measure=False,
                reasons=(learned.reason(), *policy_reasons),
            )
            if known is not None:
                known.moved = (learned, decision, moved)
            self._log.append(moved)
        # A script's next run starts its submits (and maps) on threads, as a
        # map's stored profile does; a map re-checks it on its first chunks.
        _profiles.save(
            fn,
            _profiles.StoredProfile(
                "thread",
                learned.compute_s,
                None,
                learned.send_s,
                learned.calls,
                time.time(),
                source="submits",
            ),
        )
        return moved, False

    def learned_route(self, fn: Any) -> Decision | None:
        """The threads decision made for ``fn`` from its submits' figures, or None.

        A verdict stands whatever other threads run: it moved ``fn`` off
        fork or loky, and other threads only choose between those two.
        """
        key = identity_key(fn)
        known = self.known.get(key)
        cached = None if known is None else known.moved
        if cached is None or cached[0] is not self.learner.verdict(fn, key):
            return None
        return cached[2]

    def call_recorder(self, backend: Backend) -> CallLog:
        """The stats recorder of calls run on ``backend`` with no chunk (submit's thread route)."""
        record = self._recorders.get(backend.name)
        if record is None:
            made = self._stats.call_recorder(backend.name, backend.max_workers)
            record = self._recorders.setdefault(backend.name, made)
        return record  # type: ignore[no-any-return]

    # -- learning: figures in, calls parked, sent and moved

    def learn_from(self, fn: Any, result: ChunkResult, send_s: float, backend: str) -> None:
        """Record a completed submit's figures; on a verdict, move the calls still queued.

        Runs where the call's future completed (a fork pool's dispatcher
        thread): takes no lock but :attr:`lock`.
        """
        self.learner.record(fn, result, send_s, backend)
        if self.learner.verdict(fn) is not None:
            self.move_to_threads(fn)

    def entry(self, fn: Any, decision: Decision, workers: int) -> LearningCalls:
        """``fn``'s :class:`LearningCalls`, made on its first learning submit. Hold :attr:`lock`."""
        key = identity_key(fn)
        known = self._known(fn, key)
        if known is None:  # not kept: each call is learned from alone
            return LearningCalls(key, decision, send_ahead(workers))
        if known.learning is None:
            known.learning = LearningCalls(key, decision, send_ahead(workers))
        return known.learning

    def _known(self, fn: Any, key: Any) -> _Known | None:
        """``fn``'s record (made now if need be), or None when ``fn`` cannot be weakly referenced."""
        known = self.known.find(fn, key)
        if known is None:
            known = _Known()
            if not self.known.keep(fn, known, key):
                return None
        return known

    def park(
        self,
        fn: Any,
        decision: Decision,
        call: Call,
        backend: Backend,
        send: Callable[[], Future[ChunkResult]],
    ) -> CallFuture | None:
        """Keep a learning submit unsent while ``fn``'s first calls run; None: send it now.

        See :mod:`smartexec._submit_learning` (:func:`send_ahead`): once its
        window of calls is on the way, a callable's later submits wait here
        until a completion lets the next go, a verdict moves them to
        threads, or shutdown sends (or cancels) them.
        """
        with self.lock:
            if self.closed:
                return None
            entry = self.entry(fn, decision, backend.max_workers)
            if not entry.parks():
                return None
            future = CallFuture(
                None, fn, call, backend.name, retries=self._max_retries, parked=True
            )
            entry.parked.append((future, send))
        return future

    def note_sent(self, fn: Any, decision: Decision, future: CallFuture, workers: int) -> None:
        """Keep a sent learning submit's future: a verdict may move it to threads while it queues."""
        with self.lock:
            if self.closed:
                return
            entry = self.entry(fn, decision, workers)
            calls = entry.sent
            while calls and calls[0].done():
                calls.popleft()  # in order, mostly: what is left waits in a queue
            calls.append(future)
            entry.in_flight += 1
        future.add_done_callback(functools.partial(_call_done, weakref.ref(self), entry))

    def call_done(self, entry: LearningCalls, done: Future[Any]) -> None:
        """A learning submit of ``entry``'s callable completed: send the calls it lets go.

        While fewer than ``MIN_CALLS`` have completed, one waiting call per
        completion keeps the window full; after that (no verdict: the
        callable stays on processes) every waiting call is sent. A verdict's
        move took them first (:meth:`learn_from` runs before the result is
        set). Runs where the future completed (a completed call's: the
        dispatcher thread); sends outside :attr:`lock`, counted as a move
        under way (``shutdown`` waits for it). A call cancelled or failed may
        have completed under its future's lock (inside ``cancel()``, whose
        done-callbacks may cancel others): a new thread sends then, so that
        no thread holds one future's lock while it waits for another's.
        """
        with self.lock:
            known = self.known.get(entry.key)
            if self.closed or known is None or known.learning is not entry:
                return  # moved to threads by a verdict, or shut down
            entry.in_flight -= 1
            entry.completed += 1
            if entry.completed >= MIN_CALLS or interpreter_exiting():
                n = len(entry.parked)
            else:
                n = min(len(entry.parked), entry.window - entry.in_flight)
            if n <= 0:
                return
            going = [entry.parked.popleft() for _ in range(n)]
            self.idle.notify_all()  # a shutdown may wait for the parked calls to go
            if interpreter_exiting():
                # A forgotten executor at exit: nothing can receive a result
                # any more and no worker may start (the fork pools' exit hook
                # cancels their queued chunks): cancelled, as those.
                stranded = going
            elif n > 1 or done.cancelled() or done.exception() is not None:
                # A thread of its own for many (the dispatcher completing
                # this call would hand no chunk to an idle worker while it
                # pickles them: 2,400 calls took it 0.9 s).
                helper = own_thread(
                    functools.partial(self.send_all_parked, entry, going), "smartexec-release"
                )
                helper.start()
                self.movers.append(helper.ident)  # type: ignore[arg-type]
                return
            else:
                self.movers.append(threading.get_ident())
                stranded = []
        if stranded:
            for future, _send_it in stranded:
                future.cancel()
            return
        self.send_all_parked(entry, going)

    def send_all_parked(self, entry: LearningCalls, going: list[Parked]) -> None:
        """Send parked calls in order; this thread is counted in :attr:`movers` (taken out here).

        Once a shutdown that cancels (``cancel_futures``, ``terminate()``,
        ``kill_workers()``) has begun, the rest are cancelled instead.
        """
        try:
            for future, send in going:
                if (self.closed and self.closing_cancels) or interpreter_exiting():
                    future.cancel()
                else:
                    self.send_parked(entry, future, send)
        finally:
            with self.lock:
                self.movers.remove(threading.get_ident())
                self.idle.notify_all()

    def send_parked(
        self,
        entry: LearningCalls | None,
        future: CallFuture,
        send: Callable[[], Future[ChunkResult]],
    ) -> None:
        """Send a parked call on its process route (learned from, when ``entry`` is given)."""
        origin = future._origin
        if origin is None:
            return  # cancelled while it waited
        fn, _, backend = origin
        learn = None
        if entry is not None:
            with self.lock:
                if self.closed:
                    entry = None
                else:
                    entry.in_flight += 1
                    entry.sent.append(future)
            if entry is not None:
                learn = functools.partial(self.learn_from, fn, backend=backend)
        if not future.release(send, learn):
            if entry is not None:
                with self.lock:
                    entry.in_flight -= 1  # cancelled meanwhile: it never went
            return
        if entry is not None:
            future.add_done_callback(functools.partial(_call_done, weakref.ref(self), entry))

    def move_to_threads(self, fn: Any) -> int:
        """Send ``fn``'s submits that no worker has taken yet to threads, as its verdict says.

        A burst of submits (``asyncio.gather`` of ``run_in_executor`` calls)
        all queue on the process route before its first call completes; the
        verdict given by the first completed ones moves the rest, which
        would otherwise wait their turn on a few processes (40 sleeps of
        50 ms: 1.04 s on 2 fork workers, 0.35 s on threads). Nothing moves
        once shutdown has begun. Returns how many calls moved.
        """
        key = identity_key(fn)
        with self.lock:
            if self.closed or interpreter_exiting():  # at exit: no new thread
                return 0
            known = self.known.get(key)
            entry = None if known is None else known.learning
            thread = self._backends.get("thread")
            if entry is None or thread is None or not known.handle.matches(fn):  # type: ignore[union-attr]
                return 0
            if self.decision(fn, entry.decision)[0].backend != "thread":
                return 0
            known.learning = None  # type: ignore[union-attr]
            calls = list(entry.sent)
            parked = list(entry.parked)
            entry.parked.clear()
            self.idle.notify_all()  # a shutdown may wait for the parked calls to go
            # Counted as under way: shutdown() waits for it before the backends
            # stop, and no future's lock is taken under the lock (a user's
            # cancel() holds its future's lock while its done-callbacks run,
            # and one may submit, which takes the lock).
            self.movers.append(threading.get_ident())
        try:
            return self._move(fn, key, thread, calls, parked)
        finally:
            with self.lock:
                self.movers.remove(threading.get_ident())
                self.idle.notify_all()

    def _move(
        self, fn: Any, key: Any, thread: Backend, calls: list[CallFuture], parked: list[Parked]
    ) -> int:
        """Move ``parked`` (never pickled) and the ``calls`` no worker took to ``thread``."""
        moved = 0
        if parked:
            # Straight onto the pool's threads, as submit's thread route runs a call.
            submit_call = functools.partial(
                thread.submit_call,
                on_done=self.call_recorder(thread),
            )
            for future, _send_it in parked:
                moved += future.release_to_threads(submit_call)
        stats = self._stats

        def send(call: Call, context: contextvars.Context) -> Future[ChunkResult]:
            # In a copy of the submitter's context, not this thread's.
            return send_chunk(thread, on_threads(fn, context), [call], None, None, stats)

        for future in calls:
            origin = future._origin
            if (
                origin is not None
                and identity_key(origin[0]) == key  # a bound method is new at each access
                and future.move(send, thread.name)
            ):
                moved += 1
        if moved:
            self._started.add(thread.name)
        return moved

    # -- fast submits: threads with no routing

    def remember_fast(
        self, fn: Any, run_call: Callable[..., Any], record: Any, learned: bool
    ) -> None:
        """Let ``fn``'s next submits skip the routing: it runs on threads for good, or until a map says otherwise.

        Either its submits' figures moved it to threads (until its calls
        there contradict a *cheap* verdict: :meth:`upheld`), or its decision
        is the thread route (the policy's, or an earlier run's stored
        profile); a map that then moves it elsewhere drops the shortcut
        (:meth:`follow_map`). Only while no initializer is set (a failed one
        breaks the executor, which submit must then report as the stdlib
        does) and no ``task_timeout`` (threads then run chunks with a
        deadline). Hold the executor's lock.
        """
        if not self._plain or self._router.options.stoppable:
            return
        key = identity_key(fn)
        verdict = self.learner.verdict(fn, key) if learned else None
        if learned and verdict is None:
            return
        known = self._known(fn, key)
        if known is None:  # never keep the user's object alive
            return
        old = known.fast
        if old is not None and old[1] is verdict:
            return  # another thread's submit remembered it
        timed: Sized = ()
        if verdict is not None and verdict.kind == "cheap":
            # Its calls on threads are timed apart, for the re-check. One log
            # per callable (the thread backend keeps a call loop per log).
            calls = known.timed
            if calls is None:
                calls = known.timed = ThreadCalls(record)
            calls.fold()
            calls.recent.clear()  # an earlier verdict's calls
            record, timed = calls, calls.calls
        known.fast = (known.handle, verdict, run_call, record, timed)

    def follow_map(self, key: Any, backend: str) -> None:
        """The callable ``key``'s last map ended on ``backend``: its submits follow it there.

        Drops the shortcut a decision (not a verdict) gave, unless the map
        stayed on threads. Hold the executor's lock.
        """
        known = self.known.get(key)
        if known is not None and known.fast is not None:
            if known.fast[1] is None and backend != "thread":
                known.fast = None

    def upheld(self, fn: Any, fast: tuple[Any, ...]) -> bool:
        """Re-check ``fn``'s cheap verdict on its calls timed on threads; False: it gave way.

        Called by submit's fast path once :data:`RECHECK_CALLS` calls
        completed since the last re-check (no lock held). When
        :func:`~smartexec._submit_learning.contradiction` says the calls now
        cost more than a process round trip, the verdict and its figures are
        forgotten and the shortcut dropped: this submit and the next take the
        policy's process route and are learned from afresh.
        """
        learned, calls = fast[1], fast[3]
        median = calls.recheck(learned)
        if median is None:
            return True
        checked = len(calls.recent)
        key = identity_key(fn)
        with self._executor_lock:
            known = self.known.get(key)
            if known is not None and known.fast is fast:
                known.fast = None
            if self.learner.forget(fn, learned):
                with self.lock:
                    cached = None if known is None else known.moved
                    if known is not None:
                        known.moved = None
                    if cached is not None:
                        policy = cached[1]
                        why = learned.gave_way(median, checked)
                        self._log.append(
                            dataclasses.replace(policy, reasons=(why, *policy.reasons))
                        )
                # Where its submits ended, for later executors (its verdict saved "thread").
                _profiles.save(
                    fn,
                    _profiles.StoredProfile(
                        learned.backend,
                        median,
                        None,
                        learned.send_s,
                        checked,
                        time.time(),
                        source="submits",
                    ),
                )
        return False

    def fold_thread_calls(self) -> None:
        """Count the calls timed apart for re-checks in the stats (see ``stats()``)."""
        for known in list(self.known.values()):
            if known.timed is not None:
                known.timed.fold()

    # -- shutdown

    def let_parked_go(self) -> None:
        """Wait (shutdown with ``wait``) until no submit waits unsent for its callable's figures.

        Submits made in a ``with`` block and read after it: their first
        calls complete meanwhile, and their figures route the waiting ones
        (to threads, when they say so) as they would have before the
        shutdown; sent on their process route at once instead, 100 sleeps
        of 20 ms took 1.07 s against a ``ThreadPoolExecutor``'s 0.34 s. Ends
        as soon as no parked call is left, or none can go (no call of its
        callable on its way: then shutdown sends them). Not from a thread of
        smartexec's (a done-callback run by a backend's thread, which may be
        the one that completes calls), and never longer than
        :data:`PARKED_WAIT_S`.
        """
        if interpreter_exiting() or is_ours():
            return

        def settled() -> bool:
            return not self.movers and all(
                not entry.parked or entry.in_flight <= 0 for entry in self._learning()
            )

        with self.lock:
            self.idle.wait_for(settled, timeout=PARKED_WAIT_S)

    def _learning(self) -> list[LearningCalls]:
        """Every callable's calls being learned (hold :attr:`lock`)."""
        return [k.learning for k in list(self.known.values()) if k.learning is not None]

    def close(self, cancel: bool) -> list[Parked]:
        """Stop moving and parking submits (shutdown); return the parked ones, oldest first.

        ``cancel``: the shutdown cancels pending work (moves under way then
        cancel what they have not sent). A thread that takes parked calls is
        counted in :attr:`closers` until :meth:`finish` has sent them:
        another shutdown waits for it before the backends stop.
        """
        with self.lock:
            self.closed = True
            self.closing_cancels = self.closing_cancels or cancel
            learning = self._learning()
            parked = [p for entry in learning for p in entry.parked]
            for entry in learning:
                entry.parked.clear()
            for known in self.known.values():
                known.learning = None
            if parked:
                self.closers.append(threading.get_ident())
        return parked

    def finish(self, parked: list[Parked], cancel: bool) -> None:
        """Wait for moves under way, then send the parked calls on their route (or cancel them).

        A move under way finishes first (its calls are then on threads,
        whose shutdown waits for them), and another shutdown's parked calls
        are sent first. Pending work runs, as in the stdlib, unless
        ``cancel``. Not from a move's own thread (a moved call's
        done-callback that shuts down): it cannot wait for itself.
        """
        me = threading.get_ident()
        with self.lock:
            if me not in self.movers:
                self.idle.wait_for(
                    lambda: not self.movers and all(c == me for c in self.closers),
                    timeout=30.0,
                )
        if not parked:
            return
        try:
            for future, send in parked:
                if cancel:
                    future.cancel()
                else:
                    self.send_parked(None, future, send)
        finally:
            with self.lock:
                self.closers.remove(me)
                self.idle.notify_all()


class _Deferred(Future):  # type: ignore[type-arg]
    """The future of a call a synchronous backend runs in the submitting thread, not run yet.

    ``SmartExecutor.submit`` routes a call under its lock; a synchronous
    backend (``backend="inline"``) would run the user's function right
    there, and another thread's submit (one the function may wait for)
    would wait for the lock. The call runs once the lock is released
    (:meth:`run`), still in the submitting thread, before ``submit`` returns.
    """

    def __init__(self, send: Callable[[], Future[ChunkResult]]) -> None:
        super().__init__()
        self._send: Callable[[], Future[ChunkResult]] | None = send

    def run(self) -> None:
        """Run the call now (once), taking its outcome; for ``SmartExecutor.submit``."""
        send, self._send = self._send, None
        if send is None or not self.set_running_or_notify_cancel():
            return
        try:
            done = send()
            error = done.exception()
        except BaseException as exc:  # noqa: BLE001 - the call's own outcome, kept
            self.set_exception(exc)
            return
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(done.result())


class Submitted(NamedTuple):
    """What :meth:`SubmitRoute.submit` hands back to ``SmartExecutor.submit``.

    Attributes:
        future: the call's future, returned to the user.
        parked: it waits unsent while its callable's first calls run.
        run_here: a synchronous backend's call, to run (``run_here.run()``)
            once the executor's lock is released; None for the others.
    """

    future: Future[Any]
    parked: bool = False
    run_here: _Deferred | None = None
