"""A map's items all run, as the stdlib's do, when the executor shuts down before they are read.

The stdlib's ``map`` submits every item when called: a map never iterated
(fire and forget), or read after the ``with`` block, still runs every item.
smartexec reads the input lazily; ``shutdown(wait=True)`` sends what is left
of each such map over an input of known length first. An input of unknown
length, a ``buffersize``, ``cancel_futures=True`` or a closed map keep the
lazy behaviour: nothing more is sent, and nothing hangs.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import threading
import time

import pytest

from smartexec import SmartExecutor

from .backends.test_conformance import die_on_three

pytestmark = pytest.mark.timeout(90)

BACKENDS = [None, "fork", "thread", "loky"]


def square(x):
    return x * x


def touch(folder, i):
    time.sleep(0.001)
    open(os.path.join(folder, str(i)), "w").close()
    return i


def touched(folder):
    return sorted(int(name) for name in os.listdir(folder))


def bad_input(n):
    yield from range(n)
    raise ValueError("the input broke")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_map_never_iterated_runs_every_item(backend, tmp_path):
    with SmartExecutor(2, backend=backend) as ex:
        ex.map(touch, [str(tmp_path)] * 200, range(200))  # dropped at once, never started
    assert touched(tmp_path) == list(range(200))


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_read_after_the_with_block(backend):
    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(square, range(3000))
        half = ex.map(square, range(3000))
        assert [next(half) for _ in range(10)] == [x * x for x in range(10)]
    assert list(results) == [x * x for x in range(3000)]
    assert list(half) == [x * x for x in range(10, 3000)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_read_after_a_shutdown_that_does_not_wait(backend):
    # The stdlib's map submitted every item: shutdown(wait=False) lets them
    # run. Here 6 of 100 ran, and reading raised "cannot schedule new futures".
    ex = SmartExecutor(2, backend=backend)
    results = ex.map(square, range(100))
    started = ex.map(square, range(3000))
    assert next(started) == 0
    ex.shutdown(wait=False)
    assert list(results) == [x * x for x in range(100)]
    assert list(started) == [x * x for x in range(1, 3000)]
    ex.shutdown(wait=True)


def test_a_map_dropped_before_a_shutdown_that_does_not_wait_runs_every_item(tmp_path):
    from ._children import run_python

    result = run_python(
        f"""
        from smartexec import SmartExecutor
        from tests.test_map_shutdown import touch
        ex = SmartExecutor(2)
        ex.map(touch, [{str(tmp_path)!r}] * 200, range(200))
        ex.shutdown(wait=False)
        print("returned")
        """,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "returned"
    assert touched(tmp_path) == list(range(200))  # the exit waited for them


def test_a_generator_input_is_not_finished_at_shutdown_and_says_so():
    # Its length is unknown, so it is not read to its end at shutdown (as
    # 3.14's map with a buffersize): the shutdown warns that its unread
    # items will not run (found by a new user: 6 of 2,000 files written),
    # and reading on after it says why it cannot go on.
    with pytest.warns(RuntimeWarning, match="map of square over an input of unknown length"):
        with SmartExecutor(2, backend="fork") as ex:
            results = ex.map(square, (x for x in range(5000)))
            sized = ex.map(square, range(400))
            read = ex.map(square, (x for x in range(50)))
            assert list(read) == [x * x for x in range(50)]  # read to its end: no warning
    assert list(sized) == [x * x for x in range(400)]
    with pytest.raises(RuntimeError, match="after shutdown.*Read a map's results before"):
        list(results)


def test_a_lazy_map_meant_so_is_not_warned_of(recwarn):
    with SmartExecutor(2, backend="fork") as ex:
        bounded = ex.map(square, (x for x in range(5000)), buffersize=2)
        assert next(bounded) == 0
    assert not [w for w in recwarn if "unknown length" in str(w.message)]


class Sized:
    """A sized input whose reading fails part-way (its __len__ promised more)."""

    def __len__(self):
        return 500

    def __iter__(self):
        return bad_input(300)


def test_a_sized_input_that_fails_at_shutdown_raises_at_its_place():
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(square, Sized())
    got = []
    with pytest.raises(ValueError, match="the input broke"):
        for value in results:
            got.append(value)
    assert got == [x * x for x in range(300)]


@pytest.mark.parametrize("backend", ["fork", "thread"])
def test_endless_or_bounded_maps_are_not_read_to_their_end(backend, tmp_path):
    # An endless input is never read to its end (the stdlib's map would not
    # return at all); a buffersize bounds what runs, as 3.14's does.
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="unknown length"):  # its unread items will not run
        with SmartExecutor(2, backend=backend) as ex:
            endless = ex.map(square, itertools.count())
            assert next(endless) == 0
            bounded = ex.map(touch, [str(tmp_path)] * 500, range(500), buffersize=2, chunksize=1)
            assert next(bounded) == 0
    assert time.monotonic() - start < 30
    assert len(touched(tmp_path)) <= 4
    with pytest.raises(RuntimeError, match="after shutdown"):
        list(bounded)


def test_cancel_futures_or_a_closed_map_runs_no_more(tmp_path):
    closed, cancelled = tmp_path / "closed", tmp_path / "cancelled"
    closed.mkdir()
    cancelled.mkdir()
    with SmartExecutor(2, backend="fork") as ex:
        gen = ex.map(touch, [str(closed)] * 500, range(500), chunksize=1)
        next(gen)
        gen.close()  # the stdlib cancels a closed map's futures not started
    assert len(touched(closed)) < 500
    ex = SmartExecutor(2, backend="fork")
    kept = ex.map(touch, [str(cancelled)] * 500, range(500), chunksize=1)
    ex.shutdown(wait=True, cancel_futures=True)
    assert len(touched(cancelled)) < 500
    del kept


def test_a_finished_map_is_not_held_by_the_executor():
    import gc
    import weakref

    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(square, range(100))
        assert list(results) == [x * x for x in range(100)]
        assert not ex._open_maps
        gen = ex.map(square, range(100))
        next(gen)
        probe = weakref.ref(gen)
        del gen
        gc.collect()
        assert probe() is None and not ex._open_maps  # closed by its collection


def spin_then_touch(folder, i, seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:  # holds the GIL: the map stays on processes
        pass
    open(os.path.join(folder, str(i)), "w").close()
    return i


@pytest.mark.parametrize(("backend", "ordered"), [("fork", True), ("loky", True), ("fork", False)])
def test_the_rest_of_a_chunk_stopped_at_its_budget_runs_at_shutdown(backend, ordered, tmp_path):
    # Measured at 1 ms an item, the next map's items take 50 ms: workers stop
    # their chunks at the budget, and the rest was re-sent only as the map
    # was read (26 of 100 items ran; reading afterwards raised RuntimeError).
    warm, folder = str(tmp_path / "warm"), str(tmp_path / "slow")
    os.mkdir(warm)
    os.mkdir(folder)
    with SmartExecutor(2, backend=backend) as ex:
        list(ex.map(spin_then_touch, [warm] * 200, range(200), [0.001] * 200))
        results = ex.map(spin_then_touch, [folder] * 60, range(60), [0.03] * 60, ordered=ordered)
    assert touched(folder) == list(range(60))
    assert sorted(results) == list(range(60))


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_worker_death_in_a_map_read_after_shutdown_fails_its_item_only(backend):
    from smartexec.errors import WorkerCrashedError

    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(die_on_three, range(20), chunksize=5)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(WorkerCrashedError):
        next(results)


def test_a_map_read_in_another_thread_during_shutdown_loses_and_repeats_nothing():
    import threading

    got = []
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(square, range(20000), chunksize=50)
        reader = threading.Thread(target=lambda: got.extend(results))
        reader.start()
    reader.join(60)
    assert got == [x * x for x in range(20000)]


def test_shutdown_called_by_an_item_on_the_executor_s_threads_does_not_wait_for_itself():
    # It hung: shutdown waited for the map's chunks, this call's own among them.
    # A ThreadPoolExecutor's own worker calling shutdown(wait=True) raises
    # "cannot join current thread"; ours waits for the other threads only,
    # as a done-callback's shutdown does on the process routes: the same
    # code behaves the same on whichever route smartexec picked.
    ex = SmartExecutor(2, backend="thread")

    def stop_at_five(x):
        if x == 5:
            ex.shutdown(wait=True)
        time.sleep(0.01)
        return x

    assert list(ex.map(stop_at_five, range(40), chunksize=1)) == list(range(40))
    ex.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(stop_at_five, 1)


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_shutdown_from_a_done_callback_does_not_wait_for_its_own_thread(backend):
    # The callback runs on the thread that completes the chunks' futures (the
    # fork dispatcher, loky's manager thread): waiting there for a map's
    # chunks hung for good.
    ex = SmartExecutor(2, backend=backend)
    results = ex.map(square, range(200), chunksize=1)
    outcome = []

    def stop(_):
        try:
            ex.shutdown(wait=True)
            outcome.append("returned")
        except Exception as exc:  # reported by the assert below
            outcome.append(exc)

    ex.submit(square, 3).add_done_callback(stop)
    assert list(results) == [x * x for x in range(200)]
    ex.shutdown()
    assert outcome == ["returned"]


def test_two_calls_on_the_executors_threads_that_shut_it_down_do_not_wait_for_each_other():
    # Each waited for the other's pool thread: the process never exited.
    ex = SmartExecutor(2, backend="thread")
    both = threading.Barrier(2)

    def stop(x):
        both.wait(10)
        ex.shutdown(wait=True)
        return x

    futures = [ex.submit(stop, i) for i in range(2)]
    assert [f.result(timeout=20) for f in futures] == [0, 1]
    ex.shutdown(wait=True)


@pytest.mark.timeout(60)
def test_a_failure_in_routing_advice_loses_no_result(monkeypatch, caplog):
    # Issue 33: the router runs after a chunk's outcomes are kept, isolated:
    # advice that raises is logged, and the map goes on where it is.
    def broken(*args, **kwargs):
        raise RuntimeError("advice broke")

    from smartexec._routed_map import RoutedMap

    monkeypatch.setattr(RoutedMap, "settle", broken)
    with SmartExecutor(max_workers=2) as ex, caplog.at_level("WARNING", logger="smartexec"):
        assert list(ex.map(_square_slowly, range(40))) == [x * x for x in range(40)]
    assert any("routing advice failed" in r.message for r in caplog.records)


def _square_slowly(x):
    import time

    time.sleep(0.002)
    return x * x


@pytest.mark.parametrize("backend", ["thread", "fork", None])
def test_an_input_that_waits_for_a_thread_submitting_here_does_not_hang(backend):
    # Found by a lock-order pass: a map read its first window from the
    # input while holding the executor's lock, so a generator waiting for
    # another thread's submit to this executor waited forever (the stdlib's
    # submit holds no lock while its map reads the input).
    import queue

    ready = threading.Event()
    items: queue.Queue = queue.Queue()
    with SmartExecutor(2, backend=backend) as ex:

        def producer():
            ready.wait(10)
            for i in range(3):
                items.put(ex.submit(abs, -i).result(timeout=20))
            items.put(None)

        def generated():
            ready.set()
            while (item := items.get(timeout=20)) is not None:
                yield item

        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        assert list(ex.map(abs, generated())) == [0, 1, 2]
        thread.join(20)


@pytest.mark.parametrize("backend", ["thread", "fork", None])
def test_shutdown_does_not_wait_for_a_map_still_reading_its_first_input(backend):
    # Found by an adversarial pass: shutdown(wait=True) waited for a map
    # whose input generator was still producing its first item, which could
    # be waiting for the thread shutting down. As the stdlib's, shutdown
    # returns, and that map raises RuntimeError once it sends.
    release = threading.Event()
    shut = threading.Event()
    outcome = {}

    def generated():
        release.wait(30)
        yield from range(10)

    ex = SmartExecutor(2, backend=backend)

    def mapper():
        try:
            outcome["results"] = list(ex.map(square, generated()))
        except RuntimeError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=mapper, daemon=True)
    thread.start()
    time.sleep(0.2)  # the map is reading its first item
    closer = threading.Thread(target=lambda: (ex.shutdown(wait=True), shut.set()), daemon=True)
    closer.start()
    assert shut.wait(20), "shutdown(wait=True) waited for the map's input"
    release.set()
    thread.join(20)
    assert "shutdown" in str(outcome.get("error")), outcome


def _a_read_map_of_a_dropped_executor():
    ex = SmartExecutor(2, backend="fork")
    results = ex.map(square, (x for x in range(5000)))
    assert next(results) == 0
    return results


def test_a_map_whose_executor_was_collected_says_so():
    # A second helper's: the message spoke of a shutdown the user never called.
    results = _a_read_map_of_a_dropped_executor()
    gc.collect()
    with pytest.raises(RuntimeError, match="its executor was garbage-collected"):
        list(results)


def test_the_shutdown_warning_points_at_the_users_line_through_an_exit_stack():
    with pytest.warns(RuntimeWarning, match="unknown length") as caught:
        with contextlib.ExitStack() as stack:
            ex = stack.enter_context(SmartExecutor(2, backend="fork"))
            ex.map(square, (x for x in range(5000)))
    assert [w.filename for w in caught] == [__file__]
