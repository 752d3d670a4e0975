"""Issue 6, point 5: never fork from our own threads, nor while they run; route
around the user's threads.

A fork copies every lock that another thread holds at that instant. smartexec
forks only in the caller's thread (one zygote per pool, which forks the
workers), pauses its own dispatcher threads and releases its idle thread-pool
threads around that fork, and sends work that need not be forked to loky while
the user's own threads run.
"""

from __future__ import annotations

import os
import threading

import pytest

from smartexec import SmartExecutor

from .. import _children
from . import _reliability_workloads as w

pytestmark = pytest.mark.timeout(120)


def inherited_a_held_lock(parent_pid):
    """True in a process forked while another thread held ``w.LOCK``: it waits for ever there."""
    return os.getpid() != parent_pid and w.LOCK.locked()


def test_no_fork_happens_while_a_thread_of_ours_runs():
    # Every fork in the child is recorded with the threads alive at that moment:
    # a crash replacement, a new pool generation while the old one runs, a fork
    # after the thread backend was used, and a timeout replacement.
    result = _children.run_python(
        """
        import os, threading, warnings
        warnings.simplefilter("error", DeprecationWarning)  # 3.12+: forking with threads
        seen = []
        real_fork = os.fork
        def fork():
            seen.append(sorted(t.name for t in threading.enumerate()
                               if t is not threading.current_thread()))
            return real_fork()
        os.fork = fork

        import numpy as np
        from smartexec import SmartExecutor, WorkerCrashedError, TaskTimeoutError
        from tests.scenarios import _reliability_workloads as w

        class Big:
            def __init__(self):
                self.data = np.ones(1 << 18)
            def get(self, i):
                return float(self.data[i])

        with SmartExecutor(2, task_timeout=2) as ex:
            ex.submit(w.square, 2).result()                   # pool 1
            assert list(ex.map(abs, [-1, -2], chunksize=1))  # threads may start
            try:
                ex.submit(w.kill_self_at, 3).result()         # crash: replacement
            except WorkerCrashedError:
                pass
            try:
                ex.submit(w.sleep_then_return, 30).result()   # timeout: replacement
            except TaskTimeoutError:
                pass
            big = Big()
            assert ex.submit(big.get, 1).result() == 1.0      # pool 2, pool 1 alive
            with SmartExecutor(backend="thread") as threads:
                threads.submit(w.square, 3).result()
                other = Big()
                assert ex.submit(other.get, 2).result() == 1.0  # pool 3
        ours = [names for names in seen if any(n.startswith("smartexec-") for n in names)]
        print("forks", len(seen), "with our threads", ours)
        """,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert "with our threads []" in result.stdout, result.stdout


def test_the_users_threads_send_forkable_work_to_loky_and_say_why():
    stop = threading.Event()
    holding = threading.Event()

    def hold():
        with w.LOCK:
            holding.set()
            stop.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    holding.wait(10)
    try:
        with SmartExecutor(2) as ex:
            decision = ex.explain(w.take_the_lock)
            assert decision.backend == "loky", str(decision)
            assert "other thread" in str(decision)
            # loky's workers start without forking us: the lock is free there
            assert list(ex.map(w.take_the_lock, range(4), chunksize=1)) == [True] * 4
    finally:
        stop.set()
        holder.join(10)
    with SmartExecutor(2) as ex:  # the thread is gone: fork again
        assert ex.explain(w.take_the_lock).backend == "fork"


def test_a_shared_object_still_forks_with_the_users_threads_and_says_so():
    import numpy as np

    class Big:
        def __init__(self):
            self.data = np.ones(1 << 18)

        def get(self, i):
            return float(self.data[i])

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(60,), daemon=True)
    thread.start()
    try:
        with SmartExecutor(2) as ex:
            big = Big()
            decision = ex.explain(big.get)
            assert decision.backend == "fork" and decision.share
            assert "zygote" in str(decision)
            assert ex.submit(big.get, 0).result(timeout=60) == 1.0
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.parametrize("where", ["constructor", "map"])
def test_task_timeout_with_the_users_threads_never_forks_and_explain_says_so(where):
    """Issue 13: task_timeout moved work back to fork while a user thread held a lock.

    The forked worker inherited the lock held and waited on it. Safety wins:
    the work stays off fork (threads, which fail the future at the deadline)
    and ``explain`` says what really runs.
    """
    stop = threading.Event()
    holding = threading.Event()

    def hold():
        with w.LOCK:
            holding.set()
            stop.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    holding.wait(10)
    kwargs = {"task_timeout": 30} if where == "constructor" else {}
    map_kwargs = {} if where == "constructor" else {"task_timeout": 30}
    try:
        with SmartExecutor(2, **kwargs) as ex:
            parent = [os.getpid()] * 4
            results = list(ex.map(inherited_a_held_lock, parent, chunksize=1, **map_kwargs))
            assert results == [False] * 4  # a forked worker inherits w.LOCK held
            ran = ex.decisions()[-1]
            assert ran.backend != "fork", str(ran)
            if where == "constructor":
                decision = ex.explain(inherited_a_held_lock)
                assert decision.backend == ran.backend, (str(decision), str(ran))
                assert "other thread" in str(decision) and "task_timeout" in str(decision)
    finally:
        stop.set()
        holder.join(10)


@pytest.mark.timeout(120)
def test_hundreds_of_fork_workers_neither_hang_map_nor_shutdown():
    """Issue 13: max_workers=10_000 on fork hung map and shutdown.

    The parent asked the zygote for every worker before reading its replies;
    about 280 replies fill the SOCK_SEQPACKET buffer, the zygote blocked in
    send and the parent in send_fds. 600 workers pass that point (10_000
    would fork for minutes on a small test machine: same code path).
    """
    result = _children.run_python(
        """
        from smartexec import SmartExecutor
        with SmartExecutor(600, backend="fork") as ex:
            assert list(ex.map(abs, range(-1200, 0), chunksize=1)) == list(range(1200, 0, -1))
        print("done", flush=True)
        """,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout


def test_more_fork_workers_than_open_files_allow_fail_fast_and_say_why():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    with pytest.raises(ValueError, match="open files") as caught:
        SmartExecutor(soft, backend="fork")
    assert f"max_workers={soft}" in str(caught.value) and "ulimit -n" in str(caught.value)
    with SmartExecutor(soft) as ex:  # routed to fork later: the same error, from map
        with pytest.raises(ValueError, match="open files"):
            list(ex.map(w.square, range(4), chunksize=1))


def test_more_loky_workers_than_open_files_allow_fail_fast_too():
    # Routed to loky (say, beside the user's threads), such a pool would
    # start thousands of processes until the machine's memory ran out.
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    with pytest.raises(ValueError, match="open files") as caught:
        SmartExecutor(soft, backend="loky")
    assert "on the loky backend" in str(caught.value) and "ulimit -n" in str(caught.value)


def test_a_done_callback_that_submits_does_not_hang_a_fork_pools_start():
    # Found by a lock-order pass: a fork pool's start lets idle thread pools'
    # threads exit first, and waited for them without bound; a thread still
    # running a future's done-callback that submits to the executor starting
    # the pool waited for its lock in turn. The wait is now bounded
    # (PAUSE_TIMEOUT_S): the callback's submit runs once the pool started.
    result = _children.run_python(
        """
        import time
        from smartexec import SmartExecutor
        on_threads = SmartExecutor(backend="thread", max_workers=1)
        on_fork = SmartExecutor(backend="fork", max_workers=1)
        late = []
        def nap():
            time.sleep(0.1)
            return 1
        def callback(_):
            time.sleep(0.4)  # the user's code, on the pool's thread
            late.append(on_fork.submit(abs, -2))
        on_threads.submit(nap).add_done_callback(callback)
        time.sleep(0.25)  # nap done: its thread pool reads as idle, the callback runs
        print("first", on_fork.submit(abs, -1).result(timeout=20))
        on_threads.shutdown()
        print("late", late[0].result(timeout=20))
        on_fork.shutdown()
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "first 1" in result.stdout and "late 2" in result.stdout, result.stdout


def nested_fork_pool_in_a_thread(_):
    """In a fork worker: a thread of its own starts a fork pool and uses it."""
    found = {}

    def other():
        with SmartExecutor(backend="fork", max_workers=1) as inner:
            found["value"] = inner.submit(abs, -5).result(timeout=20)

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    thread.join(30)
    return found.get("value", "hung")


def test_a_thread_in_a_fork_worker_may_start_a_fork_pool():
    # Found by a lock-order pass: workers are forked while the fork package's
    # _QUIESCE_LOCK is held, and inherited it held; a thread of the worker's
    # own that started a fork pool then waited on it forever. The child
    # re-initialises the locks a fork may copy held.
    with SmartExecutor(backend="fork", max_workers=1) as ex:
        assert ex.submit(nested_fork_pool_in_a_thread, 0).result(timeout=60) == 5
