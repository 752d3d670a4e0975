"""smartexec.gil: the classification table, the sampler, the per-callable memory."""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import os
import threading
import time

import pytest

from smartexec import SmartExecutor, gil
from smartexec.gil import CPU_SHARE_WAITS, GIL_SHARE_HOLDS, GilSampler, classify

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("cpu", "held", "kind"),
    [
        (0.0, 0.0, "waits"),
        (CPU_SHARE_WAITS - 0.01, 0.9, "waits"),  # mostly off the CPU: threads overlap it
        (1.0, 0.0, "releases"),
        (1.0, GIL_SHARE_HOLDS - 0.01, "releases"),
        (1.0, GIL_SHARE_HOLDS, "holds"),
        (CPU_SHARE_WAITS, 1.0, "holds"),
    ],
)
def test_classify(cpu, held, kind):
    assert classify(cpu, held) == kind


def _watch(work, seconds=0.06):
    sampler = GilSampler()
    sampler.start()
    items = 0
    while sampler.elapsed_s() < seconds:
        work()
        items += 1
    sampler.items = items
    return sampler.stop()


def _watch_until(kind, work, tries=3):
    """Watch ``work`` up to ``tries`` times; the first profile of ``kind``, else the last.

    A busy machine (another test run, a build) delays the sampler's wake-ups
    now and then, which reads as held GIL: one watch in three seeing the
    release or the wait shows the sampler can tell it.
    """
    for _ in range(tries):
        profile = _watch(work)
        if profile.kind == kind:
            break
    return profile


def _spin():
    total = 0
    for i in range(20_000):
        total += i
    return total


def test_sampler_sees_a_python_loop_hold_the_gil():
    profile = _watch(_spin)
    assert profile.kind == "holds", profile
    assert profile.samples > 0 and profile.items > 0


def test_sampler_sees_a_sleep_wait():
    profile = _watch_until("waits", lambda: time.sleep(0.005))
    assert profile.kind == "waits", profile


def test_sampler_sees_zlib_release_the_gil():
    import zlib

    data = bytes(range(256)) * (1 << 13)
    profile = _watch_until("releases", lambda: zlib.compress(data))
    assert profile.kind == "releases", profile


def test_the_gil_held_while_the_sampler_starts_is_counted():
    # The sampler thread needs the GIL to start: behind a Python loop it
    # starts late (10-15 ms), and that delay is held GIL too. Here its start
    # is made 20 ms late by hand.
    sampler = GilSampler()
    sampler._start_wall = time.perf_counter() - 0.02
    sampler._stop.set()  # one pass: the start-up only
    sampler._sample()
    assert 0.018 <= sampler._late_s < 0.5, sampler._late_s
    on_time = GilSampler()
    on_time._start_wall = time.perf_counter()
    on_time._stop.set()
    on_time._sample()
    assert on_time._late_s == 0.0


def test_a_watch_ends_early_once_its_figures_are_decisive():
    watched = gil.watch(lambda x: (time.sleep(0.005), x)[1], iter(range(1000)), False, seconds=2)
    assert watched.profile.kind == "waits"
    assert watched.results == list(range(len(watched.results)))
    assert len(watched.results) < 100, watched.profile  # 2 s would be ~400 items
    undecided = gil.watch(
        lambda x: (time.sleep(0.005), x)[1], iter(range(30)), False, seconds=0.1, decided_s=None
    )
    assert len(undecided.results) > len(watched.results) or undecided.exhausted


def test_stop_is_idempotent_and_joins_the_thread():
    sampler = GilSampler()
    sampler.start()
    first = sampler.stop()
    assert sampler.stop() is first
    assert not [t for t in threading.enumerate() if t.name == "smartexec-gil"]


def test_stop_wakes_the_sampler_at_once():
    sampler = GilSampler(period_s=10.0)  # asleep for 10 s unless woken
    sampler.start(settle=True)
    started = time.perf_counter()
    sampler.stop()
    assert time.perf_counter() - started < 5.0  # woken, not slept out
    assert not [t for t in threading.enumerate() if t.name == "smartexec-gil"]


def _nap(seconds):
    time.sleep(seconds)
    return seconds


def _worker_watch_key(fn):
    from smartexec import _remote

    key = _remote._watch_key(fn)
    _remote._watched.pop(key, None)  # as in a fresh worker
    _remote._last_call_s.pop(key, None)
    return key


def test_a_chunk_of_several_short_items_runs_unwatched():
    from smartexec import _remote

    key = _worker_watch_key(abs)
    result = _remote.run_chunk(abs, [((-i,), {}) for i in range(50)], remote=True)
    assert result.gil is None  # 50 calls of abs() end long before WATCH_AFTER_S
    assert [value for _, value in result.outcomes] == list(range(50))
    assert _remote._watched.get(key, 0.0) == 0.0  # the budget is not spent on it


def test_a_long_chunk_is_watched_after_its_first_items():
    from smartexec import _remote

    _worker_watch_key(_nap)
    calls = [((0.002,), {})] * 8
    result = _remote.run_chunk(_nap, calls, remote=True)
    assert result.gil is not None and result.gil.kind == "waits"
    # The first item runs past WATCH_AFTER_S unwatched; the watch has the rest.
    assert 1 <= result.gil.items < len(calls)
    assert len(result.outcomes) == len(calls)


def test_a_one_item_chunk_is_watched_whole_after_a_long_enough_call():
    from smartexec import _remote

    _worker_watch_key(_nap)
    long_call = [((1.5 * _remote.MIN_WATCHED_S,), {})]
    # A process's first call holds its warm-up (imports, caches): not watched.
    assert _remote.run_chunk(_nap, long_call, remote=True).gil is None
    result = _remote.run_chunk(_nap, long_call, remote=True)
    assert result.gil is not None and result.gil.items == 1


def test_a_one_item_chunk_after_a_short_call_is_not_watched():
    from smartexec import _remote

    key = _worker_watch_key(_nap)
    _remote.run_chunk(_nap, [((0.0,), {})], remote=True)
    # Its last call ran far under MIN_WATCHED_S: a watch of the next would
    # be too short for the parent to read, and only spend the budget.
    assert _remote.run_chunk(_nap, [((0.0,), {})], remote=True).gil is None
    assert _remote._watched.get(key, 0.0) == 0.0


def test_a_chunk_stopped_at_its_budget_before_the_watch_keeps_its_outcomes():
    from smartexec import _remote

    _worker_watch_key(_nap)
    result = _remote.run_chunk(_nap, [((0.002,), {})] * 50, remote=True, budget_s=0.0)
    assert len(result.outcomes) == 1 and result.gil is None


def test_a_chunk_given_as_an_iterator_runs_while_a_watch_is_due():
    from smartexec import _remote

    _worker_watch_key(_nap)
    result = _remote.run_chunk(_nap, (((0.0,), {}) for _ in range(3)), remote=True)
    assert [value for _, value in result.outcomes] == [0.0] * 3


def test_a_watch_is_not_started_for_a_short_rest(monkeypatch):
    import types

    from smartexec import _remote

    _worker_watch_key(_nap)
    # After 1.5 ms one item is left: at that pace, under MIN_WATCHED_S. The
    # pace is injected (a clock that moves 1.5 ms a reading): a busy machine
    # stretched the real 1.5 ms sleep to 5 ms, and that rest was watched.
    ticks = itertools.count()
    clock = types.SimpleNamespace(
        perf_counter=lambda: next(ticks) * 0.0015, thread_time=time.thread_time
    )
    monkeypatch.setattr(_remote, "time", clock)
    result = _remote.run_chunk(_nap, [((0.0,), {}), ((0.0,), {})], remote=True)
    assert result.gil is None and len(result.outcomes) == 2


def test_a_chunk_reports_its_first_calls_seconds_apart(monkeypatch):
    import types

    from smartexec import _remote

    # A clock that moves 1 ms a reading: the chunk reads it at its start,
    # after its first call and at its end.
    ticks = itertools.count()
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks) * 0.001, thread_time=lambda: 0.0)
    monkeypatch.setattr(_remote, "time", clock)
    _worker_watch_key(abs)  # as in a fresh worker
    result = _remote.run_chunk(abs, [((-i,), {}) for i in range(50)], watch=False)
    assert result.first == (0.001, 0.0) and result.compute_s == pytest.approx(0.002)
    assert [value for _, value in result.outcomes] == list(range(50))
    # Only the process's first call of the callable is reported apart.
    assert _remote.run_chunk(abs, [((-1,), {}), ((-2,), {})], watch=False).first is None
    _worker_watch_key(abs)
    unclocked = _remote.run_chunk(abs, [((-1,), {}), ((-2,), {})], watch=False, clock_cpu=False)
    assert unclocked.first is None  # figures nobody reads: nothing claimed either
    assert _remote.run_chunk(abs, [((-1,), {})], watch=False).first is not None


def test_only_one_of_the_chunks_starting_together_reports_the_first_call():
    from smartexec import _remote

    _worker_watch_key(_nap)
    started = threading.Barrier(4)

    def chunk():
        started.wait()
        return _remote.run_chunk(_nap, [((0.001,), {})] * 2, watch=False)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: chunk(), range(4)))
    assert sum(result.first is not None for result in results) == 1


def test_a_watched_chunk_reports_its_first_call_too():
    from smartexec import _remote

    _worker_watch_key(_nap)
    result = _remote.run_chunk(_nap, [((0.002,), {})] * 4, remote=True)
    assert result.first is not None
    assert 0.0 < result.first[0] <= result.compute_s and result.first[1] <= result.cpu_s


def test_starting_a_watch_part_way_is_not_the_items_time(monkeypatch):
    from smartexec import _remote

    _worker_watch_key(_nap)
    real = _remote._started_sampler

    def slow_start():
        time.sleep(0.3)  # a sampler thread that waits long for a CPU
        return real()

    monkeypatch.setattr(_remote, "_started_sampler", slow_start)
    result = _remote.run_chunk(_nap, [((0.002,), {})] * 5, remote=True, budget_s=0.1)
    assert result.gil is not None
    assert len(result.outcomes) == 5  # the start did not use up the budget
    assert result.compute_s < 0.25  # ~10 ms of items; the 0.3 s start is not in it


def test_a_sampler_that_cannot_start_leaves_the_chunk_unwatched(monkeypatch):
    from smartexec import _remote

    _worker_watch_key(_nap)

    def refuse(self, settle=False):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(gil.GilSampler, "start", refuse)
    for calls in ([((0.0,), {})], [((0.002,), {})] * 3):
        result = _remote.run_chunk(_nap, calls, remote=True)
        assert result.gil is None and len(result.outcomes) == len(calls)
        assert all(ok for ok, _ in result.outcomes)


class Model:
    def predict(self, x):
        return x


def test_measurements_are_kept_weakly_and_can_be_forgotten():
    profile = gil.GilProfile("waits", 1, 0.05, 0.0, 0.0, 10)
    model = Model()
    gil.remember(model.predict, profile)
    assert gil.recall(model.predict) is profile  # a new bound method, same object
    assert gil.recall(Model().predict) is None
    gil.forget(model.predict)
    assert gil.recall(model.predict) is None

    gil.remember(model.predict, profile)
    del model
    gc.collect()
    assert not [k for k in gil._measured if isinstance(k, tuple) and k[0] == "m"]


def test_a_callable_without_weak_references_is_not_kept():
    profile = gil.GilProfile("waits", 1, 0.05, 0.0, 0.0, 10)
    items = []
    gil.remember(items.append, profile)  # a list's method: cannot be held weakly
    assert gil.recall(items.append) is None


def matrix_sum(a):
    return float(a.sum())


def test_an_item_that_keeps_every_core_busy_runs_inline_not_on_threads():
    # A @ A on a multithreaded BLAS: the measurement says one item keeps all
    # cores busy, so threads running several would only oversubscribe them.
    import numpy as np

    from smartexec._system import current_platform

    cores = float(current_platform().cpu_count)
    gil.remember(matrix_sum, gil.GilProfile("releases", 9, 0.055, 1.0, 0.0, 100, 1, cores))
    try:
        with SmartExecutor(2) as ex:
            arrays = [np.full(4, float(i)) for i in range(200)]
            assert list(ex.map(matrix_sum, arrays)) == [4.0 * i for i in range(200)]
            last = ex.decisions()[-1]
            assert ex.stats().backends["inline"].items == 200
        assert last.backend == "inline", str(last)
        assert f"keeps {cores:.1f} cores busy" in str(last)
    finally:
        gil.forget(matrix_sum)


def sleep_5ms(x):
    time.sleep(0.005)
    return x


def test_work_of_other_threads_is_not_the_items():
    # A thread of the program keeps the BLAS pool busy while a sleeping item is
    # measured: the process's CPU time is theirs, not the item's.
    import numpy as np

    stop = threading.Event()

    def busy():
        a = np.ones((600, 600))
        while not stop.is_set():
            a @ a

    thread = threading.Thread(target=busy)
    thread.start()
    time.sleep(0.1)
    gil.forget(sleep_5ms)
    try:
        watched = gil.watch(sleep_5ms, iter(range(60)), False)
        with SmartExecutor(2) as ex:
            assert list(ex.map(sleep_5ms, range(60))) == list(range(60))
            last = ex.decisions()[-1]
    finally:
        stop.set()
        thread.join()
        gil.forget(sleep_5ms)
    assert watched.profile.cores <= 1.0, watched.profile
    # it ran 6x slower inline when the item was said to keep the cores busy
    assert last.backend != "inline", str(last)


def test_a_blas_pool_still_spinning_is_not_the_items():
    # OpenBLAS's threads spin ~0.1 s after a call: a sleeping item measured
    # right after the program's own A @ A must still read as waiting.
    import numpy as np

    a = np.ones((800, 800))
    gil.forget(sleep_5ms)
    try:
        with SmartExecutor(2, allow_inline=True) as ex:
            (a @ a).sum()
            assert list(ex.map(sleep_5ms, range(40))) == list(range(40))
            measured = gil.recall(sleep_5ms)
            last = ex.decisions()[-1]
    finally:
        gil.forget(sleep_5ms)
    assert measured is not None and measured.kind == "waits", measured
    assert measured.cores <= 1.0 and last.backend == "thread", str(last)


def test_a_blas_pool_still_spinning_is_not_a_computing_item_s_cores():
    # A hashing item computes on its own thread all the time; right after the
    # program's A @ A, OpenBLAS's spinning threads read as the item's own:
    # 2.0 cores on 2, and a map with allow_inline ran one item at a time.
    import hashlib

    import numpy as np

    a = np.ones((800, 800))
    data = b"x" * (1 << 16)
    for _ in range(3):
        (a @ a).sum()
        watched = gil.watch(lambda _: hashlib.sha256(data).digest(), iter(range(10**6)), False)
        # (its GIL kind is not the subject: a busy machine's late wake-ups
        # may read as held GIL)
        assert watched.profile.cores <= 1.0, watched.profile


def test_a_spinning_thread_python_does_not_know_is_seen():
    import numpy as np

    a = np.ones((800, 800))
    (a @ a).sum()
    spinning = gil._foreign_thread_running()
    time.sleep(1.0)  # OpenBLAS's threads sleep after ~0.1 s
    assert not gil._foreign_thread_running()
    from threadpoolctl import threadpool_info

    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    if blas and blas[0]["internal_api"] == "openblas" and blas[0]["num_threads"] > 1:
        assert spinning


def test_a_noisy_queue_reading_cannot_make_one_thread_several_cores(monkeypatch):
    # Under load, "time queued" is read apart from the wall clock: were it to
    # reach the wall time, one busy thread would read as many cores.
    import hashlib

    monkeypatch.setattr(gil, "sched_times", lambda native_id=None: (0.0, time.perf_counter()))
    data = b"x" * (1 << 20)
    watched = gil.watch(lambda _: hashlib.sha256(data).digest(), iter(range(10**6)), False)
    assert watched.profile.cores < 1.5, watched.profile
    assert watched.profile.cpu_share <= 1.0


def test_an_item_on_one_core_still_runs_on_threads():
    import numpy as np

    gil.remember(matrix_sum, gil.GilProfile("releases", 9, 0.055, 1.0, 0.0, 100, 1, 1.0))
    try:
        with SmartExecutor(2) as ex:
            arrays = [np.full(4, float(i)) for i in range(20)]
            assert list(ex.map(matrix_sum, arrays)) == [4.0 * i for i in range(20)]
            assert ex.decisions()[-1].backend == "thread"
    finally:
        gil.forget(matrix_sum)


def test_str_states_the_figures_and_the_meaning():
    text = str(gil.GilProfile("holds", 4, 0.056, 0.99, 0.87, 11))
    assert text.startswith("measured over 4 items (56 ms)")
    assert "the GIL held 87%" in text and "threads would take turns" in text


def test_watch_keeps_results_in_order_and_loses_no_item():
    items = iter(range(1000))
    watched = gil.watch(lambda x: (time.sleep(0.001), x)[1], items, False, seconds=0.05)
    assert watched.results == list(range(len(watched.results)))
    assert watched.error is None and not watched.exhausted
    assert watched.profile.kind == "waits"
    assert next(items) == len(watched.results)  # nothing taken was lost
    assert not [t for t in threading.enumerate() if t.name.startswith("smartexec-gil")]


def test_watch_stops_at_the_first_failing_item_by_position():
    def fail_at_7(x):
        if x == 7:
            raise ValueError(x)
        return x

    items = iter(range(100))
    watched = gil.watch(fail_at_7, items, False, seconds=5)
    assert watched.results == list(range(7))
    assert isinstance(watched.error, ValueError)
    assert next(items) == 8  # the failing item was taken; nothing after it


def test_watch_records_a_failing_input_at_its_position():
    def reading():
        yield 1
        yield 2
        raise OSError("the input broke")

    watched = gil.watch(abs, reading(), False, seconds=5)
    assert watched.results == [1, 2] and isinstance(watched.error, OSError)


def test_watch_raises_a_keyboard_interrupt_and_stops_its_sampler():
    def interrupted(x):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gil.watch(interrupted, iter(range(3)), False, seconds=5)
    assert not [t for t in threading.enumerate() if t.name.startswith("smartexec-gil")]


def test_watch_sees_the_end_of_the_input_and_star_arguments():
    watched = gil.watch(pow, iter([(2, 3), (3, 2)]), True, seconds=5)
    assert watched.results == [8, 9] and watched.exhausted


def test_the_sched_reader_keeps_one_descriptor_per_thread_and_closes_them():
    from smartexec._system import SchedReader, sched_times

    me = threading.get_native_id()
    if sched_times(me) is None:
        pytest.skip("no /proc/self/task/<tid>/schedstat here")
    reader = SchedReader()
    before = len(os.listdir("/proc/self/fd"))
    first = reader.read(me)
    assert first is not None and first[0] > 0
    for _ in range(100):  # no new descriptor per reading
        assert reader.read(me) is not None
    assert len(os.listdir("/proc/self/fd")) == before + 1
    assert reader.read(2**30) is None  # no such thread: nothing kept open
    reader.keep_only(set())
    assert len(os.listdir("/proc/self/fd")) == before
    reader.read(me)
    reader.close()
    reader.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert reader.read(me) is None  # closed for good: no descriptor opens again
    assert len(os.listdir("/proc/self/fd")) == before


def test_the_sched_reader_reads_the_machines_idle_seconds_through_one_descriptor():
    from smartexec._system import IDLE_TICK_S, SchedReader

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here")
    reader = SchedReader()
    before = len(os.listdir("/proc/self/fd"))
    first = reader.idle_s()
    assert first is not None and first > 0
    start = time.perf_counter()
    time.sleep(0.1)  # this thread sleeps: unless the machine is busy, its CPUs idle
    later = reader.idle_s()
    wall = time.perf_counter() - start
    assert later is not None
    # No more than every CPU idle throughout, give or take the ticks' rounding.
    assert -2 * IDLE_TICK_S <= later - first <= wall * (os.cpu_count() or 1) + 2 * IDLE_TICK_S
    for _ in range(100):  # no new descriptor per reading
        assert reader.idle_s() is not None
    assert len(os.listdir("/proc/self/fd")) == before + 1
    reader.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert reader.idle_s() is None  # closed for good


def test_the_sched_reader_tries_an_unreadable_proc_stat_once(monkeypatch):
    from smartexec._system import SchedReader

    tried = []

    def missing(path, flags):
        tried.append(path)
        raise FileNotFoundError(path)

    reader = SchedReader()
    monkeypatch.setattr(os, "open", missing)
    assert reader.idle_s() is None and reader.idle_s() is None
    assert tried == ["/proc/stat"]  # every later map reading skips it
    reader.close()


def test_a_kind_read_from_the_pool_clocks_names_no_duration():
    # Kinds found on threads from the pool's clocks have no watch: "(0 ms)" read as a bug.
    from smartexec.gil import GilProfile

    assert "(0 ms)" not in str(GilProfile("waits", 13, 0.0, 0.08, 0.0, 0))
    assert "(79 ms)" in str(GilProfile("holds", 10, 0.079, 1.0, 0.9, 150))
