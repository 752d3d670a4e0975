"""A new fork pool's start: direct forks when alone, the zygote's replies not waited for."""

from __future__ import annotations

import os
import threading
import time

import pytest

from smartexec.backends import fork
from smartexec.errors import TaskTimeoutError

from .._children import run_python

pytestmark = pytest.mark.timeout(60)


def getpid():
    return os.getpid()


def nap(seconds):
    time.sleep(seconds)
    return os.getpid()


def parent_pid():
    return os.getppid()


@pytest.fixture
def user_thread():
    """A thread of the user's, running (waiting) for the length of the test."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="user-thread", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join()


class Held(list):
    """The zygote's "worker forked" replies (P messages) held back."""

    def __init__(self):
        super().__init__()
        self.released = threading.Event()

    def release(self):
        self.released.set()


@pytest.fixture
def unreported(monkeypatch):
    """Hold back the zygote's "worker forked" replies until ``release()``.

    Returns the list of held messages; the held ones are handled, in the
    dispatcher's thread, when it next looks for work after ``release``.
    """
    held = Held()
    released = held.released
    handle = fork._ForkPool._handle_ctl
    dispatch = fork._ForkPool._dispatch

    def holding(self, message):
        if message[:1] == b"P" and not released.is_set():
            held.append(message)
            return
        handle(self, message)

    def dispatching(self):
        if released.is_set():
            while held:
                handle(self, held.pop(0))
        dispatch(self)

    monkeypatch.setattr(fork._ForkPool, "_handle_ctl", holding)
    monkeypatch.setattr(fork._ForkPool, "_dispatch", dispatching)
    return held


def test_first_chunk_runs_before_the_zygote_reports_its_worker(unreported, user_thread):
    backend = fork.ForkBackend(2, 2)
    try:
        pid = backend.submit_chunk(getpid, [((), {})]).result(timeout=20).outcomes[0][1]
        assert pid != os.getpid()
        assert any(message.endswith(b" %d" % pid) for message in unreported)  # not yet handled
    finally:
        backend.shutdown()


def test_chunk_timed_out_before_its_worker_was_reported_kills_it_once_it_is(
    unreported, user_thread
):
    backend = fork.ForkBackend(1, 2)
    try:
        future = backend.submit_chunk(nap, [((30,), {})], timeout_s=0.5)
        with pytest.raises(TaskTimeoutError):
            future.result(timeout=20)
        assert unreported, "the worker was reported before its chunk timed out"
        pid = int(unreported[0].split()[1])
        unreported.release()
        # The next chunk wakes the dispatcher, which now handles the held
        # report: the doomed worker is killed, and a replacement runs the chunk.
        replacement = backend.submit_chunk(nap, [((0.2,), {})], timeout_s=20)
        assert replacement.result(timeout=20).outcomes[0][1] != pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"worker {pid}, whose chunk timed out, still runs")
    finally:
        backend.shutdown()


def test_with_a_user_thread_running_the_zygote_forks_the_workers(user_thread):
    backend = fork.ForkBackend(2, 2)
    try:
        ppid = backend.submit_chunk(parent_pid, [((), {})]).result(timeout=20).outcomes[0][1]
        assert backend._pool is not None and not backend._pool.forked_directly
        assert ppid == backend._pool._zygote.pid != os.getpid()
    finally:
        backend.shutdown()


def counting_spawns(monkeypatch):
    """Count the workers a pool asks its zygote for; returns the list that grows."""
    asked = []
    spawn = fork._forking._Forker.spawn

    def counted(self):
        asked.append(1)
        return spawn(self)

    monkeypatch.setattr(fork._forking._Forker, "spawn", counted)
    return asked


@pytest.mark.parametrize("direct", [True, False], ids=["alone", "user-thread"])
def test_a_new_pool_forks_more_workers_once_chunks_wait_behind_busy_ones(
    monkeypatch, request, direct
):
    # One worker at first (forked here, or by the zygote as it starts); the
    # others once chunks wait while every worker has been busy GROW_BLIND_S.
    if direct:
        monkeypatch.setattr(fork._forking, "_may_fork_directly", lambda initializer: True)
    else:
        request.getfixturevalue("user_thread")
    asked = counting_spawns(monkeypatch)
    backend = fork.ForkBackend(3, 2)
    try:
        futures = [backend.submit_chunk(nap, [((1.0,), {})]) for _ in range(3)]
        pids = {future.result(timeout=20).outcomes[0][1] for future in futures}
        assert len(pids) == 3 and os.getpid() not in pids  # all three ran at once
        assert backend._pool is not None and backend._pool.forked_directly is direct
        assert len(asked) == 2
    finally:
        backend.shutdown()


@pytest.mark.parametrize(
    "fn, args, workers",
    [(getpid, (), 1), (nap, (0.05,), 2)],
    ids=["microseconds-stay-on-one", "measured-work-forks-another"],
)
def test_a_pool_grows_by_the_measured_work_that_waits(monkeypatch, fn, args, workers):
    # The other rules are put out of reach (a busy machine may stall a
    # worker for ms). Forty chunks of microseconds hold far under
    # GROW_WORK_S of work; once a 50 ms chunk has finished, the 39 that wait
    # hold ~2 s.
    monkeypatch.setattr(fork._pool, "GROW_BLIND_S", 3600.0)
    monkeypatch.setattr(fork._pool, "GROW_BACKLOG_S", 3600.0)
    asked = counting_spawns(monkeypatch)
    backend = fork.ForkBackend(2, 2)
    try:
        futures = [backend.submit_chunk(fn, [(args, {})]) for _ in range(40)]
        pids = {future.result(timeout=30).outcomes[0][1] for future in futures}
        assert len(pids) == workers and len(asked) == workers - 1
    finally:
        backend.shutdown()


# In a fresh interpreter: this one may run threads left by other tests (loky's),
# which rightly send every pool through the zygote.
DIRECT = """
    import os, threading
    import numpy as np
    from threadpoolctl import threadpool_info
    from smartexec.backends import fork
    from smartexec.errors import WorkerCrashedError
    from smartexec import _blas
    from tests.backends.test_fork import blas_thread_counts
    from tests.backends.test_fork_start import parent_pid, crash, nap, use_blas

    (np.ones((64, 64)) @ np.ones((64, 64))).sum()  # this process's BLAS pool runs
    limits = [lib["num_threads"] for lib in threadpool_info()]
    backend = fork.ForkBackend(2, 2)
    chunk = [((), {})]
    first = backend.submit_chunk(parent_pid, chunk).result(timeout=20).outcomes[0][1]
    pool = backend._pool
    assert pool.forked_directly and pool.took_first and first == os.getpid(), first
    # This process's first pool too: its table was built here, for the forks,
    # and this process's limits put back after them.
    assert _blas._controller is not None
    assert [lib["num_threads"] for lib in threadpool_info()] == limits
    # Two chunks at once: the second waits behind the first, so the zygote
    # forks a second worker. One worker was forked here, the other there.
    both = [((0.3,), {})]
    futures = [backend.submit_chunk(nap, both) for _ in range(2)]
    assert len({future.result(timeout=20).outcomes[0][1] for future in futures}) == 2
    assert [w.pidfd is not None for w in pool._workers] == [True, False]
    for _ in range(2):  # both capped from their start: 2 CPUs, 2 workers: 1 each
        futures = [backend.submit_chunk(use_blas, both) for _ in range(2)]
        pids, caps = set(), []
        for future in futures:
            pid, counts = future.result(timeout=20).outcomes[0][1]
            pids.add(pid)
            caps += counts
        assert len(pids) == 2 and max(caps) <= 1, caps
    backend.shutdown()

    # A later pool starts capped too, with the table built for the first.
    backend = fork.ForkBackend(2, 2)
    caps = backend.submit_chunk(blas_thread_counts, chunk).result(timeout=20).outcomes[0][1]
    assert _blas._controller is not None and caps and max(caps) <= 1, caps
    assert [lib["num_threads"] for lib in threadpool_info()] == limits  # restored here
    backend.shutdown()

    backend = fork.ForkBackend(1, 2)
    assert backend.submit_chunk(parent_pid, chunk).result(timeout=20).outcomes[0][1] == os.getpid()
    pool = backend._pool
    zygote = pool._zygote.pid
    # Idle, with no worker to fork yet, the zygote has not capped its BLAS
    # pools: capping starts OpenBLAS's threads, which would spin there
    # (~50 ms of CPU).
    assert os.listdir(f"/proc/{zygote}/task") == [str(zygote)]
    direct = pool._workers[0].pid
    try:
        backend.submit_chunk(crash, chunk).result(timeout=20)
    except WorkerCrashedError as exc:
        assert exc.exitcode == 3, exc  # reaped here, through its pidfd
    else:
        raise AssertionError("no crash")
    # Replaced by one of the zygote's.
    assert backend.submit_chunk(parent_pid, chunk).result(timeout=20).outcomes[0][1] == zygote
    assert not os.path.exists(f"/proc/{direct}")  # reaped, gone
    backend.shutdown()
    assert not pool._workers
    print("ok")
"""


def crash():
    os._exit(3)


FIRST_POOL = """
    import numpy as np
    from smartexec.backends import fork
    from tests.backends.test_fork import blas_thread_counts, threads_in_this_process

    (np.ones((64, 64)) @ np.ones((64, 64))).sum()  # this process's BLAS pool runs
    backend = fork.ForkBackend(2, 2)
    chunk = [((), {})]
    for _ in range(4):  # one thread: no BLAS pool started, nor a cap that would start it
        threads = backend.submit_chunk(threads_in_this_process, chunk).result(timeout=20)
        assert threads.outcomes[0][1] == 1, threads
    assert backend._pool.forked_directly
    # Capped all the same, by inheritance: 2 CPUs, 2 workers, 1 thread each.
    counts = backend.submit_chunk(blas_thread_counts, chunk).result(timeout=20).outcomes[0][1]
    assert counts == [1], counts
    backend.shutdown()
    print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="direct forks need os.pidfd_open")
def test_a_first_pool_s_worker_starts_capped_and_runs_no_blas_thread():
    # Capping OpenBLAS in a fork child starts its pool, whose threads spin:
    # the first worker, forked here directly, is capped by inheritance (this
    # process limits its pools for the fork) and starts none. (When it capped
    # its pools itself, its own thread's native_id, still the parent's after
    # the fork, read as a thread Python does not know: every first worker
    # capped after one chunk.)
    result = run_python(FIRST_POOL, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def use_blas(seconds):
    """A product big enough for OpenBLAS to start its threads, then a nap; the pid and BLAS counts.

    The counts are read before the product, as the worker starts it.
    """
    import numpy as np

    from tests.backends.test_fork import blas_thread_counts

    counts = blas_thread_counts()
    a = np.ones((400, 400))
    (a @ a).sum()
    time.sleep(seconds)
    return os.getpid(), counts


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="direct forks need os.pidfd_open")
def test_alone_the_first_workers_are_forked_directly_and_reaped_here():
    result = run_python(DIRECT, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def frozen_objects():
    import gc

    return gc.get_freeze_count()


def test_workers_freeze_what_they_inherit_out_of_their_garbage_collector(user_thread):
    # A collection in a worker would write to every inherited object it scans,
    # copying the parent's pages; frozen, they are not scanned. Both paths:
    # the zygote's workers (a user thread runs here) and the direct ones.
    backend = fork.ForkBackend(1, 2)
    try:
        frozen = backend.submit_chunk(frozen_objects, [((), {})]).result(timeout=20)
        assert frozen.outcomes[0][1] > 1000
    finally:
        backend.shutdown()
    result = run_python(
        """
        from smartexec.backends import fork
        from tests.backends.test_fork_start import frozen_objects
        backend = fork.ForkBackend(1, 2)
        outcome = backend.submit_chunk(frozen_objects, [((), {})]).result(timeout=20)
        assert backend._pool.forked_directly
        backend.shutdown()
        print(outcome.outcomes[0][1])
        """
    )
    assert result.returncode == 0 and int(result.stdout) > 1000, result.stderr


def test_no_direct_fork_with_an_initializer_or_without_pidfds(monkeypatch):
    # An initializer's failure is reported through the zygote; a worker forked
    # here is reaped through its pidfd (Linux 5.3+).
    assert not fork._may_fork_directly(print)
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    assert not fork._may_fork_directly(None)


def span(seconds):
    """Sleep; the pid and the span, on the machine's monotonic clock (shared by processes)."""
    start = time.monotonic()
    time.sleep(seconds)
    return os.getpid(), start, time.monotonic()


def crash_after(seconds):
    time.sleep(seconds)
    os._exit(1)


def most_at_once(spans):
    edges = sorted([(start, 1) for _, start, _ in spans] + [(end, -1) for _, _, end in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("how", ["max_tasks_per_child", "crashes"])
def test_a_growing_pool_never_runs_more_than_max_workers(how):
    # A worker that exited (its share run, or crashed) and was not yet
    # replaced left room to grow into, and its replacement came on top: up
    # to 8 chunks ran at once with max_workers=2 (an adversarial pass).
    from smartexec import SmartExecutor

    options = {"max_tasks_per_child": 1} if how == "max_tasks_per_child" else {}
    with SmartExecutor(2, backend="fork", **options) as ex:
        futures = [
            ex.submit(crash_after, 0.02)
            if how == "crashes" and i % 4 == 0
            else ex.submit(span, 0.05)
            for i in range(40)
        ]
        spans = []
        for future in futures:
            try:
                spans.append(future.result(timeout=30))
            except Exception:
                pass
    assert spans and most_at_once(spans) <= 2


def test_cancel_futures_keeps_a_chunk_for_each_worker_not_forked_yet():
    # The stdlib keeps the tasks its workers are about to take; workers a
    # growing pool has not forked yet would be idle for them, as forked ones
    # were (one of 8 ran, against 4 before pools grew on demand).
    backend = fork.ForkBackend(4, 2)
    futures = [backend.submit_chunk(nap, [((0.2,), {})]) for _ in range(8)]
    backend.shutdown(wait=True, cancel_futures=True)
    assert sum(f.cancelled() for f in futures) == 4
    assert all(f.result(timeout=20) for f in futures if not f.cancelled())


def spin(seconds):
    """Keep the CPU busy for ``seconds``; this process's pid."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return os.getpid()


def test_a_map_s_steady_backlog_forks_more_workers(monkeypatch):
    # A map sends a window of chunks at a time: the queue never shows more
    # than a few short ones (three here: under GROW_WORK_S of work), yet the
    # worker is never idle. 0.4 ms chunks, the blind rule out of reach: the
    # backlog rule forks the second worker (sha256 of the demo's files ran
    # on one for most of the map).
    from smartexec import SmartExecutor

    monkeypatch.setattr(fork._pool, "GROW_BLIND_S", 3600.0)
    with SmartExecutor(2, backend="fork") as ex:
        pids = set(ex.map(spin, [0.0004] * 500, chunksize=1, buffersize=3))
    assert len(pids) == 2
