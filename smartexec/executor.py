"""SmartExecutor: a ``concurrent.futures.Executor`` that routes each callable.

For each callable, :mod:`smartexec.inspection` says what it is and how big its
state is, :func:`smartexec.policy.decide` picks a backend and says why, and the
chosen backend (:mod:`smartexec.backends`) runs it in chunks. Decisions are
cached per callable (weakly: the cache never keeps a callable alive).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future
from typing import Any, Literal, TypeVar

from . import _initializer, _open_maps, _profiles, _setup
from ._code_hint import arithmetic_only
from ._identity import identity_key
from ._inputs import common_length
from ._map_run import MapRun
from ._map_run import check_task_timeout as _check_task_timeout
from ._mapping import as_generator
from ._open_maps import OpenMaps
from ._router import Router
from ._submit_route import SubmitRoute
from ._system import current_platform, interpreter_exiting
from .backends._base import Backend
from .errors import (
    InitializerError,
)
from .inspection import callable_name, payload_size
from .policy import (
    BIG_STATE_BYTES,
    Decision,
    Options,
)
from .progress import ProgressFactory, progress_factory, track
from .registry import create_backend, get_backend_class
from .stats import ExecutorStats, StatsRecorder
from .tuning import Estimate

__all__ = ["SmartExecutor"]

T = TypeVar("T")

#: Most decisions kept for :meth:`SmartExecutor.decisions`.
DECISION_LOG_SIZE = 1000


def check_open(executor: SmartExecutor) -> None:
    error = executor._broken_error()
    if error is not None:
        # As a broken stdlib pool: submit raises its Broken* error.
        if isinstance(error, InitializerError):
            raise error.again()
        raise BrokenExecutor(str(error)) from error
    if executor._shutdown:
        raise RuntimeError("cannot schedule new futures after shutdown")
    if interpreter_exiting():
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")


class SmartExecutor(Executor):
    """An executor that picks threads, fork workers, loky workers or inline per callable.

    Mirrors ``concurrent.futures.Executor``: ``submit``, ``map``,
    ``shutdown`` and the context-manager protocol behave as in the stdlib
    (Python 3.14's ``map(buffersize=)``, ``terminate_workers()`` and
    ``kill_workers()`` included, on every supported Python), so
    it works wherever an executor is expected (``loop.run_in_executor``,
    ``concurrent.futures.wait`` / ``as_completed``).

    Args:
        max_workers: workers per backend (int >= 1, or any integer type:
            numpy's too; a bool is refused), fixed, as the stdlib pools
            take it. None means one per usable CPU for process
            backends; threads start at ``min(32, cpus + 4)``, as
            ``ThreadPoolExecutor``'s, and grow while calls queue and the
            threads mostly wait (up to
            :data:`~smartexec.tuning.MAX_WAITING_THREADS`, see
            :class:`~smartexec.backends.thread.ThreadBackend`). The only argument taken by
            position (the stdlib pools differ from the second on); every
            other one is keyword-only.
        max_threads: the thread pool's width (int >= 1), fixed, in place of
            ``max_workers`` for threads only; None: ``max_workers``'s rule.
            ``SmartExecutor(max_processes=4)`` caps process workers at 4
            and lets threads grow for waiting work; ``max_threads=64`` fixes
            the thread pool at 64 and leaves process workers at one per CPU.
        max_processes: the process backends' worker count (int >= 1: fork,
            loky, a plugin's that does not run in this process), in place of
            ``max_workers`` for them only; None: ``max_workers``'s rule.
        initializer: called as ``initializer(*initargs)`` once in every
            worker before its first task, as the stdlib pools do: in each
            thread of the thread backend, in each fork worker (after its
            fork, replacement workers too), in each loky worker; with
            ``backend="inline"``, once in the calling thread before the
            first item. With an initializer set, ``map`` never runs items in
            the calling thread to measure them. When it raises, the executor
            is broken as a stdlib pool is: pending futures of that backend
            fail, and ``submit`` / ``map`` raise from then on, with
            :class:`~smartexec.errors.ProcessInitializerError` (a
            ``BrokenProcessPool``) or
            :class:`~smartexec.errors.ThreadInitializerError` (a
            ``BrokenThreadPool``), which names the initializer and chains
            its exception; the failure is also logged (CRITICAL, logger
            ``concurrent.futures``). None: nothing runs.
        initargs: the initializer's arguments (a tuple). Fork workers
            inherit them; loky pickles them with cloudpickle.
        max_tasks_per_child: calls (not chunks) a worker process runs
            before it exits and is replaced by a fresh one (int >= 1), as
            ``ProcessPoolExecutor``'s; chunks then hold at most this many
            items. Honoured by fork workers (unlike the stdlib, whose fork
            start method refuses it: ours fork from a clean zygote), so
            process work goes to fork, not loky. Threads are not processes:
            the thread backend ignores it. None: workers live as long as the
            executor.
        mp_context: a multiprocessing context (or its start method name)
            fixing how worker processes start: ``"fork"`` (or None) allows
            the fork backend; ``"spawn"`` and ``"forkserver"`` send process
            work to loky, whose workers start as fresh interpreters (its own
            fork+exec; the context object itself is not used), and
            ``explain()`` says so.
        backend: force every call onto one backend: ``"thread"``, ``"fork"``,
            ``"loky"``, ``"inline"``, ``"dask"`` or a registered plugin name. None lets the
            policy choose per callable.
        prefer: ``"threads"`` or ``"processes"``: a hint the policy follows
            unless the callable's state must not be pickled.
        big_state_bytes: callables whose state (bound object, closure cells,
            partial arguments) pickles to more bytes than this are shared with
            fork workers by copy-on-write instead of pickled (without fork:
            sent once to each loky worker and kept there). Default 1 MiB.
            Numpy arrays of 1 MiB or more, arguments and results alike,
            always cross to process workers through shared memory
            (:mod:`smartexec.transport`).
        task_timeout: seconds one task (one item) may run once started.
            On the fork backend a task over it is stopped (its worker is
            killed and replaced) and its future raises
            :class:`~smartexec.errors.TaskTimeoutError`; on threads the
            future raises at the deadline while the call runs on (threads
            cannot be stopped). Callables the policy would send to loky go
            to fork instead. A ``map`` call may set its own. None: no limit.
        max_retries: times a task whose worker process died
            (:class:`~smartexec.errors.WorkerCrashedError`) is run again
            before its future fails (0, the default: never). Whatever its
            value, a ``map`` chunk of several items whose worker died is
            re-sent one item per chunk (charged to none of them), so only
            the item that kills its worker fails, at its own position.
        allow_inline: let ``map`` run items of a callable routed to process
            workers in the calling thread: its first items for about 10 ms
            to measure them (per-item time, pickling cost, GIL use: a
            callable found to release the GIL moves to threads), and the
            whole map when a plain loop is predicted to be as fast. False
            (the default): such items are measured only in worker processes,
            so a crash there (a segfault in a C extension, ``os._exit``)
            fails its item with :class:`~smartexec.errors.WorkerCrashedError`
            (a ``BrokenProcessPool``) instead of killing this process; the
            first chunks are small, to measure the items in the workers, and
            an unmeasured callable that may hold the GIL stays on processes.
            Once the workers' figures show threads or a loop here faster,
            the rest of the map, the callable's later maps and submits, and
            (through the profile store) a later run's, run in this process;
            ``prefer="processes"`` keeps every item in workers. Callables
            routed to threads are measured in this process either way (they
            run in it).
        progress: the default for ``map``'s ``progress``: True draws a tqdm
            bar that counts items for every ``map``; a tqdm-like factory
            (:data:`smartexec.progress.ProgressFactory`) draws its bars;
            False (the default) draws none.
        **backend_options: options for the backend named by ``backend``,
            passed to its constructor, e.g.
            ``SmartExecutor(backend="dask", address="tcp://10.0.0.5:8786")``
            (see each backend's class for the options it takes; the built-in
            ``dask`` backend is the only one that takes any).

    A backend named by ``backend`` is created here, at once, so that a bad
    option or an unreachable cluster fails this call rather than the first
    ``submit``. Other backends start when the policy first picks them.

    Raises:
        ValueError: ``max_workers``, ``max_threads`` or ``max_processes`` is not positive, or ``prefer`` is not
            one of the accepted values; ``max_tasks_per_child`` is below 1,
            or set where no backend can honour it (``backend="loky"``, or an
            ``mp_context`` that is not fork); ``mp_context`` names a start
            method this platform lacks, or contradicts ``backend="fork"``.
        TypeError: ``max_workers``, ``max_threads`` or ``max_processes`` is not an int; ``initializer`` is not
            callable (``"initializer must be a callable"``, as the stdlib);
            ``max_tasks_per_child`` is not an int; ``mp_context`` is not a
            context; ``initializer`` is given for a backend that cannot run
            one; ``progress`` is neither a bool nor callable;
            ``allow_inline`` is not a bool; backend options were given without
            ``backend``, or the backend does not take one of them (the
            message lists those it takes).
        ImportError: ``progress=True`` and tqdm is not installed
            (``pip install 'smartexec[progress]'``).
        ValueError: ``task_timeout`` is not positive, ``max_retries`` is
            negative, or ``backend`` names a backend that cannot time out a
            task while ``task_timeout`` is set.
        smartexec.errors.UnknownBackendError: no backend has the given name.
        smartexec.errors.BackendUnavailableError: the backend cannot run here
            (e.g. its package is not installed; the message says how to).
        OSError: the named backend could not start or reach its workers.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        max_threads: int | None = None,
        max_processes: int | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_child: int | None = None,
        mp_context: Any = None,
        backend: str | None = None,
        prefer: Literal["threads", "processes"] | None = None,
        big_state_bytes: int = BIG_STATE_BYTES,
        task_timeout: float | None = None,
        max_retries: int = 0,
        progress: bool | ProgressFactory = False,
        allow_inline: bool = False,
        **backend_options: Any,
    ):
        widths = _setup.Widths.checked(max_workers, max_threads, max_processes)
        _setup.check_arguments(
            backend=backend,
            prefer=prefer,
            big_state_bytes=big_state_bytes,
            max_retries=max_retries,
            allow_inline=allow_inline,
            backend_options=backend_options,
        )
        task_timeout = _check_task_timeout(task_timeout)
        self._workers_setup = _setup.WorkerSetup(
            initializer,
            _initializer.check(initializer, initargs),
            _initializer.check_max_tasks(max_tasks_per_child),
        )
        start_method = _setup.start_method(mp_context)
        self._workers_setup.check(backend, start_method)
        _setup.check_forced_backend(backend, task_timeout)
        self._platform = current_platform()
        options = Options(
            backend=backend,
            prefer=prefer,
            big_state_bytes=big_state_bytes,
            stoppable=task_timeout is not None,
            # The stdlib needs a non-fork mp_context for max_tasks_per_child; ours
            # retires fork workers (forked from a single-threaded zygote, not from
            # this process), so with it the fork route stays open (docs/reliability.md).
            start_method=None
            if self._workers_setup.max_tasks_per_child is not None
            else start_method,
            retires_workers=self._workers_setup.max_tasks_per_child is not None,
            initializer=initializer is not None,
            allow_inline=allow_inline,
        )
        self._log: collections.deque[Decision] = collections.deque(maxlen=DECISION_LOG_SIZE)
        self._lock = threading.RLock()
        self._router = Router(
            self._platform, options, self._log, self._lock, initializer is not None
        )
        self._allow_inline = allow_inline
        self._task_timeout = task_timeout
        self._max_retries = max_retries
        self._progress = progress_factory(progress)
        self._max_workers = widths.max_workers
        self._widths = widths
        self._shutdown = False
        self._backends: dict[str, Backend] = {}
        self._stats = StatsRecorder()
        self._open_maps = OpenMaps()  # what shutdown() finishes
        self._open_maps.release_when_dropped(self, self._backends)
        self._started: set[str] = set()
        # Completed submits' figures (smartexec._submit_learning) move later
        # submits to threads only where the route is the policy's guess.
        self._submits = SubmitRoute(self, learns=options.routes_freely)
        if backend is not None:
            self._backends[backend] = create_backend(
                backend,
                self._widths.for_backend(backend),
                self._platform.cpu_count,
                {**backend_options, **self._workers_setup.for_backend(backend)},
            )

    def _broken_error(self) -> BaseException | None:
        """The error of a backend that can run nothing any more (an initializer failed)."""
        for backend in tuple(self._backends.values()):
            if not hasattr(type(backend), "broken"):
                continue  # cannot break (read on each submit: no instance lookup)
            error = backend.broken
            if error is not None:
                return error
        return None

    @property
    def _broken(self) -> str | bool:
        """As the stdlib pools' ``_broken``: False, or why the executor is broken."""
        error = self._broken_error()
        return False if error is None else str(error)

    # -- routing -----------------------------------------------------------------

    @property
    def _options(self) -> Options:
        """The user's options, as routing reads them (see :meth:`_keep_stoppable`)."""
        return self._router.options

    def _keep_stoppable(self) -> None:
        """Route as under a ``task_timeout``, with no deadline (:meth:`Router.keep_stoppable`).

        For joblib's ``Parallel(timeout=)``; no submit moves work to threads either.
        """
        self._router.keep_stoppable()
        self._submits.learns = False

    def _route_next(self, fn: Callable[..., Any], decision: Decision, why: str) -> None:
        """Start ``fn``'s next maps (and its submits) on ``decision``'s backend, saying why."""
        with self._lock:
            self._submits.follow_map(identity_key(fn), decision.backend)
            self._router.route_next(fn, decision, why)

    def _backend(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            backend = self._backends[name] = create_backend(
                name,
                self._widths.for_backend(name),
                self._platform.cpu_count,
                self._workers_setup.for_backend(name),
            )
        return backend

    def explain(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Decision:
        """Return the :class:`~smartexec.policy.Decision` for ``fn``; run nothing.

        Args:
            fn: the callable, as it would be passed to ``submit`` or ``map``.
            *args: an example call's positional arguments; when given (or
                ``**kwargs``), their pickled size is added to the reasons.
            **kwargs: that call's keyword arguments.

        Returns:
            The decision: ``.backend``, ``.reasons``, ``.share``, and
            ``str()`` for people. When that backend is already running, its
            own account follows the policy's reasons (the dask backend names
            its cluster: address, workers, and whether this executor owns it).

        Raises:
            TypeError: ``fn`` is not callable.
        """
        # A dry run: decisions() unchanged.
        decision, estimate = self._router.route(fn, self._task_timeout, record=False)
        # What its submits' figures decided, read only: explain() stores nothing.
        learned = self._submits.learned_route(fn)
        if learned is not None and decision.backend in ("fork", "loky") and not decision.share:
            decision = learned
        with self._lock:
            running = self._backends.get(decision.backend)
        explained = _explained(decision, estimate, running, fn, (args, kwargs))
        if self._options.prefer is None and not _runs_here(decision) and arithmetic_only(fn):
            # What MapRun._cheap_here does with a map's items, said here without them.
            note = (
                f"a map over small numbers (its code only does arithmetic) starts in a "
                f"loop in this thread, its first items timed, and moves to "
                f"{decision.backend} only if they turn out slow"
            )
            explained = dataclasses.replace(explained, reasons=(*explained.reasons, note))
        return explained

    def refresh(self, fn: Callable[..., Any]) -> bool:
        """Drop every copy of a shared callable's object kept for ``fn``'s workers.

        On fork and loky this is never needed for correct results: each
        ``map`` or ``submit`` sees the object as it was when it was called
        (fork forks fresh workers or proves their copy current by digest;
        loky compares its cached copy with the object before reusing it). It
        frees a kept copy at once. On the dask backend a callable with big
        state is scattered to the cluster once and changes the parent makes
        afterwards (``model.bias = 2``) are not seen: call ``refresh(fn)``
        after such a change.

        Args:
            fn: the callable, e.g. ``model.predict`` (or, on the dask backend,
                a big argument).

        Returns:
            True when some backend kept a copy of ``fn`` (now dropped), False
            when nothing needed doing.
        """
        with self._lock:
            backends = list(self._backends.values())
        refreshed = [backend.refresh(fn) for backend in backends]
        return any(refreshed)

    def stats(self) -> ExecutorStats:
        """Return where this executor's time went, per backend, and why workers idled.

        For each backend that ran work: items and chunks run, the chunksizes
        used, seconds working (in the calls, measured in the workers),
        waiting (worker time not in calls while work was in flight) and
        dispatching (the caller sending chunks); ``"inline"`` counts items
        run in the calling thread. ``.warnings`` holds one line per backend
        whose workers were busy under 80 % of the time, with the likely cause
        (chunks too small, payload too big, too few items), as mpire's
        insights do; ``str()`` prints it all with the last decisions.

        Returns:
            An :class:`~smartexec.stats.ExecutorStats` snapshot (it does not
            change as more work runs).
        """
        self._submits.fold_thread_calls()  # a cheap verdict's calls, not re-checked yet
        widths = {name: b.max_workers for name, b in list(self._backends.items())}
        return self._stats.snapshot(self.decisions(), widths)

    def decisions(self) -> tuple[Decision, ...]:
        """Return the routing decisions this executor made, oldest first.

        Keeps the last :data:`DECISION_LOG_SIZE` (the policy's decision for
        each new callable, and one entry per ``map`` saying what it ran on).
        """
        return tuple(self._log)

    # -- the Executor contract ---------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        submits = self._submits
        if submits.known:
            # On threads for good (see SubmitRoute.remember_fast): no lock of
            # ours and no routing, nearly as cheap as a ThreadPoolExecutor's
            # submit (the backend raises RuntimeError once shut down).
            fast = submits.fast_path(fn, self._shutdown)
            if fast is not None:
                return fast[2](fn, args, kwargs, fast[3])  # type: ignore[no-any-return]
        with self._lock:
            check_open(self)
            future, parked, run_here = submits.submit(self, fn, args, kwargs)
        if run_here is not None:
            run_here.run()  # a synchronous backend's call runs here, not under our lock
        if parked:
            # The calls on their way decide where this one runs: let the
            # thread that completes them have the GIL now, rather than after
            # the switch interval (5 ms) of a loop of submits.
            time.sleep(0)
        return future

    submit.__doc__ = (
        (Executor.submit.__doc__ or "")
        + """
        smartexec adds: the callable is routed to a backend by
        :meth:`explain`'s policy. Returns at once, however long the
        arguments take to pickle (plain data is pickled before it returns,
        anything else on a background thread, in submission order). While
        a process-routed callable's first calls are measured, calls beyond
        two per worker wait unsent in this process, as
        ``ProcessPoolExecutor`` queues calls beyond ``max_workers + 1``:
        their arguments are pickled when they are sent, or never if the
        measurement moves them to threads (``docs/routing.md``). When the
        callable or an argument cannot be sent to the chosen backend's
        workers, the future fails with
        :class:`~smartexec.errors.PayloadPicklingError` (a
        ``pickle.PicklingError``), as ``ProcessPoolExecutor``'s does;
        failures on the worker side are ``BrokenProcessPool`` subclasses
        (see ``docs/reliability.md``). Raises ``RuntimeError`` after
        :meth:`shutdown`. The future is a ``concurrent.futures.Future``
        subclass; it can be cancelled until a worker takes the call.
        """
    )

    async def run_async(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` run by this executor, from asyncio code.

        ``await ex.run_async(fn, *args, **kwargs)`` is
        ``await loop.run_in_executor(ex, fn, *args)`` with keyword arguments
        (no ``functools.partial``): the call goes through :meth:`submit`, so
        it is routed as a submit is (and a process route learns from its
        calls). The call starts when the coroutine does; gather or wrap them
        in tasks to run several at once. asyncio's default executor cannot be
        a SmartExecutor (``loop.set_default_executor`` takes only a
        ``ThreadPoolExecutor``); see ``docs/faq.md``.

        Args:
            fn: the callable, as for :meth:`submit`.
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            What ``fn`` returned.

        Raises:
            asyncio.CancelledError: the awaiting task was cancelled; the call
                is cancelled too and never runs if no worker has taken it
                yet (one already running runs on, as in ``concurrent.futures``).
            RuntimeError: the executor was shut down, or no event loop runs
                in this thread; or ``fn`` raised ``StopIteration``, which a
                coroutine cannot raise (it is the ``__cause__``).
            BaseException: whatever ``fn`` raised, unchanged (on a process
                backend, the unpickled copy ``Future.result()`` gives).
        """
        from . import _awaiting  # asyncio only for those who await (17 ms of import)

        return await _awaiting.run_async(functools.partial(self.submit, fn, *args, **kwargs))

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
        task_timeout: float | None = None,
        progress: bool | ProgressFactory | None = None,
        ordered: bool = True,
    ) -> Generator[T, None, None]:
        if not isinstance(ordered, bool):
            raise TypeError(
                f"ordered must be True (results in input order) or False (as they "
                f"complete), got {ordered!r} ({type(ordered).__qualname__})"
            )
        factory = self._progress if progress is None else progress_factory(progress)
        results = self._map(fn, iterables, timeout, chunksize, buffersize, task_timeout, ordered)
        if factory is not None:
            total = common_length(iterables)
            results = track(results, factory, total=total, desc=callable_name(fn))
        return as_generator(results)

    def _map(
        self,
        fn: Callable[..., T],
        iterables: tuple[Iterable[Any], ...],
        timeout: float | None,
        chunksize: int | None,
        buffersize: int | None,
        task_timeout: float | None,
        ordered: bool = True,
    ) -> Iterator[T]:
        """:meth:`map`'s work: the iterator of results (not always a generator); see :class:`MapRun`."""
        run = MapRun(self, fn, iterables, timeout, chunksize, buffersize, task_timeout, ordered)
        return run.start()

    def _ensure_open(self) -> None:
        """Raise as a shut-down or broken stdlib pool's ``submit`` does."""
        check_open(self)

    map.__doc__ = (
        (Executor.map.__doc__ or "")
        + """
        smartexec adds (each point in full in ``docs/reference/executor.md``):
        the input is read lazily, ``buffersize`` chunks ahead (default
        ``2 * workers + 2``; Python 3.14's argument, on every Python);
        ``chunksize`` is tuned from per-item times measured in the workers
        when not given; the result is a generator on every route; the first
        chunks measure the items, and the rest of the map may move once to a
        route predicted at least 1.3x faster (``docs/routing.md``); each
        item's exception is raised at its own position, and only the item
        that kills its worker fails; ``ordered=False`` yields results as
        their chunks complete; ``progress`` draws a tqdm bar (True), a
        factory's bar, none (False), or follows the executor's (None).
        Raises ``TypeError`` for a non-bool ``ordered``, ``ImportError`` for
        ``progress=True`` without tqdm.
        """
    )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
        if wait and not cancel_futures:
            self._submits.let_parked_go()
        with self._lock:
            parked = self._submits.close(cancel_futures)
            backends = list(self._backends.values())
            unsent = self._open_maps.take()
        # Not under self._lock: a moved call's done-callbacks (the user's) may submit.
        self._submits.finish(parked, cancel_futures)
        _open_maps.finish(unsent, backends, wait=wait, cancel_futures=cancel_futures)
        for backend in backends:
            backend.shutdown(wait=wait, cancel_futures=cancel_futures)
        # The profiles its maps measured, kept in memory meanwhile: written
        # now, not while those maps ran (see smartexec._profiles.save).
        _profiles.flush()

    shutdown.__doc__ = (
        (Executor.shutdown.__doc__ or "")
        + """
        smartexec adds (in full in ``docs/reference/executor.md``): every
        backend this executor started is shut down, and no worker process
        outlives ``shutdown(wait=True)``; idempotent. As the stdlib's
        ``map`` submits every item when called, the items not yet sent of
        every open map over an input of known length (no ``buffersize``)
        are sent first, and every chunk already sent finishes whole; submits
        still waiting for their callable's first figures are routed first,
        unless ``cancel_futures`` cancels them. Ctrl-C while it waits stops
        those maps' chunks.
        """
    )

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool | None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Ctrl-C (KeyboardInterrupt) or SystemExit: stop now rather than
            # wait for chunks nobody will read.
            self.terminate()
            return False
        return super().__exit__(exc_type, exc_val, exc_tb)

    def terminate(self) -> None:
        """Shut down now: cancel pending work and kill process workers mid-task.

        What a ``with`` block does when it ends by ``KeyboardInterrupt`` or
        ``SystemExit``. Chunks running on process workers fail with
        :class:`~smartexec.errors.WorkerCrashedError`; threads cannot be
        stopped, so calls running on the thread backend run on. Returns once
        every worker process is gone. Idempotent; afterwards the executor
        refuses new work, as after :meth:`shutdown`.
        """
        with self._lock:
            self._shutdown = True
            parked = self._submits.close(cancel=True)
            backends = list(self._backends.values())
        self._submits.finish(parked, cancel=True)
        for backend in backends:
            backend.terminate()

    def terminate_workers(self) -> None:
        """Send ``SIGTERM`` to every worker process, and shut down without waiting.

        Python 3.14's ``ProcessPoolExecutor.terminate_workers()``, for every
        backend this executor started: it is ``shutdown(wait=False,
        cancel_futures=True)`` (calls not started are cancelled, no new
        work is taken, no worker is replaced), then each worker process
        still alive is sent ``SIGTERM``: fork workers, and loky's. A call
        whose worker dies of it fails with ``BrokenProcessPool`` (a map
        raises it at that item's position); on fork, one whose worker
        outlives it (a handler for ``SIGTERM`` in the worker) ends as it
        would have, as in the stdlib, while on loky every running call fails
        at once (loky stops its whole pool once one worker dies). The fork
        pool's zygote, which forks the workers and runs no user code, is
        stopped as at shutdown. Threads cannot be signalled: calls
        running on the thread backend run on; a dask backend is shut down
        as by ``shutdown(wait=False, cancel_futures=True)``: its chunks'
        futures are cancelled and a ``LocalCluster`` it started is closed
        (a cluster it connected to runs on). Does nothing more on
        an executor that started no workers, and may be called again.
        Returns at once; ``shutdown()`` (``wait=True``, or leaving the
        ``with`` block) then waits until every worker process is gone.
        Afterwards ``submit`` and ``map`` raise ``RuntimeError``.
        """
        self._signal_workers(signal.SIGTERM)

    def kill_workers(self) -> None:
        """Send ``SIGKILL`` to every worker process, and shut down without waiting.

        Python 3.14's ``ProcessPoolExecutor.kill_workers()``: as
        :meth:`terminate_workers`, with ``SIGKILL``, which no worker can
        outlive, so every call running on a process backend fails with
        ``BrokenProcessPool``. (Where the platform has no ``SIGKILL``, it is
        ``SIGTERM``, as in the stdlib.)
        """
        self._signal_workers(getattr(signal, "SIGKILL", signal.SIGTERM))

    def _signal_workers(self, signum: int) -> None:
        with self._lock:
            self._shutdown = True
            parked = self._submits.close(cancel=True)
            backends = list(self._backends.values())
        self._submits.finish(parked, cancel=True)  # calls not started are cancelled
        for backend in backends:
            backend.signal_workers(signum)

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        started = ", ".join(sorted(self._started)) or "none yet"
        return f"<SmartExecutor {state}; backends started: {started}>"


def _runs_here(decision: Decision) -> bool:
    """Whether ``decision``'s backend runs calls in this process (threads, a loop)."""
    return bool(_setup.check_available(decision.backend).shares_memory)


def _explained(
    decision: Decision,
    estimate: Estimate,
    running: Backend | None,
    fn: Callable[..., Any],
    call: tuple[tuple[Any, ...], dict[str, Any]],
) -> Decision:
    """``decision`` with what :meth:`SmartExecutor.explain` adds to its reasons.

    How its workers start, the running backend's own account, the per-item
    figures of every item measured, its last map's route, and, for an
    example ``call`` (``(args, kwargs)``, both empty for none), its
    arguments' pickled size.
    """
    notes = list(running.describe(fn)) if running is not None else []
    started_by = _setup.start_method_note(get_backend_class(decision.backend))
    if started_by is not None:
        notes.insert(0, started_by)
    if estimate.per_item_s is not None:
        # Every item measured, all maps' (a map's line gives its first chunks' mean)
        notes.append(f"per item, over every item measured: {estimate}")
    last = estimate.last_map
    if last is not None:
        if f"its last map: {last.reasons[0]}" in decision.reasons:
            notes.append(f"its last map ran on {last.backend}")  # its figures are above
        else:
            notes.append(f"its last map ran on {last.backend}: {last.reasons[0]}")
    if any(call):
        size = payload_size(call)
        note = f"one call's arguments pickle to {size}"
        if _setup.check_available(decision.backend).shares_memory:
            note += " (not pickled on this backend)"
        notes.append(note)
    if not notes:
        return decision
    return dataclasses.replace(decision, reasons=(*decision.reasons, *notes))
