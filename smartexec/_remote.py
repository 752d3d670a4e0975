"""Run a chunk of calls and carry each outcome back, exceptions included.

Every backend runs :func:`run_chunk` in its workers. Each item's outcome is
kept separately, so a failing item does not hide the results of the items
before it, and each exception object belongs to exactly one item.

For process backends (``remote=True``) an exception travels with the worker's
formatted traceback, re-attached as ``__cause__`` in the parent (as
``concurrent.futures.process`` does); an exception that cannot make the trip
(it cannot be pickled, or cannot be rebuilt from its pickle) is replaced by a
:class:`~smartexec.errors.RemoteError` carrying its type name, message and
traceback text.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import cloudpickle

from . import _memmap
from .errors import RemoteError, RemoteTraceback, ResultPicklingError
from .gil import MIN_WATCH_S, GilSampler

__all__ = [
    "ChunkResult",
    "run_chunk",
    "Call",
    "remote_exception",
    "dumps",
    "loads",
    "picklable_outcomes",
]

#: One call: (positional arguments, keyword arguments).
Call = tuple[tuple[Any, ...], dict[str, Any]]

#: Pickle protocol for everything that crosses a process boundary.
PROTOCOL = 5


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, but a method bound to an importable class, and a memmap, go by reference.

    A ``numpy.memmap`` of a file is sent as a reference to the file
    (:mod:`smartexec._memmap`): writes a task makes land in the file. cloudpickle sends ``SomeClass.a_classmethod`` by value, which loses the
    source file name in worker tracebacks; ``getattr(SomeClass, name)`` is
    what plain pickle would send.
    """

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            return _code_reduce_keeping_file(obj)
        # A numpy memmap goes by reference to its file (see smartexec._memmap).
        reduced = _memmap.reduce(obj)
        if reduced is not None:
            return reduced
        if type(obj) is types.MethodType and isinstance(obj.__self__, type):
            owner, name = obj.__self__, obj.__func__.__name__
            if _importable(owner) and getattr(owner, name, None) == obj:
                return getattr, (owner, name)
        return super().reducer_override(obj)


#: cloudpickle's reducer for code objects (None if a later cloudpickle drops it).
_CODE_REDUCE = getattr(getattr(cloudpickle, "cloudpickle", None), "_code_reduce", None)

#: The file name cloudpickle gives the code it sends by value.
_DYNAMIC_CODE = "<dynamic-code>"


def _code_reduce_keeping_file(code: types.CodeType) -> Any:
    """cloudpickle's reduction of ``code``, with the file it was defined in kept.

    cloudpickle (3.1) names every code object it sends by value
    ``<dynamic-code>``, so that equal functions pickle to equal bytes. A
    function of a script's ``__main__`` then raised in a fork worker with
    ``File "<dynamic-code>", line 9`` and no source line, where
    ``ProcessPoolExecutor`` shows the script's path and the line (found by an
    adversarial review). Nothing here relies on equal bytes; the name is put
    back. Falls back to cloudpickle's own reduction if its shape changes.
    """
    if _CODE_REDUCE is None:
        return NotImplemented
    reduced = _CODE_REDUCE(code)
    try:
        constructor, args = reduced
        at = [i for i, arg in enumerate(args) if type(arg) is str and arg == _DYNAMIC_CODE]
    except (TypeError, ValueError):
        return reduced
    if len(at) != 1:
        return reduced
    args = list(args)
    args[at[0]] = code.co_filename
    return constructor, tuple(args)


def _importable(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    if module is None or cls.__module__ == "__main__":
        return False
    target: Any = module
    for part in cls.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is cls


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` with cloudpickle at protocol 5 (classmethods by reference)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """Unpickle bytes made by :func:`dumps` (the stdlib's ``pickle.loads``)."""
    return cloudpickle.loads(data)


class PackedCalls(NamedTuple):
    """A chunk's calls as they travel to a worker when none has keyword arguments.

    The ``(args, kwargs)`` pairs of a map carry one empty dict each:
    pickling a reference to it per item made a 100,000-item chunk's request
    take 6x longer to pickle and unpickle than its arguments alone (~120 and
    ~95 ms against ~16 ms each; with one argument per call, the bare items,
    1 and 4 ms). :func:`pack_calls` makes one; :func:`unpack_calls` undoes it.

    Attributes:
        single: each call has exactly one positional argument, and ``items``
            holds those arguments; else ``items`` holds each call's ``args``.
        items: one entry per call, in order.
        own: each call must get arguments of its own in the worker
            (:func:`separate_calls`): the callable writes into them.
        snapshots: each result a later call could change is copied as it
            is returned (:func:`snapshot`).
    """

    single: bool
    items: list[Any]
    own: bool = False
    snapshots: bool = False


class OwnCalls(list):  # type: ignore[type-arg]
    """A chunk's calls whose callable writes what other calls see: each gets its own in the worker.

    A chunk travels as one pickle, which keeps one object passed to several
    of its calls one object there (a repeated big argument is even sent
    once, :class:`~smartexec._object_cache.ObjectCache`). That is free, and
    right, for a callable that only reads its arguments; for one that
    writes into them (``effects`` of kind ``"argument"``) each call gets a
    copy, as a ``ProcessPoolExecutor`` pickling each call alone gives it.
    Its results go back together after the chunk's last call: for one that
    writes what a later call reaches (kind ``"shared"``: :attr:`snapshots`),
    each result is copied as it is returned where a later call could change
    it (:func:`snapshot`; see :meth:`smartexec.effects.Effects.owns_calls`).
    """

    own = True
    #: Each result a later call could change is copied as it is returned.
    snapshots = False


def own_calls(calls: Iterable[Call], snapshots: bool) -> OwnCalls:
    """``calls`` marked :class:`OwnCalls`, with :attr:`OwnCalls.snapshots` as given."""
    marked = OwnCalls(calls)
    marked.snapshots = snapshots
    return marked


def copy_calls(chunk: Sequence[Call]) -> list[Call]:
    """A list of ``chunk``'s calls, still an :class:`OwnCalls` (and its marks) when it was one."""
    return own_calls(chunk, chunk.snapshots) if isinstance(chunk, OwnCalls) else list(chunk)


def pack_calls(calls: Sequence[Call]) -> Sequence[Call] | PackedCalls:
    """``calls`` in their compact form when no call has keyword arguments, else as they are.

    An :class:`OwnCalls` chunk stays marked (``own``).
    """
    own = isinstance(calls, OwnCalls)
    snapshots = own and calls.snapshots  # type: ignore[attr-defined]
    if not calls or any(kwargs for _, kwargs in calls):
        return calls
    if all(len(args) == 1 for args, _ in calls):
        return PackedCalls(True, [args[0] for args, _ in calls], own, snapshots)
    return PackedCalls(False, [args for args, _ in calls], own, snapshots)


#: The keyword arguments of every call of a map: one shared empty dict (a
#: call unpacks it, ``fn(*args, **kwargs)``, so it is never handed out); the
#: executor builds a map's calls with it, and :func:`unpack_calls` too.
_NO_KWARGS: dict[str, Any] = {}


def unpack_calls(calls: Sequence[Call] | PackedCalls) -> Sequence[Call]:
    """The ``(args, kwargs)`` pairs of :func:`pack_calls`' result (a list is returned as it is)."""
    if not isinstance(calls, PackedCalls):
        return calls
    if calls.single:
        return [((item,), _NO_KWARGS) for item in calls.items]
    return [(args, _NO_KWARGS) for args in calls.items]


#: Types whose objects no call can change: a chunk may hold one object of these many times.
_IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None), frozenset, range})


def _copy(obj: Any) -> Any:
    """A copy of ``obj`` as a pickle round trip makes it (what a worker gets)."""
    return cloudpickle.loads(dumps(obj))


def separated(values: list[Any]) -> list[Any]:
    """``values`` with each repeat of a mutable object replaced by a copy of its own.

    A chunk travels as one pickle, which keeps one object given to several
    calls one object: a call that changes its argument in place would
    change the next call's. A ``ProcessPoolExecutor`` pickles each call on
    its own (``chunksize=1``), so each gets a copy; so does each call here.
    Only top-level repeats are found (an object nested in several
    arguments stays shared, as it does within one call).
    """
    seen: set[int] = set()
    out = values
    for index, value in enumerate(values):
        if type(value) in _IMMUTABLE:
            continue
        if id(value) in seen:
            if out is values:
                out = list(values)
            out[index] = _copy(value)
        else:
            seen.add(id(value))
    return out


def _references(value: Any) -> int:
    return sys.getrefcount(value)  # counted as snapshot() counts: its argument, one frame down


def _fresh_references() -> int:
    value = object()  # held here alone, as a result just returned is by _run_items
    return _references(value)


#: What :func:`snapshot` reads for an object only its caller's variable holds.
_FRESH_REFERENCES = _fresh_references()


def snapshot(value: Any) -> Any:
    """``value``, or a copy of it as it is now when a later call could change it; run in a worker.

    A chunk's results are pickled together once its last call returns. A
    result that holds what a later call writes (a module-level buffer the
    callable fills and returns, alone or in a tuple, a dict or an object of
    its own) would go back as the last call left it: 1,000 calls that
    filled and returned one module-level array came back as 17 distinct
    rows (one per chunk), where a ``ProcessPoolExecutor`` (``chunksize=1``)
    pickles each as it is returned. Used for callables whose calls may
    write what a later call reaches (see :class:`OwnCalls`): each result is
    copied (a pickle round trip) but for what no call can change, and a
    numpy array only this call holds that owns its numbers.
    """
    if type(value) in _IMMUTABLE:
        return value
    if (
        type(value).__module__ == "numpy"
        and getattr(value, "base", False) is None
        and not value.dtype.hasobject
        and sys.getrefcount(value) <= _FRESH_REFERENCES
    ):
        return value  # a new array of numbers: nothing else reaches it
    try:
        return _copy(value)
    except Exception:  # it cannot be pickled: the reply says so, as it would have
        return value


def own_arguments(calls: Sequence[Call] | PackedCalls) -> Sequence[Call] | PackedCalls:
    """In a worker: the calls, each with arguments of its own where the chunk is marked ``own``."""
    if getattr(calls, "own", False):
        return separate_calls(calls)
    return calls


def separate_calls(calls: Sequence[Call] | PackedCalls) -> Sequence[Call] | PackedCalls:
    """The calls, each with arguments of its own (see :func:`separated`); run in a worker."""
    if isinstance(calls, PackedCalls) and calls.single:
        items = separated(calls.items)
        return calls if items is calls.items else calls._replace(items=items)
    shapes: list[Call]
    if isinstance(calls, PackedCalls):
        shapes = [(args, {}) for args in calls.items]
    else:
        shapes = list(calls)
    flat = [v for args, kwargs in shapes for v in (*args, *kwargs.values())]
    fresh = separated(flat)
    if fresh is flat:
        return calls
    rebuilt: list[Call] = []
    at = 0
    for args, kwargs in shapes:
        n, m = len(args), len(kwargs)
        rebuilt.append((tuple(fresh[at : at + n]), dict(zip(kwargs, fresh[at + n : at + n + m]))))
        at += n + m
    if isinstance(calls, PackedCalls):
        return calls._replace(single=False, items=[args for args, _ in rebuilt])
    return own_calls(rebuilt, calls.snapshots) if isinstance(calls, OwnCalls) else rebuilt


def separate_outcomes(result: ChunkResult) -> ChunkResult:
    """``result`` with each call's value its own object (one returned twice is copied); run in a worker."""
    values = [value for _, value in result.outcomes]
    fresh = separated(values)
    if fresh is values:
        return result
    outcomes = [(ok, value) for (ok, _), value in zip(result.outcomes, fresh)]
    return result._replace(outcomes=outcomes)


class ChunkResult(NamedTuple):
    """What a worker returns for one chunk.

    Attributes:
        outcomes: one ``(ok, value)`` per call, in order; ``value`` is the
            result when ``ok`` else the exception.
        compute_s: seconds the worker spent running the calls (wall clock,
            measured where the work ran, excluding dispatch).
        cpu_s: CPU seconds of the thread that ran the calls meanwhile
            (``time.thread_time``); well under ``compute_s`` for calls that
            wait (sleep, I/O); -1.0 when not read (``run_chunk``'s
            ``clock_cpu``).
        gil: how the calls used the CPU and the GIL, watched where they ran
            (a :class:`~smartexec.gil.GilProfile`), for the first chunks of
            each callable in each worker process (see :func:`run_chunk`);
            None for the others.
        first: ``(wall, CPU)`` seconds of the chunk's first call when it
            was this process's first call of the callable (the CPU -1.0
            when not read); else None, as where not measured. A fresh
            worker's first call pays for what later calls do not (the pages
            it copies after the fork, first imports): 270 us against 2.4 us
            for a numpy call, which read 6.7 us an item over the chunk of
            64 (see :meth:`smartexec._rerouting.Evidence.add`).
        receive_s: seconds the worker spent taking in a request of at least
            :data:`BIG_REQUEST_BYTES` pickled bytes (reading it from its
            pipe, unpickling it) before the first call; 0.0 for smaller ones,
            or where not measured. Pickled into nothing, 2 MiB ``bytes``
            took microseconds; sent, about 3 ms an item (see
            :meth:`smartexec._rerouting.Evidence.send_s`).
    """

    outcomes: list[tuple[bool, Any]]
    compute_s: float
    cpu_s: float = 0.0
    gil: Any = None
    first: tuple[float, float] | None = None
    receive_s: float = 0.0


#: Requests whose pickle stream is this many bytes or more have their
#: receive timed (see :attr:`ChunkResult.receive_s`): big ``bytes`` and
#: ``str`` arguments travel in the stream (only buffers such as arrays go
#: out of band), and their cost is in copying them, not in pickling.
BIG_REQUEST_BYTES = 1 << 20


def _rebuild(exc: BaseException, tb: str) -> BaseException:
    exc.__cause__ = RemoteTraceback(tb)
    return exc


class _ExceptionWithTraceback:
    """Pickles an exception with its traceback text; unpickles to the exception."""

    def __init__(self, exc: BaseException, tb: str):
        self.exc = exc
        self.tb = tb

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.exc, self.tb)


def remote_exception(exc: BaseException) -> Any:
    """Wrap ``exc`` so that it survives pickling, with its traceback text.

    Returns an object that unpickles to ``exc`` (with ``__cause__`` set to a
    :class:`~smartexec.errors.RemoteTraceback`) when ``exc`` round-trips
    through pickle, otherwise to a :class:`~smartexec.errors.RemoteError`.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    tb = f'\n"""\n{tb}"""'
    exc.__traceback__ = None  # frames hold locals that may not pickle
    try:
        cloudpickle.loads(dumps(exc))
    except BaseException:
        type_name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        try:
            message = str(exc)
        except BaseException:
            message = "<str() failed>"
        return _ExceptionWithTraceback(RemoteError(type_name, message, tb), tb)
    return _ExceptionWithTraceback(exc, tb)


#: Seconds of work per callable (and per process) run with a GIL watch: the
#: first chunks of a callable in each worker process, or in the threads of
#: the caller's process, tell the parent whether it holds the GIL. A watch
#: counts as at least a quarter of it (at most four watches per callable).
WATCH_S = 0.03

#: The least a watched chunk is charged against :data:`WATCH_S`, so a callable
#: is watched in at most 4 chunks per process. Starting and joining the
#: sampling thread costs 0.1-1 ms a chunk: charged only their own few
#: microseconds, 20,000 submits of ``operator.add`` were all watched (530 us
#: a call on threads instead of ~5).
WATCH_MIN_CHARGE_S = WATCH_S / 4

#: Seconds a chunk of several items runs before its GIL watch may start (see
#: :func:`run_chunk`).
WATCH_AFTER_S = 0.001

#: Seconds of work a chunk's remaining items must promise (at its pace so
#: far) for a watch to start part-way: what the parent counts as a watch
#: (:data:`smartexec.gil.MIN_WATCH_S`), several sampling periods.
MIN_WATCHED_S = MIN_WATCH_S

#: Most items a chunk runs between two reads of the clock while its watch
#: may still start.
MAX_UNCHECKED_ITEMS = 256

_watched: dict[tuple[str, str], float] = {}
_watched_lock = threading.Lock()

#: Per callable, the seconds per call of its last chunk run in this process
#: (no entry: not called here yet; NaN: its first chunk here is running).
_last_call_s: dict[tuple[str, str], float] = {}


def _watch_key(fn: Any) -> tuple[str, str]:
    """A callable's name, the same for each unpickled copy of it in a worker."""
    target = getattr(fn, "__func__", fn)
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return str(module), str(name)


class _CallState(NamedTuple):
    """What a chunk finds of its callable in this process (see :func:`_call_state`)."""

    key: tuple[str, str]
    #: Seconds per call of its last chunk here; None: this chunk makes the
    #: process's first call of it; NaN: that first chunk is still running.
    last_s: float | None
    #: Its GIL watch budget (:data:`WATCH_S`) is not spent.
    watch_due: bool


def _call_state(fn: Any) -> _CallState | None:
    """``fn``'s key, last seconds per call and watch budget here, in one read; None for an odd callable.

    The chunk that finds no entry claims the process's first call of
    ``fn``: a chunk starting beside it on another thread is not a first.
    """
    try:
        key = _watch_key(fn)
    except Exception:  # an odd callable's __getattr__: run it unwatched
        return None
    with _watched_lock:
        last_s = _last_call_s.get(key)
        if last_s is None:
            _last_call_s[key] = math.nan
        return _CallState(key, last_s, _watched.get(key, 0.0) < WATCH_S)


def _watched_for(key: tuple[str, str], seconds: float) -> None:
    with _watched_lock:
        _watched[key] = _watched.get(key, 0.0) + seconds


def _one_call_watched(last_s: float | None) -> bool:
    """Whether a chunk of one call is watched, given its callable's seconds per call in its last chunk here (None: its first call here).

    A chunk of one call is watched only when its callable's last chunk here
    ran at least :data:`MIN_WATCHED_S` a call: the parent reads no watch
    shorter than that (a 3 ms call's would only spend the budget), and a
    process's first call is never watched whole, as a longer chunk's first
    call is not: it holds its warm-up (imports, caches). A fresh fork
    worker's first ``default_rng(i).standard_normal`` of 2 MiB took 18 ms
    and read the GIL held 41 % of it, against 0 % for the 3 ms calls after
    it; the two watches disagreed and the map stayed on fork, 1.3x slower
    than threads. Such a first call is reported apart instead
    (:attr:`ChunkResult.first`).
    """
    return last_s is not None and last_s >= MIN_WATCHED_S  # (False for NaN)


def forget_watches() -> None:
    """Forget which callables were watched in this process (each is watched again).

    Runs in each forked child: a fork worker watches its first chunks even
    when the parent's threads already watched the same callable.
    """
    global _watched_lock
    _watched_lock = threading.Lock()  # a thread of the parent may have held it
    _watched.clear()
    _last_call_s.clear()


os.register_at_fork(after_in_child=forget_watches)


def run_chunk(
    fn: Callable[..., Any],
    chunk: Sequence[Call] | PackedCalls,
    remote: bool = False,
    budget_s: float | None = None,
    *,
    watch: bool = True,
    clock_cpu: bool = True,
) -> ChunkResult:
    """Call ``fn`` on each item of ``chunk``; keep every outcome.

    Args:
        fn: the callable.
        chunk: a sequence of ``(args, kwargs)`` pairs, or the
            :class:`PackedCalls` a request carries them in (run as they are:
            unpacking 100,000 calls cost ~80 ms of garbage collection).
        remote: True when the outcomes will be pickled to another process:
            exceptions are then wrapped by :func:`remote_exception`.
        budget_s: stop after the item during which this many seconds have
            passed (at least one item always runs); None runs every item.
            The caller re-sends the items with no outcome.
        watch: False never takes a GIL watch (the thread backend, where
            Linux tells how many cores the pool's threads wanted).
        clock_cpu: False does not read the thread's CPU clock (``cpu_s`` is
            then -1.0): for chunks on threads whose figures no router reads.
            Reading it made CFS settle the thread's CPU account at once:
            under a competing process, two reads per item slowed 64 numpy
            items on six threads from 0.055 to 0.064 s (25 interleaved runs
            each); other system calls cost nothing there.

    Returns:
        A :class:`ChunkResult` with one outcome per item run, in order, the
        chunk's wall and CPU seconds (and, where it made this process's first
        call of ``fn``, that call's apart), and, while the callable has had under
        :data:`WATCH_S` seconds of watched work in this process (each
        watched chunk counting at least :data:`WATCH_MIN_CHARGE_S`), a GIL
        measurement (:class:`~smartexec.gil.GilSampler`: a thread that wakes
        every 0.5 ms): of the whole chunk when it holds one call and the
        callable's last chunk here ran :data:`MIN_WATCHED_S` a call (none
        for a process's first call: see :func:`_one_call_watched`); else of
        the items left at the first check (after 1, 2, 4, ... items, at most
        :data:`MAX_UNCHECKED_ITEMS` apart) past :data:`WATCH_AFTER_S`, when
        at the pace so far they run :data:`MIN_WATCHED_S` more; none when
        the chunk ends sooner. Starting that watch counts neither in the
        chunk's seconds nor against ``budget_s``. Exceptions (``BaseException``
        included, as in ``concurrent.futures``) are caught and stored,
        never raised.
    """
    packed = isinstance(chunk, PackedCalls)
    entries: Sequence[Any] = chunk.items if packed else chunk  # type: ignore[union-attr]
    if not isinstance(entries, Sequence):
        entries = list(entries)  # an iterator: its length is needed
    run = _ChunkRun(fn, 2 if packed and chunk.single else 1 if packed else 0, remote)  # type: ignore[union-attr]
    state = _call_state(fn) if clock_cpu else None  # None: a reply nobody reads
    watching = state is not None and watch and state.watch_due
    last_s = state.last_s if state is not None else math.nan
    one_call = len(entries) <= 1
    if one_call and watching and _one_call_watched(last_s):
        run.sampler = _started_sampler()  # one item: watched whole (a submit, a measuring chunk)
    run.clock_cpu = clock_cpu
    run.own = remote and getattr(chunk, "snapshots", False)
    run.cpu_start = time.thread_time() if clock_cpu else 0.0
    start = run.start = time.perf_counter()
    run.deadline = math.inf if budget_s is None else start + budget_s
    try:
        if watching and not one_call:
            run.watch_midway(entries, start)
        elif not one_call:
            items = iter(entries)
            if not run.first_item(items):
                run.items(items)
        else:  # one call (a submit): it is its own first call, not timed apart
            run.items(entries)
    finally:
        wall = time.perf_counter() - start - run.paused
        cpu = time.thread_time() - run.cpu_start - run.paused_cpu if clock_cpu else -1.0
        gil = None
        if run.sampler is not None and state is not None:
            run.sampler.items = len(run.outcomes) - run.watched_from
            gil = run.sampler.stop()
            _watched_for(state.key, max(run.sampler.elapsed_s(), WATCH_MIN_CHARGE_S))
        if state is not None and run.outcomes:
            with _watched_lock:
                _last_call_s[state.key] = wall / len(run.outcomes)
    first = None
    if last_s is None and run.outcomes:  # this process's first call of fn
        first = run.first if len(run.outcomes) > 1 else (wall, cpu)
    return ChunkResult(run.outcomes, wall, cpu, gil, first)


class _ChunkRun:
    """One chunk's calls as :func:`run_chunk` makes them: outcomes, deadline, GIL watch."""

    __slots__ = (
        "fn",
        "mode",
        "remote",
        "outcomes",
        "deadline",
        "sampler",
        "watched_from",
        "paused",
        "paused_cpu",
        "start",
        "cpu_start",
        "clock_cpu",
        "first",
        "own",
    )

    def __init__(self, fn: Callable[..., Any], mode: int, remote: bool) -> None:
        self.fn = fn
        self.mode = mode
        self.remote = remote
        self.outcomes: list[tuple[bool, Any]] = []
        self.deadline = math.inf
        self.sampler: GilSampler | None = None
        self.watched_from = 0  # the first item the sampler saw
        self.paused = 0.0  # seconds spent starting a watch mid-chunk: not the items'
        self.paused_cpu = 0.0
        self.start = self.cpu_start = 0.0  # the chunk's clocks at its start
        self.clock_cpu = True
        self.first: tuple[float, float] | None = None  # see ChunkResult.first
        self.own = False  # results copied as returned (see snapshot)

    def items(self, items: Iterable[Any]) -> bool:
        """Run ``items``; True when the deadline stopped them."""
        return _run_items(
            self.fn, items, self.mode, self.remote, self.outcomes, self.deadline, self.own
        )

    def first_item(self, items: Iterator[Any]) -> bool:
        """Run the first of ``items`` and keep its seconds (:attr:`first`); True when the deadline stopped it."""
        stopped = self.items(itertools.islice(items, 1))
        cpu = time.thread_time() - self.cpu_start if self.clock_cpu else -1.0
        self.first = (time.perf_counter() - self.start, cpu)
        return stopped

    def watch_midway(self, entries: Sequence[Any], start: float) -> None:
        """Run every entry; watch the GIL from the first check where it pays.

        The checks come after 1, 2, 4, ... items (at most
        :data:`MAX_UNCHECKED_ITEMS` apart); the watch starts at the first
        past :data:`WATCH_AFTER_S` if at the pace so far the items left run
        :data:`MIN_WATCHED_S` more. A chunk over sooner is not watched: the
        sampler's start and stop (0.3-4 ms, most when the pool's processes
        start together) would cost more than its work, and under a sampling
        period its figures say nothing.
        """
        items = iter(entries)
        stopped = self.first_item(items)
        batch = 1
        while not stopped:
            done = len(self.outcomes)
            if done >= len(entries):
                return
            elapsed = time.perf_counter() - start
            if elapsed >= WATCH_AFTER_S:
                if elapsed / done * (len(entries) - done) >= MIN_WATCHED_S:
                    self._start_watch()
                self.items(items)
                return
            batch = min(2 * batch, MAX_UNCHECKED_ITEMS)
            stopped = self.items(itertools.islice(items, batch))

    def _start_watch(self) -> None:
        """Start the sampler; its start's seconds count neither as the items' nor on the budget."""
        before, before_cpu = time.perf_counter(), time.thread_time()
        self.sampler = _started_sampler()
        self.paused = time.perf_counter() - before
        self.paused_cpu = time.thread_time() - before_cpu
        self.deadline += self.paused
        self.watched_from = len(self.outcomes)


def _started_sampler() -> GilSampler | None:
    """A started :class:`~smartexec.gil.GilSampler`, or None when its thread cannot start."""
    sampler = GilSampler()
    try:
        sampler.start(settle=True)
    except Exception:  # e.g. RuntimeError: can't start new thread (a process at its limit)
        return None
    return sampler


def _run_items(
    fn: Callable[..., Any],
    entries: Iterable[Any],
    mode: int,
    remote: bool,
    outcomes: list[tuple[bool, Any]],
    deadline: float,
    own: bool = False,
) -> bool:
    """Run ``entries`` (mode 0: ``(args, kwargs)``; 1: args tuples; 2: single arguments).

    Appends one outcome per item to ``outcomes``; True when it stopped at
    ``deadline`` (a ``time.perf_counter()`` value, ``math.inf`` for none).
    With ``own``, each result a later call could still change is copied as
    it is returned (:func:`snapshot`).
    """
    timed = deadline != math.inf
    for entry in entries:
        try:
            if mode == 2:
                value = fn(entry)
            elif mode == 1:
                value = fn(*entry)
            else:
                value = fn(*entry[0], **entry[1])
            outcomes.append((True, snapshot(value) if own else value))
            del value
        except BaseException as exc:
            outcomes.append((False, remote_exception(exc) if remote else exc))
            del exc
        if timed and time.perf_counter() > deadline:
            return True
    return False


def picklable_outcomes(
    result: ChunkResult, check: Callable[[Any], Any] | None = None
) -> ChunkResult:
    """Replace each result that cannot be pickled by an error naming it.

    Run in a worker process when a chunk's reply failed to pickle: the items
    whose results pickle keep them; each other item gets a
    :class:`~smartexec.errors.ResultPicklingError` (a ``PicklingError`` and a
    ``BrokenProcessPool``, ``where == "result"``), wrapped by
    :func:`remote_exception`. A ``BaseException`` that is not an
    ``Exception`` (``SystemExit`` from a ``__reduce__``) is sent back as
    itself, as ``ProcessPoolExecutor`` does.

    Args:
        result: the chunk's outcomes.
        check: pickles one value or raises; default :func:`dumps`
            (:mod:`smartexec.transport` passes one that copies no big buffer).
    """
    check = dumps if check is None else check
    outcomes = []
    for ok, value in result.outcomes:
        try:
            check(value)
        except Exception as exc:
            error = ResultPicklingError(
                f"the result ({type(value).__qualname__}) could not be pickled to send it "
                f"back from the worker process: {type(exc).__name__}: {exc}. Return plain "
                f"data (numbers, strings, lists, dicts, numpy arrays), or use "
                f'backend="thread" to keep results in-process',
                reason=str(exc),
            )
            error.__cause__ = exc
            outcomes.append((False, remote_exception(error)))
        except BaseException as exc:
            outcomes.append((False, remote_exception(exc)))
        else:
            outcomes.append((ok, value))
    return result._replace(outcomes=outcomes)
