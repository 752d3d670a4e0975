"""Issue 14, item 7: threads that are not the user's do not block fork.

joblib's and loky's executor threads (left after a ``Parallel`` run), tqdm's
monitor and a Jupyter kernel's threads are library threads idle in a known
wait: they hold no lock a forked worker could need, so a module function
still goes to fork, and ``explain()`` names them. An unknown thread, or a
known one that is busy or runs someone else's code, still counts as the
user's running thread and keeps work off fork.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from smartexec import SmartExecutor, _threads

from . import _children
from .scenarios import _reliability_workloads as w

pytestmark = pytest.mark.timeout(120)

ROOT = str(Path(__file__).resolve().parent.parent)

#: Show, in a child's stderr, Python's warning at a fork of a multi-threaded
#: process (3.12+; os.fork reports it as unraisable even under "error").
FORK_WARNING_SHOWS = """
import warnings
warnings.filterwarnings("always", message=".*multi-threaded, use of fork", category=DeprecationWarning)
"""


@pytest.fixture(autouse=True)
def no_tqdm_monitor():
    """Stop a tqdm monitor thread an earlier test left (the census here counts threads)."""
    std = sys.modules.get("tqdm.std")
    if std is not None:
        for thread in threading.enumerate():
            if isinstance(thread, std.TMonitor):
                thread.exit()
        classes = [std.tqdm]
        while classes:
            cls = classes.pop()
            classes += cls.__subclasses__()
            if cls.__dict__.get("monitor") is not None:
                cls.monitor = None
    yield


def _run(code: str) -> str:
    result = _children.run_python(FORK_WARNING_SHOWS + textwrap.dedent(code), timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is multi-threaded" not in result.stderr, result.stderr
    return result.stdout


def test_after_joblib_a_module_function_still_forks_and_explain_names_its_threads():
    out = _run(
        """
        import math, threading
        from joblib import Parallel, delayed
        from smartexec import SmartExecutor
        from tests.scenarios import _reliability_workloads as w
        from tests import _thread_workloads as t

        assert Parallel(n_jobs=2)(delayed(math.sqrt)(i) for i in (1, 4)) == [1.0, 2.0]
        print("threads", sorted(x.name for x in threading.enumerate()))
        with SmartExecutor(2) as ex:
            decision = ex.explain(w.square)
            print("backend", decision.backend)
            print("reasons", str(decision).replace("\\n", " "))
            print("squares", list(ex.map(w.square, range(6), chunksize=1)))
            print("ran", ex.decisions()[-1].backend)
            # a fork worker runs joblib itself: it must not use the parent's executor
            print("nested", list(ex.map(t.joblib_sum_of_roots, [1, 2], timeout=60)))
            print("nested ran", ex.decisions()[-1].backend)
        """
    )
    assert "ExecutorManagerThread" in out and "QueueFeederThread" in out, out
    assert "backend fork" in out, out
    assert "joblib/loky's executor manager: 'ExecutorManagerThread'" in out, out
    assert "squares [0, 1, 4, 9, 16, 25]" in out and "ran fork" in out, out
    assert "nested [0.0, 1.0]" in out and "nested ran fork" in out, out


def test_after_a_tqdm_bar_its_monitor_does_not_stop_fork():
    out = _run(
        """
        import io, time
        from tqdm import tqdm
        from smartexec import SmartExecutor
        from tests.scenarios import _reliability_workloads as w

        for _ in tqdm(range(3), file=io.StringIO()):
            time.sleep(0.001)
        assert tqdm.monitor is not None and tqdm.monitor.is_alive()
        with SmartExecutor(2) as ex:
            decision = ex.explain(w.square_by_call)
            print("backend", decision.backend)
            print("reasons", str(decision).replace("\\n", " "))
            print("squares", list(ex.map(w.square_by_call, range(4))), ex.decisions()[-1].backend)
        """
    )
    assert "backend fork" in out and "tqdm's monitor: 'tqdm_monitor'" in out, out
    assert "squares [0, 1, 4, 9] fork" in out, out


@pytest.mark.skipif(
    importlib.util.find_spec("ipykernel") is None
    or importlib.util.find_spec("jupyter_client") is None,
    reason="needs ipykernel and jupyter_client (pip install ipykernel)",
)
@pytest.mark.timeout(150)
def test_in_a_jupyter_kernel_its_threads_do_not_stop_fork():
    from jupyter_client.manager import start_new_kernel

    code = FORK_WARNING_SHOWS + textwrap.dedent(
        f"""
        import sys, threading
        sys.path.insert(0, {ROOT!r})
        from smartexec import SmartExecutor
        from tests.scenarios import _reliability_workloads as w
        print("threads", len(threading.enumerate()))

        def cell_function(x):  # defined in a notebook cell: __main__, sent by value
            return x + 1

        with SmartExecutor(2) as ex:
            decision = ex.explain(w.square_by_call)
            print("backend", decision.backend)
            print("reasons", str(decision).replace("\\n", " "))
            print("squares", list(ex.map(w.square_by_call, range(4))), ex.decisions()[-1].backend)
            print("cell", ex.explain(cell_function).backend, list(ex.map(cell_function, range(3))))
        """
    )
    kernel, client = start_new_kernel(kernel_name="python3", cwd=ROOT)
    out: list[str] = []

    def hook(message):
        if message["msg_type"] == "stream":
            out.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            out.append("\n".join(message["content"]["traceback"]))

    try:
        client.execute_interactive(code, output_hook=hook, timeout=100)
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
    text = "".join(out)
    assert "backend fork" in text, text
    assert "the Jupyter kernel's: 'IOPub'" in text and "'Heartbeat'" in text, text
    assert "squares [0, 1, 4, 9] fork" in text, text
    assert "cell fork [1, 2, 3]" in text, text


# -- in this process: what counts, and what does not ------------------------------------

LIBRARY_THREAD = '''
import threading

class TMonitor(threading.Thread):
    """Stands for tqdm's monitor: a known class, defined in a module of tqdm."""

    def __init__(self, stop, how, callback=None):
        super().__init__(daemon=True, name="monitor-" + how)
        self.stop, self.how, self.callback = stop, how, callback

    def run(self):
        if self.how == "waits":
            self.stop.wait()
        elif self.how == "spins":
            while not self.stop.is_set():
                pass
        elif self.how == "spins, then waits":
            import time

            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                pass
            self.stop.wait()
        else:
            self.callback()
'''


def _library_thread(stop: threading.Event, how: str) -> threading.Thread:
    namespace: dict = {"__name__": "tqdm._monitor"}
    exec(LIBRARY_THREAD, namespace)

    def callback() -> None:  # someone else's code, on the known thread's stack
        stop.wait()

    thread = namespace["TMonitor"](stop, how, callback=callback)
    thread.start()
    return thread


def _settled(thread: threading.Thread) -> None:
    """Wait until ``thread`` is past its start (its stack is where it stays)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None and frame.f_code.co_name in ("wait", "run", "is_set"):
            time.sleep(0.05)
            return
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["waits", "spins", "calls back"])
def test_a_known_thread_is_left_out_only_while_it_waits_in_its_own_code(how):
    stop = threading.Event()
    thread = _library_thread(stop, how)
    try:
        _settled(thread)
        found = _threads.census()
        if how == "waits":
            assert found.running == (), found
            assert [t.name for t in found.ignored] == ["monitor-waits"], found
            assert found.ignored[0].waiting_in == "threading.wait"
        else:  # busy, or waiting in code that is not tqdm's: the user's running thread
            assert found.running == (f"monitor-{how}",), found
            assert found.ignored == (), found
        with SmartExecutor(2) as ex:
            decision = ex.explain(w.square)
            assert decision.backend == ("fork" if how == "waits" else "loky"), str(decision)
            assert ("1 library thread left out" in str(decision)) == (how == "waits")
    finally:
        stop.set()
        thread.join(10)


def test_routing_waits_a_moment_for_a_busy_library_thread_to_go_back_to_its_wait():
    stop = threading.Event()
    namespace: dict = {"__name__": "tqdm._monitor"}
    exec(LIBRARY_THREAD, namespace)
    thread = namespace["TMonitor"](stop, "spins, then waits")
    thread.start()
    try:
        assert _threads.census().running == ("monitor-spins, then waits",)  # busy for 0.5 s
        found = _threads.census(settle_s=30)  # returns once it waits
        assert found.running == () and len(found.ignored) == 1, found
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.parametrize("how", ["waits", "spins"])
def test_an_unknown_thread_counts_as_the_users_even_when_it_waits(how):
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    thread = threading.Thread(target=stop.wait if how == "waits" else spin, daemon=True)
    thread.start()
    try:
        found = _threads.census()
        assert found.running == (thread.name,) and found.ignored == (), found
        with SmartExecutor(2) as ex:
            decision = ex.explain(w.square)
            assert decision.backend == "loky", str(decision)
            assert "other thread is running" in str(decision), str(decision)
            assert "library thread" not in str(decision), str(decision)
    finally:
        stop.set()
        thread.join(10)


def test_a_thread_pool_executors_idle_workers_still_count():
    # Its copy in a forked child believes its idle workers exist: a submit there waits for ever.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(abs, 1).result()
        found = _threads.census()
        assert len(found.running) == 1 and found.ignored == (), found


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12+ warns at a fork with threads")
def test_a_fork_with_the_users_thread_running_still_warns():
    # A shared object forks with the user's threads all the same (one
    # single-threaded zygote): that warning is the user's to see.
    result = _children.run_python(
        """
        import threading, warnings
        import numpy as np
        from smartexec import SmartExecutor

        class Big:
            def __init__(self):
                self.data = np.ones(1 << 18)
            def get(self, i):
                return float(self.data[i])

        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            with SmartExecutor(2) as ex:
                big = Big()
                assert ex.explain(big.get).backend == "fork"
                assert ex.submit(big.get, 0).result() == 1.0
        stop.set()
        print("warned", sum("multi-threaded" in str(x.message) for x in got))
        """,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr
    assert "warned 0" not in result.stdout and "warned" in result.stdout, result.stdout


def test_a_fork_worker_forgets_the_parents_reusable_loky_executor():
    from joblib.externals.loky import reusable_executor

    result = _children.run_python(
        """
        import os
        from joblib.externals.loky import reusable_executor
        from smartexec import _threads
        executor = reusable_executor.get_reusable_executor(max_workers=1)
        assert executor.submit(abs, -1).result() == 1
        pid = os.fork()
        if pid == 0:
            _threads.forget_inherited_pools()
            os._exit(0 if reusable_executor._executor is None else 1)
        print("child", os.waitpid(pid, 0)[1])
        print("parent keeps it", reusable_executor._executor is executor)
        executor.shutdown(wait=True)
        """,
        timeout=60,
    )
    assert reusable_executor is not None
    assert result.returncode == 0, result.stderr
    assert "child 0" in result.stdout and "parent keeps it True" in result.stdout, result.stdout


def test_smartexecs_own_thread_counts_as_the_users_while_it_runs_their_code():
    started, release = threading.Event(), threading.Event()

    def pool_thread():
        with _threads.running_user_code():
            started.set()
            release.wait(10)

    thread = _threads.own_thread(pool_thread, "smartexec-thread_test")
    thread.start()
    try:
        assert started.wait(10)
        found = _threads.census()
        assert "smartexec-thread_test (running your code)" in found.running, found
    finally:
        release.set()
        thread.join(10)
    assert not _threads._USER_CODE  # left when its code returned


def test_a_users_thread_named_like_ours_is_still_the_users():
    started, release = threading.Event(), threading.Event()

    def users_thread():
        started.set()
        release.wait(10)

    thread = threading.Thread(target=users_thread, name="smartexec-thread_mine")
    thread.start()
    try:
        assert started.wait(10)
        assert not _threads.is_ours(thread)
        assert "smartexec-thread_mine" in _threads.census().running
    finally:
        release.set()
        thread.join(10)


def test_smartexecs_pool_threads_are_known_as_ours():
    with SmartExecutor(2, backend="thread") as ex:
        assert ex.submit(_threads.is_ours).result(timeout=30)
        assert all(ex.map(lambda _: _threads.is_ours(), range(4)))
    assert not _threads.is_ours()


LOCK = threading.Lock()


def wait_under_lock(x):
    with LOCK:  # I/O done under a module lock (a rate limiter, a shared connection)
        time.sleep(0.02)
    return x


def compute_under_lock(x):
    with LOCK:
        total = sum(range(20_000))
    return x * 2 + total * 0


def test_no_fork_while_this_process_runs_the_users_code_on_smartexecs_threads():
    # Found by an adversarial review: the census skipped every thread named
    # smartexec-*, so a second executor forked while the first one's threads
    # held LOCK, and the forked worker waited for it for ever.
    with SmartExecutor(2, prefer="threads") as io:
        busy = [io.submit(wait_under_lock, i) for i in range(100)]
        time.sleep(0.1)  # its threads run wait_under_lock now
        with SmartExecutor(2) as ex:
            assert ex.submit(compute_under_lock, 1).result(timeout=60) == 2
            assert ex.explain(compute_under_lock).backend != "fork"
        io.shutdown(cancel_futures=True)
    assert all(f.cancelled() or f.result() == i for i, f in enumerate(busy))


IN_A_FORK_CHILD = """
    import os
    from smartexec._threads import foreign_thread_ids

    pid = os.fork()
    if pid == 0:
        print(foreign_thread_ids(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


FOREIGN = """
    import numpy as np
    from threadpoolctl import threadpool_info
    from smartexec._threads import foreign_thread_ids

    a = np.ones((400, 400))
    (a @ a).sum()  # OpenBLAS runs its threads (from its load on), which Python does not know
    blas = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=1)
    print(len(foreign_thread_ids()) if blas > 1 else "one thread")
"""

NATIVE_RUN = """
    import threading
    from smartexec._threads import native_threads_run

    before = native_threads_run(settle_s=0.001)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()  # Python forgets it before the system ends it
    after_join = native_threads_run(settle_s=0.01)
    import numpy as np
    from threadpoolctl import threadpool_info

    a = np.ones((400, 400))
    (a @ a).sum()
    blas = max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=1)
    print(before, after_join, native_threads_run() if blas > 1 else "one thread")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's /proc")
def test_foreign_thread_ids_are_the_threads_python_does_not_know():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert thread.native_id not in _threads.foreign_thread_ids()
    finally:
        stop.set()
        thread.join()
    # In a fork child, its own thread's native_id is still the parent's.
    result = _children.run_python(IN_A_FORK_CHILD, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    result = _children.run_python(FOREIGN, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout.strip()
    if out == "one thread":
        pytest.skip("BLAS runs one thread here: it starts none")
    assert int(out) >= 1, out


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's /proc")
def test_native_threads_run_counts_only_threads_python_does_not_know():
    result = _children.run_python(NATIVE_RUN, timeout=60)
    assert result.returncode == 0, result.stderr
    before, after_join, blas = result.stdout.split()
    assert (before, after_join) == ("False", "False")
    if blas != "one":
        assert blas == "True"  # OpenBLAS's pool runs its threads
