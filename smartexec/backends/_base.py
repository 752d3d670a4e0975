"""The backend interface: a few hooks and capability flags.

A backend runs *chunks*: a callable and a list of ``(args, kwargs)`` calls.
:meth:`Backend.submit_chunk` returns a ``concurrent.futures.Future`` whose
result is a :class:`~smartexec._remote.ChunkResult` (one outcome per call).
``SmartExecutor`` builds ``submit`` (a chunk of one) and ``map`` on top of it,
so chunksize tuning, streaming and error placement come for free.

Life of a backend, as ``SmartExecutor`` drives it::

    Backend(max_workers, cpu_count, **options)   # once, on first use (or at once,
                                                 # for the backend named by backend=)
    broken                                       # read before each submit / map
    prepare(fn, share) -> target                 # once per submit() / map()
    submit_chunk(target, chunk, budget_s)        # once per chunk, from any thread
    describe(fn), refresh(fn)                    # explain() / refresh()
    terminate()                                  # Ctrl-C in a with block
    signal_workers(signum)                       # terminate_workers() / kill_workers()
    shutdown(wait, cancel_futures=...)           # once or more; idempotent

Built-in backends and third-party plugins implement exactly this class and are
found through the same registry (:mod:`smartexec.registry`). A worker process
runs :func:`smartexec._remote.run_chunk` and, when its reply crosses a process
boundary, :func:`smartexec.transport.dumps_reply` / ``loads_reply``.
"""

from __future__ import annotations

import abc
import os
import signal
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol, TypeVar

from .._remote import Call, ChunkResult

__all__ = ["Backend", "check_open_files", "forced_by", "next_ready"]


_Item = TypeVar("_Item")


def next_ready(
    queue: deque[_Item], future_of: Callable[[_Item], Future[Any]], pickled: Callable[[_Item], bool]
) -> _Item | None:
    """Take the queue's first chunk that may start now, and start its future.

    Chunks start in the order they were queued, so one still being pickled
    holds those behind it (as the stdlib's feeder thread does). A cancelled
    chunk is dropped and its cancellation made known (``wait()`` and
    ``as_completed()`` see it); one whose future is done already (its
    pickling failed) is dropped. Only here does a chunk's future start
    running: until then it can be cancelled. Call it under the queue's lock.

    Args:
        queue: the chunks, oldest first (a ``deque``; taken from the left).
        future_of: a chunk's future.
        pickled: whether a chunk's payload is ready.

    Returns:
        The chunk, its future now running; None when the queue is empty or
        its first live chunk is still being pickled.
    """
    while queue:
        item = queue[0]
        future = future_of(item)
        if future.cancelled():
            queue.popleft()
            future.set_running_or_notify_cancel()  # tells wait() / as_completed()
            continue
        if future.done():  # its pickling failed: the error is on the future
            queue.popleft()
            continue
        if not pickled(item):
            return None  # still being pickled; whoever pickles it wakes the consumer
        queue.popleft()
        if future.set_running_or_notify_cancel():
            return item
    return None


def forced_by(signum: int) -> str:
    """Who sent ``signum`` to the workers, for error messages: ``"terminate_workers() (SIGTERM)"``."""
    name = {signal.SIGTERM: "terminate_workers()", getattr(signal, "SIGKILL", -1): "kill_workers()"}
    try:
        signame = signal.Signals(signum).name
    except ValueError:
        signame = f"signal {signum}"
    return f"{name.get(signum, 'SmartExecutor')} ({signame})"


#: Open files a process pool needs besides two per worker and what the
#: process has open already: fork: its zygote's control socket, the
#: dispatcher's wake-up pipe and poller, a reply's shared memory while it is
#: mapped; loky: its call and result queues. A fork pool of 2 measured 6 and
#: ran under ``ulimit -n 16``, as ``ProcessPoolExecutor(2)`` does.
POOL_FILES = 8


def _open_now() -> int:
    """Files this process has open now (0 where it cannot tell)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less listdir's own
        except OSError:
            continue
    return 0


def check_open_files(max_workers: int, backend: str) -> None:
    """Fail fast when a pool of ``max_workers`` processes cannot hold its pipes open.

    Counts what this process has open now, :data:`POOL_FILES` for the pool
    and two per worker (a fork pool keeps a pipe per worker, two pools'
    worth while one replaces the other; loky a sentinel and a pipe per
    process). Without this check a pool of thousands of workers starts them
    until ``EMFILE`` (or the machine's memory) stops it.

    Args:
        max_workers: the pool's processes.
        backend: its name, for the message (``"fork"``, ``"loky"``).

    Raises:
        ValueError: the process's open-file limit is too low, naming its
            soft limit and fixes that pass this check.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return
    if soft == resource.RLIM_INFINITY:
        return
    open_now = _open_now()
    needed = open_now + POOL_FILES + 2 * max_workers
    if needed <= soft:
        return
    bigger = max(needed, 1024)
    if hard != resource.RLIM_INFINITY:
        bigger = min(bigger, hard)
    fits = (soft - open_now - POOL_FILES) // 2
    fixes = []
    if bigger >= needed:
        fixes.append(
            f"raise the limit before creating the executor (ulimit -n {bigger}, or "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({bigger}, hard)))"
        )
    if fits >= 1:
        fixes.append(f"lower max_workers to at most {fits}")
    if not fixes:
        fixes.append("close files this process keeps open")
    advice = " or ".join(fixes)
    raise ValueError(
        f"max_workers={max_workers} on the {backend} backend needs about {needed} open "
        f"files: the {open_now} this process has open, {POOL_FILES} for the pool and 2 per "
        f"worker process; its RLIMIT_NOFILE soft limit is {soft} (ulimit -n). "
        f"{advice[0].upper()}{advice[1:]}"
    )


class PoolClocks(Protocol):
    """What a map on threads reads of the pool's threads (:class:`~smartexec.backends.thread.ThreadBackend`'s).

    Each returns seconds so far, summed over the threads, or None where the
    platform cannot tell (see the thread backend for each figure's source).
    """

    def threads_cpu_s(self) -> float | None: ...
    def threads_wanted_s(self) -> float | None: ...
    def threads_busy_s(self) -> float: ...
    def machine_idle_s(self) -> float | None: ...


class Backend(abc.ABC):
    """Base class of every backend.

    Capabilities are class attributes that callers read instead of checking
    types:

    Attributes:
        name: the short lowercase name the backend is registered under.
        shares_memory: workers run in the caller's process (threads, inline).
        pickles_closures: lambdas and closures can be sent (cloudpickle).
        copy_on_write: workers inherit the parent's memory at fork time.
        distributed: workers may run on other machines.
        synchronous: chunks run in the submitting thread before
            ``submit_chunk`` returns (inline).
        takes_timeouts: ``submit_chunk`` accepts a keyword ``timeout_s`` and
            fails the future with a
            :class:`~smartexec.errors.TaskTimeoutError` at the deadline
            (threads, fork). The executor refuses a ``task_timeout`` on a
            backend without it.
        stops_tasks: besides, the backend stops the chunk at the deadline
            (killing its worker). The executor routes callables with a
            ``task_timeout`` to such a backend where it can.
        calls_directly: :meth:`submit_call` runs one call with no chunk
            (threads: ``submit``'s fast route).
        max_tasks_per_child: the most calls a worker process runs before
            it is replaced (an int), or None; set per instance by backends
            that take the worker option of that name.
        worker_startup_s: seconds to start one worker, for the cost model of
            :mod:`smartexec.tuning` (measured by benchmarks/bench_overheads.py).
        chunk_overhead_s: seconds of dispatch per chunk (pickling, pipes,
            wake-ups), likewise.
        start_method: how the backend starts its worker processes, named in
            ``SmartExecutor.explain()`` (``"fork"``, ``"loky"``, or a
            multiprocessing start method); None for backends with no worker
            processes of their own (threads, inline, a cluster's).

    Args:
        max_workers: how many workers to run (int >= 1), or None for the
            backend's default (:meth:`default_workers`).
        cpu_count: CPUs this process may use (cgroups and affinity taken into
            account), for the default.

    *Worker options* are passed as keyword arguments only when the user sets
    them on ``SmartExecutor``, and only to backends whose signature names
    them: ``initializer`` and ``initargs`` (run ``initializer(*initargs)``
    once in each worker before its first chunk; when it raises, set
    :attr:`broken` and fail the pending chunks with it) and
    ``max_tasks_per_child`` (a worker process runs at most that many calls,
    then is replaced). The executor refuses to start a backend that cannot
    honour one that is set.

    Subclasses may take more keyword arguments (*backend options*): the user
    passes them to ``SmartExecutor(backend="name", option=...)``, which checks
    their names against this signature before calling it, and raises a
    ``TypeError`` naming the accepted ones when a name does not fit. Raise
    ``TypeError`` / ``ValueError`` for bad values, naming the option.
    """

    name: ClassVar[str] = ""
    shares_memory: ClassVar[bool] = False
    pickles_closures: ClassVar[bool] = False
    copy_on_write: ClassVar[bool] = False
    distributed: ClassVar[bool] = False
    synchronous: ClassVar[bool] = False
    takes_timeouts: ClassVar[bool] = False
    stops_tasks: ClassVar[bool] = False
    calls_directly: ClassVar[bool] = False
    max_tasks_per_child: int | None = None
    worker_startup_s: ClassVar[float] = 0.0
    chunk_overhead_s: ClassVar[float] = 0.0
    start_method: ClassVar[str | None] = None

    def __init__(self, max_workers: int | None, cpu_count: int):
        self.max_workers = (
            max_workers if max_workers is not None else self.default_workers(cpu_count)
        )

    @property
    def broken(self) -> BaseException | None:
        """Why this backend can run nothing any more, or None while it can.

        Set (by backends that take an ``initializer``) once the initializer
        raised in a worker: an :class:`~smartexec.errors.InitializerError`.
        ``SmartExecutor`` then raises a copy from ``submit`` and ``map``, as
        a broken stdlib pool does. The default is None.
        """
        return None

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        """Workers to run when the user gives no ``max_workers``: one per CPU."""
        return cpu_count

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run here, or None when it can.

        Read by ``available_backends()`` and before the backend is created.
        Say what is missing and how to get it, e.g. ``"start method 'fork'
        is not available on this platform"``. (A missing package is better
        reported by letting the module's import fail: the registry then adds
        the install hint.)
        """
        return None

    def prepare(self, fn: Callable[..., Any], share: bool) -> Any:
        """Return what :meth:`submit_chunk` should send in place of ``fn``.

        Called once per ``map`` (``submit`` calls :meth:`prepare_call`), in
        the submitting thread; the result is passed to every
        :meth:`submit_chunk` of that call, and dropped when the call is done.
        The default returns ``fn``.

        A backend that keeps a copy of a callable's state in its workers
        (fork: copy-on-write; dask: scattered once) returns a stand-in here.
        It must not keep ``fn`` alive beyond the calls that use it (hold it
        weakly, see :class:`smartexec._identity.WeakCallable`), and its
        workers must see ``fn``'s state as it is now or later, never an
        older copy.

        Args:
            fn: the user's callable.
            share: the policy's ``Decision.share``: ``fn``'s state is too big
                (or impossible) to pickle with every chunk and should reach
                the workers by copy-on-write (only backends with
                ``copy_on_write`` honour it; others may ignore it).

        Raises:
            smartexec.errors.PayloadPicklingError: ``fn`` must be sent now and
                cannot be pickled.
        """
        return fn

    def prepare_call(self, fn: Callable[..., Any], share: bool) -> Any:
        """:meth:`prepare` for ``submit``: one call, not a stream of chunks.

        A backend whose proof that a kept copy is current costs less than
        a fresh copy for one call, but more than that for a whole ``map``
        (fork: a digest against forking a new pool), overrides this. The
        default is :meth:`prepare`.

        Args:
            fn: the user's callable.
            share: as for :meth:`prepare`.
        """
        return self.prepare(fn, share)

    def submit_call(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_done: Any = None,
        context: Any = None,
    ) -> Future[Any]:
        """Run one call with no chunk; return a future of its result (where ``calls_directly``).

        ``submit``'s fast route (see
        :meth:`smartexec.backends.thread.ThreadBackend.submit_call`).

        Args:
            fn: the callable.
            args: its positional arguments (tuple).
            kwargs: its keyword arguments (dict).
            on_done: where the worker counts the call once it is over (a
                :class:`~smartexec.stats.CallLog`), or None.
            context: the ``contextvars.Context`` the call runs in a copy
                of, or None for the worker's own.

        Returns:
            A ``concurrent.futures.Future`` of what ``fn`` returns (or raises).

        Raises:
            NotImplementedError: the backend runs calls in chunks only (the default).
        """
        raise NotImplementedError(f"backend {self.name!r} runs calls in chunks only")

    def unclocked(self, fn: Any) -> Any:
        """What to send in place of ``fn`` (from :meth:`prepare`) for chunks whose CPU seconds nobody reads.

        A backend whose reading of a worker's CPU clock costs the work
        (threads under load) returns a stand-in that skips it; the default
        returns ``fn``.
        """
        return fn

    def initialize(self) -> None:
        """Run the worker initializer in the calling thread, for a ``synchronous`` backend.

        Called by a map before it runs items in the caller (inline); the
        default does nothing.
        """
        return None

    def runs_this_thread(self) -> bool:
        """Whether the calling thread is one of this backend's workers (default: False).

        A call there that maps on the same executor and waits for the
        results would wait for chunks queued behind itself.
        """
        return False

    def pool_clocks(self) -> PoolClocks | None:
        """The clocks of this backend's worker threads, where it has them in this process.

        Read by a map on threads to tell items that wait from items that
        take turns on the GIL (each figure in seconds, summed over the
        threads; see :class:`PoolClocks`).

        Returns:
            A :class:`PoolClocks`, or None (the default: no worker threads
            in this process).
        """
        return None

    def describe(self, fn: Callable[..., Any]) -> tuple[str, ...]:
        """Say, for ``SmartExecutor.explain``, where and how this backend would run ``fn``.

        Runs nothing and sends nothing. The default says nothing.

        Args:
            fn: the user's callable.

        Returns:
            Short sentences for people (e.g. the cluster's address and size),
            appended to the decision's reasons.
        """
        return ()

    def refresh(self, fn: Callable[..., Any]) -> bool:
        """Forget any copy of ``fn`` (or of this object) kept in the workers.

        The next chunks of ``fn`` then see its state as it is now. The default
        keeps no copies and returns False.

        Args:
            fn: a callable previously passed to :meth:`prepare`, or (for
                backends that keep big arguments) such an argument.

        Returns:
            True when a kept copy was dropped.
        """
        return False

    @abc.abstractmethod
    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        """Schedule ``fn`` over ``chunk``; return a future of its ChunkResult.

        Called from any thread (several at once). Unless the backend is
        ``synchronous``, it returns without waiting for the chunk to run.

        Args:
            fn: what :meth:`prepare` returned.
            chunk: a sequence of ``(args, kwargs)`` pairs (``tuple``,
                ``dict``), at least one; the backend must not modify it.
            budget_s: seconds; pass to :func:`smartexec._remote.run_chunk`:
                the worker may stop after this long and return outcomes for a
                prefix of the chunk only (the caller re-sends the rest); None
                runs the whole chunk.

        The executor passes a keyword ``timeout_s`` (seconds the chunk may
        run once started) only when the user set a ``task_timeout``; a
        backend that accepts it fails the future with
        :class:`~smartexec.errors.TaskTimeoutError` at the deadline (and
        sets ``takes_timeouts``, and ``stops_tasks`` when it also stops the
        work).

        Returns:
            A ``concurrent.futures.Future`` whose result is a
            :class:`~smartexec._remote.ChunkResult` with one outcome per call
            run (a prefix of ``chunk``, at least one). An exception raised by
            the user's function is an *outcome*, not the future's exception;
            the future fails only when the chunk as a whole could not run (a
            worker died, the reply could not be unpickled). Cancelling it
            before it runs cancels the chunk.

        Raises:
            smartexec.errors.PayloadPicklingError: ``fn`` or an argument cannot
                be sent to the workers (backends that pickle eagerly; others
                fail the future instead).
            RuntimeError: called after :meth:`shutdown`.
        """

    def abort(self, futures: Sequence[Future[ChunkResult]]) -> None:
        """Stop these chunks (one interrupted ``map``'s): cancel them, and stop running ones.

        Called by a ``map`` whose iteration ended by ``KeyboardInterrupt``,
        ``SystemExit`` or ``close()``, so that the next map does not wait for
        chunks nobody will read. The default cancels those not started and
        lets running ones finish (threads cannot be stopped); process
        backends override it to kill the workers running them (the pool
        replaces them). Returns without waiting for the chunks to end; a
        stopped chunk's future fails (nobody reads it). Chunks of other maps
        are not touched.

        Args:
            futures: futures returned by :meth:`submit_chunk` of this backend.
        """
        for future in futures:
            future.cancel()

    def terminate(self) -> None:
        """Stop now (Ctrl-C): cancel chunks not started, stop running ones if possible.

        Called by ``SmartExecutor`` when a ``with`` block ends with
        ``KeyboardInterrupt`` or ``SystemExit``. The default cancels what has
        not started and returns without waiting; process backends override it
        to kill their workers.
        """
        self.shutdown(wait=False, cancel_futures=True)

    def signal_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker process, and shut down without waiting.

        Called by ``SmartExecutor.terminate_workers()`` (``SIGTERM``) and
        ``kill_workers()`` (``SIGKILL``), which mirror Python 3.14's
        ``ProcessPoolExecutor`` methods: chunks not started are cancelled,
        no new chunk starts, no worker is replaced, and a chunk whose worker
        dies of the signal fails with ``BrokenProcessPool`` (not the
        :class:`~smartexec.errors.WorkerCrashedError` a map would re-send).
        Returns without waiting for the workers to exit; a later
        ``shutdown(wait=True)`` waits for them. The default, for backends
        with no worker processes of their own (threads, inline, a cluster's
        workers), is ``shutdown(wait=False, cancel_futures=True)``: calls
        already running there run on.

        Args:
            signum: the signal number, e.g. ``signal.SIGTERM``.
        """
        self.shutdown(wait=False, cancel_futures=True)

    @abc.abstractmethod
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers; mirrors ``concurrent.futures.Executor.shutdown``.

        Idempotent. With ``cancel_futures`` chunks not yet started are
        cancelled; with ``wait`` the call returns once every pending chunk has
        finished and every worker this backend started is gone. Without
        ``wait`` it returns at once and the workers stop once their chunks are
        done. Resources the backend did not start (a cluster it connected
        to) are left running.

        Args:
            wait: block until the workers are gone (bool).
            cancel_futures: cancel the chunks not yet started (bool).
        """
