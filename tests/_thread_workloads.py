"""Workloads for tests/test_threads.py, importable by forked and spawned workers."""

from __future__ import annotations

import math


def joblib_sum_of_roots(n: int) -> float:
    """Run a joblib ``Parallel`` inside a worker: it must start its own executor there.

    Its executor is shut down before returning: a fork worker ends with
    ``os._exit`` (as multiprocessing's do), so no ``atexit`` hook of joblib's
    would stop the workers it started (they would wait out loky's idle
    timeout, holding the test child's output pipes open).
    """
    from joblib import Parallel, delayed
    from joblib.externals.loky import get_reusable_executor

    total = sum(Parallel(n_jobs=2)(delayed(math.sqrt)(i) for i in range(n)))
    get_reusable_executor().shutdown(wait=True)
    return total
