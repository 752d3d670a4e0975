"""Cap BLAS / OpenMP threads in workers, so workers x threads <= CPUs.

Each process worker that calls numpy would otherwise start its own BLAS
thread pool of one thread per CPU: two workers on two cores then run four
busy threads and both slow down. Worker processes get
``max(1, cpus // workers)`` threads each, through the environment variables
the common runtimes read at start-up and, where numpy is already loaded (fork
workers inherit it), through threadpoolctl.

Thread workers share one process, whose BLAS pools serve them all: while
``k`` chunks run on threads at once, :class:`ThreadCap` lowers the loaded
pools to ``max(1, cpus // k)`` threads each (never above what they were set
to, by the user or by default) and puts them back when no chunk runs.
threadpoolctl's limits are process-wide, so this is one counter for every
thread backend of the process.

A pool whose threads are not running is left alone: a fork stops OpenBLAS's
threads in the forking process, and setting its count afterwards starts them
again, each spinning on a core for ~100 ms before it sleeps. A map that moved
from fork workers to threads paid that on every run (one of two cores, while
the thread pool's widener read the process as busy and did not grow). A pool
stopped that way restarts itself, at its count, when a call next uses it;
the next chunk that starts then sees its threads and caps it.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import threading
from typing import Any

from . import _threads

__all__ = [
    "THREAD_VARIABLES",
    "threads_per_worker",
    "thread_env",
    "controller_for_fork",
    "cap_in_this_process",
    "ThreadCap",
    "THREAD_CAP",
]

#: Environment variables that OpenMP, OpenBLAS, MKL, BLIS, Accelerate and
#: numexpr read when they start.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def threads_per_worker(cpu_count: int, n_workers: int) -> int:
    """BLAS threads each of ``n_workers`` process workers may use (int >= 1)."""
    return max(1, cpu_count // max(1, n_workers))


def thread_env(threads: int) -> dict[str, str]:
    """The environment that caps a fresh worker's thread pools at ``threads``."""
    return {name: str(threads) for name in THREAD_VARIABLES}


#: (len(sys.modules), extension modules among them, controller) when built.
_controller: tuple[int, int, Any] | None = None


def _extension_modules() -> int:
    """How many of the imported modules are extension modules (shared libraries)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    count = 0
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(suffixes):
            count += 1
    return count


def controller_for_fork() -> Any | None:
    """threadpoolctl's table of this process's BLAS / OpenMP pools, or None without numpy.

    Called in the parent before a fork, so the child caps its pools in
    microseconds instead of importing threadpoolctl and scanning its loaded
    libraries (~5 ms, on the path to the first result). Built once and kept
    until an extension module is imported (a new library may have been
    loaded with it): a plain Python module's import (tens, lazily, in a
    process's first maps) loads no library, and a new scan cost 1-3 ms each
    time, twice or three times in one thread map.
    """
    global _controller
    if "numpy" not in sys.modules:
        return None
    held = _controller
    if held is not None and held[0] == len(sys.modules):
        return held[2]
    modules, extensions = len(sys.modules), _extension_modules()
    if held is None or held[1] != extensions:
        from threadpoolctl import ThreadpoolController

        held = (modules, extensions, ThreadpoolController())
    else:
        held = (modules, extensions, held[2])
    _controller = held
    return held[2]


def cap_in_this_process(threads: int, controller: Any | None = None) -> None:
    """Cap this (worker) process's thread pools at ``threads``.

    Sets the environment for libraries loaded later and, when numpy is
    already imported (a fork child inherits it), limits the loaded BLAS and
    OpenMP pools with threadpoolctl, through ``controller`` (from
    :func:`controller_for_fork`) when given.
    """
    os.environ.update(thread_env(threads))
    if controller is not None:
        controller.limit(limits=threads)  # applies now; kept for the process's life
    elif "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)


class ThreadCap:
    """Count the chunks running on threads; cap the process's BLAS pools to share the CPUs.

    Use :meth:`running` around each chunk a thread backend runs. The first
    time two chunks overlap, the loaded pools' thread counts are recorded
    (the user's own limits included); while ``k`` run, each pool gets
    ``min(recorded, max(1, cpus // k))`` threads; when none runs, the
    recorded counts come back. A limit the user sets while chunks run is
    overwritten at that point. One threadpoolctl call per pool and change of
    ``k`` (about a microsecond each), on a controller built once
    (:func:`controller_for_fork`); nothing at all without numpy. The first
    thread that needs that controller builds it outside the lock; chunks
    that start meanwhile run uncapped (:meth:`_build`). Nothing is capped
    while no pool's threads run (see the module's notes on forks).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One token per chunk running: list.append and list.pop are atomic,
        # so counting takes no lock. Thousands of tiny calls on six threads
        # queued behind a lock held by a thread the GIL had switched out
        # (submit on threads ran at 1.5x a ThreadPoolExecutor's cost).
        self.tokens: list[None] = []
        self._cpus = 1
        #: While a cap is set: each BLAS pool capped, with its threads before
        #: (the counts put back once no chunk runs); else None.
        self.saved: list[tuple[Any, int]] | None = None
        self._applied: int | None = None  # the cap last set on the pools
        self._building = False  # a thread is building threadpoolctl's table

    def running(self, cpus: int) -> _Running:
        """A context manager for one chunk, on a host with ``cpus`` CPUs (int >= 1)."""
        return _Running(self, cpus)

    @property
    def active(self) -> int:
        """Chunks running on threads now."""
        return len(self.tokens)

    @property
    def _active(self) -> int:
        return len(self.tokens)

    def enter(self, cpus: int) -> None:
        """One chunk (or call) starts on a thread, on a host with ``cpus`` CPUs; see :meth:`running`.

        The same as ``tokens.append(None)`` then, when numpy is loaded and
        another chunk runs or a cap is set, :meth:`entered` (the thread
        backend's per-call path does that inline: a method call is a few
        percent of a trivial submit's cost).
        """
        self.tokens.append(None)
        if "numpy" in sys.modules:
            self.entered(cpus)

    def entered(self, cpus: int) -> None:
        """Set the cap for the chunks running now, one of them just counted in :attr:`tokens`."""
        if len(self.tokens) > 1 or self.saved is not None:
            cpus = max(1, cpus)
            if self.saved is None:
                if not _threads.native_threads_run():
                    return  # no pool runs: a count set now would start a stopped one
                if _controller is None and (self._building or not self._build()):
                    return  # another thread builds the table: uncapped meanwhile
            if self.saved is None or cpus != self._cpus or self._cap_now(cpus) != self._applied:
                with self._lock:
                    self._cpus = cpus
                    self._apply()

    def prepare(self) -> None:
        """Build threadpoolctl's table now, in the calling thread, if numpy is loaded and it is not built.

        For a thread backend, once its first chunk is sent: built by the
        first chunks that overlap, it held the GIL for 4-20 ms while the
        others ran, and under a competing process 64 numpy items on threads
        took 0.077 s against 0.063 s with the table built before their pool
        started (15 interleaved runs each). The first chunk runs alone
        meanwhile, and one chunk alone needs no cap. Costs one dictionary
        lookup once built. Not while no pool's threads run (after a fork):
        the table is then built by the first chunks that find them running.
        Never raises.
        """
        if (
            "numpy" in sys.modules
            and _controller is None
            and not self._building
            and _threads.native_threads_run()
        ):
            self._build()

    def _build(self) -> bool:
        """Build threadpoolctl's table in this thread, outside the lock, unless another thread is.

        Importing threadpoolctl and scanning the loaded libraries takes ~5
        ms of the GIL (20 ms under load). Built under the lock, it held back
        every pool thread's chunk meanwhile: 64 numpy items on threads ran
        in 1.4x a ThreadPoolExecutor's time under a competing process (0.07
        s against 0.05 s), 1.05x with the table built before. The chunks
        that start meanwhile run uncapped. Returns whether the table exists.
        """
        with self._lock:
            if self._building:
                return False
            self._building = True
        try:
            controller_for_fork()
        except Exception:  # pragma: no cover - threadpoolctl missing or broken
            pass
        finally:
            self._building = False
        return _controller is not None

    def exit(self) -> None:
        """The chunk (or call) of an :meth:`enter` ended.

        The same as ``tokens.pop()`` then, while a cap is set (:attr:`saved`), :meth:`exited`.
        """
        self.tokens.pop()
        if self.saved is not None:
            self.exited()

    def exited(self) -> None:
        """Lift or ease the cap once a chunk's token left :attr:`tokens`."""
        if self.saved is not None and (
            not self.tokens or self._cap_now(self._cpus) != self._applied
        ):
            with self._lock:
                if self.saved is not None:
                    self._apply()

    def _cap_now(self, cpus: int) -> int:
        return max(1, cpus // max(1, len(self.tokens)))

    def _apply(self) -> None:
        if self.saved is None:
            if "numpy" not in sys.modules:
                return
            try:
                controller = controller_for_fork()
            except Exception:  # pragma: no cover - threadpoolctl missing or broken
                return
            if controller is None:
                return  # nothing to cap (entered saw the pool's threads run)
            self.saved = [(pool, pool.num_threads) for pool in controller.lib_controllers]
        active = self._active  # read once: the tokens change without the lock
        if active <= 0:
            saved, self.saved, self._applied = self.saved, None, None
            for pool, threads in saved:
                _set_threads(pool, threads)
            return
        cap = max(1, self._cpus // active)
        if cap == self._applied:
            return  # as set: thousands of short calls change nothing (no library call)
        self._applied = cap
        for pool, threads in self.saved:
            _set_threads(pool, min(threads, cap))


def _set_threads(pool: Any, threads: int) -> None:
    """Set ``pool``'s threads from whichever thread calls, under :class:`ThreadCap`'s lock.

    threadpoolctl (3.5+) lets only the first Python thread that set an
    OpenBLAS limit set it again, and silently ignores the others: a cap set
    from one pool thread could then never be lifted from another (BLAS stayed
    at one thread after a map). The raw setter it wraps has no such rule;
    the lock here is what keeps threads from fighting.
    """
    setter = getattr(pool, "_real_set_num_threads", None) or pool.set_num_threads
    try:
        if pool.num_threads != threads:
            setter(threads)
    except Exception:  # pragma: no cover - a library that refuses: leave it
        pass


class _Running:
    __slots__ = ("cap", "cpus")

    def __init__(self, cap: ThreadCap, cpus: int):
        self.cap = cap
        self.cpus = cpus

    def __enter__(self) -> None:
        self.cap.enter(self.cpus)

    def __exit__(self, *exc: object) -> None:
        self.cap.exit()


#: The process's one :class:`ThreadCap` (limits are process-wide).
THREAD_CAP = ThreadCap()
