"""Cases an adversarial pass found: each was a hang, a lost result or a broken pool."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from smartexec import SmartExecutor

from .. import _children
from . import _reliability_workloads as w

pytestmark = pytest.mark.timeout(90)


def test_the_fork_backend_works_with_over_1024_open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"cannot raise the open-file limit past 2048 (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    held = []
    try:
        held = [open(os.devnull) for _ in range(1100)]
        with SmartExecutor(2, backend="fork") as ex:
            assert ex.submit(w.square, 3).result(timeout=30) == 9
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_an_endless_task_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        SmartExecutor(task_timeout=bad)


def test_a_very_long_task_timeout_is_fine():
    with SmartExecutor(2, task_timeout=86400 * 365) as ex:
        assert ex.submit(w.square, 4).result(timeout=30) == 16


def test_an_executor_dropped_without_shutdown_lets_its_workers_go():
    ex = SmartExecutor(2, backend="fork")
    assert ex.submit(w.square, 2).result(timeout=30) == 4
    assert _children.child_processes(os.getpid())
    del ex
    gc.collect()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not [c for c in _children.child_processes(os.getpid()).values() if "tracker" not in c]:
            break
        time.sleep(0.05)
    assert not [c for c in _children.child_processes(os.getpid()).values() if "tracker" not in c]


def failing_input(n_good):
    yield from range(n_good)
    raise OSError("the input broke")


@pytest.mark.parametrize(
    "options", [{"backend": "fork", "chunksize": 3}, {"backend": "fork"}, {}, {"chunksize": 4}]
)
@pytest.mark.parametrize("n_good", [5, 50])  # 5: within the first window of chunks
def test_an_input_error_comes_after_every_item_read_before_it(options, n_good):
    got = []
    with SmartExecutor(2, backend=options.get("backend")) as ex:
        with pytest.raises(OSError, match="the input broke"):
            for value in ex.map(
                w.square, failing_input(n_good), chunksize=options.get("chunksize")
            ):
                got.append(value)
    assert got == [i * i for i in range(n_good)]


class SizedBrokenInput:
    """A sized input whose iteration fails at item 537 of 1000."""

    def __len__(self):
        return 1000

    def __iter__(self):
        yield from range(537)
        raise OSError("the input broke")


class ShortLength:
    """An input that says it has 500 items and yields 20,000."""

    def __len__(self):
        return 500

    def __iter__(self):
        return iter(range(20_000))


@pytest.mark.parametrize("backend", ["fork", "thread", None])
def test_a_sized_input_that_fails_gives_every_result_before_it(backend):
    got = []
    with SmartExecutor(2, backend=backend) as ex:
        with pytest.raises(OSError, match="the input broke"):
            for value in ex.map(w.square, SizedBrokenInput()):
                got.append(value)
    assert got == [i * i for i in range(537)]


@pytest.mark.parametrize("backend", ["fork", "thread"])
def test_an_input_longer_than_its_len_is_not_sent_one_item_per_chunk(backend):
    with SmartExecutor(2, backend=backend) as ex:
        assert list(ex.map(w.square, ShortLength())) == [i * i for i in range(20_000)]
        sent = ex.stats().backends[backend]
    assert sent.items == 20_000
    assert sent.chunks < 1_000, sent  # it sent ~19,500 one-item chunks


@pytest.mark.parametrize("n_good", [0, 7, 2000, 5003])
def test_an_input_error_inline_comes_after_every_item_read_before_it(n_good):
    # A measured tiny callable runs inline in C-level batches read ahead as lists.
    got = []
    with SmartExecutor(2, allow_inline=True) as ex:
        assert list(ex.map(w.square, range(20_000))) == [i * i for i in range(20_000)]
        with pytest.raises(OSError, match="the input broke"):
            for value in ex.map(w.square, failing_input(n_good)):
                got.append(value)
        assert ex.decisions()[-1].backend == "inline"
    assert got == [i * i for i in range(n_good)]


@pytest.mark.parametrize("backend", ["fork", "thread", None])
def test_results_of_a_slow_producer_are_not_held_back(backend):
    produced = []

    def ticker():
        for i in itertools.count():
            time.sleep(0.02)
            produced.append(i)
            yield i

    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(w.square, ticker())
        first = [next(results) for _ in range(3)]
        results.close()
    assert first == [0, 1, 4]
    assert len(produced) < 60, len(produced)  # not thousands: a chunk did not wait to fill


class WrongLength:
    """Says 100 items, yields 300."""

    def __len__(self):
        return 100

    def __iter__(self):
        return iter(range(300))


def test_a_wrong_len_does_not_cut_the_map_short():
    with SmartExecutor(2) as ex:
        assert list(ex.map(w.square, WrongLength())) == [i * i for i in range(300)]


def test_a_crashed_chunk_does_not_spend_the_retries_of_its_other_items(tmp_path):
    with SmartExecutor(2, max_retries=1) as ex:
        out = list(ex.map(w.crash_once_each, range(60), [str(tmp_path)] * 60, chunksize=50))
    assert out == list(range(60))


def test_a_task_timeout_moves_a_function_measured_as_waiting_to_fork():
    # Threads cannot be stopped: the stuck call ran on and leaving the `with`
    # block waited for it for ever. A fork worker is killed instead.
    from smartexec import gil
    from smartexec.errors import TaskTimeoutError

    gil.remember(w.sleep_then_return, gil.GilProfile("waits", 5, 0.05, 0.01, 0.0, 90))
    try:
        start = time.monotonic()
        with SmartExecutor(2, task_timeout=1) as ex:
            assert ex.explain(w.sleep_then_return).backend == "fork"
            results = ex.map(w.sleep_then_return, [0.01, 600])
            assert next(results)[0] == 0.01
            with pytest.raises(TaskTimeoutError):
                next(results)
            assert ex.decisions()[-1].backend == "fork"
        assert time.monotonic() - start < 60  # not the 600 s the stuck call wanted
    finally:
        gil.forget(w.sleep_then_return)


def headroom(_):
    """How many more frames a call could nest here before ``RecursionError``."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return sys.getrecursionlimit() - depth


def test_a_fork_worker_leaves_the_callable_the_recursion_a_process_pool_worker_does():
    # smartexec's frames above a fork worker's call are 8-10 more than the
    # stdlib's: a recursion a ProcessPoolExecutor worker ran raised
    # RecursionError in one (found by a helper trying to break it); raised
    # by the whole stack it inherited, the limit then let deeper ones pass.
    fork = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(2, mp_context=fork) as pool:
        stdlib = set(pool.map(headroom, range(4)))
    with SmartExecutor(2, backend="fork") as ex:
        ours = set(ex.map(headroom, range(4)))
    assert ours == stdlib and len(ours) == 1
