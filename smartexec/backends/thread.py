"""The thread backend: chunks run on a ``concurrent.futures.ThreadPoolExecutor``.

Right for work that releases the GIL (numpy kernels, hashing, compression,
I/O) and for any work on a free-threaded build: nothing is pickled and the
workers share the caller's memory. While several chunks run at once, the
process's BLAS pools are capped so that chunks x BLAS threads stay within the
CPUs (:class:`smartexec._blas.ThreadCap`).
"""

from __future__ import annotations

import contextvars
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any

from .. import _initializer
from .._blas import THREAD_CAP
from .._context import on_threads
from .._deadlines import call_later
from .._remote import Call, ChunkResult, run_chunk
from .._system import SchedReader, sched_times
from .._threads import (
    _USER_CODE,
    mark_ours,
    running_user_code,
    user_code_ends,
    user_code_starts,
)
from ..errors import InitializerError, TaskTimeoutError, ThreadInitializerError
from ..stats import CALLS_BATCH, CallLog
from ..tuning import waiting_width
from ._base import Backend
from ._widener import _peek, _Widener

__all__ = ["ThreadBackend"]

#: Whether chunks on threads take a GIL watch (a sampler thread each, ~0.2 ms
#: a chunk and a thread switch or more under load). A map on threads reads
#: the kind from the cores its threads wanted (``ThreadBackend.threads_wanted_s``,
#: Linux schedstat) and their CPU clocks, not from watches, which see the
#: caller and the other pool threads hold the GIL too; only where schedstat
#: cannot be read do watches help decide (see ``_rerouting.Evidence``).
WATCH_GIL = sched_times() is None


class _ThreadInit:
    """The pool's initializer: runs the user's; on failure, records and logs it.

    It does not re-raise: the stdlib pool would then fail its queued work
    with a ``BrokenThreadPool`` that names nothing (and, on some versions,
    race with a map cancelling that work). Each chunk checks the record
    instead (:func:`_run_checked`), so the pool's threads fail every chunk
    with the error that names the initializer.
    """

    def __init__(self, initializer: Callable[..., Any], initargs: tuple[Any, ...], box: Any):
        self.initializer = initializer
        self.initargs = initargs
        self.box = box

    def __call__(self) -> None:
        try:
            with running_user_code():
                self.initializer(*self.initargs)
        except BaseException as exc:
            name = _initializer.name_of(self.initializer)
            error = ThreadInitializerError(
                _initializer.message(
                    name,
                    f"worker thread {threading.current_thread().name}",
                    f"{type(exc).__qualname__}: {exc}",
                ),
                initializer=name,
                backend="thread",
            )
            error.__cause__ = exc
            if self.box.record(error):
                _initializer.log_failure(error)


class ThreadBackend(Backend):
    """Runs chunks on a thread pool owned by this backend.

    Args:
        max_workers: threads (int), a fixed width as ``ThreadPoolExecutor``'s.
            None starts at the stdlib's ``min(32, cpu_count + 4)`` and lets
            the pool grow, up to :data:`~smartexec.tuning.MAX_WAITING_THREADS`
            (less where the open-files limit is low), while calls queue and
            its threads wait (I/O, sleeps): see :class:`_Widener`. With an
            ``initializer`` the width stays the stdlib's.
        cpu_count: CPUs this process may use.
        initializer: called as ``initializer(*initargs)`` once in each thread
            before its first chunk (None: nothing). When it raises, the
            backend is broken (:attr:`broken`): pending and later chunks fail
            with :class:`~smartexec.errors.ThreadInitializerError`, a
            ``BrokenThreadPool``.
        initargs: the initializer's arguments (tuple).
    """

    name = "thread"
    takes_timeouts = True
    calls_directly = True
    shares_memory = True
    pickles_closures = True
    #: Source: benchmarks/bench_overheads.py (2-core machine, 2026-11-29).
    worker_startup_s = 0.0005
    chunk_overhead_s = 20e-6

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ):
        super().__init__(max_workers, cpu_count)
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self._box = _initializer.Breakage()
        self._cpu_count = cpu_count
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending = 0  # chunks submitted and not finished
        # submit_call() calls sent and ended (ran, or failed to be sent): two
        # counters, each next() atomic, so a call takes no lock of ours. A
        # call cancelled before it ran never ends: the pool then never looks
        # idle to release_idle() (it stays, as it would with calls queued).
        self._calls_in = itertools.count()
        self._calls_out = itertools.count()
        self._closed = False
        self._sched = SchedReader()  # the pool threads' schedstat files, kept open
        #: Per pool thread (by ident): (seconds spent in chunks and calls that
        #: ended, perf_counter() at the start of the one running or 0.0, items
        #: of those that ended). Each thread replaces only its own entry, in
        #: one assignment: no lock.
        self._busy: dict[int, tuple[float, float, int]] = {}
        #: Grows the pool for waiting work; None where the user fixed the width,
        #: or set an initializer (each new thread would run it: a connection each).
        self._widener = _Widener(self) if max_workers is None and initializer is None else None
        #: submit_call()'s per-call function, one per CallLog (see _call_runner).
        self._runners: dict[CallLog | None, Callable[..., Any]] = {}
        _LIVE_THREAD_BACKENDS.add(self)

    def _live_threads(self) -> list[threading.Thread] | None:
        """The pool's threads alive now, or None before the pool starts."""
        pool = self._pool
        if pool is None:
            return None
        return [t for t in list(getattr(pool, "_threads", ())) if t.is_alive()]

    def threads_wanted_s(self) -> float | None:
        """Seconds this backend's live pool threads were on a CPU or queued for one, or None.

        Read from ``/proc/self/task/<tid>/schedstat`` (Linux); None where
        that file cannot be read. Unlike their CPU time, it does not drop
        when a busy machine leaves the threads short of CPUs: threads that
        release the GIL are all runnable (about one core each), threads
        that take turns on it one at a time (about one core together),
        threads that wait for I/O seldom.
        """
        threads = self._live_threads()
        if threads is None:
            return None
        total = 0.0
        self._sched.keep_only({t.native_id for t in threads if t.native_id is not None})
        for thread in threads:
            ident = thread.native_id
            if ident is None:
                continue
            times = self._sched.read(ident)
            if times is None:
                if thread.is_alive():
                    return None  # no schedstat here
                continue  # it ended meanwhile
            total += times[0] + times[1]
        return total

    def threads_busy_s(self) -> float:
        """Seconds this backend's pool threads spent in chunks and calls so far (running ones to now).

        The thread-seconds of work given to the pool, whatever the threads
        did meanwhile (computed, waited for the GIL, for a CPU, for I/O);
        a thread waiting for its next chunk adds nothing. Read beside
        :meth:`threads_wanted_s`: threads that release the GIL want about
        one core per busy thread, threads that take turns on it about one
        core between them, however many are busy.
        """
        now = time.perf_counter()
        total = 0.0
        for done, start, _ in list(self._busy.values()):
            total += done + (now - start if start else 0.0)
        return total

    def threads_done(self) -> tuple[float, int]:
        """Seconds of work this backend's pool threads finished so far, and how many items it was.

        Calls and the items of chunks that ended (a chunk's seconds are its
        items'); running ones are not counted. Between two reads, their
        ratio is how long an item took, from start to end.
        """
        seconds = 0.0
        items = 0
        for done, _, count in list(self._busy.values()):
            seconds += done
            items += count
        return seconds, items

    def machine_idle_s(self) -> float | None:
        """Seconds the machine's CPUs spent idle so far, summed over them, or None.

        See :meth:`smartexec._system.SchedReader.idle_s` (Linux's
        ``/proc/stat``, in whole ticks of 10 ms). Read beside
        :meth:`threads_wanted_s`: threads that want few cores while cores
        sit idle wait for each other (the GIL); on a machine with no core
        to spare, threads that take turns on the GIL and threads that share
        the few cores left to them read alike. Never raises.
        """
        return self._sched.idle_s()

    def threads_cpu_s(self) -> float | None:
        """CPU seconds used so far by this backend's pool threads (live ones), or None.

        Read from each thread's CPU clock (``time.pthread_getcpuclockid``);
        None where that clock does not exist. The map's router reads it to
        tell items that wait from items that take turns on the GIL.
        """
        threads = self._live_threads()
        getclock = getattr(time, "pthread_getcpuclockid", None)
        if threads is None or getclock is None:
            return None
        total = 0.0
        for thread in threads:
            ident = thread.ident
            if ident is None:
                continue
            try:
                total += time.clock_gettime(getclock(ident))
            except (OSError, ValueError):
                continue  # it ended meanwhile
        return total

    def _take_pool(self, chunk: bool = True) -> ThreadPoolExecutor:
        """The pool (started on demand); ``chunk``: count a chunk pending on it.

        Raises:
            RuntimeError: the backend was shut down.
            ThreadInitializerError: the initializer failed.
        """
        with self._lock:
            self._box.raise_if_broken()
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_workers,
                    thread_name_prefix="smartexec-thread",
                    initializer=_MarkThread(
                        self,
                        None
                        if self._initializer is None
                        else _ThreadInit(self._initializer, self._initargs, self._box),
                    ),
                )
            if chunk:
                self._pending += 1
            return self._pool

    def runs_this_thread(self) -> bool:
        """Whether the calling thread is one of this backend's pool threads.

        A call running there that maps on the same executor, and waits for
        the results, would wait for chunks queued behind itself: once every
        thread does, nothing runs (a deadlock). The executor runs such a
        nested map in the calling thread instead.
        """
        return _marked(self)

    def _finished(self, _: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1

    def _calls_idle(self) -> bool:
        """Whether every submit_call() call sent has ended (reads both counters, advancing neither)."""
        return _peek(self._calls_in) == _peek(self._calls_out)

    def release_idle(self, timeout_s: float | None = None) -> None:
        """Let the pool's threads exit if no chunk is pending (a new pool starts on demand).

        The fork backend calls it before forking, so that the fork copies no
        idle thread of ours. A pool counts as idle once its calls have
        returned, but a thread may still run a future's done-callbacks (the
        user's code, which may wait for the thread that forks: a callback
        that submits to the executor starting the fork pool waits for its
        lock). So the wait for the threads to exit is bounded.

        Args:
            timeout_s: seconds to wait for the threads, all together; None
                waits until they have exited. Past it, the threads still in
                a callback exit when it returns.
        """
        with self._lock:
            pool = self._pool if self._pending == 0 and self._calls_idle() else None
            if pool is not None:
                self._pool = None
        if pool is None:
            return
        pool.shutdown(wait=timeout_s is None)
        if timeout_s is not None:
            deadline = time.monotonic() + timeout_s
            for thread in list(getattr(pool, "_threads", ())):
                thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed in a thread, or None."""
        return self._box.error

    def grows_to(self, cpu_share: float | None) -> int:
        """The width this pool grows to for calls runnable ``cpu_share`` of their time (:func:`~smartexec.tuning.waiting_width`).

        Its width now where it does not grow (``max_workers`` given, an
        initializer) or the share is not known (None).
        """
        if self._widener is None or cpu_share is None:
            return self.max_workers
        return max(self.max_workers, waiting_width(cpu_share, self._widener.limit))

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        """The stdlib's default, ``min(32, cpu_count + 4)``: room for I/O waits."""
        return min(32, cpu_count + 4)

    def pool_clocks(self) -> ThreadBackend:
        """This backend: its pool threads' clocks (:class:`~smartexec.backends.PoolClocks`)."""
        return self

    def prepare(self, fn: Callable[..., Any], share: bool) -> Any:
        """``fn`` run in a copy of the submitting thread's context (see :mod:`smartexec._context`)."""
        return on_threads(fn)

    def unclocked(self, fn: Any) -> Any:
        """What to send in place of ``fn`` for chunks whose CPU seconds nobody reads.

        :meth:`submit_chunk` then runs ``fn`` without reading the thread's
        CPU clock: the reply's ``cpu_s`` is -1.0 (see
        :func:`~smartexec._remote.run_chunk`'s ``clock_cpu``). A subclass
        that overrides :meth:`submit_chunk` (a plugin that wraps ``fn``)
        gets ``fn`` itself, as :meth:`Backend.submit_chunk` promises.
        """
        if type(self).submit_chunk is not ThreadBackend.submit_chunk:
            return fn
        return _Unclocked(fn)

    def submit_chunk(
        self,
        fn: Any,
        chunk: Sequence[Call],
        budget_s: float | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Future[ChunkResult]:
        """Run a chunk on a pool thread; see :meth:`Backend.submit_chunk`.

        A thread cannot be stopped: with ``timeout_s``, the returned future
        fails with :class:`~smartexec.errors.TaskTimeoutError` once the
        chunk has run that many seconds, and the call runs on in its thread
        (holding that worker) until it returns; its result is dropped.
        ``fn`` may come from :meth:`unclocked`.
        """
        clock = type(fn) is not _Unclocked
        if not clock:
            fn = fn.fn
        pool = self._take_pool()
        box = None if self._initializer is None else self._box
        try:
            if timeout_s is None:
                future = pool.submit(
                    _run_capped,
                    box,
                    self._cpu_count,
                    fn,
                    chunk,
                    budget_s,
                    self._busy,
                    clock,
                    self._widener,
                )
                future.add_done_callback(self._finished)
            else:
                outer: Future[ChunkResult] = Future()
                inner = pool.submit(
                    _run_with_deadline,
                    outer,
                    fn,
                    chunk,
                    budget_s,
                    timeout_s,
                    box,
                    self._cpu_count,
                    self._busy,
                    clock,
                    self._widener,
                )
        except BaseException:
            self._finished(None)  # type: ignore[arg-type]
            raise
        if timeout_s is not None:
            inner.add_done_callback(self._finished)
            outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
            future = outer
        # After the pool's first chunk is on its way (it runs alone,
        # uncapped), before a second can overlap it: see ThreadCap.prepare.
        THREAD_CAP.prepare()
        self._queued()
        return future

    def _queued(self) -> None:
        """Let the widener take its first reading as soon as chunks queue, not at a call's end.

        Its next look, :data:`~smartexec.backends._widener.WIDEN_EVERY_S`
        later (see :meth:`_Widener.look_soon`), can then widen the pool.
        """
        widener = self._widener
        if widener is None:
            return
        now = time.perf_counter()
        if now < widener.due:
            return  # looked less than WIDEN_EVERY_S ago (a burst of submits: once)
        queue = getattr(self._pool, "_work_queue", None)
        if queue is None or not queue.qsize():
            return  # nothing waits for a thread
        first = widener.unmeasured
        widener.check(now)
        if first and not widener.unmeasured:
            widener.look_soon()

    def submit_call(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_done: CallLog | None = None,
        context: contextvars.Context | None = None,
    ) -> Future[Any]:
        """Run one call on a pool thread; return the pool's own future for it.

        ``submit``'s route: no chunk, no chunk future, no callback chain,
        no future of ours: the ``ThreadPoolExecutor``'s future is the
        caller's, so cancelling it, ``shutdown(cancel_futures=True)`` and
        its exceptions (any ``BaseException``) behave exactly as the
        stdlib's do.

        Args:
            fn: the callable.
            args: its positional arguments.
            kwargs: its keyword arguments.
            on_done: where the pool thread counts the call once it is over,
                before its future is completed (a
                :class:`~smartexec.stats.CallLog`); not for a call cancelled
                before it ran. Or None.
            context: the context the call runs in a copy of (the
                submitter's, captured at ``submit``); None: this thread's.

        Raises:
            RuntimeError: the backend was shut down.
            ThreadInitializerError: the initializer failed.
        """
        next(self._calls_in)  # first: release_idle() must not take the pool from under it
        fn = on_threads(fn, context)
        try:
            run = self._runners.get(on_done)
            if run is None:
                run = self._runners.setdefault(on_done, _call_runner(self, on_done))
            pool = self._pool
            if pool is None or self._closed or self._box.error is not None:
                pool = self._take_pool(chunk=False)
            try:
                future = pool.submit(run, fn, *args, **kwargs)
            except RuntimeError:
                if self._closed:
                    raise
                # release_idle() let that pool go just before this call was
                # counted: a new pool takes it.
                future = self._take_pool(chunk=False).submit(run, fn, *args, **kwargs)
        except BaseException:
            next(self._calls_out)
            raise
        # Calls that wait end late and together (six 50 ms sleeps end within
        # a millisecond): the pool's ends alone never gave two readings close
        # enough to compare, and 200 submits ran on the stdlib's 6 threads.
        self._queued()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pool = self._pool
        self._sched.close()
        if pool is not None:
            own = _marked(self)
            # From one of the pool's own threads (a done-callback of a call
            # it ran, or a call itself), joining every thread would join this
            # one (the stdlib raises "cannot join current thread"), and
            # joining the others deadlocks once two of them do so (each
            # waits for the other). It waits for none: the pool takes no new
            # work, its threads exit once their calls end, and the
            # interpreter's exit waits for them, as for any pool thread.
            pool.shutdown(wait=wait and not own, cancel_futures=cancel_futures)
            if wait and not own:
                # Its threads have exited: let their Thread objects go now,
                # not when the garbage collector finds this backend (CPython's
                # threading_cleanup() counts live Thread objects after a test).
                with self._lock:
                    if self._pool is pool:
                        self._pool = None


class _Unclocked:
    """A callable to run without reading the thread's CPU clock (:meth:`ThreadBackend.unclocked`)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any):
        self.fn = fn


_LIVE_THREAD_BACKENDS: weakref.WeakSet[ThreadBackend] = weakref.WeakSet()


#: Which backend a pool thread belongs to (a weak reference), set by its
#: pool's initializer before it runs anything.
_POOL_THREAD = threading.local()


def _marked(backend: ThreadBackend) -> bool:
    """Whether the calling thread is a pool thread of ``backend`` (of any of its pools)."""
    ref = getattr(_POOL_THREAD, "backend", None)
    return ref is not None and ref() is backend


class _MarkThread:
    """A pool's thread initializer: marks the thread as ``backend``'s, then runs ``then``.

    A call that shuts its own executor down, or maps on it, must know it
    runs on one of its threads from its very first call: the stdlib pool
    adds a thread to its own list only after starting it, and a fresh
    thread missing from it joined itself ("cannot join current thread").
    """

    def __init__(self, backend: ThreadBackend, then: Any) -> None:
        self._backend = weakref.ref(backend)
        self._then = then

    def __call__(self) -> None:
        mark_ours()
        _POOL_THREAD.backend = self._backend
        if self._then is not None:
            self._then()


def release_idle_thread_pools(timeout_s: float | None = None) -> None:
    """Let every idle thread backend's threads exit (see :meth:`ThreadBackend.release_idle`).

    Args:
        timeout_s: seconds to wait for each backend's threads; None: until they exit.
    """
    for backend in list(_LIVE_THREAD_BACKENDS):
        backend.release_idle(timeout_s)


def _run_capped(
    box: _initializer.Breakage | None,
    cpu_count: int,
    fn: Any,
    chunk: Sequence[Call],
    budget_s: float | None,
    busy: dict[int, tuple[float, float, int]] | None = None,
    clock: bool = True,
    widener: _Widener | None = None,
) -> ChunkResult:
    """Run a chunk in a pool thread, BLAS capped while others run, unless the initializer failed.

    ``busy``: the backend's per-thread busy seconds (see
    :meth:`ThreadBackend.threads_busy_s`), which this chunk adds to;
    ``widener``: the pool's, told when the chunk ends;
    ``clock``: read the thread's CPU clock (see :meth:`ThreadBackend.unclocked`).

    Raises:
        ThreadInitializerError: the initializer raised (in this thread or another).
    """
    if box is not None:
        box.raise_if_broken()
    ident = user_code_starts()  # this thread's ident, which keys ``busy`` too
    done = begun = 0.0
    if busy is not None:
        done, _, items = busy.get(ident, _IDLE)
        begun = time.perf_counter()
        busy[ident] = (done, begun, items)
    try:
        with THREAD_CAP.running(cpu_count):
            return run_chunk(fn, chunk, False, budget_s, watch=WATCH_GIL, clock_cpu=clock)
    finally:
        if busy is not None:
            end = time.perf_counter()
            busy[ident] = (done + end - begun, 0.0, items + len(chunk))
            if widener is not None and end >= widener.due:
                widener.check(end)
        user_code_ends(ident)


_IDLE = (0.0, 0.0, 0)


def _call_runner(
    backend: ThreadBackend,
    log: CallLog | None,
    _clock: Callable[[], float] = time.perf_counter,
    _ident: Callable[[], int] = threading.get_ident,
    _modules: dict[str, Any] = sys.modules,
    _tokens: list[None] = THREAD_CAP.tokens,
    _user_code: dict[int, int] = _USER_CODE,
) -> Callable[..., Any]:
    """The function a pool thread runs for each call of :meth:`ThreadBackend.submit_call`.

    ``run(fn, *args, **kwargs)``, submitted as ``pool.submit(run, fn, *args,
    **kwargs)``: a call waiting in the pool's queue then holds the objects a
    ``ThreadPoolExecutor``'s own would (one tuple, one dict), not ours
    besides. A burst of 20,000 trivial submits spent a third of its time in
    the garbage collector walking the calls waiting. The steps of
    ``THREAD_CAP.running``, ``user_code_starts`` and the log's
    ``__call__`` are written out: each of those calls was 0.3 us of a
    trivial submit's ~10 us of the GIL (the names bound here are closure
    and local lookups).
    """
    busy = backend._busy
    box = backend._box
    widener = backend._widener
    calls_out = backend._calls_out
    cpus = backend._cpu_count
    calls = log.calls if log is not None else None

    def run(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in this pool thread, counted.

        Raises:
            ThreadInitializerError: the initializer raised (in this thread or another).
            BaseException: whatever the call raises (its future gets it).
        """
        start = _clock()
        thread = _ident()
        done, _, items = busy.get(thread, _IDLE)
        busy[thread] = (done, start, items)
        try:
            if box.error is not None:
                box.raise_if_broken()
            _tokens.append(None)
            try:
                if "numpy" in _modules and (len(_tokens) > 1 or THREAD_CAP.saved is not None):
                    THREAD_CAP.entered(cpus)
                _user_code[thread] = _user_code.get(thread, 0) + 1
                try:
                    return fn(*args, **kwargs)
                finally:
                    left = _user_code.get(thread, 1) - 1
                    if left > 0:
                        _user_code[thread] = left
                    else:
                        _user_code.pop(thread, None)
            finally:
                _tokens.pop()
                if THREAD_CAP.saved is not None:
                    THREAD_CAP.exited()
        finally:
            end = _clock()
            busy[thread] = (done + end - start, 0.0, items + 1)
            next(calls_out)
            if widener is not None and end >= widener.due:
                widener.check(end)
            if calls is not None:
                calls.append((start, end))
                if len(calls) >= CALLS_BATCH:
                    try:
                        log.fold()  # type: ignore[union-attr]
                    except Exception:  # pragma: no cover - stats must never lose an outcome
                        pass

    return run


def _run_with_deadline(
    outer: Future[ChunkResult],
    fn: Any,
    chunk: Sequence[Call],
    budget_s: float | None,
    timeout_s: float,
    box: _initializer.Breakage | None = None,
    cpu_count: int = 1,
    busy: dict[int, tuple[float, float, int]] | None = None,
    clock: bool = True,
    widener: _Widener | None = None,
) -> None:
    if not outer.set_running_or_notify_cancel():
        return
    if box is not None and box.error is not None:
        outer.set_exception(box.error.again())
        return
    try:
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    except Exception:  # a __getattr__ that raises KeyError: still a fine callable
        name = type(fn).__qualname__

    def expire() -> None:
        try:
            outer.set_exception(
                TaskTimeoutError(
                    f"{name} ran longer than its task_timeout of {timeout_s:g} s on a "
                    f"thread; threads cannot be stopped, so the call runs on until it "
                    f"returns (its result is dropped)",
                    timeout_s=timeout_s,
                    items=len(chunk),
                )
            )
        except InvalidStateError:
            pass  # finished just in time

    timer = call_later(timeout_s, expire)  # one thread keeps every chunk's deadline
    try:
        result = _run_capped(None, cpu_count, fn, chunk, budget_s, busy, clock, widener)
    except BaseException as exc:
        result = None
        error: BaseException | None = exc
    else:
        error = None
    finally:
        timer.cancel()
    try:
        if error is not None:
            outer.set_exception(error)
        else:
            outer.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass  # timed out already
