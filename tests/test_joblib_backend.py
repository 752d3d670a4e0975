"""smartexec.joblib: joblib's Parallel on the "smartexec" backend gives joblib's results and errors."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import sys
import time
import zlib

import numpy as np
import pytest

joblib = pytest.importorskip("joblib")

from joblib import Parallel, delayed, parallel_config  # noqa: E402
from joblib.parallel import get_active_backend  # noqa: E402

import smartexec.joblib as smartexec_joblib  # noqa: E402
from smartexec._system import current_platform  # noqa: E402
from smartexec.errors import WorkerCrashedError  # noqa: E402
from smartexec.joblib import SmartBackend, alike, same_function  # noqa: E402

HAS_FORK = current_platform().has_fork
JOBLIB_VERSION = tuple(int(part) for part in joblib.__version__.split(".")[:2])


def square(x):
    return x * x


def pid_after(seconds):
    time.sleep(seconds)
    return os.getpid()


def pid_after_polls(seconds, polls=2):
    """``pid_after`` in ``polls`` sleeps: a loop, so the code hint leaves it to processes."""
    for _ in range(polls):
        time.sleep(seconds / polls)
    return os.getpid()


class Unusual(Exception):
    """An exception type of the user's own, with a message and an attribute."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return Unusual, (str(self), self.code)


def fail_on_three(x):
    if x == 3:
        raise Unusual(f"item {x} is bad", code=x)
    return x


def die_on_two(x):
    if x == 2:
        os._exit(7)
    return x


class Model:
    """A big object: a method bound to it must not be pickled for every batch."""

    def __init__(self, megabytes=50):
        self.weights = np.arange(megabytes * 2**20 // 8, dtype=np.float64)

    def predict(self, i):
        return float(self.weights[i]) * 2


class Wrapper:
    """A callable made for each item, as scikit-learn's delayed makes one (with its config)."""

    def __init__(self, function, config):
        self.function = function
        self.config = config
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1  # each item's own object: always 1 on its item
        return self.function(*args), self.calls


def nested_sum(n):
    """A worker that runs a Parallel of its own: it must not start processes."""
    inner = Parallel(n_jobs=2, backend="smartexec")(delayed(pid_after)(0) for _ in range(n))
    default_kind = type(get_active_backend()[0]).__name__
    return os.getpid(), sorted(set(inner)), default_kind


def nested_on_threads(i):
    """Batches on threads, each running a Parallel on joblib's nested (threading) backend."""
    inner = Parallel(n_jobs=2)(delayed(pid_after)(0.002) for _ in range(20))
    return i, len(inner)


def run(items_fn, backend=None, **config):
    """Parallel(...) on the smartexec backend (an instance, to read its decisions)."""
    backend = backend if backend is not None else SmartBackend()
    with parallel_config(backend=backend, **config):
        return Parallel()(items_fn()), backend


@pytest.mark.timeout(60)
def test_importing_registers_the_backend_by_name_and_register_is_idempotent():
    smartexec_joblib.register()
    smartexec_joblib.register()
    with parallel_config(backend="smartexec", n_jobs=2):
        assert Parallel()(delayed(square)(x) for x in range(5)) == [0, 1, 4, 9, 16]
        assert isinstance(get_active_backend()[0], SmartBackend)


@pytest.mark.timeout(60)
def test_a_module_function_equals_serial_on_fork_workers():
    got, backend = run(lambda: (delayed(square)(x) for x in range(40)), n_jobs=2)
    assert got == [square(x) for x in range(40)]
    assert backend.executor is None  # joblib ended the backend: workers shut down
    kinds = {d.backend for d in backend.decisions()}
    assert kinds == ({"fork"} if HAS_FORK else {"loky"})


@pytest.mark.timeout(60)
def test_a_lambda_made_for_each_item_equals_serial_and_is_routed_once():
    offset = 7
    got, backend = run(lambda: (delayed(lambda x: x + offset)(x) for x in range(30)), n_jobs=2)
    assert got == [x + 7 for x in range(30)]
    # one function made 30 times: routed once, where smartexec sends closures
    assert len(backend.decisions()) == 1
    assert backend.decisions()[0].backend == ("fork" if HAS_FORK else "loky")


def test_same_function_sees_a_lambda_made_twice_but_not_other_defaults():
    k = 1
    made = [lambda x: x + k for _ in range(2)]
    assert same_function(made[0], made[1])
    a, b = (lambda x, k=[]: x), (lambda x, k=[]: x)  # noqa: B006
    assert not same_function(a, b)
    m = Model(megabytes=1)
    assert same_function(m.predict, m.predict)
    assert not same_function(m.predict, Model(megabytes=1).predict)


def test_alike_sees_callables_made_alike_for_each_item():
    config = {"assume_finite": False, "filters": [("ignore", None, Warning)]}
    assert alike(Wrapper(square, dict(config)), Wrapper(square, dict(config)))
    assert not same_function(Wrapper(square, config), Wrapper(square, config))
    assert not alike(Wrapper(square, config), Wrapper(square, {**config, "assume_finite": True}))
    assert not alike(Wrapper(square, config), Wrapper(pid_after, config))
    assert not alike(Wrapper(np.ones(3), config), Wrapper(np.ones(3), config))
    assert alike(functools.partial(square), functools.partial(square))
    assert not alike(functools.partial(pid_after, 1), functools.partial(pid_after, 2))


@pytest.mark.timeout(60)
def test_callables_made_for_each_item_are_routed_once_and_each_runs_its_own_item():
    config = {"assume_finite": False}
    got, backend = run(
        lambda: (delayed(Wrapper(square, dict(config)))(x) for x in range(30)), n_jobs=2
    )
    assert got == [(x * x, 1) for x in range(30)]  # as serial: each object called once
    assert len(backend.decisions()) == 1
    got, backend = run(
        lambda: (delayed(functools.partial(pow, exp=2))(x) for x in range(30)), n_jobs=2
    )
    assert got == [x**2 for x in range(30)] and len(backend.decisions()) == 1


@pytest.mark.timeout(90)
@pytest.mark.skipif(not HAS_FORK, reason="copy-on-write sharing needs the fork start method")
def test_a_big_bound_method_equals_serial_and_its_object_is_never_pickled(sent):
    model = Model(megabytes=50)
    got, backend = run(lambda: (delayed(model.predict)(i) for i in range(64)), n_jobs=2)
    assert got == [model.predict(i) for i in range(64)]
    (decision,) = backend.decisions()
    assert (decision.backend, decision.share) == ("fork", True)
    assert sent and max(sent) < 2**20, sent  # 50 MB never crossed a pipe


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefer", [None, "threads"])
def test_the_users_exception_comes_back_unchanged(prefer):
    with pytest.raises(Unusual, match=r"^item 3 is bad$") as caught:
        with parallel_config(backend="smartexec", n_jobs=2, prefer=prefer):
            Parallel()(delayed(fail_on_three)(x) for x in range(20))
    assert type(caught.value) is Unusual and caught.value.code == 3


@pytest.mark.timeout(60)
def test_serial_runs_give_the_same_exception():
    # the reference: joblib's sequential backend raises the same type and message
    with pytest.raises(Unusual, match=r"^item 3 is bad$"):
        Parallel(n_jobs=1)(delayed(fail_on_three)(x) for x in range(20))


@pytest.mark.timeout(60)
@pytest.mark.skipif(not HAS_FORK, reason="a fork worker's death; loky's differs")
def test_a_worker_that_dies_fails_the_call_with_worker_crashed_error():
    with pytest.raises(WorkerCrashedError):
        with parallel_config(backend="smartexec", n_jobs=2):
            Parallel()(delayed(die_on_two)(x) for x in range(6))


@pytest.mark.timeout(60)
def test_prefer_threads_runs_on_threads_of_this_process():
    got, backend = run(
        lambda: (delayed(pid_after)(0) for _ in range(8)), n_jobs=2, prefer="threads"
    )
    assert got == [os.getpid()] * 8
    assert {d.backend for d in backend.decisions()} == {"thread"}


@pytest.mark.timeout(60)
def test_work_known_to_release_the_gil_runs_on_threads():
    data = [bytes(range(256)) * 64 * (i + 1) for i in range(12)]
    got, backend = run(lambda: (delayed(zlib.compress)(d) for d in data), n_jobs=2)
    assert got == [zlib.compress(d) for d in data]
    assert {d.backend for d in backend.decisions()} == {"thread"}


def test_n_jobs_has_joblibs_meaning():
    backend = SmartBackend(nesting_level=0)
    cpus = current_platform().cpu_count
    assert backend.effective_n_jobs(3) == 3
    assert backend.effective_n_jobs(-1) == cpus
    assert backend.effective_n_jobs(-2) == max(cpus - 1, 1)
    assert backend.effective_n_jobs(-10_000) == 1
    assert backend.effective_n_jobs(None) == 1
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend.effective_n_jobs(0)
    # inside a worker of an outer Parallel: no new workers
    assert SmartBackend(nesting_level=1).effective_n_jobs(4) == 1


@pytest.mark.timeout(60)
def test_n_jobs_sets_the_workers():
    got, backend = run(lambda: (delayed(pid_after_polls)(0.05) for _ in range(12)), n_jobs=3)
    assert os.getpid() not in got and 1 <= len(set(got)) <= 3
    got, _ = run(lambda: (delayed(pid_after)(0) for _ in range(3)), n_jobs=1)
    assert got == [os.getpid()] * 3  # joblib runs n_jobs=1 in the calling thread


@pytest.mark.timeout(60)
def test_with_parallel_block_keeps_one_executor_for_its_calls():
    with parallel_config(backend="smartexec", n_jobs=2):
        with Parallel() as parallel:
            first = parallel(delayed(pid_after_polls)(0) for _ in range(6))
            second = parallel(delayed(pid_after_polls)(0) for _ in range(6))
    assert os.getpid() not in first and set(first) & set(second)  # the same workers


@pytest.mark.timeout(60)
@pytest.mark.parametrize("return_as", ["generator", "generator_unordered"])
def test_return_as_generators(return_as):
    if return_as == "generator_unordered" and JOBLIB_VERSION < (1, 4):
        pytest.skip("joblib added return_as='generator_unordered' in 1.4")
    with parallel_config(backend="smartexec", n_jobs=2):
        results = Parallel(return_as=return_as)(delayed(square)(x) for x in range(25))
        assert not isinstance(results, list)
        got = list(results)
    if return_as == "generator":
        assert got == [x * x for x in range(25)]
    else:
        assert sorted(got) == [x * x for x in range(25)]


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:.*tasks which were still being processed:UserWarning")
def test_a_generator_dropped_early_stops_its_workers():
    with parallel_config(backend="smartexec", n_jobs=2):
        results = Parallel(return_as="generator")(delayed(pid_after)(0.01) for _ in range(200))
        next(results)
        results.close()  # joblib aborts: the workers must go (the no_leaks fixture checks)


@pytest.mark.timeout(60)
def test_a_nested_parallel_in_a_worker_runs_in_that_worker():
    got, _ = run(lambda: (delayed(nested_sum)(3) for _ in range(4)), n_jobs=2)
    for worker_pid, inner_pids, default_kind in got:
        assert inner_pids == [worker_pid]  # no processes of its own
        assert default_kind == "ThreadingBackend"  # joblib's convention one level down


@pytest.mark.timeout(60)
def test_nested_parallels_in_concurrent_thread_batches_each_get_their_own_backend():
    # joblib's nested backend object is configured by the nested Parallel: two
    # batches running at once on threads must not share one (their pools would mix)
    for _ in range(3):
        got, _ = run(
            lambda: (delayed(nested_on_threads)(i) for i in range(16)), n_jobs=4, prefer="threads"
        )
        assert got == [(i, 20) for i in range(16)]


@pytest.mark.timeout(120)
def test_executor_options_pass_through_and_max_workers_is_refused():
    backend = SmartBackend(mp_context="spawn")  # process work goes to loky then
    got, _ = run(lambda: (delayed(square)(x) for x in range(40)), backend=backend, n_jobs=2)
    assert got == [x * x for x in range(40)]
    assert {d.backend for d in backend.decisions()} == {"loky"}
    with pytest.raises(TypeError, match="n_jobs"):
        SmartBackend(max_workers=2)
    with pytest.raises(TypeError, match="no_such_option"):
        with parallel_config(backend=SmartBackend(no_such_option=1), n_jobs=2):
            Parallel()(delayed(square)(x) for x in range(4))


@pytest.mark.timeout(60)
def test_without_joblib_the_import_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib", None)
    monkeypatch.delitem(sys.modules, "smartexec.joblib")
    with pytest.raises(ImportError, match=r"pip install 'smartexec\[joblib\]'"):
        importlib.import_module("smartexec.joblib")


@pytest.mark.timeout(300)
def test_scikit_learn_cross_val_score_equals_serial():
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (tox -e sklearn)")
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    X, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500)
    serial = cross_val_score(model, X, y, cv=5, n_jobs=None)
    with parallel_config(backend="smartexec"):
        parallel = cross_val_score(model, X, y, cv=5, n_jobs=2)
    np.testing.assert_array_equal(parallel, serial)


@pytest.mark.timeout(60)
def test_tiny_items_are_batched_as_joblibs_process_backends_batch_them():
    class Counting(SmartBackend):
        batches = 0

        def submit(self, func, callback=None):
            Counting.batches += 1
            return super().submit(func, callback)

    got, _ = run(lambda: (delayed(square)(x) for x in range(5000)), backend=Counting(), n_jobs=2)
    assert got == [x * x for x in range(5000)]
    assert Counting.batches < 1000  # one batch per item took 20 s for 20,000 items


@pytest.mark.timeout(60)
def test_parallels_timeout_raises_and_stops_the_workers():
    start = time.monotonic()
    # pid_after's code (a call of time.sleep) sends it to threads without a
    # timeout; with one, it runs where a call can be stopped.
    with pytest.raises(multiprocessing.TimeoutError):  # what joblib raises on every backend
        with parallel_config(backend="smartexec", n_jobs=2):
            Parallel(timeout=0.5)(delayed(pid_after)(30) for _ in range(4))
    assert time.monotonic() - start < 20  # the 30 s calls were stopped, not waited for


@pytest.mark.timeout(60)
def test_task_timeout_stops_a_call_that_runs_past_it():
    # The option reached the executor, but batches were sent with no limit:
    # the 30 s call ran to its end.
    from smartexec.errors import TaskTimeoutError

    start = time.monotonic()
    with pytest.raises(TaskTimeoutError, match="pid_after ran longer than its task_timeout"):
        with parallel_config(backend="smartexec", n_jobs=2, task_timeout=0.5):
            Parallel()(delayed(pid_after)(s) for s in (0.01, 30))
    assert time.monotonic() - start < 20


@pytest.mark.timeout(60)
@pytest.mark.skipif(JOBLIB_VERSION < (1, 4), reason="generator_unordered needs joblib 1.4")
def test_parallels_timeout_in_unordered_mode_lets_a_long_call_finish():
    # joblib's unordered mode times out only while no call completes: a 2 s
    # call beside quicker ones is not stopped (a deadline of ours killed it).
    with parallel_config(backend="smartexec", n_jobs=2):
        got = Parallel(timeout=1, return_as="generator_unordered", batch_size=1)(
            delayed(wait_then_return)(d) for d in [2.0] + [0.4] * 8
        )
        assert sorted(got) == sorted([2.0] + [0.4] * 8)


def wait_then_return(seconds):
    time.sleep(seconds)
    return seconds


class _Table:
    """A big argument (~2 MB pickled)."""

    def __init__(self) -> None:
        self.rows = list(range(400_000))


def _row(table, i):
    return table.rows[i]


@pytest.mark.timeout(120)
def test_a_big_argument_repeated_across_batches_is_sent_once_per_worker(sent):
    # Issue 34: each batch's tasks are the chunk's arguments, where the
    # send-once cache finds the repeat; it was pickled inside every batch.
    sizes = sent  # conftest's: the size of every request pickled
    table = _Table()
    with parallel_config(backend=SmartBackend(backend="fork"), n_jobs=2):
        got = Parallel(batch_size=1)(delayed(_row)(table, i) for i in range(16))
    assert got == list(range(16))
    assert len(sizes) == 16
    assert sum(size > 1_000_000 for size in sizes) <= 2, sizes  # was 16: every batch


@pytest.mark.timeout(120)
def test_a_repeated_argument_changed_between_batches_is_seen_changed():
    # The send-once cache must never serve a copy older than the object:
    # a batch sent after an in-place change sees the change, as a pickled
    # argument would.
    table = _Table()

    def tasks():
        for i in range(16):
            if i == 8:
                table.rows[0] = -1  # in place, between batches
            yield delayed(_row)(table, 0)

    with parallel_config(backend=SmartBackend(backend="fork"), n_jobs=2):
        got = Parallel(batch_size=1, pre_dispatch="1")(tasks())
    # Every task made after the change sees it, never a stale copy. (A task
    # made before it may see it too: as with ProcessPoolExecutor, an
    # argument is pickled some time after submit, off the caller's thread.)
    assert got[8:] == [-1] * 8
    assert set(got[:8]) <= {0, -1}
