"""Python 3.14's executor API: terminate_workers(), kill_workers(), map(buffersize=), the start method.

Python 3.14 cannot be installed here: its semantics are checked as its
documentation and ``Lib/concurrent/futures`` define them, and its new
default start method on Linux (forkserver) is forced in a child interpreter.
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from smartexec import SmartExecutor, WorkerCrashedError

from ._children import run_python

pytestmark = pytest.mark.timeout(90)

#: Longest wait for a worker to report that its item started, seconds.
START_S = 30.0


def square(x):
    return x * x


def nap_marked(seconds, marker):
    """Write ``marker`` (a path), then sleep: the test knows the item is running."""
    Path(marker).write_text("started")
    time.sleep(seconds)
    return seconds


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + START_S
    while not path.exists():
        assert time.monotonic() < deadline, f"the item never started ({path})"
        time.sleep(0.01)


# -- terminate_workers() / kill_workers() ----------------------------------------


@pytest.mark.parametrize("backend", ["fork", "loky"])
@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_signalling_the_workers_ends_running_items_and_cancels_the_rest(backend, method, tmp_path):
    ex = SmartExecutor(2, backend=backend)
    markers = [tmp_path / f"started-{i}" for i in range(2)]
    running = [ex.submit(nap_marked, 60, str(m)) for m in markers]
    queued = [ex.submit(square, i) for i in range(4)]
    for marker in markers:
        wait_for(marker)
    getattr(ex, method)()
    done, not_done = cf.wait(running + queued, timeout=30)
    assert not not_done
    for future in running:
        error = future.exception()
        # The stdlib's error; not a WorkerCrashedError, which a map would re-send.
        assert isinstance(error, BrokenProcessPool), error
        assert not isinstance(error, WorkerCrashedError), error
        assert f"{method}()" in str(error)
    assert all(future.cancelled() for future in queued)
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        ex.submit(square, 2)
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        ex.map(square, [1])
    ex.shutdown(wait=True)  # then no worker process is left (the conftest checks)


def ignore_sigterm_then_nap(seconds, marker):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return nap_marked(seconds, marker)


def test_a_fork_worker_that_outlives_sigterm_finishes_its_call(tmp_path):
    # As the stdlib's: a signal sent is not a signal obeyed; nothing is replaced.
    marker = tmp_path / "started"
    with SmartExecutor(1, backend="fork") as ex:
        running = ex.submit(ignore_sigterm_then_nap, 0.5, str(marker))
        queued = ex.submit(square, 3)
        wait_for(marker)
        ex.terminate_workers()
        assert running.result(timeout=30) == 0.5
        assert queued.cancelled()


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_map_in_flight_raises_the_error_at_its_running_item(backend, tmp_path):
    marker = tmp_path / "started"
    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(nap_marked, [60, 60, 60], [str(marker)] * 3, chunksize=1, buffersize=1)
        wait_for(marker)
        ex.kill_workers()
        with pytest.raises(BrokenProcessPool, match=r"kill_workers\(\) \(SIGKILL\)"):
            next(results)


@pytest.mark.parametrize("backend", [None, "fork", "loky", "thread", "inline"])
@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_an_executor_that_started_no_workers(backend, method):
    ex = SmartExecutor(2, backend=backend)
    getattr(ex, method)()
    getattr(ex, method)()  # again: nothing more happens
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        ex.submit(square, 2)
    ex.shutdown()


def test_threads_cannot_be_signalled_running_calls_run_on():
    started, release = threading.Event(), threading.Event()

    def held():
        started.set()
        release.wait(30)
        return "ran on"

    ex = SmartExecutor(1, backend="thread")
    running = ex.submit(held)
    queued = ex.submit(square, 3)
    assert started.wait(START_S)
    ex.terminate_workers()
    release.set()
    assert running.result(timeout=30) == "ran on"
    assert queued.cancelled()
    ex.shutdown()


# -- map(buffersize=) ---------------------------------------------------------------


@pytest.mark.parametrize("bad", ["2", 2.0, True])
def test_buffersize_type_error_in_the_stdlibs_words(bad):
    with SmartExecutor(backend="inline") as ex:
        with pytest.raises(TypeError, match="buffersize must be an integer or None"):
            ex.map(square, range(4), buffersize=bad)


@pytest.mark.parametrize("bad", [0, -1])
def test_buffersize_value_error_in_the_stdlibs_words(bad):
    with SmartExecutor(backend="inline") as ex:
        with pytest.raises(ValueError, match="buffersize must be None or > 0"):
            ex.map(square, range(4), buffersize=bad)


@pytest.mark.parametrize("backend", [None, "thread", "fork", "loky"])
@pytest.mark.parametrize("buffersize", [1, 3])
def test_buffersize_reads_the_input_as_python_314_does(backend, buffersize):
    # 3.14: map() submits `buffersize` tasks; each result asked for submits
    # one more before its wait. So after k results, k + buffersize were read.
    n = 8
    pulled = 0

    def items():
        nonlocal pulled
        for i in range(n):
            pulled += 1
            yield i

    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(square, items(), chunksize=1, buffersize=buffersize)
        assert pulled == buffersize
        for taken, value in enumerate(results, start=1):
            assert value == (taken - 1) ** 2
            assert pulled == min(n, taken + buffersize), (taken, pulled)


def test_buffersize_with_several_iterables_stops_at_the_shortest():
    with SmartExecutor(2, backend="thread") as ex:
        got = list(ex.map(pow, range(10), [2] * 4, buffersize=2))
    assert got == [0, 1, 4, 9]


# -- the start method ------------------------------------------------------------------


def test_explain_names_the_start_method_of_the_route():
    with SmartExecutor(2, backend="fork") as ex:
        assert "fork workers (start method: fork" in str(ex.explain(square))
    with SmartExecutor(2, backend="loky") as ex:
        assert "loky workers (start method: loky's own fork+exec" in str(ex.explain(square))
    with SmartExecutor(2, backend="thread") as ex:
        assert "start method" not in str(ex.explain(square))


@pytest.mark.timeout(120)
def test_fork_routes_work_with_forkserver_as_the_default_start_method():
    # Python 3.14 on Linux: forkserver is the default. smartexec's fork route
    # asks for fork by name, so __main__ functions and closures still run
    # there, no forkserver process is ever started, and explain() says so.
    result = run_python(
        """
        import multiprocessing
        import multiprocessing.forkserver

        multiprocessing.set_start_method("forkserver", force=True)

        from smartexec import SmartExecutor

        def square(x):  # defined in __main__
            return x * x

        def make_scaler(k):
            def scale(x):  # a closure
                return x * k
            return scale

        scale = make_scaler(3)
        for backend in (None, "fork"):
            with SmartExecutor(2, backend=backend) as ex:
                assert ex.explain(square).backend == "fork", ex.explain(square)
                assert "start method: fork" in str(ex.explain(square))
                assert ex.explain(scale).backend == "fork", ex.explain(scale)
                assert list(ex.map(square, range(50))) == [x * x for x in range(50)]
                assert list(ex.map(scale, range(50))) == [3 * x for x in range(50)]
                assert ex.submit(square, 7).result() == 49
                assert ex.submit(scale, 7).result() == 21
                assert ex.submit(lambda: 5).result() == 5
        with SmartExecutor(2, backend="loky") as ex:
            assert list(ex.map(scale, range(20))) == [3 * x for x in range(20)]
            assert "start method: loky" in str(ex.explain(scale))
        assert multiprocessing.get_start_method() == "forkserver"
        assert multiprocessing.forkserver._forkserver._forkserver_pid is None
        print("ok")
        """,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok"), result.stdout
