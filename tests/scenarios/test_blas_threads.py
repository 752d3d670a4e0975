"""Issue 13: BLAS on the thread route.

Three concurrent calls on threads each ran a 2-thread BLAS on 2 CPUs (6
threads). Process workers get ``cpus // workers`` BLAS threads each; thread
workers share one process's pools, which smartexec caps while chunks overlap.
"""

from __future__ import annotations

import os
import sys
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


def start_blas_pool() -> None:
    """Start the BLAS pool's threads (a fork earlier in this process stops OpenBLAS's)."""
    a = np.ones((512, 512))
    float((a @ a).sum())


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
    start_blas_pool()  # a pool whose threads are stopped is not capped (the next tests)
    if user_limit is None:
        seen = seen_by_concurrent_tasks(3)
        assert seen == [max(1, min(original, cpus // 3))] * 3
    else:
        with threadpoolctl.threadpool_limits(user_limit):  # the user's own limit stands
            seen = seen_by_concurrent_tasks(3)
            assert blas_threads() == user_limit
        assert seen == [user_limit] * 3
    assert blas_threads() == original  # put back once no chunk runs


class _FakePool:
    """A BLAS pool as threadpoolctl's table holds it: its thread count, and every count set."""

    def __init__(self, threads: int):
        self.num_threads = threads
        self.set: list[int] = []

    def set_num_threads(self, threads: int) -> None:
        self.num_threads = threads
        self.set.append(threads)


@pytest.mark.parametrize(("threads_run", "counts_set"), [(True, [1, 2]), (False, [])])
def test_a_blas_pool_is_capped_only_while_its_threads_run(monkeypatch, threads_run, counts_set):
    # After a fork, OpenBLAS's threads are stopped in the forking process,
    # and setting its count starts them again (each spins on a core for
    # ~100 ms): a map moved from fork to threads lost one of two cores.
    from smartexec import _blas, _threads

    pool = _FakePool(2)

    class Table:
        lib_controllers = [pool]

    monkeypatch.setattr(_blas, "_controller", (0, 0, Table()))
    monkeypatch.setattr(_blas, "controller_for_fork", lambda: Table())
    monkeypatch.setattr(_threads, "native_threads_run", lambda: threads_run)
    monkeypatch.setitem(sys.modules, "numpy", np)
    cap = _blas.ThreadCap()
    cap.enter(2)
    cap.enter(2)  # two chunks overlap: 1 thread each, if the pool runs
    cap.exit()
    cap.exit()
    assert pool.set == counts_set
    assert pool.num_threads == 2


def _openblas_pthreads() -> bool:
    return any(
        p.get("internal_api") == "openblas"
        and p.get("threading_layer") == "pthreads"
        and p["num_threads"] > 1
        for p in threadpoolctl.threadpool_info()
    )


@pytest.mark.skipif(sys.platform != "linux", reason="counts threads in /proc")
def test_a_thread_map_after_a_fork_does_not_restart_a_stopped_blas_pool():
    if not _openblas_pthreads():
        pytest.skip("OpenBLAS with pthreads and 2 or more threads only")
    from smartexec._threads import foreign_thread_ids

    pid = os.fork()  # OpenBLAS stops its threads in this process before a fork
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if foreign_thread_ids():
        pytest.skip("another library's threads run here: nothing to tell apart")
    with SmartExecutor(4, backend="thread") as ex:
        list(ex.map(time.sleep, [0.02] * 8, chunksize=1))  # chunks overlap
    # The pool's threads, just joined, may be listed a moment longer; a BLAS
    # thread started meanwhile stays for the process's life.
    deadline = time.monotonic() + 5
    while foreign_thread_ids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert foreign_thread_ids() == []  # no BLAS thread started (nor spinning)


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
    from smartexec import _blas, _threads

    built = threading.Event()
    release = threading.Event()
    real = _blas.controller_for_fork

    def slow_build():
        built.set()
        release.wait(10)
        return real()

    monkeypatch.setattr(_blas, "_controller", None)
    monkeypatch.setattr(_blas, "controller_for_fork", slow_build)
    monkeypatch.setattr(_threads, "native_threads_run", lambda: True)
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
