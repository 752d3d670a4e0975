"""Issue 6: a crash fails one task, per-task timeouts, errors that survive the trip,
clean Ctrl-C and exit, thread safety, nested executors.

Every test bounds its own time (pytest-timeout); none asserts a duration.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from concurrent.futures import TimeoutError as FuturesTimeoutError

import pytest

from smartexec import RemoteError, SmartExecutor, TaskTimeoutError, WorkerCrashedError
from smartexec.errors import PayloadPicklingError

from .. import _children
from . import _reliability_workloads as w

pytestmark = pytest.mark.timeout(60)


# -- crash containment ---------------------------------------------------------


def test_a_sigkilled_worker_fails_one_task_and_the_executor_goes_on():
    with SmartExecutor(2) as ex:
        futures = [ex.submit(w.kill_self_at, i) for i in range(21)]
        results, errors = [], []
        for future in futures:
            try:
                results.append(future.result(timeout=30))
            except WorkerCrashedError as exc:
                errors.append(exc)
        assert len(errors) == 1 and len(results) == 20
        assert "SIGKILL" in str(errors[0]) and "memory" in str(errors[0])
        assert errors[0].exitcode == -signal.SIGKILL
        assert ex.submit(w.square, 7).result(timeout=30) == 49  # replaced worker


def test_max_retries_reruns_a_task_whose_worker_died(tmp_path):
    marker = str(tmp_path / "died-once")
    with SmartExecutor(2, max_retries=1) as ex:
        assert ex.submit(w.kill_self_once, 5, marker).result(timeout=30) == 5
    with SmartExecutor(2, max_retries=0) as ex:
        os.remove(marker)
        with pytest.raises(WorkerCrashedError):
            ex.submit(w.kill_self_once, 5, marker).result(timeout=30)


def test_a_crashed_chunk_is_retried_one_item_at_a_time_so_only_the_culprit_fails():
    with SmartExecutor(2, max_retries=1) as ex:
        got = []
        with pytest.raises(WorkerCrashedError):
            for value in ex.map(w.kill_self_at, range(8), chunksize=4):
                got.append(value)
    assert got == [0, 1, 2]  # items 0-2 shared a chunk with 3: run again, alone


# -- per-task timeouts -----------------------------------------------------------


def test_a_stuck_task_times_out_its_worker_is_killed_and_neighbours_finish():
    with SmartExecutor(2, task_timeout=1.0) as ex:
        stuck = ex.submit(w.sleep_then_return, 60)
        neighbours = [ex.submit(w.sleep_then_return, 0.1) for _ in range(6)]
        with pytest.raises(TaskTimeoutError) as info:
            stuck.result(timeout=30)
        assert isinstance(info.value, TimeoutError)
        assert isinstance(info.value, FuturesTimeoutError)
        assert "task_timeout of 1 s" in str(info.value)
        pid = int(str(info.value).split("pid ")[1].split(")")[0])
        assert [f.result(timeout=30)[0] for f in neighbours] == [0.1] * 6
        assert ex.submit(w.square, 3).result(timeout=30) == 9
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the stuck worker is gone


def test_map_task_timeout_fails_the_stuck_item_at_its_position():
    with SmartExecutor(2) as ex:
        got = []
        with pytest.raises(TimeoutError):
            for seconds, _ in ex.map(
                w.sleep_then_return, [0.01, 0.01, 60, 0.01], chunksize=4, task_timeout=1
            ):
                got.append(seconds)
    assert got == [0.01, 0.01]


def test_task_timeout_on_threads_fails_the_future_and_the_call_runs_on():
    with SmartExecutor(2, backend="thread", task_timeout=0.2) as ex:
        future = ex.submit(w.sleep_then_return, 1.0)
        with pytest.raises(TaskTimeoutError, match="threads cannot be stopped"):
            future.result(timeout=30)


def test_task_timeout_moves_closures_from_loky_to_fork():
    def closure(x):
        return x + 1

    with SmartExecutor(2, task_timeout=5) as ex:
        decision = ex.explain(closure)
        assert decision.backend == "fork", str(decision)
        assert "task_timeout" in str(decision)
        assert ex.submit(closure, 1).result(timeout=30) == 2


@pytest.mark.parametrize("bad", [0, -1, "1", True])
def test_bad_task_timeout_is_refused(bad):
    with pytest.raises((TypeError, ValueError), match="task_timeout"):
        SmartExecutor(task_timeout=bad)


def test_a_backend_that_cannot_time_out_a_task_is_refused_with_the_fix():
    with pytest.raises(ValueError, match='backend="fork"'):
        SmartExecutor(backend="loky", task_timeout=1)


# -- errors that survive the trip -----------------------------------------------


def test_an_exception_needing_constructor_arguments_arrives_with_its_traceback():
    with SmartExecutor(2, backend="fork") as ex:
        with pytest.raises(RemoteError) as info:
            ex.submit(w.raise_needs_args, 7).result(timeout=30)
    error = info.value
    assert "NeedsArgs" in str(error) and "code 7: boom" in str(error)
    assert "raise_needs_args" in "".join(traceback.format_exception(error))


def test_an_unpicklable_result_arrives_as_a_clear_error():
    with SmartExecutor(2, backend="fork") as ex:
        with pytest.raises(PayloadPicklingError, match="result") as info:
            ex.submit(w.return_a_lock).result(timeout=30)
        assert "lock" in str(info.value)
        assert ex.submit(w.square, 2).result(timeout=30) == 4


def test_each_future_gets_its_own_exception_object():
    with SmartExecutor(2, backend="fork") as ex:
        futures = [ex.submit(w.fail, 1) for _ in range(3)]
        errors = [f.exception(timeout=30) for f in futures]
    assert len({id(e) for e in errors}) == 3
    before = [len(traceback.format_exception(e)) for e in errors[1:]]
    for _ in range(3):
        try:
            raise errors[0]
        except ValueError:
            pass
    # raising one future's error leaves the others' tracebacks as they were
    assert [len(traceback.format_exception(e)) for e in errors[1:]] == before


# -- Ctrl-C and interpreter exit --------------------------------------------------


def _wait_for_line(proc, text, timeout=30):
    lines = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                return
    finally:
        timer.cancel()
    raise AssertionError("child never printed " + repr(text) + ": " + "".join(lines))


@pytest.mark.parametrize("use_with", [True, False])
def test_ctrl_c_during_map_stops_workers_and_leaves_no_orphans(use_with):
    body = (
        """
        with SmartExecutor(2) as ex:
            run(ex)
        """
        if use_with
        else """
        ex = SmartExecutor(2)
        run(ex)
        """
    )
    proc = _children.start_python(
        """
        from smartexec import SmartExecutor
        from tests.scenarios import _reliability_workloads as w

        def run(ex):
            out = ex.map(w.sleep_then_return, [30] * 8, chunksize=1)
            print("started", flush=True)
            for _ in out:
                pass
        """
        + body
    )
    try:
        _wait_for_line(proc, "started")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # parent, zygote, 2 workers
            alive = _children.session_processes(proc.pid)
            if len(alive) >= 4:
                break
            time.sleep(0.05)
        assert len(alive) >= 4, alive
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)  # the issue asks for 2 s; 10 bounds a noisy machine
        except Exception:
            raise AssertionError("the child did not exit after Ctrl-C") from None
        assert "KeyboardInterrupt" in proc.stderr.read()
        assert _children.session_processes(proc.pid) == {}
    finally:
        for pid in _children.session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("backend", [None, "fork"])
def test_a_forgotten_shutdown_does_not_hold_the_exit(backend):
    # With backend="fork" the executor's own clean-up for a dropped executor
    # ran at exit too (weakref.finalize's default) and had the fork pool run
    # its whole queue out: 4 calls of 60 s held the exit.
    result = _children.run_python(
        f"""
        from smartexec import SmartExecutor
        from tests.scenarios import _reliability_workloads as w

        import time

        ex = SmartExecutor(2, backend={backend!r})
        running = [ex.submit(w.sleep_then_return, 60) for _ in range(2)]
        queued = [ex.submit(w.sleep_then_return, 60) for _ in range(4)]
        while not all(f.running() for f in running):
            time.sleep(0.01)
        print("exiting", flush=True)
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "exiting" in result.stdout


@pytest.mark.parametrize("backend", ["fork", "loky", "thread"])
def test_work_queued_before_shutdown_without_wait_runs_at_exit(backend, tmp_path):
    # As concurrent.futures: shutdown(wait=False) returns, and the queued
    # calls still run before the interpreter exits. loky's backend handed
    # loky one chunk per worker and kept the rest: 2 of 6 ran.
    result = _children.run_python(
        f"""
        import os, time
        from smartexec import SmartExecutor

        def touch(i):
            time.sleep(0.2)
            open(os.path.join({str(tmp_path)!r}, str(i)), "w").close()
            return i

        ex = SmartExecutor(2, backend={backend!r})
        futures = [ex.submit(touch, i) for i in range(6)]
        mapped = ex.map(touch, range(6, 10), chunksize=1)
        ex.shutdown(wait=False)
        print("exiting", flush=True)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(int(name) for name in os.listdir(tmp_path)) == list(range(10)), result.stderr


# -- thread safety and nesting ---------------------------------------------------


def test_eight_threads_share_one_executor():
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    with SmartExecutor(2) as ex:

        def hammer(k):
            try:
                futures = [ex.submit(w.square, k * 100 + j) for j in range(25)]
                mapped = list(ex.map(w.square, range(k * 100, k * 100 + 25)))
                results[k] = [f.result(timeout=30) for f in futures]
                assert mapped == results[k]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert results == {k: [(k * 100 + j) ** 2 for j in range(25)] for k in range(8)}


def test_shutdown_racing_with_submits_never_hangs_or_loses_a_future():
    ex = SmartExecutor(2)
    futures, refused = [], []
    start = threading.Barrier(5)

    def submit_many():
        start.wait()
        for i in range(50):
            try:
                futures.append(ex.submit(w.square, i))
            except RuntimeError:
                refused.append(i)

    threads = [threading.Thread(target=submit_many) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait()
    ex.shutdown(wait=True)
    for t in threads:
        t.join(30)
    for future in futures:
        assert future.result(timeout=30) is not None
    assert len(futures) + len(refused) == 200


def test_a_task_that_creates_an_executor_runs_its_work_inline():
    from smartexec import gil

    gil.forget()  # fork workers inherit the measurements: start from none
    for backend in ("fork", "loky"):
        with SmartExecutor(2, backend=backend) as ex:
            results, inner_backend, _ = ex.submit(w.nested_map, 5).result(timeout=60)
        assert results == [0, 1, 4, 9, 16]
        assert inner_backend == "inline", backend
    with SmartExecutor(2) as ex:
        assert ex.explain(w.square).backend == "fork"  # the outer process is no worker
