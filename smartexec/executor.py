"""SmartExecutor: a ``concurrent.futures.Executor`` that routes each callable.

For each callable, :mod:`smartexec.inspection` says what it is and how big its
state is, :func:`smartexec.policy.decide` picks a backend and says why, and the
chosen backend (:mod:`smartexec.backends`) runs it in chunks. Decisions are
cached per callable (weakly: the cache never keeps a callable alive).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import difflib
import inspect
import itertools
import multiprocessing
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Executor, Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal, TypeVar

from . import _initializer
from ._diagnose import is_pickling_failure, pickling_error
from ._futures import ChainedFuture
from ._identity import WeakCallable, identity_key
from ._mapping import (
    PICKLE_SAMPLE,
    TINY_ITEM_S,
    ChunkStream,
    InlineRun,
    as_generator,
    common_length,
    count_at_end,
    default_buffersize,
    drain,
    inline_batches,
    lazy_inline,
    measure_pickling,
    stream_values,
    then_raise,
)
from ._remote import Call, ChunkResult
from ._system import current_platform
from .backends._base import Backend
from .errors import (
    BackendUnavailableError,
    InitializerError,
    PayloadPicklingError,
    WorkerCrashedError,
)
from .gil import (
    GIL_DECIDED_S,
    GIL_MIN_ITEM_S,
    GIL_PROBE_MAX_ITEMS,
    GIL_PROBE_S,
    MANY_CORES,
    GilProfile,
    recall,
    recheck_due,
    remember,
    watch,
)
from .inspection import callable_name, inspect_callable, payload_size
from .policy import (
    BIG_STATE_BYTES,
    INITIALIZER_BY_VALUE,
    PREFER_VALUES,
    Decision,
    Options,
    decide,
    stoppable,
)
from .progress import ProgressFactory, progress_factory, track
from .registry import _accepted_options, create_backend, get_backend_class
from .stats import ExecutorStats, StatsRecorder
from .tuning import PROBE_MAX_ITEMS, PROBE_S, Estimate, Verdict, inline_verdict

__all__ = ["SmartExecutor"]

T = TypeVar("T")

#: Most decisions kept for :meth:`SmartExecutor.decisions`.
DECISION_LOG_SIZE = 1000

_interpreter_exiting = False


def _mark_interpreter_exit() -> None:
    global _interpreter_exiting
    _interpreter_exiting = True


# Runs before atexit handlers, as concurrent.futures' own hook does: from then
# on nothing may start workers (their exit hooks could no longer run).
getattr(threading, "_register_atexit", atexit.register)(_mark_interpreter_exit)


def _require_int(name: str, value: Any, what: str) -> None:
    """Raise TypeError unless ``value`` is an int (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__qualname__})")


def _check_task_timeout(value: Any) -> float | None:
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


def _takes_timeouts(backend: Any) -> bool:
    """Whether a backend's ``submit_chunk`` accepts ``timeout_s``."""
    try:
        return "timeout_s" in inspect.signature(backend.submit_chunk).parameters
    except (TypeError, ValueError):
        return False


def _send(
    backend: Backend,
    target: Any,
    calls: list[Call],
    budget_s: float | None,
    timeout_s: float | None,
    recorder: StatsRecorder,
) -> Future[ChunkResult]:
    """Send one chunk (with a timeout only when one is set) and count it for stats()."""
    start = time.perf_counter()
    if timeout_s is None:
        future = backend.submit_chunk(target, calls, budget_s)
    else:
        future = backend.submit_chunk(target, calls, budget_s, timeout_s=timeout_s)  # type: ignore[call-arg]
    recorder.track(
        backend.name, backend.max_workers, len(calls), future, time.perf_counter() - start
    )
    return future


def _other_threads() -> int:
    """Threads running besides the calling one and smartexec's pausable own.

    Ours are named ``smartexec-*`` (paused or released around a fork). loky's
    threads count: they cannot be paused, and a fork would copy their locks.
    """
    current = threading.current_thread()
    return sum(
        1
        for thread in threading.enumerate()
        if thread is not current and not thread.name.startswith("smartexec-")
    )


def _chunk_timeout(
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


def _release_backends(backends: dict[str, Backend]) -> None:
    """Shut down (without waiting) the backends of an executor that was dropped."""
    for backend in list(backends.values()):
        try:
            backend.shutdown(wait=False)
        except Exception:  # pragma: no cover - best effort during garbage collection
            pass


def _retryable(exc: BaseException) -> bool:
    """A worker death: the call itself may well succeed on a fresh worker."""
    return isinstance(exc, WorkerCrashedError)


def _options_without_backend(options: dict[str, Any]) -> str:
    """The message for backend options given with no ``backend=``."""
    own = (
        "max_workers",
        "backend",
        "prefer",
        "big_state_bytes",
        "task_timeout",
        "max_retries",
        "allow_inline",
    )
    names = ", ".join(f"{name}=" for name in sorted(options))
    close = [
        f"did you mean {match[0]}= for {name}=? "
        for name in sorted(options)
        if (match := difflib.get_close_matches(name, own, n=1))
    ]
    example = sorted(options)[0]
    return (
        f"SmartExecutor() got unexpected keyword argument(s) {names}. "
        + "".join(close)
        + f"Backend options need the backend that takes them, e.g. "
        f'SmartExecutor(backend="dask", {example}=...)'
    )


def _check_open(executor: SmartExecutor) -> None:
    error = executor._broken_error()
    if error is not None:
        # As a broken stdlib pool: submit raises its Broken* error.
        if isinstance(error, InitializerError):
            raise error.again()
        raise BrokenExecutor(str(error)) from error
    if executor._shutdown:
        raise RuntimeError("cannot schedule new futures after shutdown")
    if _interpreter_exiting:
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")


def _start_method(mp_context: Any) -> str | None:
    """The start method of ``mp_context`` (a multiprocessing context or its name), or None.

    Raises:
        TypeError: neither None, a context nor a string.
        ValueError: a start method this platform does not offer.
    """
    if mp_context is None:
        return None
    if isinstance(mp_context, str):
        method = mp_context
    elif callable(getattr(mp_context, "get_start_method", None)):
        method = mp_context.get_start_method(allow_none=False)
    else:
        raise TypeError(
            f"mp_context must be a multiprocessing context (e.g. "
            f'multiprocessing.get_context("spawn")), a start method name or None, got '
            f"{mp_context!r} ({type(mp_context).__qualname__})"
        )
    offered = multiprocessing.get_all_start_methods()
    if method not in offered:
        raise ValueError(
            f"mp_context: start method {method!r} is not offered here; this platform "
            f"offers {', '.join(map(repr, offered))}"
        )
    return str(method)


class _CallFuture(ChainedFuture):
    """The future ``submit`` returns; completed from its one-call chunk.

    A ``concurrent.futures.Future``: built with no argument (``type(fut)()``)
    it is a plain, pending one, as the stdlib's is.

    Args:
        inner: the chunk's future, or None for a plain future.
        fn: the user's callable (for a clear pickling error).
        call: its ``(args, kwargs)``.
        backend: the backend's name.
        resend: sends the call again (a retry after a worker died).
        retries: times to retry, at most.
    """

    def __init__(
        self,
        inner: Future[ChunkResult] | None = None,
        fn: Any = None,
        call: Call | None = None,
        backend: str = "",
        resend: Callable[[], Future[ChunkResult]] | None = None,
        retries: int = 0,
    ):
        super().__init__(inner)
        self._origin: tuple[Any, Call, str] | None = None if call is None else (fn, call, backend)
        self._resend = resend
        self._retries = retries
        if inner is not None:
            inner.add_done_callback(self._transfer)

    def _transfer(self, inner: Future[ChunkResult]) -> None:
        if (
            self._retries > 0
            and self._resend is not None
            and not inner.cancelled()
            and _retryable(inner.exception())  # type: ignore[arg-type]
        ):
            self._retries -= 1
            try:
                retry = self._resend()
            except BaseException as exc:  # e.g. the executor shut down meanwhile
                self._origin = self._inner = self._resend = None
                Future.set_running_or_notify_cancel(self)
                self.set_exception(exc)
                return
            self._inner = retry
            retry.add_done_callback(self._transfer)
            return
        origin, self._origin, self._inner, self._resend = self._origin, None, None, None
        if inner.cancelled():
            Future.cancel(self)
            self.set_running_or_notify_cancel()
            return
        error = inner.exception()
        if error is not None:
            if (
                origin is not None
                and not isinstance(error, (PayloadPicklingError, BrokenProcessPool))
                and is_pickling_failure(error)
            ):
                # A plugin backend's own pickling error: name the part that failed.
                fn, call, backend = origin
                error = pickling_error(fn, [call], error, backend)
            self.set_exception(error)
            return
        ok, value = inner.result().outcomes[0]
        if ok:
            self.set_result(value)
        else:
            self.set_exception(value)


class SmartExecutor(Executor):
    """An executor that picks threads, fork workers, loky workers or inline per callable.

    Mirrors ``concurrent.futures.Executor``: ``submit``, ``map``,
    ``shutdown`` and the context-manager protocol behave as in the stdlib, so
    it works wherever an executor is expected (``loop.run_in_executor``,
    ``concurrent.futures.wait`` / ``as_completed``).

    Args:
        max_workers: workers per backend (int >= 1). None means one per usable
            CPU for process backends and ``min(32, cpus + 4)`` for threads,
            as ``ThreadPoolExecutor`` does. The only argument taken by
            position (the stdlib pools differ from the second on); every
            other one is keyword-only.
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
            (the default): such items only ever run in worker processes, so
            a crash (a segfault in a C extension, ``os._exit``) fails its
            item with :class:`~smartexec.errors.WorkerCrashedError` (a
            ``BrokenProcessPool``) instead of killing this process; the
            first chunks are small, to measure the items in the workers, and
            an unmeasured callable that may hold the GIL stays on processes.
            Callables routed to threads are measured in this process either
            way (they run in it).
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
        ValueError: ``max_workers`` is not positive, or ``prefer`` is not
            one of the accepted values; ``max_tasks_per_child`` is below 1,
            or set where no backend can honour it (``backend="loky"``, or an
            ``mp_context`` that is not fork); ``mp_context`` names a start
            method this platform lacks, or contradicts ``backend="fork"``.
        TypeError: ``max_workers`` is not an int; ``initializer`` is not
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
        if max_workers is not None:
            _require_int("max_workers", max_workers, "an int or None")
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        if backend is not None and not isinstance(backend, str):
            raise TypeError(
                f"backend must be a backend name (str) or None, got {backend!r} "
                f'({type(backend).__qualname__}); e.g. backend="thread"'
            )
        _require_int("big_state_bytes", big_state_bytes, "an int (bytes)")
        if big_state_bytes < 0:
            raise ValueError(f"big_state_bytes must be >= 0, got {big_state_bytes}")
        if prefer is not None and prefer not in PREFER_VALUES:
            raise ValueError(
                f"prefer must be one of {', '.join(map(repr, PREFER_VALUES))} or None, "
                f"got {prefer!r}"
            )
        if backend_options and backend is None:
            raise TypeError(_options_without_backend(backend_options))
        task_timeout = _check_task_timeout(task_timeout)
        _require_int("max_retries", max_retries, "an int")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self._max_tasks_per_child = _initializer.check_max_tasks(max_tasks_per_child)
        start_method = _start_method(mp_context)
        self._check_worker_options(backend, start_method)
        if not isinstance(allow_inline, bool):
            raise TypeError(
                f"allow_inline must be True or False, got {allow_inline!r} "
                f"({type(allow_inline).__qualname__})"
            )
        if backend is not None:
            factory = self._check_available(backend)
            if task_timeout is not None and not _takes_timeouts(factory):
                raise ValueError(
                    f"backend {backend!r} cannot stop or time out one task, so "
                    f"task_timeout={task_timeout:g} cannot be honoured there; use "
                    f'backend="fork" (stops the task) or backend="thread" (fails the '
                    f"future at the deadline), or leave backend unset"
                )
        self._platform = current_platform()
        self._options = Options(
            backend=backend,
            prefer=prefer,
            big_state_bytes=big_state_bytes,
            stoppable=task_timeout is not None,
            # The stdlib needs a non-fork mp_context for max_tasks_per_child; ours
            # retires fork workers (forked from a single-threaded zygote, not from
            # this process), so with it the fork route stays open (docs/reliability.md).
            start_method=None if self._max_tasks_per_child is not None else start_method,
            retires_workers=self._max_tasks_per_child is not None,
            initializer=initializer is not None,
            allow_inline=allow_inline,
        )
        self._allow_inline = allow_inline
        self._task_timeout = task_timeout
        self._max_retries = max_retries
        self._progress = progress_factory(progress)
        self._max_workers = max_workers
        self._lock = threading.RLock()
        self._shutdown = False
        self._backends: dict[str, Backend] = {}
        self._decisions: dict[Any, tuple[WeakCallable, Decision, Estimate]] = {}
        self._decided_with_threads: dict[Any, bool] = {}
        self._stats = StatsRecorder()
        # Dropped without shutdown(): let the backends go when this object
        # dies, as the stdlib executors do (the callback holds no reference to self).
        weakref.finalize(self, _release_backends, self._backends)
        self._log: collections.deque[Decision] = collections.deque(maxlen=DECISION_LOG_SIZE)
        self._started: set[str] = set()
        if backend is not None:
            self._backends[backend] = create_backend(
                backend,
                max_workers,
                self._platform.cpu_count,
                {**backend_options, **self._worker_options(backend)},
            )

    def _check_worker_options(self, backend: str | None, start_method: str | None) -> None:
        """Refuse worker options no backend of this executor could honour.

        Raises:
            ValueError: ``max_tasks_per_child`` without fork workers, or an
                ``mp_context`` that contradicts ``backend="fork"``.
        """
        no_fork = start_method not in (None, "fork")
        if backend == "fork" and no_fork:
            raise ValueError(
                f'backend="fork" contradicts mp_context with start method {start_method!r}; '
                f"leave backend unset (process work then goes to loky) or use a fork context"
            )
        if self._max_tasks_per_child is None:
            return
        if backend is None and not current_platform().has_fork:
            raise ValueError(
                "max_tasks_per_child needs fork workers (loky cannot retire one worker "
                "after a number of tasks), but start method 'fork' is not available "
                "here; drop max_tasks_per_child"
            )

    def _worker_options(self, name: str) -> dict[str, Any]:
        """The worker options set by the user, for backend ``name``'s constructor.

        Raises:
            TypeError: an initializer is set and the backend cannot run one.
            ValueError: ``max_tasks_per_child`` is set and the backend runs
                worker processes it cannot retire.
        """
        wanted: dict[str, Any] = {}
        if self._initializer is not None:
            wanted["initializer"] = self._initializer
            wanted["initargs"] = self._initargs
        if self._max_tasks_per_child is not None:
            wanted["max_tasks_per_child"] = self._max_tasks_per_child
        if not wanted:
            return {}
        factory = get_backend_class(name)
        accepted = _accepted_options(factory)
        if accepted is None:
            return wanted
        if "initializer" in wanted and "initializer" not in accepted:
            raise TypeError(
                f"backend {name!r} cannot run an initializer= in its workers; use "
                f'backend="thread", "fork" or "loky", or leave backend unset'
            )
        if "max_tasks_per_child" in wanted and "max_tasks_per_child" not in accepted:
            if not getattr(factory, "shares_memory", False):
                raise ValueError(
                    f"backend {name!r} cannot retire a worker after max_tasks_per_child="
                    f'{self._max_tasks_per_child} tasks; use backend="fork" or leave '
                    f"backend unset"
                )
            del wanted["max_tasks_per_child"]  # threads and inline are no processes
        return wanted

    def _broken_error(self) -> BaseException | None:
        """The error of a backend that can run nothing any more (an initializer failed)."""
        for backend in list(self._backends.values()):
            error = getattr(backend, "broken", None)
            if error is not None:
                return error  # type: ignore[no-any-return]
        return None

    @property
    def _broken(self) -> str | bool:
        """As the stdlib pools' ``_broken``: False, or why the executor is broken."""
        error = self._broken_error()
        return False if error is None else str(error)

    @staticmethod
    def _check_available(name: str) -> type[Backend]:
        factory = get_backend_class(name)
        reason_of = getattr(factory, "unavailable_reason", None)
        reason = reason_of() if reason_of is not None else None
        if reason is not None:
            raise BackendUnavailableError(
                f"backend {name!r} cannot run here: {reason}", backend=name
            )
        return factory  # type: ignore[return-value]

    # -- routing -----------------------------------------------------------------

    def _route(self, fn: Callable[..., Any]) -> tuple[Decision, Estimate]:
        """The policy's decision for ``fn`` and its per-item estimate, cached weakly.

        Decided again when threads of the user's start or stop running (see
        :func:`smartexec.policy.decide`'s ``other_threads``).
        """
        key = identity_key(fn)
        threads = _other_threads()
        cached = self._decisions.get(key)
        if cached is not None and cached[0].matches(fn):
            decision, estimate = cached[1], cached[2]
            if (threads > 0) == self._decided_with_threads.get(key, False):
                return decision, estimate
            assert decision.profile is not None
            decision = decide(decision.profile, self._platform, self._options, recall(fn), threads)
            self._decisions[key] = (cached[0], decision, estimate)
            self._decided_with_threads[key] = threads > 0
            self._log.append(decision)
            return decision, estimate
        decision = decide(inspect_callable(fn), self._platform, self._options, recall(fn), threads)
        if INITIALIZER_BY_VALUE in decision.reasons:
            warnings.warn(
                f"{callable_name(fn)}: {INITIALIZER_BY_VALUE}", RuntimeWarning, stacklevel=3
            )
        estimate = Estimate()
        decisions = self._decisions  # the weakref callback must not hold self
        with_threads = self._decided_with_threads

        def forget() -> None:
            decisions.pop(key, None)
            with_threads.pop(key, None)

        handle = WeakCallable(fn, forget)
        if handle.weak:
            decisions[key] = (handle, decision, estimate)
            with_threads[key] = threads > 0
        self._log.append(decision)
        return decision, estimate

    def _with_timeout(self, decision: Decision, task_timeout: float | None) -> Decision:
        """Move a decision to a backend that can time out one task, if needed.

        Raises:
            ValueError: the user forced a backend that cannot time out a task.
        """
        if task_timeout is None:
            return decision
        threads = _other_threads()
        decision = stoppable(decision, self._platform, self._options, threads)
        if _takes_timeouts(get_backend_class(decision.backend)):
            return decision
        if self._options.backend is not None:
            raise ValueError(
                f"backend {decision.backend!r} cannot time out one task; use "
                f'backend="fork" or backend="thread" for task_timeout'
            )
        fork_ok = self._platform.has_fork and self._options.start_method in (None, "fork")
        target = "fork" if fork_ok and not threads else "thread"
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

    def _backend(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            backend = self._backends[name] = create_backend(
                name, self._max_workers, self._platform.cpu_count, self._worker_options(name)
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
        decision, estimate = self._route(fn)
        decision = self._with_timeout(decision, self._task_timeout)
        with self._lock:
            running = self._backends.get(decision.backend)
        notes = list(running.describe(fn)) if running is not None else []
        if estimate.per_item_s is not None:
            notes.append(f"measured so far: {estimate!r}")
        if estimate.last_map is not None:
            notes.append(
                f"its last map ran on {estimate.last_map.backend}: {estimate.last_map.reasons[0]}"
            )
        if notes:
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, *notes))
        if args or kwargs:
            size = payload_size((args, kwargs))
            note = f"one call's arguments pickle to {size}"
            if self._check_available(decision.backend).shares_memory:
                note += " (not pickled on this backend)"
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, note))
        return decision

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
        return self._stats.snapshot(self.decisions())

    def decisions(self) -> tuple[Decision, ...]:
        """Return the routing decisions this executor made, oldest first.

        Keeps the last :data:`DECISION_LOG_SIZE` (the policy's decision for
        each new callable, and one entry per ``map`` saying what it ran on).
        """
        return tuple(self._log)

    # -- the Executor contract ---------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            _check_open(self)
            decision, _ = self._route(fn)
            backend = self._backend(decision.backend)
            decision = self._with_timeout(decision, self._task_timeout)
            backend = self._backend(decision.backend)
            call: Call = (args, kwargs)
            timeout_s = self._task_timeout
            try:
                target = backend.prepare_call(fn, decision.share)

                def send() -> Future[ChunkResult]:
                    return _send(backend, target, [call], None, timeout_s, self._stats)

                inner = send()
            except Exception as exc:
                # As the stdlib: a call that cannot be sent fails its future,
                # submit() itself does not raise (the built-in process
                # backends never raise here; a plugin backend may).
                if not is_pickling_failure(exc):
                    raise
                error = exc
                if not isinstance(exc, PayloadPicklingError):
                    error = pickling_error(fn, [call], exc, backend.name)
                    error.__cause__ = exc
                failed: _CallFuture = _CallFuture()
                failed.set_exception(error)
                return failed
            self._started.add(backend.name)
        return _CallFuture(inner, fn, call, backend.name, send, self._max_retries)

    submit.__doc__ = (
        (Executor.submit.__doc__ or "")
        + """
        smartexec adds: the callable is routed to a backend by
        :meth:`explain`'s policy. Returns at once, however long the
        arguments take to pickle (plain data is pickled before it returns,
        anything else on a background thread, in submission order). When the
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

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
        task_timeout: float | None = None,
        progress: bool | ProgressFactory | None = None,
    ) -> Generator[T, None, None]:
        factory = self._progress if progress is None else progress_factory(progress)
        results = self._map(fn, iterables, timeout, chunksize, buffersize, task_timeout)
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
    ) -> Iterator[T]:
        """:meth:`map`'s work: the iterator of results (not always a generator)."""
        for name, value in (("chunksize", chunksize), ("buffersize", buffersize)):
            if value is not None:
                _require_int(name, value, "an int or None")
        if chunksize is not None and chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0.")
        task_timeout = _check_task_timeout(task_timeout)
        if task_timeout is None:
            task_timeout = self._task_timeout
        end_time = None if timeout is None else timeout + time.monotonic()
        remaining = common_length(iterables)
        inputs = zip(*iterables)
        with self._lock:
            _check_open(self)
            decision, estimate = self._route(fn)
            decision = self._with_timeout(decision, task_timeout)
            backend = self._backend(decision.backend)
        if backend.synchronous:
            initialize = getattr(backend, "initialize", None)
            if initialize is not None:
                initialize()  # backend="inline" runs the initializer in this thread
            return lazy_inline(fn, inputs, self._stats.inline)

        # Callables shared by copy-on-write never run here: their writes to
        # their own state must stay in the workers, for every item alike.
        # Threads start in microseconds and cost ~20 us a chunk, so measuring
        # in this thread first buys little there, and would block map() on
        # producer/consumer code (items that wait for the caller).
        # A route that rests on whether the callable holds the GIL is measured
        # on its first map, and again every GIL_RECHECK_MAPS maps. An item
        # that keeps the cores busy by itself (its own BLAS threads) is
        # measured on threads too: a loop is then as fast, with no
        # oversubscription.
        # Without allow_inline, no item of a process-routed callable runs here:
        # a crash must fail its item, not kill this process.
        inline_ok = self._allow_inline or backend.shares_memory
        gil_check = inline_ok and (
            decision.measure or (decision.gil is not None and recheck_due(fn))
        )
        parallel_already = (
            backend.shares_memory
            and decision.gil is not None
            and decision.gil.cores >= MANY_CORES
            and self._parallelism(backend, decision) <= 1
        )
        auto = (
            chunksize is None
            and self._options.backend is None
            and timeout is None
            and task_timeout is None
            and not decision.share
            and self._initializer is None
            and (gil_check or not backend.shares_memory or parallel_already)
        )

        def open_stream(
            rest: Iterator[tuple[Any, ...]], left: int | None, measure_first: bool = False
        ) -> ChunkStream:
            return self._open_stream(
                fn,
                decision,
                estimate,
                backend,
                rest,
                left,
                chunksize,
                buffersize,
                end_time,
                task_timeout,
                measure_first,
            )

        if auto and not inline_ok:
            stream = open_stream(inputs, remaining, measure_first=True)
            self._note(
                decision,
                estimate,
                decision.backend,
                (
                    "no items ran in this thread (a crash there would kill it): the first "
                    "chunks are small, to measure the items in the workers "
                    "(allow_inline=True measures here first)",
                ),
                stream,
            )
            return stream_values([], stream)
        if not auto:
            stream = open_stream(inputs, remaining)
            why = (
                "chunksize given"
                if chunksize is not None
                else "backend given"
                if self._options.backend is not None
                else "timeout given"
                if timeout is not None
                else "task_timeout given"
                if task_timeout is not None
                else "initializer given: every item runs in a worker that ran it"
                if self._initializer is not None
                else "shared by copy-on-write"
                if decision.share and backend.copy_on_write
                else "sent once per worker"
                if decision.share
                else "threads: nothing to measure first"
            )
            self._note(
                decision,
                estimate,
                decision.backend,
                (f"{why}: no items ran in this thread",),
                stream,
            )
            return stream_values([], stream)

        pickled = not backend.shares_memory
        star = len(iterables) != 1
        items: Iterator[Any] = inputs if star else iter(iterables[0])
        head: list[Any] = []
        if pickled and not star and isinstance(iterables[0], (list, tuple, range)):
            head = [(x,) for x in iterables[0][:PICKLE_SAMPLE]]  # a sample, not consumed
        elif pickled:
            # Kept as the probe reads them: reading ahead would block map() on
            # a slow producer.
            items = _recording(items, head, PICKLE_SAMPLE, star)
        run = InlineRun(fn, items, estimate, star, self._stats.inline)
        prefix: list[Any] = []
        measured_now = estimate.per_item_s is None
        if measured_now or gil_check:
            prefix = run.batch(PROBE_S, PROBE_MAX_ITEMS)
        if gil_check and self._worth_watching(run, estimate, backend, remaining):
            # Run the next items on two threads while sampling the GIL.
            watched = watch(fn, run.inputs, star, max_items=GIL_PROBE_MAX_ITEMS)
            prefix += watched.results
            self._stats.inline(len(watched.results), watched.profile.wall_s)
            run.items += len(watched.results)
            run.elapsed_s += watched.profile.wall_s
            run.error, run.exhausted = watched.error, watched.exhausted
            # Too short a watch (the input ran out) is no evidence to keep;
            # one that stopped early stopped on decisive figures.
            wall_s = watched.profile.wall_s
            if run.error is None and (
                wall_s >= GIL_PROBE_S / 2 or (not watched.exhausted and wall_s >= GIL_DECIDED_S)
            ):
                decision = self._measured(fn, decision, watched.profile)
                with self._lock:
                    _check_open(self)
                    backend = self._backend(decision.backend)
        if measured_now and pickled and not backend.shares_memory and prefix and run.error is None:
            measure_pickling(estimate, head[: len(prefix)], prefix[:PICKLE_SAMPLE])
        del head

        def rest() -> Iterator[tuple[Any, ...]]:
            return run.inputs if star else zip(run.inputs)

        def left() -> int | None:
            # None once past the end its __len__ gave: the length was wrong.
            return None if remaining is None or run.items > remaining else remaining - run.items

        def verdict() -> Verdict:
            return inline_verdict(
                per_item_s=estimate.per_item_s or 0.0,
                pickle_parent_s=0.0 if backend.shares_memory else estimate.pickle_parent_s,
                pickle_worker_s=0.0 if backend.shares_memory else estimate.pickle_parent_s,
                remaining=left(),
                n_workers=self._parallelism(backend, decision),
                startup_s=(
                    0.0
                    if backend.name in self._started
                    else backend.worker_startup_s * backend.max_workers
                ),
                overhead_s=backend.chunk_overhead_s,
            )

        if run.error is not None:
            return then_raise(prefix, run.error)
        if run.exhausted:
            self._note(
                decision,
                estimate,
                "inline",
                (
                    f"the whole input ({run.items} items) ran in this thread while measuring "
                    f"it: {run.elapsed_s * 1000:.1f} ms, "
                    f"{run.elapsed_s / max(run.items, 1) * 1e6:.2f} us per item",
                ),
            )
            return drain(prefix)
        if not (self._allow_inline or backend.shares_memory):
            # Measured on threads, which moved it to processes: no more items here.
            stream = open_stream(rest(), left())
            self._note(
                decision,
                estimate,
                decision.backend,
                (
                    f"after {run.items} items measured in this thread (routed to threads "
                    f"then), the rest runs on {decision.backend} (allow_inline=False)",
                ),
                stream,
            )
            return stream_values(prefix, stream)
        first = verdict()
        if not first.inline:
            stream = open_stream(rest(), left())
            self._note(decision, estimate, decision.backend, (first.reason,), stream)
            return stream_values(prefix, stream)
        self._note(decision, estimate, "inline", (first.reason,))

        def switch(reason: str) -> ChunkStream:
            stream = open_stream(rest(), left())
            self._note(
                decision,
                estimate,
                decision.backend,
                (f"after {run.items} items inline: {reason}",),
                stream,
            )
            return stream

        if measured_now and remaining is not None and (estimate.per_item_s or 0.0) < TINY_ITEM_S:
            # Sub-microsecond items of a sized input, just measured: the rest
            # runs as one C-level map, with no re-checks. Should the items turn
            # slow, the map costs what a plain loop costs (never more); the
            # batches below would cost 15-25 ns per item more on every tiny map.
            # (An estimate from an older map is re-checked: it may be stale.)
            rest_items = run.inputs
            n_rest = remaining - run.items
            return itertools.chain(
                drain(prefix),
                (itertools.starmap if star else map)(fn, rest_items),
                count_at_end(n_rest, time.perf_counter(), self._stats.inline),
            )
        return itertools.chain.from_iterable(inline_batches(prefix, run, left, verdict, switch))

    def _parallelism(self, backend: Backend, decision: Decision) -> int:
        """How many items ``backend`` can run at once for ``decision``'s callable.

        Threads beyond the CPU count only help calls that wait: a thread
        backend's ``min(32, cpus + 4)`` workers run computing calls (even
        GIL-releasing ones) on ``cpus`` cores; and an item measured to keep
        ``k`` cores busy (its own BLAS threads) leaves room for ``cpus / k``
        of them, so one that already uses every core is run inline.
        """
        gil = decision.gil
        if backend.shares_memory and (gil is None or gil.kind != "waits"):
            cpus = self._platform.cpu_count
            return max(1, min(backend.max_workers, gil.at_once(cpus) if gil else cpus))
        return backend.max_workers

    def _worth_watching(
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
            pickle_parent_s=0.0,
            pickle_worker_s=0.0,
            remaining=left,
            n_workers=min(backend.max_workers, self._platform.cpu_count),
            startup_s=0.0,
            overhead_s=backend.chunk_overhead_s,
        ).inline

    def _measured(self, fn: Callable[..., Any], decision: Decision, gil: GilProfile) -> Decision:
        """Decide again for ``fn`` with a GIL measurement; cache and log the result."""
        assert decision.profile is not None
        new = decide(decision.profile, self._platform, self._options, gil, _other_threads())
        remember(fn, gil)
        key = identity_key(fn)
        with self._lock:
            cached = self._decisions.get(key)
            if cached is not None and cached[0].matches(fn):
                self._decisions[key] = (cached[0], new, cached[2])
            self._log.append(new)
        return new

    def _open_stream(
        self,
        fn: Callable[..., Any],
        decision: Decision,
        estimate: Estimate,
        backend: Backend,
        inputs: Iterator[tuple[Any, ...]],
        remaining: int | None,
        chunksize: int | None,
        buffersize: int | None,
        end_time: float | None,
        task_timeout: float | None = None,
        measure_first: bool = False,
    ) -> ChunkStream:
        """Start sending ``inputs`` to ``backend`` in chunks; the first window goes now.

        ``measure_first``: until an item is measured, chunks grow from one
        item (see :class:`~smartexec._mapping.ChunkStream`).
        """
        with self._lock:
            _check_open(self)
            target = backend.prepare(fn, decision.share)
            self._started.add(backend.name)
            # max_tasks_per_child: a chunk holds at most that many calls, so a
            # fresh worker can always take it (the stream re-sends the rest,
            # as it does for a chunk stopped by its budget).
            cap: int | None = getattr(backend, "max_tasks_per_child", None)

            def send(calls: list[Call], budget_s: float | None) -> Future[ChunkResult]:
                if cap is not None:
                    calls = calls[:cap]
                return _send(
                    backend,
                    target,
                    calls,
                    budget_s,
                    _chunk_timeout(task_timeout, len(calls), estimate.per_item_s),
                    self._stats,
                )

            def explain_error(exc: BaseException, calls: list[Call]) -> BaseException:
                if is_pickling_failure(exc):
                    return pickling_error(fn, calls, exc, backend.name)
                return exc

            return ChunkStream(
                send=send,
                calls=((args, {}) for args in inputs),
                remaining=remaining,
                n_workers=backend.max_workers,
                overhead_s=backend.chunk_overhead_s,
                estimate=None if chunksize is not None else estimate,
                fixed_chunksize=chunksize,
                buffersize=buffersize or default_buffersize(backend.max_workers),
                end_time=end_time,
                on_chunk_error=explain_error,
                in_process=backend.shares_memory,
                max_retries=self._max_retries,
                measure_first=measure_first and chunksize is None,
                abort=backend.abort,
            )

    map.__doc__ = (
        (Executor.map.__doc__ or "")
        + """
        smartexec adds:

        * the input is read lazily and at most ``buffersize`` chunks are in
          flight (default ``2 * workers + 2``), so ``map`` over an endless
          generator streams in flat memory (``buffersize`` as in Python
          3.14's ``Executor.map``, counted in chunks);
        * with no ``chunksize``, chunks are sized from per-item time measured
          in the workers, re-tuned as chunks finish; workers stop a chunk that
          runs far past its expected time and the rest is re-chunked;
        * it returns a generator on every route (``close()``, ``send()``,
          ``throw()``; ``send(x)`` acts as ``next()``);
        * no item of a callable routed to process workers runs in the calling
          process (a crash fails its item with
          :class:`~smartexec.errors.WorkerCrashedError`, a
          ``BrokenProcessPool``); until the items are measured, chunks grow
          from one item (1, 2, 4, ...);
        * with ``SmartExecutor(allow_inline=True)``, or for a callable routed
          to threads, when the executor chose the backend (no ``backend=``),
          no ``chunksize``, no ``timeout`` and no ``initializer`` are given (nor
          a ``task_timeout``), the first items run
          in the calling thread for about 10 ms to measure them (their
          results are kept, and their side effects happen in this process);
          if a plain loop is predicted to be at least as fast, the whole map
          runs inline (see :meth:`decisions` for the figures). Callables
          shared with fork workers by copy-on-write never run in the calling
          thread;
        * each item's exception is raised at its own position, after the
          results of the items before it, even within a chunk; a chunk of
          several items whose worker died is re-sent one item per chunk, so
          only the culprit fails. An item's exception or ``timeout`` cancels
          every chunk not yet started (running ones finish, as in the
          stdlib); ``close()``, ``KeyboardInterrupt`` or ``SystemExit``
          also stops the chunks running on process workers (their workers
          are killed and replaced), so the next map does not wait for them;
        * ``progress``: True draws a tqdm bar that counts items (whatever the
          chunksize or backend) as their results are taken, a tqdm-like
          factory draws its own, False draws none, and None (the default)
          follows the executor's ``progress``. The bar's total is the
          input's length when known, and the bar is closed when the results
          end, raise, or the iterator is closed (:mod:`smartexec.progress`).
          Raises ``ImportError`` for True without tqdm installed
          (``pip install 'smartexec[progress]'``).
        """
    )

    def _note(
        self,
        decision: Decision,
        estimate: Estimate,
        backend: str,
        reasons: tuple[str, ...],
        stream: ChunkStream | None = None,
    ) -> None:
        """Log what a map did, with its measured figures, before the policy's reasons."""
        size = stream.sizes[0] if stream is not None and stream.sizes else None
        done = dataclasses.replace(
            decision,
            backend=backend,
            reasons=(*reasons, *decision.reasons),
            share=decision.share and backend == decision.backend,
            chunksize=size,
            measure=False,
        )
        estimate.last_map = done
        self._log.append(done)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            backends = list(self._backends.values())
        for backend in backends:
            backend.shutdown(wait=wait, cancel_futures=cancel_futures)

    shutdown.__doc__ = (
        (Executor.shutdown.__doc__ or "")
        + """
        smartexec adds: every backend this executor started is shut down;
        no worker process outlives a ``shutdown(wait=True)``. Idempotent.
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
            backends = list(self._backends.values())
        for backend in backends:
            backend.terminate()

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        started = ", ".join(sorted(self._started)) or "none yet"
        return f"<SmartExecutor {state}; backends started: {started}>"
