"""One conformance class that every backend runs, by subclassing with ``backend = "<name>"``.

A plugin backend can reuse it the same way: subclass :class:`BackendConformance`
and set ``backend`` to its registered name (and override the ``backend_options``
fixture when it needs options, as tests/backends/test_dask.py does).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import os
import threading
import time

import numpy as np
import pytest

from smartexec import PayloadPicklingError, SmartExecutor
from smartexec.errors import RemoteTraceback

pytestmark = pytest.mark.timeout(60)


def square(x):
    return x * x


def add(x, y=0, *, z=0):
    return x + y + z


def fail_on_three(x):
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


def nap(seconds):
    time.sleep(seconds)
    return seconds


def whoami(_):
    return os.getpid(), threading.get_ident()


class Table:
    def __init__(self, nbytes):
        self.values = np.arange(nbytes // 8, dtype=np.int64)

    def lookup(self, i):
        return int(self.values[i * 997])


class BackendConformance:
    backend: str = ""
    in_process = False  # results and exceptions are the very objects

    @pytest.fixture
    def backend_options(self):
        """Options for ``SmartExecutor(backend=...)``; a subclass may override it."""
        return {}

    @pytest.fixture
    def ex(self, backend_options):
        executor = SmartExecutor(2, backend=self.backend, **backend_options)
        yield executor
        executor.shutdown(wait=True, cancel_futures=True)

    def test_explain_names_the_backend(self, ex):
        assert ex.explain(square).backend == (self.backend or "fork")

    def test_submit_returns_a_future_with_the_result(self, ex):
        future = ex.submit(square, 7)
        assert isinstance(future, cf.Future)
        assert future.result(timeout=30) == 49

    def test_submit_passes_keyword_arguments(self, ex):
        assert ex.submit(add, 1, y=2, z=3).result(timeout=30) == 6

    @pytest.mark.parametrize("chunksize", [None, 1, 3, 100])
    def test_map_keeps_input_order(self, ex, chunksize):
        items = list(range(23))
        assert list(ex.map(square, items, chunksize=chunksize)) == [square(i) for i in items]

    def test_map_over_several_iterables_stops_at_the_shortest(self, ex):
        assert list(ex.map(add, [1, 2, 3], [10, 20])) == [11, 22]

    def test_map_of_nothing(self, ex):
        assert list(ex.map(square, [])) == []

    def test_exception_is_raised_at_its_position_within_a_chunk(self, ex):
        results = ex.map(fail_on_three, range(6), chunksize=6)
        assert [next(results) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError, match="bad item 3"):
            next(results)

    def test_exception_from_submit_keeps_the_worker_traceback(self, ex):
        error = ex.submit(fail_on_three, 3).exception(timeout=30)
        assert isinstance(error, ValueError)
        if not self.in_process:
            assert isinstance(error.__cause__, RemoteTraceback)
            assert "fail_on_three" in str(error.__cause__)

    def test_each_future_gets_its_own_exception_object(self, ex):
        errors = [ex.submit(fail_on_three, 3).exception(timeout=30) for _ in range(3)]
        assert len({id(e) for e in errors}) == 3

    def test_lambda_and_closure_results_equal_a_loop(self, ex):
        offset = 5
        assert list(ex.map(lambda x: x + offset, range(10))) == [x + offset for x in range(10)]

    def test_bound_method_of_a_big_object(self, ex):
        table = Table(8 << 20)
        assert list(ex.map(table.lookup, range(50))) == [table.lookup(i) for i in range(50)]

    def test_partial(self, ex):
        assert ex.submit(functools.partial(add, 1, z=2), 3).result(timeout=30) == 6

    def test_wait_and_as_completed(self, ex):
        futures = [ex.submit(square, i) for i in range(8)]
        done, not_done = cf.wait(futures, timeout=30)
        assert not not_done
        assert sorted(f.result() for f in cf.as_completed(futures)) == [i * i for i in range(8)]

    def test_map_timeout(self, ex):
        if self.backend == "inline":
            pytest.skip("inline runs every item before map() returns")
        # The timeout counts from the call; a worker's start is not the
        # subject (a loky worker's interpreter took over 1 s on a busy machine).
        assert list(ex.map(nap, [0, 0], chunksize=1)) == [0, 0]
        results = ex.map(nap, [0, 5], timeout=2, chunksize=1)
        assert next(results) == 0
        with pytest.raises(cf.TimeoutError):
            next(results)

    def test_closing_map_early_cancels_pending_chunks(self, ex):
        if self.backend == "inline":
            pytest.skip("inline has nothing pending")
        results = ex.map(nap, [0.0] + [1.0] * 20, chunksize=1)
        assert next(results) == 0.0
        start = time.monotonic()
        results.close()
        ex.shutdown(wait=True)
        # 20 x 1 s on 2 workers would take 10 s; only the running ones finish
        assert time.monotonic() - start < 8

    def test_submit_after_shutdown_raises(self, ex):
        ex.submit(square, 1).result(timeout=30)
        ex.shutdown()
        ex.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="after shutdown"):
            ex.submit(square, 2)
        with pytest.raises(RuntimeError, match="after shutdown"):
            ex.map(square, [1])

    def test_context_manager_shuts_down(self, backend_options):
        with SmartExecutor(2, backend=self.backend, **backend_options) as ex:
            assert ex.submit(square, 3).result(timeout=30) == 9
        with pytest.raises(RuntimeError):
            ex.submit(square, 3)

    def test_unpicklable_argument_gets_a_clear_error(self, ex):
        lock = threading.Lock()
        if self.in_process:
            assert ex.submit(lambda lk: lk.locked(), lock).result(timeout=30) is False
            return
        with pytest.raises(PayloadPicklingError) as info:
            ex.submit(add, lock).result(timeout=30)
        message = str(info.value)
        assert "argument 1 " in message and "lock" in message
        assert "add()" in message
        assert info.value.obj is lock

    def test_unpicklable_result_gets_a_clear_error(self, ex):
        if self.in_process:
            pytest.skip("results are not pickled in-process")
        with pytest.raises(Exception, match="(?i)pickl") as info:
            ex.submit(threading.Lock).result(timeout=30)
        assert "lock" in str(info.value).lower()
        # the executor stays usable
        assert ex.submit(square, 4).result(timeout=30) == 16


class TestInline(BackendConformance):
    backend = "inline"
    in_process = True


class TestThread(BackendConformance):
    backend = "thread"
    in_process = True


class TestFork(BackendConformance):
    backend = "fork"


class TestLoky(BackendConformance):
    backend = "loky"


def die_on_three(x):
    if x == 3:
        os._exit(7)
    return x


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_executor_stays_usable_after_a_worker_dies(backend):
    with SmartExecutor(2, backend=backend) as ex:
        futures = [ex.submit(die_on_three, i) for i in range(6)]
        cf.wait(futures, timeout=30)
        assert futures[3].exception() is not None
        assert ex.submit(abs, -5).result(timeout=30) == 5
