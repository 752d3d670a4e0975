"""Growing a thread pool for work that waits: :class:`_Widener`, the thread backend's.

The law is the cost model's (:func:`smartexec.tuning.threads_for_waiting`);
this module reads the pool's figures and widens the stdlib pool under it.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._threads import own_thread
from ..tuning import MAX_WAITING_THREADS, threads_for_waiting

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from .thread import ThreadBackend

__all__ = ["WIDEN_EVERY_S", "waiting_limit"]


#: Seconds between two looks at whether a pool should grow (each reads every
#: pool thread's schedstat: ~5 us a thread).
WIDEN_EVERY_S = 0.005


def waiting_limit() -> int:
    """The most threads a pool grows to: :data:`~smartexec.tuning.MAX_WAITING_THREADS`, and an eighth of the open-files limit."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return MAX_WAITING_THREADS
    return (
        MAX_WAITING_THREADS
        if soft == resource.RLIM_INFINITY
        else min(MAX_WAITING_THREADS, soft // 8)
    )


class _Widener:
    """Grows a pool whose threads wait while calls queue for them (:func:`~smartexec.tuning.threads_for_waiting`).

    A pool thread that ends a call or chunk looks, at most every
    :data:`WIDEN_EVERY_S` (and, after a first reading taken as calls
    queue, a thread of smartexec's once: :meth:`look_soon`), at the calls
    queued beyond the pool's width;
    while some are, it reads how many threads were busy and how many cores
    they were runnable for since its last look (the backend's
    :meth:`~ThreadBackend.threads_busy_s` and
    :meth:`~ThreadBackend.threads_wanted_s`, its CPU clocks where schedstat
    cannot be read), and the process's CPU seconds meanwhile, and widens
    the pool to what Little's law gives, while an item takes under
    :data:`~smartexec.tuning.SATURATED_SLOWDOWN` times the quickest the pool
    measured (past that, what the threads wait for is saturated and more
    threads only queue there). The process's CPU tells waiting
    from taking turns on the GIL: pool threads that wait for a GIL held by
    another thread (the caller's, dispatching chunks) are not runnable
    either, but the holder keeps the process on a core. A
    pool never narrows: idle threads wait for work at no cost, and leave
    at shutdown or before a fork (:meth:`ThreadBackend.release_idle`).
    The width is at most :data:`~smartexec.tuning.MAX_WAITING_THREADS` and
    an eighth of the open-files limit (each call may hold a socket).

    Only where the user left ``max_workers`` unset; it reaches into the
    stdlib pool's ``_max_workers`` and ``_adjust_thread_count`` (3.10 to
    3.14), and does nothing where they are missing.
    """

    __slots__ = ("_backend", "_lock", "_last", "_latency", "due", "limit", "process_cpu")

    def __init__(self, backend: ThreadBackend):
        self._backend = weakref.ref(backend)  # the pool's runners hold this object
        self._lock = threading.Lock()
        #: (time, busy s, runnable s, process CPU s, finished s, finished items) at the last look
        self._last: tuple[float, float, float, float, float, int] | None = None
        self._latency = _Latency()
        self.due = 0.0
        self.limit = max(backend.max_workers, waiting_limit())
        self.process_cpu: Callable[[], float] = time.process_time

    @property
    def unmeasured(self) -> bool:
        """Whether no reading of the pool's clocks is kept (nothing queued at the last look)."""
        return self._last is None

    def look_soon(self) -> None:
        """Look again :data:`WIDEN_EVERY_S` from now, from a thread of smartexec's own.

        After a first reading taken as calls queue: the pool threads look
        when a call ends, and calls that wait end late (100 sleeps of 10
        ms: the pool grew at 10 ms, its queued calls waiting meanwhile).
        """

        def look() -> None:
            time.sleep(WIDEN_EVERY_S)
            self.check(time.perf_counter())

        try:
            own_thread(look, "smartexec-widener").start()
        except RuntimeError:  # no new thread at interpreter shutdown
            pass

    def check(self, now: float) -> None:
        """Look at the pool (at most one thread at a time; the others go on)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self.due = now + WIDEN_EVERY_S
            backend = self._backend()
            if backend is not None:
                self._look(backend, now)
        except Exception:  # pragma: no cover - sizing must never fail a call
            pass
        finally:
            self._lock.release()

    def _look(self, backend: ThreadBackend, now: float) -> None:
        pool = backend._pool
        width = getattr(pool, "_max_workers", None)
        if pool is None or width is None or width >= self.limit:
            return
        in_flight = backend._pending + _peek(backend._calls_in) - _peek(backend._calls_out)
        last, self._last = self._last, None
        if in_flight <= width:
            return  # nothing queued: the width serves
        runnable = backend.threads_wanted_s()
        if runnable is None:
            runnable = backend.threads_cpu_s()
        if runnable is None:
            return
        self._last = (
            now,
            backend.threads_busy_s(),
            runnable,
            self.process_cpu(),
            *backend.threads_done(),
        )
        if last is None or now - last[0] > 4 * WIDEN_EVERY_S:
            return  # a first look, or a stale one: the next look compares
        wall = now - last[0]
        busy, runnable_cores, process_cores = (
            (new - old) / wall for new, old in zip(self._last[1:4], last[1:4])
        )
        slowdown = self._latency.slowdown(self._last[4] - last[4], self._last[5] - last[5])
        wider = threads_for_waiting(busy, runnable_cores, self.limit, process_cores, slowdown)
        if wider > width:
            _widen(backend, pool, wider, in_flight - width)


class _Latency:
    """How long a pool's items take now against the quickest it measured (the slowdown)."""

    __slots__ = ("quickest", "last")

    def __init__(self) -> None:
        self.quickest = float("inf")  # seconds per item, the least of any look
        self.last = 1.0

    def slowdown(self, seconds: float, items: int) -> float:
        """The slowdown of the items that ended since the last look (the last one's if none did)."""
        if items > 0:
            latency = seconds / items
            self.quickest = min(self.quickest, latency)
            self.last = latency / self.quickest if self.quickest > 0 else 1.0
        return self.last


def _widen(backend: ThreadBackend, pool: ThreadPoolExecutor, width: int, queued: int) -> None:
    """Let ``pool`` run ``width`` threads, and start threads for up to ``queued`` calls now."""
    with backend._lock:
        if backend._pool is not pool or backend._closed:
            return
        backend.max_workers = width  # a pool the backend starts later gets it too
    lock = getattr(pool, "_shutdown_lock", None)
    adjust = getattr(pool, "_adjust_thread_count", None)
    if lock is None or adjust is None:
        return
    with lock:
        if getattr(pool, "_shutdown", True):
            return
        pool._max_workers = width
        try:
            for _ in range(min(queued, width)):
                adjust()
        except RuntimeError:  # no new thread at interpreter shutdown
            pass


def _peek(counter: itertools.count[int]) -> int:
    """The value ``next(counter)`` would return, without advancing it."""
    return int(repr(counter)[6:-1])
