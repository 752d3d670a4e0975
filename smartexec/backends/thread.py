"""The thread backend: chunks run on a ``concurrent.futures.ThreadPoolExecutor``.

Right for work that releases the GIL (numpy kernels, hashing, compression,
I/O) and for any work on a free-threaded build: nothing is pickled and the
workers share the caller's memory. While several chunks run at once, the
process's BLAS pools are capped so that chunks x BLAS threads stay within the
CPUs (:class:`smartexec._blas.ThreadCap`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any

from .. import _initializer
from .._blas import THREAD_CAP
from .._remote import Call, ChunkResult, run_chunk
from ..errors import InitializerError, TaskTimeoutError, ThreadInitializerError
from ._base import Backend

__all__ = ["ThreadBackend"]


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
        max_workers: threads (None: ``min(32, cpu_count + 4)``).
        cpu_count: CPUs this process may use.
        initializer: called as ``initializer(*initargs)`` once in each thread
            before its first chunk (None: nothing). When it raises, the
            backend is broken (:attr:`broken`): pending and later chunks fail
            with :class:`~smartexec.errors.ThreadInitializerError`, a
            ``BrokenThreadPool``.
        initargs: the initializer's arguments (tuple).
    """

    name = "thread"
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
        self._closed = False
        _LIVE_THREAD_BACKENDS.add(self)

    def _take_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            self._box.raise_if_broken()
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_workers,
                    thread_name_prefix="smartexec-thread",
                    initializer=(
                        None
                        if self._initializer is None
                        else _ThreadInit(self._initializer, self._initargs, self._box)
                    ),
                )
            self._pending += 1
            return self._pool

    def _finished(self, _: Future[Any]) -> None:
        with self._lock:
            self._pending -= 1

    def release_idle(self) -> None:
        """Let the pool's threads exit if no chunk is pending (a new pool starts on demand).

        The fork backend calls it before forking, so that the fork copies no
        idle thread of ours.
        """
        with self._lock:
            pool = self._pool if self._pending == 0 else None
            if pool is not None:
                self._pool = None
        if pool is not None:
            pool.shutdown(wait=True)

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed in a thread, or None."""
        return self._box.error

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        """The stdlib's default, ``min(32, cpu_count + 4)``: room for I/O waits."""
        return min(32, cpu_count + 4)

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
        """
        pool = self._take_pool()
        box = None if self._initializer is None else self._box
        try:
            if timeout_s is None:
                future = pool.submit(_run_capped, box, self._cpu_count, fn, chunk, budget_s)
                future.add_done_callback(self._finished)
                return future
            outer: Future[ChunkResult] = Future()
            inner = pool.submit(
                _run_with_deadline, outer, fn, chunk, budget_s, timeout_s, box, self._cpu_count
            )
        except BaseException:
            self._finished(None)  # type: ignore[arg-type]
            raise
        inner.add_done_callback(self._finished)
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        return outer

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


_LIVE_THREAD_BACKENDS: weakref.WeakSet[ThreadBackend] = weakref.WeakSet()


def release_idle_thread_pools() -> None:
    """Let every idle thread backend's threads exit (see :meth:`ThreadBackend.release_idle`)."""
    for backend in list(_LIVE_THREAD_BACKENDS):
        backend.release_idle()


def _run_capped(
    box: _initializer.Breakage | None,
    cpu_count: int,
    fn: Any,
    chunk: Sequence[Call],
    budget_s: float | None,
) -> ChunkResult:
    """Run a chunk in a pool thread, BLAS capped while others run, unless the initializer failed.

    Raises:
        ThreadInitializerError: the initializer raised (in this thread or another).
    """
    if box is not None:
        box.raise_if_broken()
    with THREAD_CAP.running(cpu_count):
        return run_chunk(fn, chunk, False, budget_s)


def _run_with_deadline(
    outer: Future[ChunkResult],
    fn: Any,
    chunk: Sequence[Call],
    budget_s: float | None,
    timeout_s: float,
    box: _initializer.Breakage | None = None,
    cpu_count: int = 1,
) -> None:
    if not outer.set_running_or_notify_cancel():
        return
    if box is not None and box.error is not None:
        outer.set_exception(box.error.again())
        return
    name = getattr(fn, "__qualname__", type(fn).__qualname__)

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

    timer = threading.Timer(min(timeout_s, threading.TIMEOUT_MAX), expire)
    timer.name = "smartexec-deadline"
    timer.daemon = True
    timer.start()
    try:
        result = _run_capped(None, cpu_count, fn, chunk, budget_s)
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
