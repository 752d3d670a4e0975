"""SmartExecutor as a concurrent.futures.Executor: routing, explain, bad input."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import pickle
import threading
import time
from typing import Any

import numpy as np
import pytest

from smartexec import (
    BackendUnavailableError,
    PayloadPicklingError,
    SmartExecutor,
    UnknownBackendError,
)

pytestmark = pytest.mark.timeout(60)


def square(x):
    return x * x


class BigIndex:
    def __init__(self, nbytes):
        self.values = np.arange(nbytes // 8, dtype=np.int64)

    def query(self, i):
        return int(self.values[i])


def test_is_an_executor():
    assert issubclass(SmartExecutor, cf.Executor)


@pytest.mark.parametrize("bad", [0, -1])
def test_max_workers_must_be_positive(bad):
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        SmartExecutor(bad)


def test_max_workers_must_be_an_int():
    with pytest.raises(TypeError, match="max_workers must be an int"):
        SmartExecutor("2")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["max_workers", "max_threads", "max_processes"])
def test_a_width_may_be_any_integer_type_as_the_stdlib_pools_take_it(name):
    # numpy's ints (a width read from an array, a config) have __index__.
    with SmartExecutor(**{name: np.int64(2)}) as ex:
        assert type(getattr(ex._widths, name)) is int
        assert list(ex.map(abs, [-1, -2], chunksize=np.int64(1))) == [1, 2]
    with pytest.raises(TypeError, match=f"{name} must be an int"):
        SmartExecutor(**{name: True})  # the stdlib takes True as 1: a slip, refused


@pytest.mark.parametrize("name", ["max_threads", "max_processes"])
def test_a_kinds_own_limit_is_checked_as_max_workers_is(name):
    with pytest.raises(ValueError, match=f"{name} must be greater than 0"):
        SmartExecutor(**{name: 0})
    with pytest.raises(TypeError, match=f"{name} must be an int"):
        SmartExecutor(**{name: 2.5})


@pytest.mark.parametrize(
    ("arguments", "threads", "processes"),
    [
        ({}, None, None),  # the defaults: threads grow, one process per CPU
        ({"max_workers": 3}, 3, 3),  # the stdlib meaning: every pool
        ({"max_processes": 1}, None, 1),  # processes capped, threads still grow
        ({"max_threads": 64}, 64, None),
        ({"max_workers": 3, "max_threads": 16}, 16, 3),
        ({"max_workers": 3, "max_processes": 1}, 3, 1),
    ],
)
def test_threads_and_processes_each_take_their_own_limit(arguments, threads, processes):
    with SmartExecutor(**arguments) as ex:
        thread, fork, loky = (ex._backend(name) for name in ("thread", "fork", "loky"))
        cpus = ex._platform.cpu_count
        assert fork.max_workers == loky.max_workers == (processes or cpus)
        if threads is None:
            assert thread._widener is not None  # grows for waiting work
        else:
            assert thread.max_workers == threads and thread._widener is None


def test_prefer_is_checked():
    with pytest.raises(ValueError, match="prefer must be one of 'threads', 'processes'"):
        SmartExecutor(prefer="gpu")  # type: ignore[arg-type]


def test_unknown_backend_lists_the_known_ones_and_a_close_match():
    with pytest.raises(UnknownBackendError) as info:
        SmartExecutor(backend="threads")
    assert "did you mean 'thread'?" in str(info.value)
    assert {"fork", "inline", "loky", "thread"} <= set(info.value.known)
    assert isinstance(info.value, ValueError)


def test_chunksize_must_be_positive():
    with SmartExecutor(backend="inline") as ex:
        with pytest.raises(ValueError, match="chunksize must be >= 1"):
            ex.map(square, [1], chunksize=0)


def test_explain_routes_as_issue_2_asks():
    index = BigIndex(100_000_000)
    with SmartExecutor() as ex:
        assert ex.explain(index.query).backend == "fork"
        assert ex.explain(index.query).share
        assert ex.explain(lambda x: x).backend == "fork"  # by value (cloudpickle)
        offset = 1
        assert ex.explain(lambda x: x + offset).backend == "fork"  # by value (cloudpickle)
        assert ex.explain(time.sleep).backend == "thread"
        assert ex.explain(square).backend == "fork"


def test_explain_runs_nothing_and_reports_argument_size():
    calls = []

    def record(x):
        calls.append(x)

    with SmartExecutor() as ex:
        decision = ex.explain(record, np.zeros(1 << 17))
        assert calls == []
        assert "arguments pickle to 1.0 MiB" in str(decision)
        assert ex._backends == {}  # nothing started


def test_decision_str_is_readable():
    with SmartExecutor() as ex:
        text = str(ex.explain(time.sleep))
    assert text.startswith("sleep -> thread")
    assert "GIL" in text


def test_decisions_are_logged_once_per_callable():
    with SmartExecutor(backend="inline") as ex:
        for _ in range(3):
            ex.submit(square, 2).result()
        list(ex.map(abs, [-1]))
    assert [d.profile.name for d in ex.decisions()] == ["square", "abs"]


def test_every_route_equals_a_serial_loop():
    index = BigIndex(8 << 20)
    offset = 3
    cases = [
        (square, range(30)),  # fork
        (index.query, range(30)),  # fork + trampoline
        (lambda x: x + offset, range(30)),  # fork, by value
        (abs, range(-15, 15)),  # fork (builtin)
        (np.negative, [np.arange(3)] * 4),  # thread (ufunc)
    ]
    with SmartExecutor(2) as ex:
        for fn, items in cases:
            items = list(items)
            got = list(ex.map(fn, items))
            expected = [fn(i) for i in items]
            assert all(np.array_equal(a, b) for a, b in zip(got, expected)), ex.explain(fn)
        backends = {d.backend for d in ex.decisions()}
    assert {"fork", "thread"} <= backends


def test_unpicklable_closure_without_fork_gets_a_clear_error():
    lock = threading.Lock()

    def uses_lock(x):
        return lock.locked() or x

    with SmartExecutor(2, backend="loky") as ex:
        with pytest.raises(PayloadPicklingError) as info:
            ex.submit(uses_lock, 1).result(timeout=30)
    message = str(info.value)
    assert "uses_lock" in message and "cell 'lock'" in message
    assert 'backend="thread"' in message


def test_unpicklable_closure_with_fork_is_shared_not_pickled():
    lock = threading.Lock()

    def uses_lock(x):
        return (lock.locked(), x)

    with SmartExecutor(2) as ex:
        assert ex.explain(uses_lock).backend == "fork"
        assert list(ex.map(uses_lock, range(4))) == [(False, i) for i in range(4)]


def test_unpicklable_argument_in_map_raises_at_its_position():
    # As the stdlib's map: the items before it give their results first.
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(square, [1, 2, threading.Lock(), 4], chunksize=1)
        assert next(results) == 1 and next(results) == 4
        with pytest.raises(PayloadPicklingError, match="argument 1 ") as info:
            next(results)
        assert ex.submit(square, 5).result(timeout=30) == 25
    # Explained once: its cause is pickle's own error, not the same explanation again.
    assert not isinstance(info.value.__cause__, PayloadPicklingError), info.value.__cause__


@pytest.mark.parametrize("backend", [None, "fork", "loky"])
def test_unpicklable_argument_in_a_chunk_raises_at_its_own_item(backend):
    # A breaker's map: ProcessPoolExecutor gave items 0-4, then raised at item
    # 5; SmartExecutor's chunk of 40 raised before item 0.
    items = [*range(5), threading.Lock(), *range(6, 40)]
    with SmartExecutor(2, backend=backend) as ex:
        got = []
        with pytest.raises(PayloadPicklingError, match="argument 1 "):
            for value in ex.map(square, items, chunksize=40):
                got.append(value)
        assert got == [0, 1, 4, 9, 16]
        assert ex.submit(square, 5).result(timeout=30) == 25


def test_an_unpicklable_argument_late_in_a_big_chunk_resends_the_items_before_it_once():
    # Sent one item at a time, 100,000 items with a bad argument at 99,990
    # took 13-17 s (0.1-0.3 s without it): the items before it go as one chunk.
    items = [*range(1990), threading.Lock(), *range(1991, 2000)]
    with SmartExecutor(2, backend="fork") as ex:
        got = []
        with pytest.raises(PayloadPicklingError, match="argument 1 "):
            for value in ex.map(square, items, chunksize=2000):
                got.append(value)
        assert got == [i * i for i in range(1990)]
        assert ex.stats().backends["fork"].chunks == 2  # the failed chunk, then the 1990


def test_unpicklable_argument_after_shutdown_still_raises_the_pickling_error():
    # A breaker's map, shut down (wait=False) before it was read: the chunk
    # cannot be sent again one item at a time, and the error stays the
    # pickling error at the chunk's first item (a RuntimeError at first).
    items = [*range(20), threading.Lock(), *range(21, 60)]
    ex = SmartExecutor(2, backend="fork")
    results = ex.map(square, items, chunksize=7)
    ex.shutdown(wait=False)
    got = []
    with pytest.raises(PayloadPicklingError, match="argument 1 "):
        for value in results:
            got.append(value)
    assert got == [i * i for i in range(len(got))] and 14 <= len(got) <= 20


def test_cancel_a_pending_future():
    with SmartExecutor(1, backend="thread") as ex:
        blocker = ex.submit(time.sleep, 0.5)
        pending = ex.submit(square, 3)
        assert pending.cancel()
        assert pending.cancelled()
        done, _ = cf.wait([pending], timeout=5)
        assert pending in done
        blocker.result()
        assert not blocker.cancel()


def test_shutdown_cancel_futures_cancels_queued_work():
    ex = SmartExecutor(1, backend="fork")
    futures = [ex.submit(time.sleep, 0.2) for _ in range(10)]
    ex.shutdown(wait=True, cancel_futures=True)
    cancelled = [f for f in futures if f.cancelled()]
    assert len(cancelled) >= 7
    assert all(f.done() for f in futures)


def test_many_threads_submitting_at_once():
    with SmartExecutor(2) as ex:
        results = [[] for _ in range(8)]

        def client(k):
            results[k] = [ex.submit(square, k * 100 + i).result(timeout=30) for i in range(20)]

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert results == [[(k * 100 + i) ** 2 for i in range(20)] for k in range(8)]


def test_usable_from_asyncio_run_in_executor():
    async def main(ex):
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*(loop.run_in_executor(ex, square, i) for i in range(5)))

    with SmartExecutor(2) as ex:
        assert asyncio.run(main(ex)) == [0, 1, 4, 9, 16]


def test_backend_unavailable_is_an_import_error():
    assert issubclass(BackendUnavailableError, ImportError)


def test_repr_says_what_started():
    with SmartExecutor(backend="inline") as ex:
        ex.submit(square, 1)
        assert "inline" in repr(ex)


def test_submit_during_interpreter_exit_is_refused():
    from ._children import run_python

    result = run_python(
        """
        import atexit
        from smartexec import SmartExecutor
        ex = SmartExecutor(2)

        def late():
            try:
                ex.submit(abs, -1)
            except RuntimeError as exc:
                print(exc)

        atexit.register(late)
        """,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cannot schedule new futures after interpreter shutdown"


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"backend": 1}, TypeError),
        ({"big_state_bytes": "x"}, TypeError),
        ({"big_state_bytes": -1}, ValueError),
    ],
)
def test_constructor_arguments_are_checked(kwargs, error):
    with pytest.raises(error):
        SmartExecutor(**kwargs)


def test_backend_options_need_a_backend_that_takes_them():
    # With dask installed the message names its backend; else it says how to find one.
    with pytest.raises(
        TypeError,
        match=r'address=\. (address= is an option of backend="dask": pass that backend too'
        r"|Backend options need the backend that takes them, e\.g\. "
        r'SmartExecutor\(backend="NAME", address=\.\.\.\))',
    ):
        SmartExecutor(address="tcp://10.0.0.5:8786")
    with pytest.raises(TypeError, match=r"chunksize= is an argument of map\(\)"):
        SmartExecutor(chunksize=100)
    with pytest.raises(TypeError, match="did you mean initializer= for initialiser="):
        SmartExecutor(initialiser=print)
    with pytest.raises(TypeError, match="did you mean mp_context= for mp_ctx="):
        SmartExecutor(mp_ctx="fork")
    with pytest.raises(TypeError, match="did you mean prefer= for prefr="):
        SmartExecutor(prefr="threads")
    with pytest.raises(TypeError, match=r"backend 'thread' got unexpected option\(s\) address=: "):
        SmartExecutor(backend="thread", address="tcp://10.0.0.5:8786")


@pytest.mark.parametrize("kwargs", [{"chunksize": 2.5}, {"chunksize": True}, {"buffersize": "2"}])
def test_map_arguments_are_checked(kwargs):
    with SmartExecutor(backend="inline") as ex, pytest.raises(TypeError):
        ex.map(square, [1], **kwargs)


def test_input_that_raises_midway_keeps_the_results_before_it():
    def items():
        yield from range(95)
        raise KeyError("input broke")

    for backend in ("fork", "thread"):
        with SmartExecutor(2, backend=backend) as ex:
            got = []
            with pytest.raises(KeyError):
                for value in ex.map(square, items(), chunksize=5):
                    got.append(value)
        assert got == [square(i) for i in range(95)], backend


def test_a_length_too_big_for_an_index_streams():
    with SmartExecutor(2, backend="thread") as ex:
        results = ex.map(square, range(10**20))
        assert [next(results) for _ in range(5)] == [0, 1, 4, 9, 16]
        results.close()


def test_cancel_after_completion_never_reports_success():
    with SmartExecutor(2, backend="thread") as ex:
        futures = [ex.submit(square, i) for i in range(200)]
        cancelled = [f for f in futures if f.cancel()]
        done, not_done = cf.wait(futures, timeout=10)
        assert not not_done
        for f in futures:
            assert f.cancelled() == (f in cancelled)
            if not f.cancelled():
                assert f.result() == square(futures.index(f))


def test_decision_log_is_bounded():
    from smartexec.executor import DECISION_LOG_SIZE

    with SmartExecutor(backend="inline") as ex:
        for i in range(DECISION_LOG_SIZE + 50):
            ex.submit(lambda x=i: x)
        assert len(ex.decisions()) == DECISION_LOG_SIZE


# -- submit returns at once; pickling errors on the future ------------------------


class SlowToPickle:
    """Its ``__reduce__`` blocks until ``release`` is set (at most 10 s)."""

    def __init__(self):
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = False

    def __reduce__(self):
        self.started.set()
        self.release.wait(10)
        self.finished = True
        return (int, (7,))


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_submit_of_an_unpicklable_argument_returns_a_future_that_raises(backend):
    with SmartExecutor(2, backend=backend) as ex:
        futures = [ex.submit(square, threading.Lock()), ex.submit(square, 3)]  # no raise
        with pytest.raises(pickle.PicklingError, match="argument 1 "):
            futures[0].result(timeout=60)
        assert futures[1].result(timeout=60) == 9  # the others are not lost


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_submit_returns_before_a_slow_argument_is_pickled(backend):
    slow = SlowToPickle()
    with SmartExecutor(2, backend=backend) as ex:
        future = ex.submit(abs, slow)
        assert not slow.finished  # submit returned while __reduce__ still ran (or had not run)
        assert not future.done()
        slow.release.set()
        assert future.result(timeout=60) == 7


def test_map_timeout_holds_while_an_argument_is_pickled():
    slow = SlowToPickle()
    with SmartExecutor(2, backend="fork") as ex:
        results = ex.map(abs, [slow], timeout=0.5)
        assert not slow.finished  # map() returned while pickling ran
        with pytest.raises(cf.TimeoutError):
            next(results)
        assert not slow.finished  # and the timeout did not wait for the pickle
        slow.release.set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_shutdown_cancel_futures_cancels_calls_still_to_be_pickled(tmp_path, backend):
    from tests.scenarios import _failure_workloads as w

    gate = str(tmp_path / "gate")
    first, second = SlowToPickle(), SlowToPickle()
    ex = SmartExecutor(1, backend=backend)
    try:
        blocker = ex.submit(w.wait_for_file, gate)  # the only worker is busy
        pickling = ex.submit(abs, first)
        waiting = ex.submit(abs, second)  # behind the first in the sender
        assert first.started.wait(30)
        ex.shutdown(wait=False, cancel_futures=True)
        assert pickling.cancelled() and waiting.cancelled()
        first.release.set()
    finally:
        open(gate, "w").close()
        ex.shutdown(wait=True)
    assert blocker.result(timeout=60)
    assert not second.started.is_set()  # never pickled


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_shutdown_waits_for_a_call_still_being_pickled(backend):
    slow = SlowToPickle()
    ex = SmartExecutor(2, backend=backend)
    future = ex.submit(abs, slow)
    threading.Thread(target=lambda: (slow.started.wait(30), slow.release.set())).start()
    ex.shutdown(wait=True)
    assert future.done() and future.result() == 7


@pytest.mark.parametrize("backend", [None, "fork", "loky", "thread"])
def test_the_submit_future_class_builds_with_no_arguments(backend):
    with SmartExecutor(2, backend=backend) as ex:
        future = ex.submit(square, 3)
        assert future.result(timeout=60) == 9
    fresh = type(future)()
    assert isinstance(fresh, cf.Future)
    assert not fresh.done() and not fresh.running()
    assert fresh.cancel() and fresh.cancelled()
    other = type(future)()
    assert other.set_running_or_notify_cancel() and other.running()
    other.set_result(5)
    assert other.result() == 5


# -- cancellation until a worker takes the call ------------------------------------


def _lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


#: Seconds the cancellation tests leave a pool between submitting calls and
#: cancelling them: loky used to move calls into its call queue (marking them
#: running, no longer cancellable) within milliseconds.
SETTLE_S = 0.3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_call_waiting_for_a_worker_stays_cancellable(tmp_path, backend):
    from tests.scenarios import _failure_workloads as w

    gate, started, log = (str(tmp_path / name) for name in ("gate", "started", "log"))
    with SmartExecutor(2, backend=backend) as ex:
        blockers = [ex.submit(w.wait_for_file, gate, started) for _ in range(2)]
        while len(_lines(started)) < 2:  # both workers busy
            time.sleep(0.01)
        queued = [ex.submit(w.append_line, log, i) for i in range(12)]
        time.sleep(SETTLE_S)
        running = [f.running() for f in queued]
        cancelled = [f.cancel() for f in queued]
        open(gate, "w").close()
        cf.wait(blockers, timeout=60)
    assert running == [False] * 12
    assert cancelled == [True] * 12
    assert _lines(log) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", [None, "fork", "loky"])
def test_asyncio_calls_cancelled_before_they_start_never_run(tmp_path, backend):
    from tests.scenarios import _failure_workloads as w

    gate, started, log = (str(tmp_path / name) for name in ("gate", "started", "log"))

    async def main(ex):
        loop = asyncio.get_running_loop()
        blockers = [loop.run_in_executor(ex, w.wait_for_file, gate, started) for _ in range(2)]
        while len(_lines(started)) < 2:
            await asyncio.sleep(0.01)
        calls = [
            asyncio.ensure_future(loop.run_in_executor(ex, w.append_line, log, i))
            for i in range(12)
        ]
        await asyncio.sleep(SETTLE_S)
        for call in calls:
            call.cancel()  # asyncio cancels the executor's future in turn
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        # asyncio cancels each executor future in a callback of its own,
        # which may run after gather() has returned (seen on 3.13): the gate
        # opens, freeing the workers, only once every one has run.
        await asyncio.sleep(SETTLE_S)
        open(gate, "w").close()
        await asyncio.gather(*blockers)
        return outcomes

    with SmartExecutor(2, backend=backend) as ex:
        outcomes = asyncio.run(main(ex))
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
    assert _lines(log) == []


@pytest.mark.parametrize("backend", [None, "fork", "thread", "loky"])
def test_shutdown_with_wait_lets_go_of_its_threads_at_once(backend):
    # CPython's threading_cleanup() (after each of its concurrent.futures
    # tests) waits for the live Thread objects to come back to their count:
    # a stopped dispatcher kept by a pool <-> backend cycle went only when the
    # garbage collector ran, and each such test then took 5-20 s on 3.10.
    import gc
    import weakref

    gc.disable()
    try:
        ex = SmartExecutor(max_workers=3, backend=backend)
        assert list(ex.map(abs, range(-50, 0))) == list(range(50, 0, -1))
        assert ex.submit(abs, -3).result() == 3
        ours = [weakref.ref(t) for t in threading.enumerate() if t.name.startswith("smartexec")]
        ex.shutdown(wait=True)
        left = [t for t in (r() for r in ours) if t is not None]
        assert not left, left
    finally:
        gc.enable()


_NESTING: dict[str, Any] = {}


def _inner_wait(x):
    time.sleep(0.002)
    return x


def _outer_maps_on_the_same_executor(x):
    return sum(_NESTING["ex"].map(_inner_wait, range(4)))


def test_a_map_nested_in_a_call_on_the_executor_s_threads_runs_in_that_thread():
    # Both on the same two threads: each outer call would wait for inner
    # chunks queued behind the other outer calls (a deadlock); they run in
    # the calling pool thread instead, as nested work runs in a worker process.
    with SmartExecutor(2, prefer="threads") as ex:
        _NESTING["ex"] = ex
        try:
            results = list(ex.map(_outer_maps_on_the_same_executor, range(20), timeout=30))
        finally:
            _NESTING.clear()
        nested = [d for d in ex.decisions() if d.backend == "inline"]
    assert results == [6] * 20
    assert nested and "own threads" in nested[-1].reasons[-1]


def test_explain_is_a_dry_run_that_logs_no_decision():
    with SmartExecutor() as ex:
        first = ex.explain(square)
        assert list(ex.decisions()) == []
        assert list(ex.map(square, range(4))) == [0, 1, 4, 9]
        logged = ex.decisions()
        assert logged and first.backend in ("fork", "inline", "thread")
        ex.explain(square)
        assert ex.decisions() == logged


def test_explain_says_a_map_over_small_numbers_starts_in_a_loop():
    # What map does with arithmetic-only code over small numbers (a loop here,
    # its first items timed), explain() says too, though it has no items.
    def square(x):
        return x * x

    with SmartExecutor(2) as ex:
        decision = ex.explain(square)
        assert decision.backend in ("fork", "loky")
        assert any("starts in a loop in this thread" in r for r in decision.reasons), decision
        assert list(ex.map(square, range(1000))) == [x * x for x in range(1000)]
        assert ex.decisions()[-1].backend == "inline"


def test_an_inline_call_that_waits_for_another_threads_submit_does_not_hang():
    # Found by a lock-order pass: backend="inline" ran a submitted call under
    # the executor's lock, so a call waiting for another thread's submit to
    # the same executor waited forever. It runs once the lock is released,
    # still in the submitting thread, before submit() returns.
    with SmartExecutor(backend="inline") as ex:

        def inner(x):
            return x + 1

        def outer(x):
            found = {}
            helper = threading.Thread(
                target=lambda: found.setdefault("v", ex.submit(inner, x).result(timeout=10))
            )
            helper.start()
            helper.join(10)
            return found.get("v", "hung"), threading.current_thread() is main

        main = threading.current_thread()
        future = ex.submit(outer, 1)
        assert future.done()  # it ran before submit returned
        assert future.result() == (2, True)
        with pytest.raises(ZeroDivisionError):
            ex.submit(lambda: 1 / 0).result()
