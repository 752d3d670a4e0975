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

__all__ = ["THREAD_VARIABLES", "threads_per_worker", "thread_env", "cap_in_this_process"]

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


def cap_in_this_process(threads: int) -> None:
    """Cap this (worker) process's thread pools at ``threads``.

    Sets the environment for libraries loaded later and, when numpy is
    already imported (a fork worker inherits it), limits the loaded BLAS and
    OpenMP pools with threadpoolctl.
    """
    os.environ.update(thread_env(threads))
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)  # applies now; kept for the process's life
