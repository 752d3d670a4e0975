"""``map(..., ordered=False)``: results as they complete, streaming, every item once (issue 15).

Chunks complete out of order; within a chunk the results come together, in
input order. The tests assert on the order of events (the slow item is the
last yielded, the moved map's new results come before the old backend's slow
chunks), never on how long anything took.
"""

from __future__ import annotations

import concurrent.futures
import functools
import gc
import io
import itertools
import os
import threading
import time
import weakref
from concurrent.futures import CancelledError, Future

import pytest
from tqdm import tqdm

from smartexec import SmartExecutor, gil, parallel_map
from smartexec import _routed_map as routed_map
from smartexec._chunk_stream import ChunkStream
from smartexec._mapping import stream_values
from smartexec._rerouting import Reroute
from smartexec.errors import WorkerCrashedError

BACKENDS = [None, "fork", "loky", "thread", "inline"]

#: Seconds the slow item sleeps: long against the other items' 10 ms.
SLOW_S = 2.0


def square(x):
    return x * x


def add(x, y):
    return x + y


def slow_first(x):
    """Item 0 sleeps SLOW_S seconds; the others 10 ms."""
    time.sleep(SLOW_S if x == 0 else 0.01)
    return x


def slow_thirtieth(x):
    """Item 30 sleeps SLOW_S seconds; the others 2 ms."""
    time.sleep(SLOW_S if x == 30 else 0.002)
    return x


def fail_at_seven(x, marks=None):
    """Item 7 raises once the other nine ran (each leaves a file in ``marks``)."""
    if x != 7:
        if marks is not None:
            with open(os.path.join(marks, str(x)), "w"):
                pass
        return x
    deadline = time.monotonic() + 30
    while marks is not None and len(os.listdir(marks)) < 9 and time.monotonic() < deadline:
        time.sleep(0.01)  # a worker still starting (loky, under load) runs its item late
    time.sleep(0.2)  # and their replies are on their way
    raise ValueError(f"bad item {x}")


def crash_at_seven(x):
    """Kills its worker process on item 7 (after the others ran)."""
    if x == 7:
        time.sleep(0.5)
        os._exit(1)
    return x


def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


def slow_window(x):
    """Items 2 to 5 (in the first window of a routed map) sleep 1.5 s; the rest 5 ms."""
    time.sleep(1.5 if 2 <= x <= 5 else 0.005)
    return x


def slow_window_fail_at_40(x):
    if x == 40:
        raise ValueError("bad item 40")
    return slow_window(x)


class Dummy:
    pass


def make_dummy(x):
    return Dummy()


class Counted:
    """An endless input that counts how many items were read from it."""

    def __init__(self):
        self.read = 0

    def __iter__(self):
        for x in itertools.count():
            self.read += 1
            yield x


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_item_comes_exactly_once(backend):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        results = list(ex.map(square, range(300), ordered=False))
        assert sorted(results) == [x * x for x in range(300)]
        # Several iterables, and an input of unknown length.
        pairs = list(ex.map(add, (x for x in range(100)), range(100), ordered=False))
        assert sorted(pairs) == [2 * x for x in range(100)]
        assert list(ex.map(square, [], ordered=False)) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("backend", "chunksize"), [(None, None), ("fork", 1), ("loky", 1), ("thread", 1)]
)
def test_the_slow_item_comes_last_not_first(backend, chunksize):
    # Item 0 sleeps 2 s, the others 10 ms on the other worker: in input order
    # item 0 holds back every result; as completed, it is the last.
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        results = list(ex.map(slow_first, range(12), chunksize=chunksize, ordered=False))
        assert sorted(results) == list(range(12))
        assert results[-1] == 0, results
        assert list(ex.map(slow_first, range(4), chunksize=chunksize)) == list(range(4))


@pytest.mark.timeout(120)
def test_with_allow_inline_the_measured_items_come_first_then_as_completed():
    # The first items run in this thread to measure them (in order); the rest
    # goes to workers and comes as completed: the slow item 30 comes last.
    with SmartExecutor(max_workers=2, allow_inline=True) as ex:
        results = list(ex.map(slow_thirtieth, range(80), ordered=False))
        log = "\n".join(map(str, ex.decisions()))
    assert sorted(results) == list(range(80))
    # Its chunk comes last; within a chunk results keep their order, so the
    # items sent with it (31, 32, ... when chunks grew under load) follow it.
    tail = results[results.index(30) :]
    assert tail == list(range(30, 30 + len(tail))), (results, log)


@pytest.mark.timeout(60)
def test_the_first_results_are_handed_out_while_the_slow_item_runs():
    arrivals = []
    with SmartExecutor(max_workers=2) as ex:
        for x in ex.map(slow_first, range(12), ordered=False):
            arrivals.append((x, time.monotonic()))
    first, slow = arrivals[0][1], dict(arrivals)[0]
    assert arrivals[0][0] != 0
    assert first < slow - SLOW_S / 2, arrivals  # generous: they are ~2 s apart


@pytest.mark.timeout(60)
def test_the_input_is_read_lazily_and_the_window_is_bounded():
    source = Counted()
    with SmartExecutor(max_workers=2, backend="thread") as ex:
        results = ex.map(square, source, chunksize=1, buffersize=3, ordered=False)
        taken = list(itertools.islice(results, 20))
        results.close()
    assert len(set(taken)) == 20 and all(round(t**0.5) ** 2 == t for t in taken)
    # 20 handed out, at most 3 chunks of one item in flight besides.
    assert 20 <= source.read <= 20 + 3 + 1, source.read


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["fork", "loky", "thread", "inline"])
def test_an_items_exception_is_raised_when_reached(backend, tmp_path):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        got = []
        marks = None if backend == "inline" else str(tmp_path)  # inline: 8 and 9 come after
        work = functools.partial(fail_at_seven, marks=marks)
        results = ex.map(work, range(10), chunksize=1, ordered=False)
        with pytest.raises(ValueError, match="bad item 7"):
            for x in results:
                got.append(x)
        assert len(got) == len(set(got)) and set(got) <= set(range(10)) - {7}
        if backend != "inline":  # every other item finished first
            assert sorted(got) == [0, 1, 2, 3, 4, 5, 6, 8, 9], got
        results.close()
        assert sorted(ex.map(square, range(5), ordered=False)) == [0, 1, 4, 9, 16]


@pytest.mark.timeout(60)
def test_a_dead_worker_fails_only_its_item_when_read_as_completed():
    # The chunk of items 4-7 dies with its worker: its items are re-sent one
    # per chunk, beside the chunk, and only item 7 fails.
    with SmartExecutor(max_workers=2, backend="fork") as ex:
        got = []
        with pytest.raises(WorkerCrashedError):
            for x in ex.map(crash_at_seven, range(8), chunksize=4, ordered=False):
                got.append(x)
        assert sorted(got) == [0, 1, 2, 3, 4, 5, 6], got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["fork", "thread"])
def test_closing_early_stops_the_map_and_leaves_nothing_behind(backend):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        results = ex.map(sleep_for, [0.0] + [0.3] * 30, chunksize=1, ordered=False)
        assert next(results) == 0.0
        results.close()
        with pytest.raises(StopIteration):
            next(results)
        assert sorted(ex.map(square, range(4), ordered=False)) == [0, 1, 4, 9]
    # the autouse no_leaks fixture checks that no worker process outlived the executor


@pytest.mark.timeout(60)
def test_timeout_is_honoured_per_wait():
    with SmartExecutor(max_workers=2, backend="thread") as ex:
        got = []
        with pytest.raises(concurrent.futures.TimeoutError):
            for x in ex.map(sleep_for, [3.0, 0.0, 0.0], chunksize=1, timeout=1.0, ordered=False):
                got.append(x)
        assert got == [0.0, 0.0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("backend", ["thread", "fork"])
def test_results_are_not_kept_alive_once_handed_out(ordered, backend):
    # As CPython's test_free_reference asks of map (the ordered reader's chunk
    # slot held its outcomes while the result was out: CPython's test caught it).
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        for obj in ex.map(make_dummy, range(10), chunksize=2, ordered=ordered):
            ref = weakref.ref(obj)
            del obj
            gc.collect()
            assert ref() is None


def _after_two_chunks(self):
    """Evidence.ready after two chunks of one item each, a worker's first call (a warm-up) or not."""
    return len(self.per_item) + len(self.lone_firsts) + len(self.warm_ups) >= 2


def _force_a_move(monkeypatch, target):
    """Make the next routed map move to ``target`` after its first two chunks."""
    monkeypatch.setattr(routed_map.Evidence, "ready", _after_two_chunks)

    def forced(evidence, **kwargs):
        return Reroute(target, {}, f"moved to {target} by the test")

    monkeypatch.setattr(routed_map, "reroute", forced)


def _keep_what_was_sent(monkeypatch):
    """The old backend keeps every chunk sent to it (none is taken back at the move)."""
    monkeypatch.setattr(ChunkStream, "take_back", lambda self: [])


def held_on_fork(x, parent, marks):
    """Returns ``(x, pid)``; in a worker, items 2 and on wait (up to 30 s) for an item run in ``parent``."""
    if os.getpid() == parent:
        open(marks, "a").close()
    elif x >= 2:
        deadline = time.monotonic() + 30
        while not os.path.exists(marks) and time.monotonic() < deadline:
            time.sleep(0.005)
    return x, os.getpid()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_move_takes_back_the_chunks_no_worker_started(monkeypatch, tmp_path, ordered):
    # The map's first window sends items 0 to 6 to two fork workers, one a
    # chunk; it moves to threads after items 0 and 1. A worker holds any
    # item from 2 on until an item has run here, so at the move at most two
    # of items 2-6 have started: the others go with the rest of the input,
    # in order, and run here rather than behind them on fork.
    _force_a_move(monkeypatch, "thread")
    gil.forget(held_on_fork)  # the other parameter's move would start it on threads
    parent, marks = os.getpid(), str(tmp_path / "mark")
    with SmartExecutor(max_workers=2) as ex:
        assert ex.explain(held_on_fork).backend == "fork"
        calls = zip(range(30), itertools.repeat(parent), itertools.repeat(marks))
        results = list(ex.map(held_on_fork, *zip(*calls), ordered=ordered))
        log = "\n".join(map(str, ex.decisions()))
        assert "moved to thread by the test" in log, log
    assert sorted(x for x, _ in results) == list(range(30))
    if ordered:
        assert [x for x, _ in results] == list(range(30))
    pids = dict(results)
    assert pids[0] != parent and pids[1] != parent
    assert sum(pids[x] == parent for x in range(2, 7)) >= 3, pids


def slow_in_workers_from_two(x, parent):
    """``x * x``; in a worker, items 2 and on take 0.3 s (queued behind them at a move: taken back)."""
    if os.getpid() != parent and x >= 2:
        time.sleep(0.3)
    return x * x


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_move_that_fails_reads_on_with_what_it_took_back(monkeypatch, ordered):
    # The new stream cannot open (the executor shut down meanwhile, say):
    # the map stays, and the items taken back are read again, first.
    _force_a_move(monkeypatch, "thread")
    gil.forget(slow_in_workers_from_two)
    opened, taken = [], []
    real_open, real_take_back = routed_map.open_stream, ChunkStream.take_back

    def open_once(*args, **kwargs):
        opened.append(1)
        if len(opened) > 1:
            raise RuntimeError("cannot open")
        return real_open(*args, **kwargs)

    def recorded(self):
        back = real_take_back(self)
        taken.extend(back)
        return back

    monkeypatch.setattr(routed_map, "open_stream", open_once)
    monkeypatch.setattr(ChunkStream, "take_back", recorded)
    parent = os.getpid()
    with SmartExecutor(max_workers=2) as ex:
        assert ex.explain(slow_in_workers_from_two).backend == "fork"
        got = list(ex.map(slow_in_workers_from_two, range(12), [parent] * 12, ordered=ordered))
        log = "\n".join(map(str, ex.decisions()))
    assert "the move failed: cannot open" in log, log
    assert taken, "nothing was queued on fork at the move"
    assert sorted(got) == [x * x for x in range(12)]
    if ordered:
        assert got == [x * x for x in range(12)]


def failing_at_ten(n):
    for i in range(n):
        if i == 10:
            raise KeyError("the input broke")
        yield i


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("target", ["thread", "inline"])
def test_a_move_after_the_input_failed_keeps_every_result_before_the_error(
    monkeypatch, target, ordered
):
    # Found by a breaker: the chunks taken back went behind the input's
    # error, kept by the stream they left, and were never read.
    _force_a_move(monkeypatch, target)
    gil.forget(square)
    got = []
    with SmartExecutor(max_workers=2) as ex:
        assert ex.explain(square).backend == "fork"
        with pytest.raises(KeyError, match="the input broke"):
            for value in ex.map(square, failing_at_ten(30), ordered=ordered):
                got.append(value)
    assert sorted(got) == [x * x for x in range(10)]
    if ordered:
        assert got == [x * x for x in range(10)]


@pytest.mark.timeout(120)
def test_a_map_that_moves_to_threads_yields_every_item_once(monkeypatch):
    _force_a_move(monkeypatch, "thread")
    _keep_what_was_sent(monkeypatch)
    with SmartExecutor(max_workers=2) as ex:
        results = list(ex.map(slow_window, range(60), ordered=False))
        log = "\n".join(map(str, ex.decisions()))
        assert "moved to thread by the test" in log, log
    assert sorted(results) == list(range(60))
    # Items 2-5 were sent to fork before the move and sleep there: the
    # threads' results came out while they ran, not after them.
    first_slow = min(results.index(x) for x in (2, 3, 4, 5))
    assert first_slow > 20, results


@pytest.mark.timeout(120)
def test_a_map_that_moves_to_a_loop_yields_every_item_once(monkeypatch):
    _force_a_move(monkeypatch, "inline")
    _keep_what_was_sent(monkeypatch)
    with SmartExecutor(max_workers=2) as ex:
        results = list(ex.map(slow_window, range(60), ordered=False))
        log = "\n".join(map(str, ex.decisions()))
        assert "moved to inline by the test" in log, log
    assert sorted(results) == list(range(60))
    first_slow = min(results.index(x) for x in (2, 3, 4, 5))
    assert first_slow > 10, results


@pytest.mark.timeout(120)
def test_an_items_exception_in_the_loop_after_a_move_is_raised_when_reached(monkeypatch):
    # Item 40 runs in this thread while items 2-5 still sleep on fork workers.
    _force_a_move(monkeypatch, "inline")
    with SmartExecutor(max_workers=2) as ex:
        got = []
        with pytest.raises(ValueError, match="bad item 40"):
            for x in ex.map(slow_window_fail_at_40, range(60), ordered=False):
                got.append(x)
        log = "\n".join(map(str, ex.decisions()))
        assert "moved to inline by the test" in log, log
    assert len(got) == len(set(got)) and 40 not in got
    # Missing: only items sent to fork before the move (2-5 and the next chunk).
    missing = set(range(6, 40)) - set(got)
    assert not missing or missing == set(range(6, max(missing) + 1)), got
    assert len(got) >= 20, got


class Bars:
    """A progress factory that keeps every bar it makes."""

    def __init__(self):
        self.made = []

    def __call__(self, **kwargs):
        bar = tqdm(file=io.StringIO(), **kwargs)
        self.made.append(bar)
        return bar


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", [None, "thread", "inline"])
def test_a_progress_bar_counts_every_item(backend):
    bars = Bars()
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        results = list(ex.map(square, range(50), progress=bars, ordered=False))
    assert sorted(results) == [x * x for x in range(50)]
    (bar,) = bars.made
    assert bar.n == 50 and bar.total == 50


@pytest.mark.timeout(60)
def test_parallel_map_takes_ordered():
    bars = Bars()
    as_completed = parallel_map(max_workers=2, progress=bars, ordered=False)(slow_first)
    results = as_completed(range(8))
    assert sorted(results) == list(range(8)) and results[-1] == 0, results
    assert bars.made[0].n == 8
    assert parallel_map(max_workers=2)(square)(range(5)) == [0, 1, 4, 9, 16]


def test_ordered_must_be_a_bool():
    with SmartExecutor(max_workers=1, backend="thread") as ex:
        with pytest.raises(TypeError, match="ordered must be True"):
            ex.map(square, range(3), ordered="no")
    with pytest.raises(TypeError, match="ordered must be True or False"):
        parallel_map(ordered=1)


@pytest.mark.timeout(10)
def test_a_chunk_cancelled_without_telling_its_waiters_does_not_hang_the_reader():
    # Future.cancel() on a pending future wakes result() but not
    # concurrent.futures.wait(): the reader must look again by itself.
    sent: list[Future] = []

    def send(calls, budget_s):
        sent.append(Future())
        return sent[-1]

    stream = ChunkStream(
        send=send,
        calls=iter([((1,), {}), ((2,), {})]),
        remaining=2,
        n_workers=1,
        overhead_s=0.0,
        estimate=None,
        fixed_chunksize=1,
        buffersize=2,
        end_time=None,
        on_chunk_error=lambda exc, calls: exc,
    )
    timer = threading.Timer(0.2, sent[0].cancel)
    timer.start()
    values = stream_values([], stream, ordered=False)
    try:
        with pytest.raises(CancelledError):
            next(values)
    finally:
        timer.join()
    assert sent[1].cancelled()  # the rest of the map was cancelled too
