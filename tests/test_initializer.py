"""SmartExecutor(initializer=, initargs=, max_tasks_per_child=, mp_context=), as the stdlib pools."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures.process import BrokenProcessPool
from concurrent.futures.thread import BrokenThreadPool

import pytest

from smartexec import SmartExecutor
from smartexec.errors import (
    InitializerError,
    ProcessInitializerError,
    ThreadInitializerError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.timeout(90)

ROUTES = [None, "thread", "fork", "loky"]

_LOCAL = threading.local()
#: Names of the threads whose initializer ran, in this process.
INITIALIZED: list[str] = []


def init(tag):
    """Mark this thread (the worker's main thread, in a worker process) as initialized."""
    _LOCAL.tag = tag
    INITIALIZED.append(threading.current_thread().name)


def status(_=None):
    """What the initializer left in the thread running this task."""
    return getattr(_LOCAL, "tag", "uninitialized"), os.getpid(), threading.current_thread().name


def fail_init():
    raise ValueError("init went wrong")


def pid(_=None):
    return os.getpid()


def mul(x, y):
    return x * y


@pytest.mark.parametrize("backend", ROUTES)
def test_initializer_runs_in_every_worker_before_its_tasks(backend):
    with SmartExecutor(2, backend=backend, initializer=init, initargs=("ready",)) as ex:
        futures = [ex.submit(status) for _ in range(6)]
        results = [f.result() for f in futures] + list(ex.map(status, range(20)))
    assert {tag for tag, _, _ in results} == {"ready"}
    # Never in the calling thread: a map with an initializer runs nothing here.
    assert getattr(_LOCAL, "tag", None) is None
    if backend == "thread":
        # Once per thread: every thread that ran a task ran the initializer once.
        threads = {name for _, _, name in results}
        assert threads <= set(INITIALIZED)
        assert len(INITIALIZED) == len(set(INITIALIZED)) <= 2
    else:
        assert os.getpid() not in {p for _, p, _ in results}
    INITIALIZED.clear()


def test_initializer_runs_once_in_the_caller_on_inline():
    INITIALIZED.clear()
    ex = SmartExecutor(backend="inline", initializer=init, initargs=("inline",))
    try:
        assert ex.submit(status).result()[0] == "inline"
        assert [r[0] for r in ex.map(status, range(3))] == ["inline"] * 3
        assert INITIALIZED == [threading.current_thread().name]
    finally:
        ex.shutdown()
        del _LOCAL.tag
        INITIALIZED.clear()


@pytest.mark.parametrize("backend", ROUTES)
def test_failing_initializer_breaks_the_executor(backend, caplog):
    broken = BrokenThreadPool if backend == "thread" else BrokenProcessPool
    ours = ThreadInitializerError if backend == "thread" else ProcessInitializerError
    with caplog.at_level(logging.CRITICAL, logger="concurrent.futures"):
        with SmartExecutor(2, backend=backend, initializer=fail_init) as ex:
            with pytest.raises(broken) as info:
                # As with the stdlib: submit itself may raise when a worker's
                # initializer failed before this call; else its future fails.
                ex.submit(status).result()
            # Later work is refused at once, with the same error.
            with pytest.raises(broken):
                ex.submit(status)
            with pytest.raises(broken):
                list(ex.map(status, range(3)))
            assert ex._broken
    error = info.value
    assert isinstance(error, ours) and isinstance(error, InitializerError)
    assert "fail_init" in str(error) and "ValueError: init went wrong" in str(error)
    assert error.initializer == "fail_init"
    assert "init went wrong" in str(error.__cause__)
    # Logged as the stdlib logs it (in this process, for every backend).
    assert any("init went wrong" in r.getMessage() or r.exc_info for r in caplog.records)


@pytest.mark.parametrize("backend", ROUTES)
def test_failing_initializer_fails_map(backend):
    broken = BrokenThreadPool if backend == "thread" else BrokenProcessPool
    with SmartExecutor(2, backend=backend, initializer=fail_init) as ex:
        with pytest.raises(broken, match="fail_init"):
            list(ex.map(status, range(10)))


@pytest.mark.timeout(60)
def test_max_tasks_per_child_replaces_fork_workers():
    with SmartExecutor(1, backend="fork", max_tasks_per_child=2) as ex:
        pids = [ex.submit(pid).result() for _ in range(6)]
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5]
        # map: calls, not chunks, are counted (a chunk holds at most 2 calls).
        mapped = list(ex.map(pid, range(9), chunksize=5))
    assert len(mapped) == 9
    assert max(mapped.count(p) for p in set(mapped)) <= 2
    assert len(set(mapped)) >= 5


def _alive(process_id):
    try:
        os.kill(process_id, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
def test_a_worker_that_did_its_share_exits_at_once():
    # Not at the next submit: the point of max_tasks_per_child is to free
    # what the worker holds.
    with SmartExecutor(1, backend="fork", max_tasks_per_child=1) as ex:
        worker = ex.submit(pid).result()
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(worker)
        assert ex.submit(pid).result() != worker


@pytest.mark.timeout(60)
def test_max_tasks_per_child_runs_the_initializer_in_each_replacement():
    with SmartExecutor(
        1, backend="fork", initializer=init, initargs=("again",), max_tasks_per_child=1
    ) as ex:
        results = [ex.submit(status).result() for _ in range(3)]
    assert [tag for tag, _, _ in results] == ["again"] * 3
    assert len({p for _, p, _ in results}) == 3


def crash(_=None):
    os._exit(3)


@pytest.mark.timeout(60)
def test_a_crashed_fork_worker_is_replaced_by_an_initialized_one():
    with SmartExecutor(1, backend="fork", initializer=init, initargs=("fresh",)) as ex:
        first = ex.submit(status).result()
        with pytest.raises(WorkerCrashedError):
            ex.submit(crash).result()
        second = ex.submit(status).result()
    assert first[0] == second[0] == "fresh"
    assert first[1] != second[1]


@pytest.mark.timeout(60)
def test_max_tasks_early_shutdown():
    # CPython's test_max_tasks_early_shutdown, on fork workers.
    ex = SmartExecutor(3, backend="fork", max_tasks_per_child=1)
    futures = [ex.submit(mul, i, i) for i in range(6)]
    ex.shutdown()
    assert [f.result() for f in futures] == [i * i for i in range(6)]


def test_max_tasks_per_child_routes_process_work_to_fork():
    ex = SmartExecutor(max_tasks_per_child=5)
    try:
        decision = ex.explain(lambda x: x)
        assert decision.backend == "fork"
        assert any("max_tasks_per_child" in r for r in decision.reasons)
    finally:
        ex.shutdown()


@pytest.mark.parametrize("context", [multiprocessing.get_context("spawn"), "forkserver"])
def test_mp_context_without_fork_routes_to_loky(context):
    ex = SmartExecutor(2, mp_context=context)
    try:
        decision = ex.explain(pid)
        method = context if isinstance(context, str) else "spawn"
        assert decision.backend == "loky", str(decision)
        assert any(f"mp_context uses start method {method!r}" in r for r in decision.reasons)
        if method == "spawn":
            assert ex.submit(pid).result() != os.getpid()
    finally:
        ex.shutdown()


def test_mp_context_fork_keeps_the_fork_route():
    ex = SmartExecutor(mp_context=multiprocessing.get_context("fork"))
    try:
        assert ex.explain(pid).backend == "fork"
    finally:
        ex.shutdown()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"initializer": 5}, TypeError, "initializer must be a callable"),
        ({"initializer": init, "initargs": 5}, TypeError, "initargs"),
        ({"max_tasks_per_child": "3"}, TypeError, "max_tasks_per_child must be an integer"),
        ({"max_tasks_per_child": True}, TypeError, "max_tasks_per_child must be an integer"),
        ({"max_tasks_per_child": 0}, ValueError, "max_tasks_per_child must be >= 1"),
        ({"mp_context": 42}, TypeError, "mp_context must be a multiprocessing context"),
        ({"mp_context": "nosuch"}, ValueError, "start method 'nosuch'"),
        ({"backend": "loky", "max_tasks_per_child": 2}, ValueError, "cannot retire"),
        ({"backend": "fork", "mp_context": "spawn"}, ValueError, "contradicts"),
    ],
)
def test_bad_worker_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        SmartExecutor(**kwargs)


def test_only_max_workers_is_positional():
    with pytest.raises(TypeError):
        SmartExecutor(2, multiprocessing.get_context("fork"))  # type: ignore[misc]


def test_thread_backend_ignores_max_tasks_per_child():
    with SmartExecutor(2, backend="thread", max_tasks_per_child=1) as ex:
        assert list(ex.map(mul, range(4), range(4))) == [0, 1, 4, 9]


def test_broken_error_is_a_broken_executor():
    assert issubclass(ProcessInitializerError, cf.BrokenExecutor)
    assert issubclass(ThreadInitializerError, BrokenThreadPool)


@pytest.mark.parametrize("backend", ["thread", "fork"])
def test_failing_initializer_with_task_timeout(backend):
    # The task_timeout paths run chunks differently: they break all the same.
    broken = BrokenThreadPool if backend == "thread" else BrokenProcessPool
    with SmartExecutor(2, backend=backend, initializer=fail_init, task_timeout=30) as ex:
        with pytest.raises(broken, match="fail_init"):
            ex.submit(status).result(timeout=20)


def test_initializer_on_the_spawn_route():
    ex = SmartExecutor(2, mp_context="spawn", initializer=init, initargs=("spawned",))
    try:
        assert ex.explain(status).backend == "loky"
        assert [r[0] for r in ex.map(status, range(4))] == ["spawned"] * 4
    finally:
        ex.shutdown()


SCRIPT = """
from smartexec import SmartExecutor
DB = None
def init(value):
    global DB
    DB = value
def task(x):
    return DB, x
if __name__ == "__main__":
    for backend in (None, "fork"):
        with SmartExecutor(2, backend=backend, initializer=init, initargs=("db",)) as ex:
            print(backend, ex.submit(task, 1).result(), list(ex.map(task, range(2))))
"""


@pytest.mark.timeout(120)
def test_a_script_whose_initializer_and_task_live_in_main(tmp_path):
    # The commonest stdlib pattern: both functions in the script. The task's
    # code travels by value; a pickled copy would read its own DB (None).
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "None ('db', 1) [('db', 0), ('db', 1)]",
        "fork ('db', 1) [('db', 0), ('db', 1)]",
    ], proc.stderr


def test_max_tasks_per_child_with_a_spawn_context_is_taken():
    # The stdlib requires a non-fork context for max_tasks_per_child, so code
    # moved from ProcessPoolExecutor passes one; ours retires fork workers.
    ex = SmartExecutor(
        2,
        mp_context=multiprocessing.get_context("spawn"),
        max_tasks_per_child=2,
        initializer=init,
        initargs=("spawned",),
    )
    try:
        assert ex.explain(pid).backend == "fork"
        assert len(set(ex.map(pid, range(8)))) >= 4  # 8 calls, 2 per worker
    finally:
        ex.shutdown()


def test_an_initializer_keeps_thread_bound_work_in_worker_processes():
    """A process initializer (here: one that sets a global) must not run in this process.

    time.sleep is a known GIL-releasing callable, so it would go to threads,
    where the initializer runs in threads of the caller's own process.
    """
    ex = SmartExecutor(2, initializer=init, initargs=("worker",))
    try:
        decision = ex.explain(time.sleep)
        assert decision.backend in ("fork", "loky"), str(decision)
        assert any("an initializer is set" in r for r in decision.reasons)
        before = len(INITIALIZED)
        list(ex.map(time.sleep, [0.0] * 4))
        assert len(INITIALIZED) == before  # the initializer never ran in this process
    finally:
        ex.shutdown()
    with SmartExecutor(2, initializer=init, initargs=("t",), prefer="threads") as ex:
        assert ex.explain(time.sleep).backend == "thread"  # asked for


def test_a_by_value_callable_on_loky_with_an_initializer_warns():
    ex = SmartExecutor(2, backend="loky", initializer=init, initargs=("x",))
    try:
        with pytest.warns(RuntimeWarning, match="initializer is set, but"):
            decision = ex.explain(lambda: status())
        assert any("importable module" in r for r in decision.reasons)
    finally:
        ex.shutdown()


def fail_init_logging_to(log_queue):
    """As CPython's tests do: send this worker's concurrent.futures logging to the parent, then fail."""
    from logging.handlers import QueueHandler

    logger = logging.getLogger("concurrent.futures")
    logger.addHandler(QueueHandler(log_queue))
    logger.setLevel("CRITICAL")
    logger.propagate = False
    raise ValueError("init went wrong")


@pytest.mark.parametrize(
    ("backend", "context"), [(None, "fork"), ("fork", "fork"), ("loky", "spawn")]
)
def test_a_worker_logs_its_failing_initializer_where_the_initializer_sent_its_logging(
    backend, context
):
    # Issue 32: only the parent logged the failure, so a worker's own logging
    # set up by the initializer (CPython's FailingInitializerMixin for
    # process pools) heard nothing. The worker logs it there as a stdlib
    # worker does, before the parent hears of the failure.
    ctx = multiprocessing.get_context(context)
    log_queue = ctx.Queue()
    freed = weakref.ref(log_queue)
    try:
        with SmartExecutor(
            2,
            backend=backend,
            mp_context=ctx,
            initializer=fail_init_logging_to,
            initargs=(log_queue,),
        ) as ex:
            with pytest.raises(BrokenProcessPool):
                ex.submit(status).result()
            record = log_queue.get_nowait()  # there already: no wait
        assert record.levelname == "CRITICAL" and record.name == "concurrent.futures"
        message = record.getMessage()  # the traceback, formatted by the QueueHandler
        assert message.startswith("Exception in initializer:"), message
        assert "ValueError: init went wrong" in message, message
    finally:
        log_queue.close()
        log_queue.join_thread()
    # A spawn context's queue holds named semaphores until it is freed: once
    # the broken loky pool that held it as initargs has shut down.
    del log_queue, ex
    deadline = time.monotonic() + 30
    while gc.collect() >= 0 and freed() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
