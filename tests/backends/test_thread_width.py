"""The thread pool grows for work that waits while calls queue (Little's law), and only then.

Decisions are tested with injected figures; the end-to-end tests use work
whose kind no load can change (sleeps never run; a held lock keeps the
GIL-holding thread runnable), and assert widths, never times.
"""

from __future__ import annotations

import threading
import time

import pytest

from smartexec import SmartExecutor
from smartexec.backends._widener import _Latency
from smartexec.backends.thread import ThreadBackend
from smartexec.tuning import (
    MAX_WAITING_THREADS,
    SATURATED_SLOWDOWN,
    WAITING_TARGET_CORES,
    predict_s,
    threads_for_waiting,
    waiting_width,
)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("busy", "cores", "limit", "width"),
    [
        (6, 0.06, 128, 100),  # 20 ms calls with 0.2 ms of Python: 100 threads keep a core busy
        (6, 0.4, 128, 15),
        (6, 0.0, 128, 128),  # sleeps: as many as the limit lets
        (6, 0.0, 40, 40),
        (6, 1.0, 128, 0),  # threads taking turns on the GIL keep a core runnable: not waiting
        (6, 0.9, 128, 0),
        (6, 0.5, 128, 0),  # half a core runnable: a pool grows only below it
        (2, 1.5, 128, 0),  # computing threads (numpy): a core each
        (0.5, 0.0, 128, 0),  # under one busy thread: nothing to read
    ],
)
def test_threads_for_waiting_is_littles_law(busy, cores, limit, width):
    assert threads_for_waiting(busy, cores, limit) == width


def test_a_waiting_maps_rest_is_priced_at_the_width_its_pool_grows_to():
    # The same law prices threads for a map's rest: at the stdlib's 6 threads,
    # 72 sleeps of 10 ms were predicted at 0.12 s and took 0.02-0.03 s.
    assert waiting_width(0.01, 128) == 100 and waiting_width(0.0, 128) == 128
    assert waiting_width(1.0, 128) == 1 and waiting_width(0.4, 128) == 3
    grows = ThreadBackend(None, 2)
    assert grows.grows_to(0.01) == min(100, grows._widener.limit)
    assert grows.grows_to(None) == grows.max_workers  # no share measured yet
    assert grows.grows_to(1.0) == grows.max_workers  # never narrower
    assert ThreadBackend(4, 2).grows_to(0.01) == 4  # a width the user fixed
    waits = predict_s(
        "thread", kind="waits", per_item_s=0.01, send_s=0.0, rest=72, cpus=2, workers=100
    )
    assert waits == pytest.approx(0.01)  # one wave


def test_pool_threads_waiting_for_a_gil_held_elsewhere_are_not_waiting_work():
    # The caller's thread holds the GIL (dispatching chunks): the pool threads
    # are not runnable, but the process keeps a core busy.
    assert threads_for_waiting(6, 0.05, 128, process_cores=0.9) == 0
    assert threads_for_waiting(6, 0.05, 128, process_cores=0.1) == 120


def test_a_pool_whose_items_slowed_down_stops_growing():
    # What the threads wait for (a server on this machine, say) is saturated.
    assert threads_for_waiting(6, 0.06, 128, slowdown=1.5) == 100
    assert threads_for_waiting(6, 0.06, 128, slowdown=SATURATED_SLOWDOWN) == 0


def test_the_slowdown_is_against_the_quickest_items_measured():
    latency = _Latency()
    assert latency.slowdown(0.0, 0) == 1.0  # nothing ended yet
    assert latency.slowdown(0.06, 6) == 1.0  # 10 ms an item: the quickest
    assert latency.slowdown(0.12, 4) == pytest.approx(3.0)  # 30 ms an item
    assert latency.slowdown(0.0, 0) == pytest.approx(3.0)  # nothing ended: as last seen
    assert latency.slowdown(0.05, 5) == 1.0


def test_a_waiting_pool_keeps_its_target_cores_runnable():
    width = threads_for_waiting(4, 0.01, 10_000)
    assert width * (0.01 / 4) == pytest.approx(WAITING_TARGET_CORES, rel=0.01)


class _Figures:
    """Injected clocks for a backend's widener: busy thread-seconds, runnable and process CPU seconds."""

    def __init__(self, backend, monkeypatch):
        self.busy = self.runnable = self.process = self.done_s = 0.0
        self.items = 0
        monkeypatch.setattr(backend, "threads_busy_s", lambda: self.busy)
        monkeypatch.setattr(backend, "threads_wanted_s", lambda: self.runnable)
        monkeypatch.setattr(backend, "threads_done", lambda: (self.done_s, self.items))
        backend._widener.process_cpu = lambda: self.process


def _queued_pool(backend, calls):
    """Fill the pool past its width with calls that wait for ``release``."""
    release = threading.Event()
    futures = [backend.submit_call(release.wait, (30,), {}) for _ in range(calls)]
    return release, futures


@pytest.mark.parametrize(
    ("runnable_cores", "process_cores", "grows"),
    [(0.01, 0.01, True), (1.0, 1.0, False), (0.01, 0.9, False)],
    ids=["waiting", "gil-held-by-the-pool", "gil-held-by-another-thread"],
)
def test_the_widener_grows_a_queued_pool_only_when_its_threads_wait(
    monkeypatch, runnable_cores, process_cores, grows
):
    backend = ThreadBackend(None, 2)
    figures = _Figures(backend, monkeypatch)
    release, futures = _queued_pool(backend, 20)
    try:
        widener = backend._widener
        widener.check(100.0)  # the first look: a baseline
        figures.busy, figures.runnable = 6 * 0.02, runnable_cores * 0.02
        figures.process = process_cores * 0.02
        widener.check(100.02)
        assert (backend.max_workers > 6) == grows
        if grows:
            assert backend.max_workers == threads_for_waiting(6, 0.01, widener.limit)
            assert len(backend._pool._threads) > 6  # the queued calls got threads at once
    finally:
        release.set()
        assert all(f.result(timeout=30) for f in futures)
        backend.shutdown()


def test_the_widener_stops_once_the_items_take_longer_than_they_did(monkeypatch):
    backend = ThreadBackend(None, 2)
    figures = _Figures(backend, monkeypatch)
    release, futures = _queued_pool(backend, 20)
    try:
        widener = backend._widener
        widener.check(100.0)
        figures.done_s, figures.items = 0.06, 6  # 10 ms an item: the quickest
        figures.busy, figures.runnable, figures.process = 0.12, 0.0002, 0.0002
        widener.check(100.02)
        assert backend.max_workers == threads_for_waiting(6, 0.01, widener.limit)
        backend.max_workers = backend._pool._max_workers = 6  # as if it had not grown
        figures.done_s, figures.items = 0.06 + 0.12, 6 + 4  # now 30 ms an item
        figures.busy, figures.runnable, figures.process = 0.24, 0.0004, 0.0004
        widener.check(100.04)
        assert backend.max_workers == 6
    finally:
        release.set()
        assert all(f.result(timeout=30) for f in futures)
        backend.shutdown()


def test_the_widener_leaves_a_pool_with_nothing_queued(monkeypatch):
    backend = ThreadBackend(None, 2)
    figures = _Figures(backend, monkeypatch)
    release, futures = _queued_pool(backend, 3)  # under the width of 6
    try:
        backend._widener.check(100.0)
        figures.busy, figures.runnable = 3 * 0.02, 0.0
        backend._widener.check(100.02)
        assert backend.max_workers == 6
    finally:
        release.set()
        [f.result(timeout=30) for f in futures]
        backend.shutdown()


@pytest.mark.parametrize(("chunks", "measured"), [(20, True), (3, False)])
def test_the_widener_takes_its_first_reading_as_chunks_queue(chunks, measured):
    # Before any call ends: the look at the first call's end can then widen.
    backend = ThreadBackend(None, 2)
    release = threading.Event()
    futures = [backend.submit_chunk(release.wait, [((30,), {})]) for _ in range(chunks)]
    try:
        assert backend._widener.unmeasured is not measured  # 3 chunks fit the 6 threads
    finally:
        release.set()
        assert all(f.result(timeout=30).outcomes for f in futures)
        backend.shutdown()


def test_the_widener_takes_its_first_reading_as_submitted_calls_queue():
    # A new user's 200 submits of a 50 ms sleep ran on the stdlib's 6 threads
    # (1.73 s): their calls end together, 50 ms apart, and no two looks at
    # their ends were close enough to compare. Now the first reading comes
    # as calls queue, and a look WIDEN_EVERY_S later compares.
    backend = ThreadBackend(None, 2)
    release = threading.Event()
    futures = [backend.submit_call(release.wait, (30,), {}) for _ in range(20)]
    try:
        assert not backend._widener.unmeasured
    finally:
        release.set()
        assert all(f.result(timeout=30) for f in futures)
        backend.shutdown()


def test_the_widener_looks_again_before_any_call_ends(monkeypatch):
    # Calls that wait long end late: the pool's threads look only when one
    # ends (100 sleeps of 10 ms: the pool grew at 10 ms). After the first
    # reading, a thread of smartexec's looks again WIDEN_EVERY_S later.
    from smartexec.backends import _widener

    monkeypatch.setattr(_widener, "WIDEN_EVERY_S", 0.2)  # the figures are set meanwhile
    backend = ThreadBackend(None, 2)
    start = time.perf_counter()

    def since() -> float:
        return time.perf_counter() - start

    monkeypatch.setattr(backend, "threads_busy_s", lambda: 6 * since())  # six threads busy
    monkeypatch.setattr(
        backend, "threads_wanted_s", lambda: 0.01 * since()
    )  # a hundredth of a core
    monkeypatch.setattr(backend, "threads_done", lambda: (0.0, 0))  # no call ended
    backend._widener.process_cpu = lambda: 0.01 * since()
    release = threading.Event()
    futures = [backend.submit_chunk(release.wait, [((30,), {})]) for _ in range(20)]
    try:
        assert not backend._widener.unmeasured  # the first reading, as chunks queued
        # The width is set before the threads start (a CI run read it between):
        # wait for the threads themselves.
        deadline = time.monotonic() + 20
        while len(backend._pool._threads) <= 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(backend._pool._threads) > 6  # while every call still waits
        assert backend.max_workers == threads_for_waiting(6, 0.01, backend._widener.limit)
    finally:
        release.set()
        assert all(f.result(timeout=30).outcomes for f in futures)
        backend.shutdown()


def test_a_stale_look_is_only_a_baseline(monkeypatch):
    backend = ThreadBackend(None, 2)
    figures = _Figures(backend, monkeypatch)
    release, futures = _queued_pool(backend, 20)
    try:
        backend._widener.check(100.0)
        figures.busy = 6.0
        backend._widener.check(110.0)  # ten seconds later: figures of another time
        assert backend.max_workers == 6
    finally:
        release.set()
        [f.result(timeout=30) for f in futures]
        backend.shutdown()


def test_a_width_the_user_fixed_never_grows():
    assert ThreadBackend(6, 2)._widener is None
    # Each new thread would run the initializer (a connection each, say).
    assert ThreadBackend(None, 2, initializer=print)._widener is None
    assert ThreadBackend(None, 2)._widener.limit <= max(6, MAX_WAITING_THREADS)


def nap(x):
    time.sleep(0.01)
    return x


def test_a_map_of_sleeps_grows_the_pool_and_keeps_every_result():
    with SmartExecutor(backend="thread") as ex:
        assert list(ex.map(nap, range(200))) == list(range(200))
        assert ex._backends["thread"].max_workers > 6
    with SmartExecutor(6, backend="thread") as ex:
        assert list(ex.map(nap, range(60))) == list(range(60))
        assert ex._backends["thread"].max_workers == 6


def test_submits_of_sleeps_grow_the_pool():
    with SmartExecutor(backend="thread") as ex:
        futures = [ex.submit(nap, i) for i in range(200)]
        assert [f.result(timeout=60) for f in futures] == list(range(200))
        assert ex._backends["thread"].max_workers > 6
