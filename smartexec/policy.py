"""The routing policy: which backend runs a callable, and why.

:func:`decide` is a pure function of a :class:`~smartexec.inspection.CallableProfile`,
a :class:`~smartexec._system.Platform` and the user's :class:`Options`. It starts
nothing and reads nothing from the host, so the whole routing table is tested
by feeding it values (``tests/test_policy.py``).

The table, first match wins:

============================================  ==========  ==========================================
the call                                      backend     why
============================================  ==========  ==========================================
(row 0) its effects forbid threads            --          the thread rows below do not apply
  (:func:`permits`, :mod:`smartexec.effects`)
``backend=`` given                            that one    the user decides
acts on an object of this process (a queue's  thread      a process would act on a copy
  ``get``, ``results.append``)
state that cannot be pickled, fork available  fork        shared by copy-on-write, never pickled
state over ``big_state_bytes``, fork avail.   fork        shared by copy-on-write, never pickled
state over ``big_state_bytes``, no fork       loky        sent once per worker, cached there
``prefer="threads"``                          thread      the user's hint
known GIL-releasing callable                  thread      no pickling, threads run in parallel
free-threaded build (GIL disabled)            thread      threads run Python code in parallel
measured: waits or computes without the GIL   thread      no pickling, threads run in parallel
unmeasured, straight-line code that calls    thread      measured on threads, moves if held
  a GIL-releasing function; an ``operator``
  function (one pass over its arguments)
lambda / closure / nested / ``__main__``      fork        cloudpickle sends the code by value
  ... where fork is not available             loky        the same, to fresh interpreters
importable function, fork available           fork        real parallelism, fast worker start
importable function, no fork                  loky        real parallelism
============================================  ==========  ==========================================

"Sent once per worker" (``share=True`` on loky): the state is pickled once,
its numpy buffers into shared memory, and each worker unpickles it at its
first chunk and keeps it (:mod:`smartexec.transport`). The same happens when
``backend="loky"`` is forced for a callable with big state.

The "straight-line code" row reads the function's bytecode (:mod:`smartexec._code_hint`):
``def f(i): time.sleep(0.01)`` or ``def f(a): return np.einsum("i,i->", a, a)``
spend their time in a call that releases the GIL. It is a first guess, not a
verdict: the map's first chunks on threads measure the GIL, the rest moves to
processes if they find it held, and that measurement routes the callable's
next maps (submits stay on threads). Code that could act on the whole process,
share global state, or call what the bytecode does not show gets no hint
(:mod:`smartexec._code_hint` lists what). ``operator.add`` and its kin (not ``pow``, ``lshift``) take this row too:
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

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import _display
from ._system import Platform
from .gil import MANY_CORES, GilProfile
from .inspection import CallableProfile, format_bytes

__all__ = [
    "Options",
    "Decision",
    "Reason",
    "rule_of",
    "decide",
    "permits",
    "stoppable",
    "BIG_STATE_BYTES",
    "PREFER_VALUES",
]

#: State bigger than this is shared with fork workers by copy-on-write rather
#: than pickled with every chunk. At 1 MiB, pickling and piping the state costs
#: about 1 ms per chunk, the same order as a process pool's own per-chunk cost
#: (docs/problems.md, problem 4).
BIG_STATE_BYTES = 1 << 20

PREFER_VALUES = ("threads", "processes")

_SENT_ONCE = (
    "is sent once to each worker and cached there, its numpy buffers through "
    "shared memory, rather than pickled with every chunk"
)


@dataclass(frozen=True)
class Options:
    """What the user asked for.

    Attributes:
        backend: a backend name that forces the route, or None to decide.
        prefer: ``"threads"``, ``"processes"`` or None; a hint, weaker than
            ``backend`` and than state that must not be pickled.
        big_state_bytes: state above this many bytes is shared by
            copy-on-write where fork is available.
        stoppable: the user set a ``task_timeout``: process work goes to a
            backend that can stop one task (fork) rather than loky.
        start_method: the start method of the user's ``mp_context``
            (``"fork"``, ``"spawn"``, ``"forkserver"``), or None. Any but
            ``"fork"`` turns the fork route off: process work goes to loky,
            whose workers start as fresh interpreters.
        retires_workers: the user set ``max_tasks_per_child``: process work
            goes to fork, whose workers can be retired one at a time, rather
            than loky.
        initializer: the user set an ``initializer``: a callable whose code
            travels by value (``__main__``, lambda, closure) is shared with
            fork workers rather than pickled, so that it reads the globals
            the initializer set in the worker (a pickled copy brings its own).
        allow_inline: the user let process-routed callables run items in
            the calling process (``SmartExecutor(allow_inline=True)``): only
            then is an unmeasured one's GIL use measured (``measure=True``).
    """

    backend: str | None = None
    prefer: Literal["threads", "processes"] | None = None
    big_state_bytes: int = BIG_STATE_BYTES
    stoppable: bool = False
    start_method: str | None = None
    retires_workers: bool = False
    initializer: bool = False
    allow_inline: bool = False


@dataclass(frozen=True, repr=False)
class Decision:
    """Where a callable runs, and why.

    Attributes:
        backend: the backend name, e.g. ``"fork"``.
        reasons: short human sentences, most important first.
        share: True when the callable reaches fork workers through the
            trampoline table (copy-on-write) instead of being pickled.
        chunksize: for a map's entry in ``SmartExecutor.decisions()``, the
            size of its first chunk (later chunks follow the measurements);
            None for the policy's own decision and for inline runs.
        profile: the profile the decision was made from.
        measure: True when the callable's first ``map`` measures its GIL use
            in the calling thread, which could change the route (it was
            routed to processes because it may hold the GIL, it has not been
            measured, and ``Options.allow_inline`` lets it run there).
        gil: the measurement the decision used, or None.
    """

    backend: str
    reasons: tuple[str, ...]
    share: bool = False
    chunksize: int | None = None
    profile: CallableProfile | None = field(default=None, compare=False)
    measure: bool = False
    gil: GilProfile | None = None

    def __str__(self) -> str:
        head = self.backend
        if self.chunksize is not None:
            head += f" (chunksize {self.chunksize})"
        if self.profile is not None:
            head = f"{self.profile.name} -> {head}"
        return head + "".join(f"\n  - {reason}" for reason in self.reasons)

    def __repr__(self) -> str:
        return _display.decision_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text display (a notebook cell's last line): ``str()``."""
        _display.pretty(self, printer, cycle)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the route in bold, the reasons as a list."""
        return _display.decision_html(self)


class Reason(str):
    """One sentence of a :class:`Decision`'s reasons, with the id of the rule that gave it.

    ``str()`` is the sentence, so logs, ``explain()`` and ``in`` tests read
    as before; code that acts on a reason compares ``rule`` (never the
    prose, which may be reworded). Plain strings among the reasons have no
    rule (:func:`rule_of` gives None).
    """

    rule: str

    def __new__(cls, rule: str, text: str) -> Reason:
        made = super().__new__(cls, text)
        made.rule = rule
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (Reason, (self.rule, str(self)))


def rule_of(reason: str) -> str | None:
    """The rule id of ``reason`` (a :class:`Reason`), or None for a plain sentence."""
    return reason.rule if isinstance(reason, Reason) else None


#: Rule ids that code acts on (see :func:`reasons_off_processes`,
#: :func:`measured_reasons` and the executor's route notes).
GIL_UNKNOWN_RULE = "gil-unknown"
REACHES_PROCESSES_RULE = "reaches-processes"
MEASURED_RULE = "measured"
LAST_MAP_RULE = "last-map"
INITIALIZER_BY_VALUE_RULE = "initializer-by-value"

#: The reason a callable not measured yet starts on processes; the words in
#: parentheses say how it will be measured, and are dropped once it was
#: (:func:`measured_reasons`).
GIL_UNKNOWN = "it may hold the GIL, so processes run it in parallel"
GIL_NOT_MEASURED = (
    " (not measured yet: its first chunks are measured in the workers, and a map "
    "may move to threads)"
)
GIL_FIRST_MAP_MEASURES = " (its first map measures this and may move it to threads)"


def reasons_off_processes(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """``reasons`` of a process decision, for the threads (or loop) its figures moved it to.

    Drops what only argued for processes: the guess that it may hold the GIL
    (:data:`GIL_UNKNOWN`, now answered by the figures) and how its code
    reaches process workers.
    """
    dropped = (GIL_UNKNOWN_RULE, REACHES_PROCESSES_RULE)
    return tuple(reason for reason in reasons if rule_of(reason) not in dropped)


def measured_reasons(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """``reasons`` (a :class:`Decision`'s) with "not measured yet" taken out.

    For the lines a map logs once its first chunks were measured: the reason
    its route was chosen stays, the promise of a measurement goes.
    """
    answered = Reason(GIL_UNKNOWN_RULE, GIL_UNKNOWN)
    return tuple(answered if rule_of(reason) == GIL_UNKNOWN_RULE else reason for reason in reasons)


#: Why a callable that its code hint sends to threads can still move.
CODE_HINT_THREADS = (
    "threads run it with no pickling; its first chunks measure its GIL use there, "
    "and the rest of a map moves to processes if they find the GIL held"
)


def _describe(profile: CallableProfile) -> str:
    kinds = {
        "function": "an importable module-level function",
        "builtin": "an importable builtin",
        "ufunc": "a numpy ufunc",
        "class": "a class",
        "bound_method": "a bound method",
        "callable_instance": "a callable instance",
        "partial": "a functools.partial",
        "lambda": "a lambda",
        "closure": "a closure",
        "nested": "a function defined inside another function",
        "main": "a function defined in __main__",
    }
    return f"{profile.name} is {kinds.get(profile.kind, profile.kind)}"


#: The reason (and the ``RuntimeWarning`` the executor gives) when an
#: initializer is set and a callable's code must travel by value to loky.
INITIALIZER_BY_VALUE = Reason(
    INITIALIZER_BY_VALUE_RULE,
    "an initializer is set, but this callable's code travels by value to loky workers "
    "(no fork route here): a pickled copy reads its own copy of its module's globals, "
    "not what the initializer set in the worker; define the callable and the "
    "initializer in an importable module (they are then pickled by reference)",
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

    Pure: it reads only its arguments. The table is in this module's
    docstring; then:

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
    fork_off = options.start_method not in (None, "fork") and platform.has_fork
    if fork_off:
        with_fork = _decide(profile, platform, options, measured)
        platform = replace(
            platform, start_methods=tuple(m for m in platform.start_methods if m != "fork")
        )
    decision = _decide(profile, platform, options, measured)
    if fork_off and with_fork.backend == "fork" and decision.backend != "fork":
        decision = replace(
            decision,
            reasons=(
                *decision.reasons,
                f"mp_context uses start method {options.start_method!r}: process work goes "
                f"to loky, whose workers start as fresh interpreters, not to fork workers",
            ),
        )
    if (
        other_threads > 0
        and options.backend is None
        and decision.backend == "fork"
        and not platform.in_worker
    ):
        threads = f"{other_threads} other thread{'s are' if other_threads != 1 else ' is'}"
        if decision.share:
            decision = replace(
                decision,
                reasons=(
                    *decision.reasons,
                    f"{threads} running in this process; sharing the object needs fork "
                    f"all the same: each pool forks one single-threaded zygote, with "
                    f"smartexec's own threads paused, and the zygote forks the workers",
                ),
            )
        else:
            decision = replace(
                decision,
                backend="loky",
                reasons=(
                    *decision.reasons,
                    f"{threads} running in this process: forking it would copy any lock "
                    f"they hold (a deadlock risk; Python 3.12+ warns), so loky starts "
                    f"the workers instead, without forking this process",
                ),
            )
    if platform.in_worker and options.backend is None and decision.backend in ("fork", "loky"):
        return replace(
            decision,
            backend="inline",
            share=False,
            measure=False,
            reasons=(
                *decision.reasons,
                "this process is itself a smartexec worker: the outer executor's workers "
                "already use the cores, so this nested work runs inline",
            ),
        )
    if (
        options.initializer
        and options.backend is None
        and options.prefer != "threads"
        and decision.backend == "thread"
        and profile.in_process is None  # row 1b: the thread backend runs the initializer too
    ):
        fork_ok = (
            platform.has_fork and options.start_method in (None, "fork") and other_threads == 0
        )
        target = "fork" if fork_ok else "loky"
        decision = replace(
            decision,
            backend=target,
            share=False,
            measure=False,
            reasons=(
                *decision.reasons,
                f"an initializer is set: as with ProcessPoolExecutor, it prepares worker "
                f"processes, so this call runs on {target} workers, not on threads of this "
                f'process (where the initializer would run too); prefer="threads" keeps it '
                f"on threads",
            ),
        )
    if (
        options.retires_workers
        and options.backend is None
        and decision.backend == "loky"
        and platform.has_fork
    ):
        decision = replace(
            decision,
            backend="fork",
            reasons=(
                *decision.reasons,
                "max_tasks_per_child is set: fork workers (which send code by value with "
                "cloudpickle too) are retired after that many calls; loky's cannot be",
            ),
        )
    if (
        options.initializer
        and options.backend in (None, "fork")
        and decision.backend in ("fork", "loky")
        and not decision.share
        and not profile.by_reference
        and platform.has_fork
    ):
        decision = replace(
            decision,
            backend="fork",
            share=True,
            measure=False,
            reasons=(
                *decision.reasons,
                "an initializer is set and this callable's code travels by value: a pickled "
                "copy would read its own copy of its module's globals, never what the "
                "initializer set in the worker; fork workers inherit the callable instead "
                "(by copy-on-write), so it reads the worker's globals",
            ),
        )
    if (
        options.initializer
        and decision.backend == "loky"
        and not decision.share
        and not profile.by_reference
    ):
        decision = replace(decision, reasons=(*decision.reasons, INITIALIZER_BY_VALUE))
    if options.stoppable:
        return stoppable(decision, platform, options, other_threads)
    return decision


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


def _decide(
    profile: CallableProfile,
    platform: Platform,
    options: Options,
    measured: GilProfile | None = None,
) -> Decision:
    """Walk the module docstring's table for :func:`decide` (same arguments)."""
    what = _describe(profile)
    threads_ok = permits(profile, "thread", options)
    state = profile.state
    stateful = state.nbytes > 0 or state.error is not None
    big = state.capped or state.nbytes > options.big_state_bytes
    holder = profile.state_holder or "its state"

    if options.backend is not None:
        reasons = [f"backend={options.backend!r} was given", what]
        share = False
        if options.backend == "fork" and stateful and (big or state.error is not None):
            share = True
            reasons.append(f"{holder} ({state}) reaches fork workers by copy-on-write")
        elif options.backend == "loky" and stateful and big and state.error is None:
            share = True
            reasons.append(f"{holder} ({state}) {_SENT_ONCE}")
        return Decision(options.backend, tuple(reasons), share=share, profile=profile)

    if profile.in_process is not None:
        # Before every other row: prefer="processes" is a hint for speed,
        # and no speed is worth a result lost or a wait never woken.
        return Decision(
            "thread",
            (what, profile.in_process, "threads run it in this process, on the object itself"),
            profile=profile,
        )

    if state.error is not None:
        if platform.has_fork:
            return Decision(
                "fork",
                (
                    what,
                    f"{holder} cannot be pickled ({state.error})",
                    "fork workers reach it by copy-on-write through a module-level "
                    "trampoline, so it is never pickled",
                    "workers see the object as it was when map() or submit() was called "
                    "(each call forks fresh workers: the state cannot be fingerprinted)",
                ),
                share=True,
                profile=profile,
            )
        # Fall through: the process backend's pickling error will name the part.

    if big and stateful:
        size = f"{holder} holds {state} (over {format_bytes(options.big_state_bytes)})"
        if platform.has_fork:
            return Decision(
                "fork",
                (
                    what,
                    size,
                    "fork workers reach it by copy-on-write through a module-level "
                    "trampoline; it is never pickled",
                    "workers see the object as it was when map() or submit() was called "
                    "(a map forks fresh workers; a submit reuses them while a digest of "
                    "the state is unchanged)",
                ),
                share=True,
                profile=profile,
            )
        threads_fit = options.prefer == "threads" or (
            options.prefer != "processes"
            and threads_ok
            and (profile.gil_hint is not None or not platform.gil_enabled)
        )
        if not threads_fit:  # the rows below send such callables to threads
            return Decision(
                "loky",
                (
                    what,
                    size,
                    f"{_no_fork(platform, options)}, so it is {_SENT_ONCE}",
                    "workers reuse the copy they received only while it is proven "
                    "unchanged (compared with what was sent, at each map or submit); "
                    "prefer='threads' shares it with no copy at all",
                ),
                share=True,
                profile=profile,
            )

    if options.prefer == "threads":
        return Decision("thread", ("prefer='threads' was given", what), profile=profile)

    if profile.gil_hint is not None and options.prefer != "processes" and threads_ok:
        return Decision(
            "thread",
            _trusting(
                profile, what, profile.gil_hint, "threads run it in parallel with no pickling"
            ),
            profile=profile,
        )

    if not platform.gil_enabled and options.prefer != "processes" and threads_ok:
        return Decision(
            "thread",
            (
                what,
                "the GIL is disabled (free-threaded build): threads run Python code in parallel",
            ),
            profile=profile,
        )

    # From here on the callable goes to processes because it may hold the GIL;
    # a measurement (unless the user said prefer="processes") can say otherwise.
    measurable = options.prefer is None
    if measured is not None and measurable and measured.kind != "holds" and threads_ok:
        at_once = measured.at_once(platform.cpu_count)
        if measured.cores < MANY_CORES:
            how = "threads run it in parallel with no pickling"
        elif at_once <= 1:
            how = (
                f"one item already keeps the {platform.cpu_count} cores busy: a map runs "
                f"it in the calling thread, one item after another (more at once would "
                f"oversubscribe the cores)"
            )
        else:
            how = f"one item keeps {measured.cores:.1f} cores busy: about {at_once} run at once"
        return Decision(
            "thread",
            _trusting(profile, what, Reason(MEASURED_RULE, str(measured)), how),
            profile=profile,
            gil=measured,
        )
    if measured is None and measurable and profile.code_hint is not None and threads_ok:
        return Decision(
            "thread",
            _trusting(profile, what, profile.code_hint, CODE_HINT_THREADS),
            profile=profile,
            measure=options.allow_inline,
        )
    kept_off = profile.effects.reason("thread") if not threads_ok else None
    if options.prefer == "processes":
        gil_reason = "prefer='processes' was given"
    elif kept_off is not None and options.prefer is None:
        gil_reason = kept_off
    elif measured is not None:
        gil_reason = Reason(MEASURED_RULE, str(measured))
    elif options.allow_inline:
        gil_reason = Reason(GIL_UNKNOWN_RULE, GIL_UNKNOWN + GIL_FIRST_MAP_MEASURES)
    else:
        gil_reason = Reason(GIL_UNKNOWN_RULE, GIL_UNKNOWN + GIL_NOT_MEASURED)
    measure = (
        measurable
        and measured is None
        and options.allow_inline
        and threads_ok
        and permits(profile, "inline", options)
    )
    gil = measured if measurable else None

    if not profile.by_reference:
        if platform.has_fork:
            return Decision(
                "fork",
                (
                    what,
                    gil_reason,
                    Reason(
                        REACHES_PROCESSES_RULE,
                        "it cannot be pickled by reference; fork workers (started in "
                        "milliseconds, the parent's modules already imported) receive it by "
                        "value with cloudpickle, as loky's would, without loky's interpreter "
                        "start-up",
                    ),
                ),
                profile=profile,
                measure=measure,
                gil=gil,
            )
        return Decision(
            "loky",
            (
                what,
                gil_reason,
                Reason(
                    REACHES_PROCESSES_RULE,
                    f"it cannot be pickled by reference; {_no_fork(platform, options)}, so "
                    f"loky sends it by value with cloudpickle to fresh interpreters",
                ),
            ),
            profile=profile,
            measure=measure,
            gil=gil,
        )

    if platform.has_fork:
        return Decision(
            "fork",
            (
                what,
                gil_reason,
                Reason(
                    REACHES_PROCESSES_RULE,
                    "it pickles by reference; fork workers start in milliseconds with the "
                    "parent's modules already imported",
                ),
            ),
            profile=profile,
            measure=measure,
            gil=gil,
        )
    return Decision(
        "loky",
        (
            what,
            gil_reason,
            Reason(
                REACHES_PROCESSES_RULE, f"it pickles by reference; {_no_fork(platform, options)}"
            ),
        ),
        profile=profile,
        measure=measure,
        gil=gil,
    )
