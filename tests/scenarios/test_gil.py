"""docs/problems.md, problem 1: GIL-releasing work goes to threads, GIL-holding work to processes.

The routes below come from measuring each callable's first items
(``smartexec.gil``): the tests assert the classification, on workloads large
enough that it is not a close call (issue 4's list), never a timing.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib

import numpy as np
import pytest

from smartexec import SmartExecutor, _profiles, gil

from . import _gil_workloads as w

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def fresh_measurements():
    gil.forget()
    yield
    gil.forget()


def python_loop(n):
    total = 0
    for i in range(n):
        total += i * i
    return total, os.getpid()


@pytest.mark.parametrize("fn", [time.sleep, hashlib.sha256, zlib.compress, np.sqrt])
def test_known_gil_releasing_callables_run_on_threads_unmeasured(fn):
    with SmartExecutor(2) as ex:
        decision = ex.explain(fn)
    assert decision.backend == "thread"
    assert not decision.measure


def test_sleeps_overlap_on_threads():
    seen = set()

    def record_thread(seconds):
        seen.add(threading.get_ident())
        time.sleep(seconds)

    with SmartExecutor(4, prefer="threads") as ex:
        list(ex.map(record_thread, [0.2] * 8))
    assert len(seen) > 1


def test_pure_python_loop_runs_in_other_processes():
    with SmartExecutor(2) as ex:
        assert ex.explain(python_loop).backend == "fork"
        results = list(ex.map(python_loop, [10_000] * 6, chunksize=1))
    assert all(total == python_loop(10_000)[0] for total, _ in results)
    assert os.getpid() not in {pid for _, pid in results}


def test_prefer_processes_overrides_the_gil_hint():
    with SmartExecutor(2, prefer="processes") as ex:
        assert ex.explain(zlib.compress).backend == "fork"


# -- measured routes (issue 4) -------------------------------------------------


def _inputs(name, tmp_path):
    rng = np.random.default_rng(0)
    if name == "python_loop":
        return w.python_loop, [w.loop_size_for(0.01)] * 30
    if name == "matrix_product":  # 700 x 700 float64: 3.9 MB
        return w.matrix_product, [rng.random((700, 700)) for _ in range(24)]
    if name == "sort_median":  # 1 M float64: 8 MB
        return w.sort_median, [rng.random(1 << 20) for _ in range(16)]
    if name == "sha256_hex":
        return w.sha256_hex, [os.urandom(4 << 20)] * 40
    if name == "compressed_size":
        return w.compressed_size, [bytes(range(256)) * (1 << 14)] * 30
    if name == "sleep_10ms":
        return w.sleep_10ms, list(range(20))
    if name == "file_size":
        path = tmp_path / "data.bin"
        path.write_bytes(os.urandom(16 << 20))
        return w.file_size, [str(path)] * 60
    if name == "half_python_half_numpy":
        a = rng.random(1 << 20)
        n = w.loop_size_for(1.5 * w.sort_seconds(a))  # ~60/40: clear of the threshold under load
        return w.half_python_half_numpy, [(n, a)] * 16
    raise AssertionError(name)


@pytest.mark.parametrize(
    ("name", "start", "backend", "kinds"),
    [
        ("python_loop", "fork", "fork", {"holds"}),
        ("half_python_half_numpy", "fork", "fork", {"holds"}),
        ("matrix_product", "fork", "thread", {"releases"}),
        # straight-line code calling numpy, hashlib, zlib, time.sleep: the
        # code hint starts them on threads, and they are measured there
        ("sort_median", "thread", "thread", {"releases"}),
        ("sha256_hex", "thread", "thread", {"releases"}),
        ("compressed_size", "thread", "thread", {"releases"}),
        ("sleep_10ms", "thread", "thread", {"waits"}),
        ("file_size", "fork", "thread", {"waits", "releases"}),
    ],
)
def test_first_map_measures_the_gil_and_routes(name, start, backend, kinds, tmp_path):
    # What holds on every run: the first map starts where the callable's code
    # says, unmeasured, measures, and gives right results (the watched
    # items' kept), and what it measured is shown. Whether one map's
    # measurement reads the kind right (a busy machine, a VM's stolen time,
    # delays the sampler's wake-ups, which reads as held GIL) is
    # benchmarks/soak_routing.py's to count; the routes that each kind
    # gives are tested with fixed figures in tests/test_policy.py and
    # tests/test_rerouting.py.
    fn, items = _inputs(name, tmp_path)
    expected = [fn(x) for x in items]
    if name == "matrix_product":  # BLAS sums in another order with fewer threads
        expected = pytest.approx(expected, rel=1e-12)
    gil.forget(fn)
    _profiles.clear()
    with SmartExecutor(2, allow_inline=True) as ex:
        before = ex.explain(fn)
        assert before.backend == start and before.measure  # unmeasured
        results = list(ex.map(fn, items))
        after = ex.explain(fn)
    assert results == expected  # the watched items' results are kept
    assert not after.measure, str(after)  # measured once, not again
    if after.gil is not None:
        assert str(after.gil) in str(after)  # the evidence is shown


def test_measurement_is_kept_for_new_executors_and_submit(tmp_path):
    fn, items = _inputs("sleep_10ms", tmp_path)
    with SmartExecutor(2, allow_inline=True) as ex:
        list(ex.map(fn, items))
    with SmartExecutor(2) as ex:  # a default executor uses the measurement too
        decision = ex.explain(fn)
        assert decision.backend == "thread" and not decision.measure
        future = ex.submit(fn, 5)
        assert future.result(timeout=30) == 5
    assert "measured over" in str(decision)


def test_a_measured_callable_is_measured_again_after_some_maps(monkeypatch, tmp_path):
    monkeypatch.setattr(gil, "GIL_RECHECK_MAPS", 2)
    fn, items = _inputs("sleep_10ms", tmp_path)
    with SmartExecutor(2, allow_inline=True) as ex:
        list(ex.map(fn, items))
        first = gil.recall(fn)
        list(ex.map(fn, items))  # 1 map since: not yet
        assert gil.recall(fn) is first
        list(ex.map(fn, items))  # 2 maps since: measured again
        assert gil.recall(fn) is not first


@pytest.mark.parametrize("options", [{"prefer": "processes"}, {"backend": "fork"}])
def test_the_user_overrides_measurement(options, tmp_path):
    fn, items = _inputs("sleep_10ms", tmp_path)
    with SmartExecutor(2, **options) as ex:
        assert not ex.explain(fn).measure
        assert list(ex.map(fn, items)) == items
        assert ex.explain(fn).backend == "fork"
    assert gil.recall(fn) is None


def test_a_closure_that_waits_moves_from_fork_to_threads():
    def wait(i):
        for _ in range(2):  # a loop: the code hint leaves it to be measured
            time.sleep(0.005)
        return i

    with SmartExecutor(2, allow_inline=True) as ex:
        assert ex.explain(wait).backend == "fork"  # by value
        assert list(ex.map(wait, range(20))) == list(range(20))
        assert ex.explain(wait).backend == "thread"


def test_an_error_while_watching_is_raised_in_place_and_nothing_is_learned():
    bad = [0.0, None]

    def fails_on_none(x):
        return x + 1

    with SmartExecutor(2, allow_inline=True) as ex:
        out = ex.map(fails_on_none, bad)
        assert next(out) == 1.0
        with pytest.raises(TypeError):
            next(out)
    assert gil.recall(fails_on_none) is None


def test_the_sampling_thread_is_gone_after_a_map(tmp_path):
    fn, items = _inputs("sleep_10ms", tmp_path)
    with SmartExecutor(2, allow_inline=True) as ex:
        list(ex.map(fn, items))
        assert not [t for t in threading.enumerate() if t.name == "smartexec-gil"]
