"""A joblib parallel backend: ``Parallel`` batches routed as :class:`~smartexec.SmartExecutor` routes.

Importing this module registers the backend ``"smartexec"`` with joblib
(``joblib.register_parallel_backend``), so code that already parallelises
through joblib, scikit-learn included, gets smartexec's routing without a
rewrite::

    import joblib
    import smartexec.joblib  # registers "smartexec"

    with joblib.parallel_config(backend="smartexec", n_jobs=-1):
        scores = cross_val_score(model, X, y, cv=5)  # any joblib user

joblib hands a backend *batches*: a few ``delayed(f)(x)`` calls at a time.
The backend routes each batch on the function inside it, ``f``, as
``SmartExecutor.submit`` routes ``f``: a pure-Python function or a closure to
fork workers, a method bound to a big object to fork workers that inherit the
object by copy-on-write (never pickled), work that releases the GIL to
threads, ``prefer="threads"`` (which scikit-learn passes for some
estimators) to threads. A batch runs as joblib's own batches do: in order,
stopping at its first exception, inside ``parallel_config`` set to the
backend joblib names for nested calls (:meth:`SmartBackend.get_nested_backend`).

joblib is optional: ``pip install 'smartexec[joblib]'``.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import threading
import types
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

try:
    import joblib
    from joblib._parallel_backends import AutoBatchingMixin
    from joblib.parallel import BatchedCalls, ParallelBackendBase, parallel_config
except ImportError as exc:  # tests/test_joblib_backend.py hides joblib to check this
    raise ImportError(
        "smartexec.joblib needs joblib, which is not installed: "
        "pip install 'smartexec[joblib]' (or pip install joblib)",
        name=exc.name,
    ) from exc

from ._diagnose import explain_pickling, is_pickling_failure
from ._identity import identity_key
from ._remote import Call, ChunkResult, separate_calls, separated, snapshot, unpack_calls
from ._routed_map import chunk_timeout
from ._sender import send_chunk
from ._system import current_platform
from .effects import process_local_reason
from .executor import SmartExecutor, check_open
from .inspection import callable_name
from .policy import Decision

__all__ = ["BACKEND_NAME", "SmartBackend", "register", "same_function", "alike"]

#: The name the backend is registered under: ``parallel_config(backend="smartexec")``.
BACKEND_NAME = "smartexec"

#: Keyword arguments ``Parallel`` passes to every backend's ``configure`` for
#: its own pools (memmapping, start context, verbosity): smartexec sends big
#: arrays through shared memory and picks its start method itself.
_JOBLIB_POOL_OPTIONS = frozenset({"max_nbytes", "temp_folder", "mmap_mode", "verbose", "context"})


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)``: the callable a batch of several functions is routed on."""
    return fn(*args, **kwargs)


class _Batch:
    """What the workers call for one batch: ``fn`` over its calls, under the nested config.

    One per routed function and ``Parallel`` call, so that a callable shared
    by copy-on-write is forked once per call, not once per batch. Its state
    is ``fn``'s plus the nested backend (small), so ``fn``'s routing holds.
    """

    __slots__ = ("fn", "nested", "nested_n_jobs", "home", "own", "snapshots", "__weakref__")

    def __init__(
        self,
        fn: Callable[..., Any],
        nested: Any,
        nested_n_jobs: int | None,
        own: bool,
        snapshots: bool = False,
    ):
        self.fn = fn
        self.nested = nested
        self.nested_n_jobs = nested_n_jobs
        self.home = os.getpid()
        # A callable that writes into its arguments gets its own in a worker
        # (from the routing's own reading of its effects); one that writes
        # what a later call reaches gives back results as they were returned.
        self.own = own
        self.snapshots = snapshots

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        """The function it calls (what :mod:`smartexec._module_reads` follows)."""
        return self.fn

    def __call__(
        self, layout: tuple[tuple[int, tuple[str, ...]], ...], /, *values: Any
    ) -> list[Any]:
        """Run the batch's calls, given flat (see :func:`_flat`), in order."""
        calls = _unflat(layout, values)
        # A nested Parallel configures the backend object it finds: a copy per
        # batch, as joblib makes one per batch (batches on threads run at once).
        nested = copy.copy(self.nested)
        away = os.getpid() != self.home
        if away and self.own:
            # In a worker process: each task gets arguments of its own, as a
            # task pickled alone would (the batch travelled as one pickle).
            calls = list(unpack_calls(separate_calls(calls)))
        # As joblib's BatchedCalls: in order, the first exception ends the batch.
        with parallel_config(backend=nested, n_jobs=self.nested_n_jobs):
            results = []
            for args, kwargs in calls:
                value = self.fn(*args, **kwargs)
                results.append(snapshot(value) if away and self.snapshots else value)
                del value
        return separated(results) if away else results

    def __getstate__(self) -> tuple[Any, Any, int | None, bool, bool]:
        return self.fn, self.nested, self.nested_n_jobs, self.own, self.snapshots

    @property
    def __name__(self) -> str:
        """The batch's name in errors and stats: ``fn``'s (e.g. a task_timeout's)."""
        return callable_name(self.fn)

    def __setstate__(self, state: tuple[Any, Any, int | None, bool, bool]) -> None:
        self.fn, self.nested, self.nested_n_jobs, self.own, self.snapshots = state
        self.home = -1  # unpickled: in another process


def _flat(calls: list[Call]) -> tuple[Any, ...]:
    """A batch's calls as one call's arguments: ``(layout, *every argument)``.

    Each task's arguments are then arguments of the chunk's one call, where
    the process backends' send-once cache finds a big one repeated across
    batches (a 200 MB array passed to every task goes once to each worker,
    as ``map`` sends it), not pickled inside a list with every batch.
    """
    layout = tuple((len(args), tuple(kwargs)) for args, kwargs in calls)
    return (layout, *(v for args, kwargs in calls for v in (*args, *kwargs.values())))


def _unflat(layout: tuple[tuple[int, tuple[str, ...]], ...], values: tuple[Any, ...]) -> list[Call]:
    """The calls :func:`_flat` flattened."""
    calls: list[Call] = []
    at = 0
    for n, names in layout:
        args = values[at : at + n]
        kwargs = dict(zip(names, values[at + n : at + n + len(names)]))
        calls.append((args, kwargs))
        at += n + len(names)
    return calls


def _same_objects(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


#: Objects :func:`_alike` compares, at most, for one pair of callables.
_ALIKE_BUDGET = 1000
_PLAIN = (int, float, complex, str, bytes, bool, type(None), re.Pattern)


def _alike(x: Any, y: Any, budget: list[int]) -> bool:
    """``x is y``, or both are equal plain data (numbers, strings, containers of them)."""
    budget[0] -= 1
    if x is y:
        return True
    if budget[0] < 0 or type(x) is not type(y):
        return False
    if isinstance(x, _PLAIN):
        return bool(x == y)
    if type(x) in (tuple, list):
        return len(x) == len(y) and all(_alike(a, b, budget) for a, b in zip(x, y))
    if type(x) is dict:
        return x.keys() == y.keys() and all(_alike(x[k], y[k], budget) for k in x)
    return False


def same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """Whether calling ``b`` is calling ``a``: the same object, or the same function made twice.

    ``delayed(lambda x: x + k)`` in a generator makes a new function object
    for each item: the same code, globals, closure cells and default
    values (the very objects), so the same behaviour. A bound method made
    afresh for each item is the same method of the same object.
    """
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is types.FunctionType:
        return (
            a.__code__ is b.__code__
            and a.__globals__ is b.__globals__
            and _same_objects(a.__closure__, b.__closure__)
            and _same_objects(a.__defaults__, b.__defaults__)
            and _same_objects(
                tuple((a.__kwdefaults__ or {}).items()), tuple((b.__kwdefaults__ or {}).items())
            )
        )
    if kind in (types.MethodType, types.BuiltinMethodType, types.BuiltinFunctionType):
        return identity_key(a) == identity_key(b)
    return False


def alike(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """Whether ``a`` and ``b`` are made alike: to be routed the same way, each called itself.

    A ``functools.partial`` or a callable instance made for each item
    (scikit-learn's ``delayed`` wraps every call in one, holding a copy of
    its configuration) is alike another of its class when their parts are
    the same objects or equal plain data. Being objects of their own (a
    call may change its object), each is still the one called for its item.
    """
    if same_function(a, b):
        return True
    kind = type(a)
    if kind is not type(b) or kind in (types.FunctionType, types.MethodType):
        return False
    budget = [_ALIKE_BUDGET]
    if isinstance(a, functools.partial):
        return (
            same_function(a.func, b.func)  # type: ignore[attr-defined]
            and _alike(a.args, b.args, budget)  # type: ignore[attr-defined]
            and _alike(a.keywords, b.keywords, budget)  # type: ignore[attr-defined]
            and _alike(vars(a), vars(b), budget)
        )
    state_a, state_b = getattr(a, "__dict__", None), getattr(b, "__dict__", None)
    if type(state_a) is not dict or type(state_b) is not dict or "__slots__" in vars(kind):
        return False
    return _alike(state_a, state_b, budget)


def _is_function(fn: Any) -> bool:
    """A function or method: :func:`same_function` knows when two are one."""
    return isinstance(
        fn,
        (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType),
    )


def _split(batch: Any) -> tuple[Callable[..., Any], str, list[tuple[Any, Any, Any]]]:
    """What a joblib batch is routed on, how its items relate, and its items.

    Returns:
        The callable to route on, the batch's mode and its ``(callable,
        args, kwargs)`` items. Modes: ``"same"``, one callable for every
        item (``delayed(f)`` over many items, the usual case;
        :func:`same_function`); ``"alike"``, callables made alike for each
        item (:func:`alike`), routed on the first; ``"mixed"``, others,
        routed on :func:`_call`, as joblib's process backends send them;
        ``"mixed-here"``, others of which one acts on an object of this
        process (``results.append``: :attr:`smartexec.effects.Effects.in_process`),
        routed on that one, which keeps the batch on threads.
    """
    items = list(batch.items)
    first = items[0][0]
    if all(same_function(first, fn) for fn, _, _ in items):
        return first, "same", items
    if all(alike(first, fn) for fn, _, _ in items):
        return first, "alike", items
    for fn, _, _ in items:
        if process_local_reason(fn) is not None:
            return fn, "mixed-here", items
    return _call, "mixed", items


def _result(future: Future[ChunkResult]) -> list[Any]:
    """A batch's results, or its first exception raised as joblib's backends raise it."""
    outcomes = future.result().outcomes
    ok, value = outcomes[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


class SmartBackend(AutoBatchingMixin, ParallelBackendBase):
    """The joblib backend ``"smartexec"``: each batch routed by a :class:`~smartexec.SmartExecutor`.

    joblib creates one per ``Parallel`` (or per ``parallel_config`` block);
    :meth:`configure` starts a ``SmartExecutor`` with ``max_workers`` from
    ``n_jobs`` and :meth:`terminate` shuts it down with its workers, so no
    worker outlives the ``Parallel`` call (a ``with Parallel(...)`` block
    keeps them for all its calls). Decisions are cached per executor and the
    per-callable profiles smartexec stores on disk carry over.

    Args:
        nesting_level: set by joblib (0 at the top; 1 inside a worker).
        inner_max_num_threads: not supported (smartexec sizes BLAS pools
            in its workers itself); joblib refuses it before this is called.
        **executor_options: keyword arguments for ``SmartExecutor``
            (``big_state_bytes``, ``task_timeout``, ``max_retries``,
            ``mp_context``, ...), given as
            ``parallel_config(backend="smartexec", task_timeout=60)``.
            ``max_workers`` comes from ``n_jobs``; ``prefer`` from joblib's.

    Raises:
        TypeError: ``max_workers`` is given (it comes from ``n_jobs``). An
            option ``SmartExecutor`` does not take fails :meth:`configure`,
            the message listing those it takes.
    """

    #: joblib's documented meaning of ``n_jobs=None``: 1, unless a
    #: ``parallel_config`` sets another.
    default_n_jobs = 1
    supports_inner_max_num_threads = False
    #: Results go through ``retrieve_result_callback``: ``return_as="generator"``,
    #: ``"generator_unordered"`` and ``timeout`` work.
    supports_retrieve_callback = True
    #: Work may run in other processes: ``require="sharedmem"`` makes joblib
    #: pick its threading backend instead.
    supports_sharedmem = False
    uses_threads = False

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        **executor_options: Any,
    ):
        if "max_workers" in executor_options:
            raise TypeError(
                "the smartexec joblib backend takes its max_workers from n_jobs: "
                "pass n_jobs= to Parallel or parallel_config instead of max_workers="
            )
        # Kept here, not passed up: joblib before 1.5 hands them to object().
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._options = executor_options
        self._executor: SmartExecutor | None = None
        self._executor_kwargs: dict[str, Any] = {}
        self._stoppable = False  # Parallel(timeout=): work stays where a call can be stopped
        #: (routed callable, mode, calls carry their callables, sender) per
        #: callable routed in this call; a few at most.
        self._batches: list[
            tuple[Callable[..., Any], str, bool, Callable[[list[Call]], Future[ChunkResult]]]
        ] = []
        self._lock = threading.Lock()
        self._last_decisions: tuple[Decision, ...] = ()
        self.parallel: Any = None

    # -- sizing ----------------------------------------------------------------

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """Workers for ``n_jobs``, with joblib's meaning of its values.

        Args:
            n_jobs: workers (int >= 1); -1 all CPUs, -2 all but one, and so
                on (``cpus + 1 + n_jobs``, at least 1); None: 1.

        Returns:
            The number of workers; 1 (joblib then runs the calls in the
            calling thread) inside a worker of an outer ``Parallel`` or
            of a smartexec worker process, so nested calls never multiply
            processes.

        Raises:
            ValueError: ``n_jobs`` is 0.
        """
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning; use n_jobs=1 or more, or -1")
        if n_jobs is None or self.nesting_level or current_platform().in_worker:
            return 1
        if n_jobs < 0:
            return max(current_platform().cpu_count + 1 + n_jobs, 1)
        return int(n_jobs)

    def configure(
        self,
        n_jobs: int = 1,
        parallel: Any = None,
        prefer: str | None = None,
        require: str | None = None,
        **backend_kwargs: Any,
    ) -> int:
        """Start the ``SmartExecutor`` for ``n_jobs`` workers (joblib calls this).

        Args:
            n_jobs: as for :meth:`effective_n_jobs`.
            parallel: the ``joblib.Parallel`` being run.
            prefer: joblib's hint, passed to ``SmartExecutor(prefer=...)``
                (``"threads"`` or ``"processes"``); None lets smartexec choose.
            require: joblib's constraint; ``"sharedmem"`` never reaches
                this backend (joblib switches to threads).
            **backend_kwargs: joblib's own pool options (``max_nbytes``,
                ``temp_folder``, ``mmap_mode``, ``verbose``, ``context``)
                are ignored; any other is a ``SmartExecutor`` option.

        Returns:
            The number of workers.

        Raises:
            joblib's FallbackToBackend: one worker: joblib runs the calls in
                the calling thread.
            TypeError, ValueError: a ``SmartExecutor`` option is wrong (its
                message says which and what is accepted).
        """
        from joblib._parallel_backends import FallbackToBackend, SequentialBackend

        n = self.effective_n_jobs(n_jobs)
        if n == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        options = {
            **self._options,
            **{k: v for k, v in backend_kwargs.items() if k not in _JOBLIB_POOL_OPTIONS},
        }
        if prefer is not None:
            options["prefer"] = prefer
        self.terminate()
        self._executor_kwargs = {"max_workers": n, **options}
        # Parallel(timeout=) stops the run itself (abort_everything kills
        # the workers), which only works where a running call can be
        # stopped: work stays off threads, as under a task_timeout (a thread
        # cannot be stopped: a callable measured to wait went there, and a
        # 0.5 s timeout waited 5 s). No deadline of ours: joblib's own rule
        # decides (in "generator_unordered" mode a long call may run on
        # while others complete).
        self._stoppable = getattr(parallel, "timeout", None) is not None
        self._executor = self._new_executor()
        self.parallel = parallel
        return n

    def _new_executor(self) -> SmartExecutor:
        """A ``SmartExecutor`` with this backend's settings (kept off threads under a timeout)."""
        executor = SmartExecutor(**self._executor_kwargs)
        if self._stoppable:
            executor._keep_stoppable()
        return executor

    # -- running batches -------------------------------------------------------

    @property
    def executor(self) -> SmartExecutor | None:
        """The ``SmartExecutor`` running this backend's batches, or None outside a call.

        Its :meth:`~smartexec.SmartExecutor.decisions` say where each
        function went and why.
        """
        return self._executor

    def _sender(
        self, fn: Callable[..., Any], mode: str
    ) -> tuple[Callable[[list[Call]], Future[ChunkResult]], bool]:
        """The chunk sender for batches routed on ``fn`` in this call (routed and prepared once).

        Args:
            fn: the callable to route on; ``mode``: as :func:`_split` says.

        Returns:
            The sender, and whether each call carries its own callable
            (False: the runner calls ``fn``). A function, or a callable
            object shared with the workers by copy-on-write, is called as
            itself; other callable objects travel with their items, so
            that each item's object is the one called, as in a serial loop.
        """
        executor = self._executor
        if executor is None:
            raise RuntimeError(
                "the smartexec joblib backend is not configured: joblib.Parallel "
                "calls configure() before its first batch"
            )
        with self._lock:
            for known, known_mode, each, send in self._batches:
                if mode.startswith("mixed") or known_mode.startswith("mixed"):
                    found = mode == known_mode
                elif each:
                    found = alike(known, fn)
                else:
                    found = same_function(known, fn) and (mode == "same" or _is_function(fn))
                if found:
                    return send, each
            nested, nested_n_jobs = self.get_nested_backend()
            chosen: list[bool] = []

            def runner(decision: Decision) -> _Batch:
                each = mode.startswith("mixed") or not (
                    _is_function(fn) or (decision.share and mode == "same")
                )
                chosen.append(each)
                profile = decision.profile
                own = profile is None or profile.effects.owns_calls()
                snapshots = profile is None or profile.effects.keeps_writes()
                return _Batch(_call if each else fn, nested, nested_n_jobs, own, snapshots)

            _, send = _chunk_sender(executor, fn, runner)
            # Holding fn keeps the objects same_function compares alive for
            # the call: their ids cannot be reused.
            self._batches.append((fn, mode, chosen[0], send))
            return send, chosen[0]

    def submit(
        self, func: Any, callback: Callable[[Any], Any] | None = None
    ) -> Future[ChunkResult]:
        """Send one joblib batch to the backend its function is routed to.

        Args:
            func: a ``joblib.parallel.BatchedCalls``.
            callback: called with the returned future once it is done.

        Returns:
            A ``concurrent.futures.Future``; :meth:`retrieve_result_callback`
            turns it into the batch's list of results.

        Raises:
            TypeError: ``func`` is not a joblib batch.
            RuntimeError: the backend is not configured, or was shut down.
        """
        if not isinstance(func, BatchedCalls):
            raise TypeError(
                f"the smartexec joblib backend runs joblib's batches (BatchedCalls), "
                f"got {type(func).__qualname__}; call it through joblib.Parallel"
            )
        if len(func.items) == 0:
            future: Future[ChunkResult] = Future()
            future.set_result(ChunkResult([(True, [])], 0.0))
        else:
            fn, mode, items = _split(func)
            send, each = self._sender(fn, mode)
            if each:
                calls = [((f, *args), dict(kwargs)) for f, args, kwargs in items]
            else:
                calls = [(tuple(args), dict(kwargs)) for _, args, kwargs in items]
            future = send([(_flat(calls), {})])
        if callback is not None:
            future.add_done_callback(callback)
        return future

    # joblib before 1.5 calls apply_async.
    apply_async = submit

    def retrieve_result_callback(self, out: Future[ChunkResult]) -> list[Any]:
        """The batch's results, in order, or its first exception, unchanged.

        An exception from the user's function is raised as it was raised
        (from a process worker with the worker's traceback as its
        ``__cause__``); a worker that died raises
        :class:`~smartexec.errors.WorkerCrashedError`.
        """
        return _result(out)

    # -- ends ------------------------------------------------------------------

    def stop_call(self) -> None:
        """Forget the call's prepared callables: the next call sees their state anew."""
        self._batches.clear()

    def terminate(self) -> None:
        """Shut the executor down and wait for its workers to exit (joblib calls this)."""
        self._retire().shutdown(wait=True, cancel_futures=True)
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Stop all batches now (a batch failed): kill process workers mid-task.

        Args:
            ensure_ready: start a fresh executor with the same settings, for
                a ``with Parallel(...)`` block's next call.
        """
        executor = self._retire()
        executor.terminate()
        executor.shutdown(wait=True)
        if ensure_ready and self._executor_kwargs:
            self._executor = self._new_executor()

    def _retire(self) -> SmartExecutor | _NoExecutor:
        """Detach the executor (its decisions kept for :meth:`decisions`) and return it."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._batches.clear()
        if executor is None:
            return _NoExecutor()
        self._last_decisions = executor.decisions()
        return executor

    def decisions(self) -> tuple[Decision, ...]:
        """The routing decisions of this backend's executor, latest last.

        Those of the current call's executor, or after joblib ended the call
        (:meth:`terminate`), of the last one: where each function went and why.
        """
        executor = self._executor
        return self._last_decisions if executor is None else executor.decisions()


class _NoExecutor:
    """Stands in for an executor already shut down."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass

    def terminate(self) -> None:
        pass


def register(make_default: bool = False) -> None:
    """Register the backend ``"smartexec"`` with joblib (importing this module does it).

    Idempotent: calling it again registers the same factory again.

    Args:
        make_default: also make it joblib's default backend, used by every
            ``Parallel`` not given one (``joblib.register_parallel_backend``'s
            ``make_default``).
    """
    joblib.register_parallel_backend(BACKEND_NAME, SmartBackend, make_default=make_default)


register()


def _chunk_sender(
    ex: SmartExecutor, fn: Callable[..., Any], runner: Callable[[Decision], Callable[..., Any]]
) -> tuple[Decision, Callable[[list[Call]], Future[ChunkResult]]]:
    """Route ``fn`` as ``ex.submit`` does; return a sender of chunks of its runner.

    For adapters whose unit of work is their own batch of calls to ``fn``
    (:mod:`smartexec.joblib`): ``runner(decision)`` makes what the
    workers call, a callable whose state is ``fn`` or less (plus small
    settings), so ``fn``'s decision (backend, sharing by copy-on-write)
    holds for it. It is prepared once, as for one ``map``: every chunk
    sent sees ``fn``'s state as it was at the first.

    Returns:
        The decision, and ``send(calls)``: one chunk of ``runner`` over
        ``calls`` (``(args, kwargs)`` pairs), a future of its
        :class:`~smartexec._remote.ChunkResult`; a chunk that cannot be
        pickled fails that future with a
        :class:`~smartexec.errors.PayloadPicklingError`.

    Raises:
        RuntimeError: after :meth:`shutdown`.
        concurrent.futures.BrokenExecutor: a backend is broken (its
            initializer failed).
    """
    with ex._lock:
        check_open(ex)
        decision, _ = ex._router.route(fn, ex._task_timeout)
        backend = ex._backend(decision.backend)
        target = backend.prepare(runner(decision), decision.share)
        ex._started.add(backend.name)
    stats = ex._stats
    task_timeout = ex._task_timeout

    def send(calls: list[Call]) -> Future[ChunkResult]:
        try:
            # task_timeout per call of the batch, as map() gives a chunk
            timeout_s = chunk_timeout(task_timeout, len(calls), None)
            return send_chunk(backend, target, calls, None, timeout_s, stats)
        except Exception as exc:
            if not is_pickling_failure(exc):
                raise
            error = explain_pickling(fn, calls, exc, backend.name)
            failed: Future[ChunkResult] = Future()
            failed.set_exception(error)
            return failed

    return decision, send
