"""The fork backend: trampolines, pool generations, crashes, and exits."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest

from smartexec import SmartExecutor, WorkerCrashedError, trampoline

from .._children import child_processes, run_python

pytestmark = pytest.mark.timeout(60)


class NeverPickled:
    """A big object that fails loudly if anything tries to pickle it."""

    def __init__(self, nbytes=4 << 20):
        self.values = np.arange(nbytes // 8, dtype=np.int64)
        self.lock = threading.Lock()  # unpicklable anyway

    def __reduce__(self):
        raise RuntimeError("NeverPickled was pickled")

    def lookup(self, i):
        return int(self.values[i]) + os.getpid() * 0


def crash_on(x, target, how):
    if x == target:
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    return x


def getpid(_=None):
    return os.getpid()


def test_shared_callable_is_never_pickled():
    obj = NeverPickled()
    with SmartExecutor(2) as ex:
        decision = ex.explain(obj.lookup)
        assert (decision.backend, decision.share) == ("fork", True)
        assert list(ex.map(obj.lookup, range(100))) == list(range(100))
        assert ex.submit(obj.lookup, 5).result(timeout=30) == 5


def test_work_runs_in_other_processes():
    with SmartExecutor(2, backend="fork") as ex:
        pids = set(ex.map(getpid, range(20), chunksize=1))
    assert os.getpid() not in pids


def test_object_first_seen_after_the_fork_gets_a_new_pool():
    with SmartExecutor(2) as ex:
        first = NeverPickled()
        assert ex.submit(first.lookup, 1).result(timeout=30) == 1
        second = NeverPickled()  # created after the workers forked
        assert list(ex.map(second.lookup, range(10))) == list(range(10))
        # the first object still works (the new pool inherited it too)
        assert ex.submit(first.lookup, 2).result(timeout=30) == 2


def test_retired_pool_workers_exit():
    with SmartExecutor(2) as ex:
        ex.submit(NeverPickled().lookup, 0).result(timeout=30)
        ex.submit(NeverPickled().lookup, 0).result(timeout=30)
        ex.submit(NeverPickled().lookup, 0).result(timeout=30)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            workers = [
                c for c in child_processes(os.getpid()).values() if "resource_tracker" not in c
            ]
            if len(workers) <= 3:  # the current pool's 2 workers and its zygote
                break
            time.sleep(0.05)
        assert len(workers) <= 3, workers


def test_shared_object_is_freed_when_the_user_drops_it():
    with SmartExecutor(2) as ex:
        obj = NeverPickled()
        ref = weakref.ref(obj)
        assert list(ex.map(obj.lookup, range(10))) == list(range(10))
        del obj
        gc.collect()
        assert ref() is None


def test_resolve_unknown_token_says_why():
    with pytest.raises(LookupError, match="only workers forked by smartexec"):
        trampoline.resolve(10**9, "thing.method")


def test_shared_ref_pickles_to_a_few_bytes():
    import pickle

    ref = trampoline.SharedRef(trampoline.new_token(), "Index.query")
    assert len(pickle.dumps(ref)) < 200


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_dead_worker_fails_only_its_chunk(how):
    with SmartExecutor(2, backend="fork") as ex:
        futures = [ex.submit(crash_on, i, 3, how) for i in range(21)]
        outcomes = [f.exception(timeout=30) for f in futures]
        failed = [i for i, e in enumerate(outcomes) if e is not None]
        assert failed == [3]
        error = outcomes[3]
        assert isinstance(error, WorkerCrashedError)
        if how == "kill":
            assert "SIGKILL" in str(error) and "out-of-memory" in str(error)
            assert error.exitcode == -signal.SIGKILL
        else:
            assert "exit code 3" in str(error)
        assert [f.result() for i, f in enumerate(futures) if i != 3] == [
            i for i in range(21) if i != 3
        ]
        # the executor stays usable
        assert ex.submit(crash_on, 1, 3, how).result(timeout=30) == 1


def test_function_defined_in_main_runs_in_a_child_interpreter():
    result = run_python(
        """
        from smartexec import SmartExecutor

        def triple(x):
            return 3 * x

        if __name__ == "__main__":
            with SmartExecutor(2) as ex:
                print(ex.explain(triple).backend, list(ex.map(triple, range(5))))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "fork [0, 3, 6, 9, 12]"  # sent by value


def test_forgotten_shutdown_exits_promptly_and_leaves_no_worker():
    result = run_python(
        """
        import os, time
        from smartexec import SmartExecutor
        from tests.backends.test_fork import getpid
        ex = SmartExecutor(2, backend="fork")
        pids = set(ex.map(getpid, range(10), chunksize=1))
        print(" ".join(map(str, pids)))
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    _assert_gone([int(p) for p in result.stdout.split()])


def test_parent_killed_workers_exit_on_their_own():
    result = run_python(
        """
        import os
        from smartexec import SmartExecutor
        from tests.backends.test_fork import getpid
        ex = SmartExecutor(2, backend="fork")
        pids = set(ex.map(getpid, range(10), chunksize=1))
        print(" ".join(map(str, pids)), flush=True)
        os._exit(0)  # no shutdown, no atexit: the workers must notice
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    _assert_gone([int(p) for p in result.stdout.split()])


def _assert_gone(pids, within=5.0):
    deadline = time.monotonic() + within
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        if not alive:
            return
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"worker processes {alive} outlived their parent")


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def test_a_finished_pool_never_writes_to_a_reused_file_descriptor():
    # Regression: a retired pool's wake-up write once landed in loky's pipes
    # after the pool had closed its own pipe and the fd number was reused.
    from smartexec.backends.fork import _ForkPool

    pool = _ForkPool(1, dict)
    old_fd = pool._wake_w
    pool.shutdown(wait=True)
    r, w = os.pipe()
    try:
        reused = old_fd in (r, w)
        pool._wake()
        pool.shutdown(wait=True)
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 1)  # nothing was written into whatever owns the old number
        assert reused or True  # the check above holds whether or not the number was reused
    finally:
        os.close(r)
        os.close(w)


class Model:
    def __init__(self):
        self.weights = np.zeros(1 << 18)  # 2 MiB: shared by copy-on-write
        self.bias = 0.0

    def predict(self, x):
        return x + self.bias


def test_workers_see_the_state_as_it_was_at_each_call_without_refresh():
    model = Model()
    with SmartExecutor(2) as ex:
        assert ex.explain(model.predict).share
        assert list(ex.map(model.predict, range(4))) == [0.0, 1.0, 2.0, 3.0]
        model.bias = 100.0
        # issue 13: never the snapshot taken when the pool forked
        assert ex.submit(model.predict, 1).result(timeout=30) == 101.0
        model.bias = 200.0
        assert list(ex.map(model.predict, range(4))) == [200.0, 201.0, 202.0, 203.0]
        assert ex.refresh(model.predict)  # still answers: a copy was kept
        assert list(ex.map(model.predict, range(4))) == [200.0, 201.0, 202.0, 203.0]
        assert not ex.refresh(len)


def nested_sum(n):
    with SmartExecutor(2, backend="fork") as inner:
        return sum(inner.map(abs, range(-n, 0)))


class Outer:
    def __init__(self):
        self.data = np.ones(1 << 18)

    def work(self, n):
        return nested_sum(n) + int(self.data[0])


def test_a_task_can_run_its_own_fork_executor():
    outer = Outer()
    with SmartExecutor(2) as ex:
        assert ex.explain(outer.work).share
        assert list(ex.map(outer.work, [3, 4, 5])) == [7, 11, 16]


def blas_thread_counts(_=None):
    from threadpoolctl import threadpool_info

    return sorted({info["num_threads"] for info in threadpool_info()})


def threads_in_this_process(_=None):
    import os
    import threading
    import time

    # Less the thread that watches a callable's first chunks for the GIL. The
    # fewest of a few readings: a thread just joined may still be listed in
    # /proc while the system ends it (2 threads once on a busy machine); a
    # BLAS pool's threads stay.
    counts = []
    for _ in range(5):
        watchers = sum(t.name == "smartexec-gil" for t in threading.enumerate())
        counts.append(len(os.listdir("/proc/self/task")) - watchers)
        time.sleep(0.01)
    return min(counts)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_fork_workers_start_no_blas_threads():
    # Capping OpenBLAS in a fork child starts its pool, whose threads spin for
    # ~0.1 s of CPU: the zygote caps it once, and its workers inherit the cap.
    import numpy as np

    (np.ones((64, 64)) @ np.ones((64, 64))).sum()  # the parent's BLAS pool runs
    with SmartExecutor(2, backend="fork") as ex:
        counts = [ex.submit(threads_in_this_process).result(timeout=60) for _ in range(4)]
        assert max(ex.submit(blas_thread_counts).result(timeout=60)) <= 2
    assert counts == [1, 1, 1, 1]


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_process_workers_cap_blas_threads(backend):
    from smartexec._blas import threads_per_worker
    from smartexec._system import current_platform

    with SmartExecutor(2, backend=backend) as ex:
        # The counts are read before a product that starts the worker's BLAS
        # pool: every worker starts capped, a process's first fork pool's too.
        counts = [ex.submit(counts_then_product).result(timeout=60) for _ in range(2)][-1]
    expected = threads_per_worker(current_platform().cpu_count, 2)
    assert counts and max(counts) <= expected, counts


def counts_then_product():
    import numpy as np

    counts = blas_thread_counts()
    a = np.ones((400, 400))
    (a @ a).sum()
    return counts


def test_shutdown_with_wait_waits_while_another_pool_starts():
    # Another pool's start pauses this pool's dispatcher (for its zygote's
    # fork) and resumes it on a new thread: shutdown(wait=True) joined the old
    # one and returned with the sleep still running (an adversarial pass, 5/5).
    ex1 = SmartExecutor(backend="fork", max_workers=1)
    future = ex1.submit(time.sleep, 0.5)
    while not future.running():
        time.sleep(0.005)
    done_at_return = []

    def stop():
        ex1.shutdown(wait=True)
        done_at_return.append(future.done())

    stopper = threading.Thread(target=stop)
    stopper.start()
    time.sleep(0.05)
    with SmartExecutor(backend="fork", max_workers=1) as ex2:
        assert ex2.submit(abs, -1).result() == 1
    stopper.join()
    assert done_at_return == [True]


def test_the_dispatchers_poller_reports_what_wait_would():
    from multiprocessing import Pipe

    from smartexec.backends.fork import _Poller

    poller = _Poller()
    ours, theirs = Pipe()
    read_fd, write_fd = os.pipe()
    try:
        assert poller.wait([ours, read_fd], 0) == []  # nothing to read yet
        theirs.send_bytes(b"reply")
        assert poller.wait([ours, read_fd], 0) == [ours]
        os.write(write_fd, b"x")
        assert sorted(map(id, poller.wait([ours, read_fd], 1.0))) == sorted([id(ours), id(read_fd)])
        ours.recv_bytes()
        # A file left out of the next wait is not reported, even when ready.
        assert poller.wait([ours], 0) == []
        # A peer that closes its end counts as ready (read as EOF), as wait() has it.
        theirs.close()
        assert poller.wait([ours], 0.5) == [ours]
        with pytest.raises(EOFError):
            ours.recv_bytes()
        # A replaced connection on a reused descriptor is the one reported.
        ours.close()
        again, peer = Pipe()
        peer.send_bytes(b"")
        assert poller.wait([again], 1.0) == [again]
        again.close()
        peer.close()
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_submitted_call_s_future_reads_as_a_stdlib_future():
    # Issue 32: repr() named the subclass (<CallFuture ...>); code, doctests
    # and the InvalidStateError messages built from it expect the stdlib's
    # <Future at 0x... state=...>.
    with SmartExecutor(1, backend="fork") as ex:
        future = ex.submit(pow, 2, 5)
        assert future.result(timeout=30) == 32
    assert isinstance(future, concurrent.futures.Future)
    assert repr(future) == f"<Future at {id(future):#x} state=finished returned int>"
    with pytest.raises(concurrent.futures.InvalidStateError, match="^FINISHED: <Future at 0x"):
        future.set_result(1)
    assert repr(type(future)()).startswith("<Future at 0x")


def double_slowly(x):
    time.sleep(0.001)
    return 2 * x


@pytest.mark.parametrize("backend", [None, "fork"])
def test_a_dropped_executor_is_collected_stops_its_workers_and_its_map_runs_every_item(backend):
    # Issue 32: closures the map's results held (its chunks' sender, the
    # router's callback) held the executor, so that `del executor` and a
    # collection left it, and its workers, alive; as with the stdlib, the
    # items not sent yet are sent when it goes (as shutdown(wait=False)
    # sends them), so that every result can still be read.
    before = set(threading.enumerate())
    ex = SmartExecutor(2, backend=backend)
    results = ex.map(double_slowly, range(500))
    threads = [thread for thread in threading.enumerate() if thread not in before]
    collected = weakref.ref(ex)
    del ex
    gc.collect()
    assert collected() is None
    for thread in threads:  # the pool's dispatcher: it stops the workers as it ends
        thread.join(30)
        assert not thread.is_alive(), thread.name
    assert list(results) == [2 * x for x in range(500)]


class SlowToPickle:
    """An argument whose pickling takes :attr:`SECONDS`; :attr:`pickled` is set once one ended."""

    SECONDS = 3.0
    pickled = threading.Event()

    def __reduce__(self):
        time.sleep(self.SECONDS)
        SlowToPickle.pickled.set()
        return (SlowToPickle, ())


def constant(_):
    return 1


def test_map_timeout_holds_while_an_argument_takes_long_to_pickle():
    # Issue 32: on the default route (a pure-Python function goes to fork),
    # map() pickled the first item in the caller's thread to see whether the
    # items were dear to send, before any deadline was looked at:
    # map(timeout=1) over an argument whose pickling took 8 s raised
    # TimeoutError after 8 s. The fork and loky routes given by name
    # already pickled off the caller's thread.
    SlowToPickle.pickled.clear()
    with SmartExecutor(2) as ex:
        results = ex.map(constant, [SlowToPickle(), SlowToPickle()], timeout=0.5)
        with pytest.raises(concurrent.futures.TimeoutError):
            list(results)
        assert not SlowToPickle.pickled.is_set()  # raised before one pickle had ended


@pytest.mark.parametrize("backend", [None, "fork"])
def test_after_a_shutdown_that_does_not_wait_the_dispatcher_ends_with_its_work(backend):
    # Issue 32 (CPython's test_shutdown_no_wait, adapted in
    # test_cpython_conformance.py for 3.10 and 3.13): after
    # shutdown(wait=False), with the map's results unread, the pool runs
    # every item, then its dispatcher stops the workers and ends.
    children = set(child_processes(os.getpid()))
    before = set(threading.enumerate())
    ex = SmartExecutor(2, backend=backend)
    results = ex.map(double_slowly, range(500))
    threads = [thread for thread in threading.enumerate() if thread not in before]
    ex.shutdown(wait=False)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), thread.name
    assert set(child_processes(os.getpid())) <= children  # its workers and zygote are gone
    assert list(results) == [2 * x for x in range(500)]
