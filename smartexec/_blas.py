"""Cap BLAS / OpenMP threads in process workers, so workers x threads <= CPUs.

Each process worker that calls numpy would otherwise start its own BLAS
thread pool of one thread per CPU: two workers on two cores then run four
busy threads and both slow down. Worker processes get
``max(1, cpus // workers)`` threads each, through the environment variables
the common runtimes read at start-up and, where numpy is already loaded (fork
workers inherit it), through threadpoolctl.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = [
    "THREAD_VARIABLES",
    "threads_per_worker",
    "thread_env",
    "controller_for_fork",
    "cap_in_this_process",
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


_controller: tuple[int, Any] | None = None  # (len(sys.modules) when built, controller)


def controller_for_fork() -> Any | None:
    """threadpoolctl's table of this process's BLAS / OpenMP pools, or None without numpy.

    Called in the parent before a fork, so the child caps its pools in
    microseconds instead of importing threadpoolctl and scanning its loaded
    libraries (~5 ms, on the path to the first result). Built once and kept
    until a module is imported (a new library may have been loaded).
    """
    global _controller
    if "numpy" not in sys.modules:
        return None
    if _controller is None or _controller[0] != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _controller = (len(sys.modules), ThreadpoolController())
    return _controller[1]


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
