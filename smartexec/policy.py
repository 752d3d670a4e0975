"""The routing policy: which backend runs a callable, and why.

:func:`decide` is a pure function of a :class:`~smartexec.inspection.CallableProfile`,
a :class:`~smartexec._system.Platform` and the user's :class:`Options`. It starts
nothing and reads nothing from the host, so the whole routing table is tested
by feeding it values (``tests/test_policy.py``).

The table is :data:`TABLE`: one named :class:`Rule` per row, first match
wins, from ``backend=`` given, through the callables that act on an object
of this process (row 1b), big or unpicklable state (fork by copy-on-write,
or sent once to loky), the thread rows (a GIL-releasing callable, a
free-threaded build, a measurement, the code hint), to the process rows
(by value or by reference, fork where it exists, else loky). Row 0 is
:func:`permits`: the thread rows apply only where the callable's effects
allow threads (:mod:`smartexec.effects`). docs/routing.md shows the table
with every row's reason; tests/test_policy.py checks it against
:data:`TABLE`, and every :class:`Decision` names its row (``rule``).

"Sent once per worker" (``share=True`` on loky): the state is pickled once,
its numpy buffers into shared memory, and each worker unpickles it at its
first chunk and keeps it (:mod:`smartexec.transport`). The same happens when
``backend="loky"`` is forced for a callable with big state.

The "straight-line code" row reads the function's bytecode (:mod:`smartexec._code_hint`):
``def f(i): time.sleep(0.01)`` or ``def f(a): return np.einsum("i,i->", a, a)``
spend their time in a call that releases the GIL. It is a first guess, not a
verdict: the map's first chunks on threads measure the GIL, the rest moves to
processes if they find it held, and that measurement routes the callable's
next maps (submits stay on threads). Code that calls what the bytecode does
not show gets no hint (:mod:`smartexec._code_hint` lists what); code whose
effects forbid threads never takes a thread row (row 0). ``operator.add``
and its kin (not ``pow``, ``lshift``) take this row too:
pickling their arguments to a process costs about what the one operation
does (:func:`smartexec._code_hint.operator_hint`).

The last four rows hold for a callable that holds the GIL, or that has not
been measured yet. Such a callable is not measured in the calling process (a
crash there would kill the caller): its first ``map`` starts on the process
backend at once, and the workers measure its first chunks (time, CPU, the
GIL, :func:`smartexec._remote.run_chunk`); the map then moves to threads if
they are predicted clearly faster (:mod:`smartexec._rerouting`), and its
next maps start there. ``SmartExecutor(allow_inline=True)`` measures in the
calling thread instead (decisions with ``measure=True``). The user's
``prefer=`` and ``backend=`` always win over a measurement.

While threads of the user's run (``other_threads``), every row that says
fork says loky instead, unless the state must be shared by copy-on-write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ._config import BIG_STATE_BYTES, PREFER_VALUES, Options
from ._decision import Decision, _describe
from ._reasons import (
    CODE_HINT_THREADS,
    GIL_FIRST_MAP_MEASURES,
    GIL_NOT_MEASURED,
    GIL_UNKNOWN,
    GIL_UNKNOWN_RULE,
    INITIALIZER_BY_VALUE,
    MEASURED_RULE,
    REACHES_PROCESSES_RULE,
    Reason,
    rule_of,
)
from ._system import Platform
from .gil import MANY_CORES, GilProfile
from .inspection import CallableProfile, format_bytes

__all__ = [
    "Options",
    "Decision",
    "Rule",
    "TABLE",
    "Override",
    "OVERRIDES",
    "Reason",
    "rule_of",
    "decide",
    "alternatives",
    "ELSEWHERE_THREADS",
    "permits",
    "stoppable",
    "BIG_STATE_BYTES",
    "PREFER_VALUES",
]

_SENT_ONCE = (
    "is sent once to each worker and cached there, its numpy buffers through "
    "shared memory, rather than pickled with every chunk"
)


def _no_fork(platform: Platform, options: Options) -> str:
    """Why the fork route is closed: the user's ``mp_context``, or the platform."""
    if options.start_method not in (None, "fork"):
        return f"mp_context uses start method {options.start_method!r}, not fork"
    return f"start method 'fork' is not available here ({', '.join(platform.start_methods)})"


def decide(
    profile: CallableProfile,
    platform: Platform,
    options: Options,
    measured: GilProfile | None = None,
    other_threads: int = 0,
) -> Decision:
    """Choose the backend for ``profile`` on ``platform`` under ``options``.

    Pure: it reads only its arguments. It walks :data:`TABLE`, then applies
    :data:`OVERRIDES` in order, each a named rule:

    * inside a smartexec worker process (``platform.in_worker``), work the
      table sends to processes runs inline: the outer executor's workers
      already use the cores;
    * while ``other_threads`` threads that are not smartexec's run, work the
      table sends to fork goes to loky, unless it must be shared by
      copy-on-write: forking copies every lock those threads hold at that
      instant (a deadlock risk in the workers; Python 3.12+ warns), and loky
      starts workers without forking this process;
    * with ``options.stoppable`` (a ``task_timeout``), work bound for loky
      or threads goes to fork, whose workers can be stopped one at a time
      (:func:`stoppable`);
    * with ``options.start_method`` other than ``"fork"`` (the user's
      ``mp_context``), the table is walked as on a platform without fork:
      process work goes to loky, and the reasons say so;
    * with ``options.retires_workers`` (``max_tasks_per_child``), work bound
      for loky goes to fork, whose workers are retired after that many calls;
    * with ``options.initializer``, process work whose code travels by value
      goes to fork, shared (inherited, not pickled): a pickled copy of a
      function reads its own copy of its module's globals, not the worker's
      that the initializer set.

    Args:
        profile: what the callable is (see :func:`smartexec.inspection.inspect_callable`).
        platform: what the host allows (see :func:`smartexec._system.current_platform`).
        options: what the user asked for.
        measured: how the callable's first items used the CPU and the GIL
            (see :mod:`smartexec.gil`), or None before any measurement.
        other_threads: threads running in this process besides the calling
            thread and smartexec's own (int >= 0).

    Returns:
        A :class:`Decision` whose ``reasons`` say why, in order.
    """
    return _decide_all(profile, platform, options, measured, other_threads)


def _decide_all(
    profile: CallableProfile,
    platform: Platform,
    options: Options,
    measured: GilProfile | None,
    other_threads: int,
    off_threads: bool = False,
) -> Decision:
    """The table, then the overrides: :func:`decide`'s body (``off_threads``: see :func:`_decide`)."""
    fork_off = options.start_method not in (None, "fork") and platform.has_fork
    if fork_off:
        with_fork = _decide(profile, platform, options, measured, off_threads)
        platform = replace(
            platform, start_methods=tuple(m for m in platform.start_methods if m != "fork")
        )
    decision = _decide(profile, platform, options, measured, off_threads)
    if fork_off and with_fork.backend == "fork" and decision.backend != "fork":
        decision = _add(
            decision,
            "mp-context",
            f"mp_context uses start method {options.start_method!r}: process work goes "
            f"to loky, whose workers start as fresh interpreters, not to fork workers",
        )
    situation = _Situation(profile, platform, options, other_threads)
    for override in OVERRIDES:
        decision = override.apply(situation, decision)
    return decision


@dataclass(frozen=True)
class _Situation:
    """What the overrides read besides the decision: the callable, the host, the user, threads."""

    profile: CallableProfile
    platform: Platform
    options: Options
    other_threads: int

    @property
    def free_to_move(self) -> bool:
        """The user fixed no backend: an override may move the work."""
        return self.options.backend is None


@dataclass(frozen=True)
class Override:
    """A rule applied after the table, in :data:`OVERRIDES` order: it may change the decision."""

    id: str
    apply: Callable[[_Situation, Decision], Decision] = field(repr=False)


def _add(decision: Decision, rule: str, text: str, **changes: Any) -> Decision:
    """``decision`` with ``changes`` and one more reason, ``Reason(rule, text)``."""
    return replace(decision, reasons=(*decision.reasons, Reason(rule, text)), **changes)


def _other_threads_override(s: _Situation, decision: Decision) -> Decision:
    if not s.other_threads or not s.free_to_move or decision.backend != "fork":
        return decision
    if s.platform.in_worker:
        return decision
    n = s.other_threads
    threads = f"{n} other thread{'s are' if n != 1 else ' is'}"
    if decision.share:
        return _add(
            decision,
            "other-threads",
            f"{threads} running in this process; sharing the object needs fork all the "
            f"same: each pool forks one single-threaded zygote, with smartexec's own "
            f"threads paused, and the zygote forks the workers",
        )
    # The fork row's "how it reaches the workers" no longer holds: replaced.
    kept = tuple(r for r in decision.reasons if rule_of(r) != REACHES_PROCESSES_RULE)
    how = (
        "it pickles by reference"
        if decision.profile is None or decision.profile.by_reference
        else ("cloudpickle sends it by value")
    )
    return replace(
        decision,
        backend="loky",
        reasons=(
            *kept,
            Reason(
                "other-threads",
                f"{threads} running in this process: forking it would copy any lock they hold "
                f"(a deadlock risk; Python 3.12+ warns), so loky starts the workers instead, "
                f"without forking this process ({how}); its workers import your modules afresh "
                f"and read a module-level value as the module's own code sets it, not as you "
                f"changed it since",
            ),
        ),
    )


def _nested_worker(s: _Situation, decision: Decision) -> Decision:
    if not (s.platform.in_worker and s.free_to_move and decision.backend in ("fork", "loky")):
        return decision
    return _add(
        decision,
        "nested-worker",
        "this process is itself a smartexec worker: the outer executor's workers already "
        "use the cores, so this nested work runs inline",
        backend="inline",
        share=False,
        measure=False,
    )


def _initializer_on_processes(s: _Situation, decision: Decision) -> Decision:
    options = s.options
    if not (
        options.initializer
        and s.free_to_move
        and options.prefer != "threads"
        and decision.backend == "thread"
        and s.profile.in_process is None  # row 1b: the thread backend runs the initializer too
    ):
        return decision
    fork_ok = (
        s.platform.has_fork and options.start_method in (None, "fork") and s.other_threads == 0
    )
    target = "fork" if fork_ok else "loky"
    return _add(
        decision,
        "initializer-processes",
        f"an initializer is set: as with ProcessPoolExecutor, it prepares worker processes, "
        f"so this call runs on {target} workers, not on threads of this process (where the "
        f'initializer would run too); prefer="threads" keeps it on threads',
        backend=target,
        share=False,
        measure=False,
    )


def _retires_workers(s: _Situation, decision: Decision) -> Decision:
    if not (
        s.options.retires_workers
        and s.free_to_move
        and decision.backend == "loky"
        and s.platform.has_fork
    ):
        return decision
    return _add(
        decision,
        "max-tasks-per-child",
        "max_tasks_per_child is set: fork workers (which send code by value with "
        "cloudpickle too) are retired after that many calls; loky's cannot be",
        backend="fork",
    )


def _initializer_shares(s: _Situation, decision: Decision) -> Decision:
    by_value = not decision.share and not s.profile.by_reference
    if not (s.options.initializer and by_value and decision.backend in ("fork", "loky")):
        return decision
    if s.options.backend in (None, "fork") and s.platform.has_fork:
        return _add(
            decision,
            "initializer-shares",
            "an initializer is set and this callable's code travels by value: a pickled "
            "copy would read its own copy of its module's globals, never what the "
            "initializer set in the worker; fork workers inherit the callable instead (by "
            "copy-on-write), so it reads the worker's globals",
            backend="fork",
            share=True,
            measure=False,
        )
    if decision.backend == "loky":
        return replace(decision, reasons=(*decision.reasons, INITIALIZER_BY_VALUE))
    return decision


def _task_timeout(s: _Situation, decision: Decision) -> Decision:
    if not s.options.stoppable:
        return decision
    return stoppable(decision, s.platform, s.options, s.other_threads)


#: The rules applied after :data:`TABLE`, in order (see :func:`decide`).
OVERRIDES: tuple[Override, ...] = (
    Override("other-threads", _other_threads_override),
    Override("nested-worker", _nested_worker),
    Override("initializer-processes", _initializer_on_processes),
    Override("max-tasks-per-child", _retires_workers),
    Override("initializer-shares", _initializer_shares),
    Override("task-timeout", _task_timeout),
)


def stoppable(
    decision: Decision, platform: Platform, options: Options, other_threads: int = 0
) -> Decision:
    """``decision`` moved to a backend that honours a ``task_timeout``, safely.

    Pure. Work bound for loky (whose workers cannot be stopped one by one)
    or for threads (a thread cannot be stopped at all: a stuck call would
    run on, and shutdown would wait for it) goes to fork, which also sends
    code by value with cloudpickle. Unchanged when ``options.backend`` was
    given, when threads were asked for (``prefer="threads"``), for a
    callable that must run in this process (``profile.in_process``: its
    threads fail the future at the deadline, the call runs on), where fork
    is missing, or where the user's ``mp_context`` chose another start method.

    While ``other_threads`` of the user's run, fork is not safe (the same
    rule as :func:`decide`: a forked worker inherits every lock they hold,
    held): safety wins over stopping the task. Work bound for loky goes to
    threads, whose backend fails the future at the deadline but cannot stop
    the call; no backend here can both stop one task and never fork this
    process. Work shared by copy-on-write stays on fork (it forks a
    single-threaded zygote, see :func:`decide`).

    Args:
        decision: the decision without a ``task_timeout``.
        platform: what the host allows.
        options: what the user asked for.
        other_threads: threads running in this process besides the calling
            thread and smartexec's own (int >= 0).

    Returns:
        A :class:`Decision`: ``decision`` itself, or a copy on ``"fork"`` or
        ``"thread"`` with one more reason.
    """
    if options.backend is not None or options.start_method not in (None, "fork"):
        return decision
    if other_threads > 0 and not decision.share:
        if decision.backend == "loky" and permits(decision.profile, "thread", options):
            why = (
                "task_timeout is set, but fork (which could stop one task) is not safe "
                "while other threads run: threads fail the future at the deadline "
                "instead; they cannot stop the call, which runs on in the background"
            )
            return replace(decision, backend="thread", reasons=(*decision.reasons, why))
        return decision
    if not platform.has_fork:
        return decision
    if decision.backend == "loky":
        why = (
            "task_timeout is set: fork workers (which send code by value with "
            "cloudpickle too) can be stopped one at a time; loky's cannot"
        )
        return replace(decision, backend="fork", reasons=(*decision.reasons, why))
    in_process = decision.profile is not None and decision.profile.in_process is not None
    if decision.backend == "thread" and options.prefer != "threads" and not in_process:
        why = (
            "task_timeout is set: a thread cannot be stopped (a stuck call would run on, "
            "and shutdown would wait for it); a fork worker can be killed and replaced"
        )
        return replace(decision, backend="fork", share=False, reasons=(*decision.reasons, why))
    return decision


#: The reason an alternative process route gives for processes: it was asked
#: for where the callable runs off threads (see :func:`alternatives`).
ELSEWHERE_THREADS = Reason(
    "elsewhere",
    "off threads, where its measured times (not its GIL use) may send it",
)


def alternatives(
    profile: CallableProfile,
    platform: Platform,
    options: Options,
    other_threads: int = 0,
) -> dict[str, Decision]:
    """Where else the callable could run: ``{route: Decision}``. Pure.

    What a measurement may choose from when it moves a map, or starts one
    where the last ended (it never fakes a GIL measurement to ask the
    table): ``"thread"`` and ``"inline"`` where :func:`permits` allows them,
    and the process route (``"fork"`` or ``"loky"``) that :func:`decide`
    gives with the rows that send work to threads for its GIL use or a code
    hint passed over, its reasons saying so (:data:`ELSEWHERE_THREADS`). A
    process route that must share a live object by copy-on-write
    (``share``) is left out: it is the table's first answer, never an
    alternative. ``prefer="threads"`` leaves no process route, and
    ``prefer="processes"`` no thread one.

    Args:
        profile: what the callable is.
        platform: what the host allows.
        options: what the user asked for.
        other_threads: as for :func:`decide`.

    Returns:
        The routes, each with the decision a move there carries.
    """
    found: dict[str, Decision] = {}
    what = _describe(profile)
    if options.prefer != "processes":
        for route in ("thread", "inline"):
            if permits(profile, route, options):
                found[route] = Decision("thread", (what,), profile=profile)
    if options.prefer != "threads":
        target = _decide_all(profile, platform, options, None, other_threads, off_threads=True)
        if target.backend in ("fork", "loky") and not target.share:
            found[target.backend] = target
    return found


def permits(profile: CallableProfile | None, route: str, options: Options) -> bool:
    """Whether ``route`` computes for ``profile``'s callable what worker processes would.

    Pure. Threads (``"thread"``) and a loop in the calling thread
    (``"inline"``) share this process; they are permitted unless the
    callable's effects say its calls would see each other's writes or
    change the caller (:meth:`smartexec.effects.Effects.allows`). The user
    widens this: ``backend=`` (any route), ``prefer="threads"``, or
    :func:`smartexec.thread_safe`. A callable that acts on an object of this
    process (``profile.in_process``, row 1b) is permitted both: a worker
    would act on a copy. Every other route is always permitted. Routing by
    measurement, an earlier run's profile or a submit verdict picks the
    fastest route among the permitted ones, never outside them.

    Args:
        profile: what the callable is, or None (nothing known: permitted).
        route: a backend name, or ``"inline"``.
        options: what the user asked for.

    Returns:
        True or False.
    """
    if route not in ("thread", "inline") or options.backend is not None or profile is None:
        return True
    if profile.in_process is not None or options.prefer == "threads":
        return True
    return profile.effects.allows(route)


def _trusting(profile: CallableProfile, *reasons: str) -> tuple[str, ...]:
    """``reasons`` for a threads route the policy chose, naming the native code it trusted."""
    note = profile.effects.trust_note()
    return reasons if note is None else (*reasons, note)


@dataclass(frozen=True)
class _Facts:
    """What every row of the table reads, worked out once per decision."""

    profile: CallableProfile
    platform: Platform
    options: Options
    measured: GilProfile | None
    what: str
    threads_ok: bool
    stateful: bool
    big: bool
    holder: str
    off_threads: bool = False

    @classmethod
    def of(
        cls,
        profile: CallableProfile,
        platform: Platform,
        options: Options,
        measured: GilProfile | None,
        off_threads: bool = False,
    ) -> _Facts:
        state = profile.state
        return cls(
            profile,
            platform,
            options,
            measured,
            _describe(profile),
            permits(profile, "thread", options) and not off_threads,
            state.nbytes > 0 or state.error is not None,
            state.capped or state.nbytes > options.big_state_bytes,
            profile.state_holder or "its state",
            off_threads,
        )

    @property
    def measurable(self) -> bool:
        """Whether a measurement may choose the route (the user gave no ``prefer=``)."""
        return self.options.prefer is None


@dataclass(frozen=True)
class Rule:
    """One row of the routing table: its id, its row in docs/routing.md, and what it does.

    ``apply`` returns the :class:`Decision` when the row matches, else None;
    the first row that matches wins (:data:`TABLE`).
    """

    id: str
    row: str
    backend: str
    apply: Callable[[_Facts], Decision | None] = field(repr=False)


def _backend_given(f: _Facts) -> Decision | None:
    backend, state = f.options.backend, f.profile.state
    if backend is None:
        return None
    reasons = [f"backend={backend!r} was given", f.what]
    share = False
    if backend == "fork" and f.stateful and (f.big or state.error is not None):
        share = True
        reasons.append(f"{f.holder} ({state}) reaches fork workers by copy-on-write")
    elif backend == "loky" and f.stateful and f.big and state.error is None:
        share = True
        reasons.append(f"{f.holder} ({state}) {_SENT_ONCE}")
    return Decision(backend, tuple(reasons), share=share, profile=f.profile)


def _in_process(f: _Facts) -> Decision | None:
    # Before every other row: prefer="processes" is a hint for speed, and
    # no speed is worth a result lost or a wait never woken.
    if f.profile.in_process is None:
        return None
    why = "threads run it in this process, on the object itself"
    return Decision("thread", (f.what, f.profile.in_process, why), profile=f.profile)


_AS_IT_WAS = (
    "workers see the object as it was when map() or submit() was called "
    "(each call forks fresh workers: the state cannot be fingerprinted)"
)


def _unpicklable_state(f: _Facts) -> Decision | None:
    # Without fork, fall through: the process backend's pickling error names the part.
    error = f.profile.state.error
    if error is None or not f.platform.has_fork:
        return None
    reasons = (
        f.what,
        f"{f.holder} cannot be pickled ({error})",
        "fork workers reach it by copy-on-write through a module-level "
        "trampoline, so it is never pickled",
        _AS_IT_WAS,
    )
    return Decision("fork", reasons, share=True, profile=f.profile)


def _size(f: _Facts) -> str:
    return f"{f.holder} holds {f.profile.state} (over {format_bytes(f.options.big_state_bytes)})"


def _big_state_fork(f: _Facts) -> Decision | None:
    if not (f.big and f.stateful and f.platform.has_fork):
        return None
    reasons = (
        f.what,
        _size(f),
        "fork workers reach it by copy-on-write through a module-level trampoline; it is "
        "never pickled",
        "workers see the object as it was when map() or submit() was called (a map forks "
        "fresh workers; a submit reuses them while a digest of the state is unchanged)",
    )
    return Decision("fork", reasons, share=True, profile=f.profile)


def _big_state_sent_once(f: _Facts) -> Decision | None:
    if not (f.big and f.stateful) or f.platform.has_fork:
        return None
    options = f.options
    threads_fit = options.prefer == "threads" or (
        options.prefer != "processes"
        and f.threads_ok
        and (f.profile.gil_hint is not None or not f.platform.gil_enabled)
    )
    if threads_fit:  # the rows below send it to threads, with no copy at all
        return None
    reasons = (
        f.what,
        _size(f),
        f"{_no_fork(f.platform, options)}, so it {_SENT_ONCE}",
        "workers reuse the copy they received only while it is proven unchanged "
        "(compared with what was sent, at each map or submit); prefer='threads' shares "
        "it with no copy at all",
    )
    return Decision("loky", reasons, share=True, profile=f.profile)


def _prefer_threads(f: _Facts) -> Decision | None:
    if f.options.prefer != "threads":
        return None
    return Decision("thread", ("prefer='threads' was given", f.what), profile=f.profile)


def _threads_allowed(f: _Facts) -> bool:
    """The thread rows below apply: no ``prefer="processes"``, and the effects permit (row 0)."""
    return f.options.prefer != "processes" and f.threads_ok


def _releases_gil(f: _Facts) -> Decision | None:
    hint = f.profile.gil_hint
    if hint is None or not _threads_allowed(f):
        return None
    reasons = _trusting(f.profile, f.what, hint, "threads run it in parallel with no pickling")
    return Decision("thread", reasons, profile=f.profile)


def _free_threaded(f: _Facts) -> Decision | None:
    if f.platform.gil_enabled or not _threads_allowed(f):
        return None
    why = "the GIL is disabled (free-threaded build): threads run Python code in parallel"
    return Decision("thread", (f.what, why), profile=f.profile)


def _measured_threads(f: _Facts) -> Decision | None:
    measured, cpus = f.measured, f.platform.cpu_count
    if measured is None or not f.measurable or measured.kind == "holds" or not f.threads_ok:
        return None
    at_once = measured.at_once(cpus)
    if measured.cores < MANY_CORES:
        how = "threads run it in parallel with no pickling"
    elif at_once <= 1:
        how = (
            f"one item already keeps the {cpus} cores busy: a map runs it in the calling "
            f"thread, one item after another (more at once would oversubscribe the cores)"
        )
    else:
        how = f"one item keeps {measured.cores:.1f} cores busy: about {at_once} run at once"
    reasons = _trusting(f.profile, f.what, Reason(MEASURED_RULE, str(measured)), how)
    return Decision("thread", reasons, profile=f.profile, gil=measured)


def _code_hint(f: _Facts) -> Decision | None:
    hint = f.profile.code_hint
    if f.measured is not None or not f.measurable or hint is None or not f.threads_ok:
        return None
    reasons = _trusting(f.profile, f.what, hint, CODE_HINT_THREADS)
    return Decision("thread", reasons, profile=f.profile, measure=f.options.allow_inline)


def _gil_reason(f: _Facts) -> str:
    """Why the process rows run it: it may hold the GIL, was measured to, or row 0."""
    kept_off = f.profile.effects.reason("thread") if not f.threads_ok else None
    if f.options.prefer == "processes":
        return "prefer='processes' was given"
    if kept_off is not None and f.options.prefer is None:
        return kept_off
    if f.off_threads:
        return ELSEWHERE_THREADS
    if f.measured is not None:
        return Reason(MEASURED_RULE, str(f.measured))
    tail = GIL_FIRST_MAP_MEASURES if f.options.allow_inline else GIL_NOT_MEASURED
    return Reason(GIL_UNKNOWN_RULE, GIL_UNKNOWN + tail)


def _on_processes(f: _Facts, backend: str, how: str) -> Decision:
    """A process row's decision: why processes, and how the code reaches them."""
    measure = (
        f.measurable
        and f.measured is None
        and f.options.allow_inline
        and f.threads_ok
        and permits(f.profile, "inline", f.options)
    )
    return Decision(
        backend,
        (f.what, _gil_reason(f), Reason(REACHES_PROCESSES_RULE, how)),
        profile=f.profile,
        measure=measure,
        gil=f.measured if f.measurable else None,
    )


def _by_value_fork(f: _Facts) -> Decision | None:
    if f.profile.by_reference or not f.platform.has_fork:
        return None
    how = (
        "it cannot be pickled by reference; fork workers (started in milliseconds, the "
        "parent's modules already imported) receive it by value with cloudpickle, as "
        "loky's would, without loky's interpreter start-up"
    )
    return _on_processes(f, "fork", how)


def _by_value_loky(f: _Facts) -> Decision | None:
    if f.profile.by_reference:
        return None
    how = (
        f"it cannot be pickled by reference; {_no_fork(f.platform, f.options)}, so loky "
        f"sends it by value with cloudpickle to fresh interpreters"
    )
    return _on_processes(f, "loky", how)


def _importable_fork(f: _Facts) -> Decision | None:
    if not f.platform.has_fork:
        return None
    how = (
        "it pickles by reference; fork workers start in milliseconds with the parent's "
        "modules already imported"
    )
    return _on_processes(f, "fork", how)


def _importable_loky(f: _Facts) -> Decision | None:
    return _on_processes(f, "loky", f"it pickles by reference; {_no_fork(f.platform, f.options)}")


#: Said of a callable declared with :func:`smartexec.thread_safe`.
DECLARED_THREAD_SAFE = Reason(
    "declared-thread-safe",
    "declared with smartexec.thread_safe: threads and a loop here may run it whatever its "
    "code writes (its writes are not checked)",
)


#: The routing table, first match wins; ``row`` is the row's number in
#: docs/routing.md (row 0, the effects, is :func:`permits`, which the thread
#: rows consult). tests/test_policy.py checks the docs' table against it.
TABLE: tuple[Rule, ...] = (
    Rule("backend-given", "1", "the one given", _backend_given),
    Rule("in-process", "1b", "thread", _in_process),
    Rule("unpicklable-state", "2", "fork", _unpicklable_state),
    Rule("big-state-fork", "3", "fork", _big_state_fork),
    Rule("big-state-sent-once", "4", "loky", _big_state_sent_once),
    Rule("prefer-threads", "5", "thread", _prefer_threads),
    Rule("releases-gil", "6", "thread", _releases_gil),
    Rule("free-threaded", "7", "thread", _free_threaded),
    Rule("measured-threads", "8", "thread", _measured_threads),
    Rule("code-hint", "8b", "thread", _code_hint),
    Rule("by-value-fork", "9", "fork", _by_value_fork),
    Rule("by-value-loky", "9b", "loky", _by_value_loky),
    Rule("importable-fork", "10", "fork", _importable_fork),
    Rule("importable-loky", "11", "loky", _importable_loky),
)


def _decide(
    profile: CallableProfile,
    platform: Platform,
    options: Options,
    measured: GilProfile | None = None,
    off_threads: bool = False,
) -> Decision:
    """Walk :data:`TABLE` for :func:`decide` (same arguments): the first row that matches.

    With ``off_threads``, the rows that send work to threads for its GIL use
    (or a code hint) are passed over, as though threads were not permitted.
    """
    facts = _Facts.of(profile, platform, options, measured, off_threads)
    for rule in TABLE:
        decision = rule.apply(facts)
        if decision is not None:
            if profile.effects.declared and options.backend is None:
                decision = replace(decision, reasons=(*decision.reasons, DECLARED_THREAD_SAFE))
            return replace(decision, rule=rule.id)
    raise AssertionError("the last row always matches")  # pragma: no cover
