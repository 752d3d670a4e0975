"""docs/problems.md, problem 4 / issue 3: chunksize from measured latency, inline fallback, streaming."""

from __future__ import annotations

import itertools
import time

import pytest

from smartexec import SmartExecutor
from smartexec.backends.fork import ForkBackend
from smartexec.backends.loky import LokyBackend
from smartexec.backends.thread import ThreadBackend
from smartexec.tuning import (
    MAX_CHUNK_ITEMS,
    MEASURING_CHUNK_S,
    PROBE_MAX_ITEMS,
    chunk_target_s,
    chunksize,
    default_chunksize,
)

pytestmark = pytest.mark.timeout(120)


def noop(x):
    return x


def busy(x, seconds=0.005):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return x


def fast_then_slow(x):
    # items below 2000 take ~10 us, the rest ~2 ms
    return busy(x, 0.00001 if x < 2000 else 0.002)


@pytest.fixture
def chunk_sizes(monkeypatch):
    sizes = []
    original = ForkBackend.submit_chunk

    def spy(self, fn, chunk, budget_s=None):
        sizes.append(len(chunk))
        return original(self, fn, chunk, budget_s)

    monkeypatch.setattr(ForkBackend, "submit_chunk", spy)
    return sizes


def test_default_chunksize_before_measuring():
    assert default_chunksize(20_000, 2) == 2_500
    assert default_chunksize(3, 2) == 1
    assert default_chunksize(10_000, 4, in_process=True) == 1


def test_chunks_aim_at_a_multiple_of_the_backends_per_chunk_cost():
    # threads: 100x (their items run one after another in one thread)
    assert chunk_target_s(ThreadBackend.chunk_overhead_s, in_process=True) == pytest.approx(0.002)
    # processes: 200x (this process's share of a chunk is dearer under load)
    assert chunk_target_s(ForkBackend.chunk_overhead_s) == pytest.approx(0.03)
    assert chunk_target_s(LokyBackend.chunk_overhead_s) == pytest.approx(0.04)
    assert chunk_target_s(3e-3) == pytest.approx(0.06)  # a cluster: 20x its cost
    assert chunk_target_s(0.0) == pytest.approx(0.001)


def test_chunks_whose_figures_still_decide_the_route_aim_lower():
    # Their figures need only a telling GIL watch each; the route's own target
    # (30 ms on fork) delays the verdict and leaves more behind on a move.
    fork = ForkBackend.chunk_overhead_s
    assert chunk_target_s(fork, measuring=True) == pytest.approx(MEASURING_CHUNK_S)
    assert chunksize(0.0127, 2, fork, 300, measuring=True) == 1  # a 12.7 ms GET
    assert chunksize(0.0127, 2, fork, 300) == 3
    assert chunksize(0.002, 2, fork, 300, measuring=True) == 5
    # Never above the route's own target (threads: 2 ms), nor below 20x a
    # dear backend's per-chunk cost (a cluster).
    assert chunk_target_s(ThreadBackend.chunk_overhead_s, in_process=True, measuring=True) == (
        pytest.approx(0.002)
    )
    assert chunk_target_s(3e-3, measuring=True) == pytest.approx(0.06)


def test_a_stream_sizes_its_chunks_for_measuring_until_the_verdict():
    from concurrent.futures import Future

    from smartexec._chunk_stream import ChunkStream
    from smartexec._mapping import stream_values
    from smartexec._remote import ChunkResult
    from smartexec.tuning import Estimate

    estimate = Estimate()
    estimate.seed(0.0127, 100, 0.0)  # an earlier run's figure: 12.7 ms an item
    verdict = []
    sent = []

    def send(calls, budget_s):
        sent.append(len(calls))
        future = Future()
        future.set_result(ChunkResult([(True, c[0][0]) for c in calls], 0.0127 * len(calls), 0.0))
        return future

    stream = ChunkStream(
        send=send,
        calls=(((x,), {}) for x in range(300)),
        remaining=300,
        n_workers=2,
        overhead_s=ForkBackend.chunk_overhead_s,
        estimate=estimate,
        fixed_chunksize=None,
        buffersize=4,
        end_time=None,
        on_chunk_error=lambda exc, calls: exc,
        measuring=lambda: not verdict,
    )
    assert sent == [1, 1, 1, 1]  # no verdict: chunks for measuring
    verdict.append("stay")
    assert list(stream_values([], stream, ordered=True)) == list(range(300))
    assert max(sent[4:]) == 3  # after it: the route's own target


def test_items_of_a_few_milliseconds_are_not_chunked_on_threads():
    # chunked, items that wait (reads) would wait one after another in one thread
    assert chunksize(0.002, 6, ThreadBackend.chunk_overhead_s, 1000, in_process=True) == 1
    assert chunksize(0.004, 2, ForkBackend.chunk_overhead_s, remaining=1000) == 8


def test_a_tail_of_tiny_items_is_not_cut_up():
    # 20 items of 1 us cost less than one fork chunk (150 us): one chunk
    assert chunksize(1e-6, 2, ForkBackend.chunk_overhead_s, remaining=20) == 20
    # 20 items of 1 ms: shrink so that both workers finish together
    assert chunksize(0.001, 2, ForkBackend.chunk_overhead_s, remaining=20) == 5


def test_the_first_chunks_are_sized_from_the_whole_input(chunk_sizes):
    with SmartExecutor(2, backend="fork") as ex:
        assert list(ex.map(noop, range(32))) == list(range(32))
    assert chunk_sizes[:6] == [4] * 6, chunk_sizes  # 32 / (2 workers x 4), as Pool.map
    # The last 8 items go in chunks sized from the measured time per item: a
    # fresh worker's cold first call (page faults after the fork, ~0.3 ms under
    # load) can read as 75 us an item and split them in 2-item chunks.
    assert sum(chunk_sizes) >= 32 and len(chunk_sizes) <= 6 + 4, chunk_sizes


def test_the_first_window_of_a_huge_input_is_bounded(chunk_sizes):
    # 10 M items / (2 workers x 4) would be 1.25 M items a chunk, 7.5 M read at once
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(noop, range(10**7))
        assert [next(results) for _ in range(3)] == [0, 1, 2]
        del results
    assert chunk_sizes and max(chunk_sizes) <= MAX_CHUNK_ITEMS, chunk_sizes[:8]


def sleep_2ms(x):
    time.sleep(0.002)
    return x


def test_waiting_items_run_one_per_chunk_on_threads(monkeypatch):
    sizes = []
    original = ThreadBackend.submit_chunk

    def spy(self, fn, chunk, *args, **kwargs):
        sizes.append(len(chunk))
        return original(self, fn, chunk, *args, **kwargs)

    monkeypatch.setattr(ThreadBackend, "submit_chunk", spy)
    with SmartExecutor(backend="thread") as ex:
        assert list(ex.map(sleep_2ms, range(200))) == list(range(200))
    assert sum(sizes) == 200
    assert set(sizes[20:]) == {1}, sizes  # once measured (2 ms per item)


def test_no_op_map_falls_back_to_inline(chunk_sizes):
    with SmartExecutor(2, allow_inline=True) as ex:
        assert list(ex.map(noop, range(20_000))) == list(range(20_000))
        last = ex.decisions()[-1]
    assert chunk_sizes == []  # nothing was sent to a worker
    assert last.backend == "inline"
    assert "us per item" in str(last)


def test_ten_millisecond_items_go_parallel(chunk_sizes):
    with SmartExecutor(2, allow_inline=True) as ex:
        items = list(range(40))
        assert list(ex.map(busy, items, itertools.repeat(0.01))) == items
        last = ex.decisions()[-1]
    assert last.backend == "fork", str(last)
    assert chunk_sizes and sum(chunk_sizes) < 40  # the probe ran the first items


def test_explicit_chunksize_is_honoured(chunk_sizes):
    with SmartExecutor(2) as ex:
        assert list(ex.map(busy, range(10), chunksize=4)) == list(range(10))
    assert chunk_sizes == [4, 4, 2]


def test_forced_backend_sends_tuned_chunks(chunk_sizes):
    with SmartExecutor(2, backend="fork") as ex:
        assert list(ex.map(noop, range(20_000))) == list(range(20_000))
    assert sum(chunk_sizes) == 20_000
    assert len(chunk_sizes) < 40


def test_fast_prefix_does_not_lock_in_huge_slow_chunks(chunk_sizes):
    with SmartExecutor(2, backend="fork") as ex:
        items = list(range(2600))
        assert list(ex.map(fast_then_slow, items)) == items
    # the last chunks (slow items) are small: 20 ms of work is ~10 items
    assert max(chunk_sizes[-5:]) <= 50, chunk_sizes


def test_worker_stops_a_chunk_that_overruns_its_budget(chunk_sizes):
    with SmartExecutor(2, backend="fork") as ex:
        # measure fast items first, then send one chunk that turns slow
        list(ex.map(fast_then_slow, range(1000)))
        chunk_sizes.clear()
        start = time.perf_counter()
        assert list(ex.map(fast_then_slow, range(1500, 2400))) == list(range(1500, 2400))
        elapsed = time.perf_counter() - start
    # some chunk was re-sent in part (more items sent than mapped)
    assert sum(chunk_sizes) > 900, chunk_sizes
    assert elapsed < 10


def test_map_over_an_endless_generator_streams():
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(noop, itertools.count())  # a map that read it whole would hang (timeout)
        first = [next(results) for _ in range(10)]
        assert first == list(range(10))
        results.close()


def test_memory_stays_flat_while_a_million_items_stream():
    pulled = 0

    def source():
        nonlocal pulled
        for i in itertools.count():
            pulled = i
            yield i

    for backend in (None, "fork"):
        ahead = 0
        with SmartExecutor(2, backend=backend) as ex:
            n = 1_000_000 if backend is None else 200_000
            for consumed, _ in enumerate(ex.map(noop, source())):
                ahead = max(ahead, pulled - consumed)
                if consumed == n:
                    break
        # bounded by the window (chunks in flight), never the whole input
        # buffersize (2 x 2 + 2) chunks in flight plus the one being consumed
        assert ahead <= 7 * MAX_CHUNK_ITEMS + PROBE_MAX_ITEMS, (backend, ahead)
        assert ahead < n / 2, (backend, ahead)


def test_early_exit_cancels_pending_chunks(chunk_sizes):
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(busy, range(100), itertools.repeat(0.2), chunksize=1)
        next(results)
        results.close()
        ex.shutdown(wait=True)
    assert len(chunk_sizes) <= 10  # only the window was ever sent: 99 x 0.2 s were not run


def test_inline_run_moves_to_workers_when_items_turn_slow():
    # Every item's result, in order, whichever way the map went: a loop here
    # that moves to fork once its items turn slow (the usual), or fork from
    # the start when the first items' GIL watch read "holds" on a busy
    # machine. How often it goes the first way is benchmarks/soak_routing.py's
    # to count; the move itself is tested on fixed timings in
    # tests/test_inline_loop.py.
    from smartexec import _profiles, gil

    gil.forget(fast_then_slow)
    _profiles.clear()
    with SmartExecutor(2, allow_inline=True) as ex:
        items = list(range(2400))
        assert list(ex.map(fast_then_slow, items)) == items
        moved = [d for d in ex.decisions() if "items inline" in d.reasons[0]]
        log = [str(d) for d in ex.decisions()]
        explained = str(ex.explain(fast_then_slow))
    assert all(d.backend == "fork" for d in moved), log
    if moved:
        assert "its last map ran on fork" in explained


def fail_at_15000(x):
    if x == 15_000:
        raise ValueError(x)
    return x


def test_inline_tail_raises_at_the_failing_item():
    with SmartExecutor(2, allow_inline=True) as ex:
        got = []
        with pytest.raises(ValueError):
            for value in ex.map(fail_at_15000, range(20_000)):
                got.append(value)
        assert ex.decisions()[-1].backend == "inline"
    assert got == list(range(15_000))
