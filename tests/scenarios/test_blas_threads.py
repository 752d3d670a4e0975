"""Issue 13: BLAS on the thread route.

Three concurrent calls on threads each ran a 2-thread BLAS on 2 CPUs (6
threads). Process workers get ``cpus // workers`` BLAS threads each; thread
workers share one process's pools, which smartexec caps while chunks overlap.
"""

from __future__ import annotations

import threading
import time

import pytest

from smartexec import SmartExecutor
from smartexec._system import current_platform

np = pytest.importorskip("numpy")
threadpoolctl = pytest.importorskip("threadpoolctl")

pytestmark = pytest.mark.timeout(60)


def blas_threads() -> int:
    """The BLAS threads a call made now would use (the largest loaded pool)."""
    pools = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    return max(pools, default=0)


def seen_by_concurrent_tasks(n: int) -> list[int]:
    """Run ``n`` tasks on threads, all at once; each reports the BLAS threads it sees."""
    barrier = threading.Barrier(n)
    a = np.ones((64, 64))

    def task(_):
        barrier.wait(10)  # every task is running
        seen = blas_threads()
        barrier.wait(10)  # every task has looked before any finishes
        float((a @ a).sum())
        return seen

    with SmartExecutor(n, backend="thread") as ex:
        return list(ex.map(task, range(n), chunksize=1))


@pytest.mark.parametrize("user_limit", [None, 1])
def test_concurrent_thread_chunks_share_the_cpus_among_blas_threads(user_limit):
    original = blas_threads()
    if original < 2:
        pytest.skip("one BLAS thread here already: nothing to cap")
    cpus = current_platform().cpu_count
    if user_limit is None:
        seen = seen_by_concurrent_tasks(3)
        assert seen == [max(1, min(original, cpus // 3))] * 3
    else:
        with threadpoolctl.threadpool_limits(user_limit):  # the user's own limit stands
            seen = seen_by_concurrent_tasks(3)
            assert blas_threads() == user_limit
        assert seen == [user_limit] * 3
    assert blas_threads() == original  # put back once no chunk runs


def test_one_chunk_at_a_time_keeps_every_blas_thread():
    original = blas_threads()
    with SmartExecutor(1, backend="thread") as ex:
        assert ex.submit(blas_threads).result(timeout=30) == original


def test_the_cap_is_lifted_whichever_thread_set_it():
    """threadpoolctl ignores OpenBLAS limits set from a second Python thread.

    Eight sleeps on four threads: the cap was set from one pool thread and
    the restore, from another, was ignored: BLAS stayed at one thread.
    """
    original = blas_threads()
    with SmartExecutor(4, backend="thread") as ex:
        list(ex.map(time.sleep, [0.1] * 8, chunksize=1))
    assert blas_threads() == original


def test_chunks_do_not_wait_while_another_thread_builds_the_blas_table(monkeypatch):
    # Importing threadpoolctl and scanning the libraries takes ~5 ms (20 ms
    # under load); built under the cap's lock, every pool thread's chunk
    # waited for it. A chunk that starts meanwhile runs uncapped.
    from smartexec import _blas

    built = threading.Event()
    release = threading.Event()
    real = _blas.controller_for_fork

    def slow_build():
        built.set()
        release.wait(10)
        return real()

    monkeypatch.setattr(_blas, "_controller", None)
    monkeypatch.setattr(_blas, "controller_for_fork", slow_build)
    cap = _blas.ThreadCap()
    cap.enter(2)  # one chunk runs: nothing to cap yet
    builder = threading.Thread(target=cap.enter, args=(2,))  # the second: it builds
    builder.start()
    assert built.wait(10)
    cap.enter(2)  # a third chunk while the table is built: no wait
    assert builder.is_alive()  # still building (10 s unless released): it did not wait for it
    release.set()
    builder.join(10)
    for _ in range(3):
        cap.exit()
    assert cap.active == 0


def test_a_chunk_ending_while_the_cap_is_applied_does_not_divide_by_zero():
    # The tokens are counted without the lock: a chunk ending between two
    # reads of the count left 0 to divide by (CI, Python 3.10).
    from smartexec import _blas

    class Shrinking(list):
        def __init__(self, counts):
            super().__init__([None])
            self.counts = iter(counts)

        def __len__(self):
            return next(self.counts, 0)

    cap = _blas.ThreadCap()
    cap._cpus = 2
    cap.saved = []  # the table was read: no library to set here
    cap.tokens = Shrinking([1, 0, 0])  # one chunk at the first read, none at the next
    cap._apply()
    assert cap._applied == 2


#: Set by FIRST_POOL_CAPS before its pool forks: the workers inherit it.
BOTH_RUNNING = None


def blas_threads_of_a_worker(_):
    """In a fork worker, once another worker runs too: its parent, its pid, its BLAS threads."""
    import os

    BOTH_RUNNING.wait(30)  # a second worker has taken the other item
    return os.getppid(), os.getpid(), blas_threads()


# In a fresh interpreter: its first fork pool, forked while no other thread runs
# (the first worker is then forked by the interpreter itself, not the zygote).
FIRST_POOL_CAPS = """
    import multiprocessing, os
    import numpy as np
    import tests.scenarios.test_blas_threads as here
    from smartexec import SmartExecutor
    from smartexec._blas import threads_per_worker
    from smartexec._system import current_platform

    (np.ones((64, 64)) @ np.ones((64, 64))).sum()  # this process's BLAS pool runs
    before = here.blas_threads()
    expected = threads_per_worker(current_platform().cpu_count, 2)
    here.BOTH_RUNNING = multiprocessing.get_context("fork").Barrier(2)
    with SmartExecutor(2, backend="fork") as ex:
        seen = list(ex.map(here.blas_threads_of_a_worker, range(2), chunksize=1))
    assert len({pid for _, pid, _ in seen}) == 2, seen  # two workers
    assert os.getpid() in {parent for parent, _, _ in seen}, seen  # one forked here
    assert [threads for _, _, threads in seen] == [expected] * 2, (seen, expected)
    assert here.blas_threads() == before  # this process's own pool is left as it was
    print("ok" if before > expected else "nothing to cap")
"""


def test_every_fork_worker_starts_with_its_share_of_the_cpus_as_blas_threads():
    """Issue 32: a first fork worker, forked straight from a parent that had loaded
    numpy, kept the parent's BLAS threads (2 on 2 CPUs beside the other
    worker's 1) until a chunk had started them; every worker is capped from
    its start now, that one too."""
    from tests._children import run_python

    result = run_python(FIRST_POOL_CAPS, timeout=60)
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() != "ok":
        pytest.skip("one BLAS thread per worker already: nothing to cap")
