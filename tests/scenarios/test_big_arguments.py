"""Issue 5: big numpy arguments and results travel through shared memory, not pipes.

What a worker may do with an array it received is what it could do with a
pickled copy: it is writable when the caller's was, and its writes are its
own (copy-on-write), never seen by the caller or another task.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from smartexec import SmartExecutor, _shm

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
BACKENDS = ["fork", "loky"]


def total(a):
    return float(a.sum())


def doubled(a):
    return a * 2


def bump_then_total(a):
    a += 1  # an in-place update of the argument
    return float(a.sum())


def is_writable(a):
    return bool(a.flags.writeable)


def ours() -> set[str]:
    return set(_shm.live())


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_arguments_cross_as_names_and_results_come_back(backend, sent):
    arrays = [np.full(2 * MiB // 8, i, dtype=np.float64) for i in range(6)]
    with SmartExecutor(2, backend=backend) as ex:
        assert list(ex.map(total, arrays, chunksize=2)) == [float(a.sum()) for a in arrays]
        assert sent and max(sent) < 16 * 1024  # names and shapes, not 4 MiB of data
        back = list(ex.map(doubled, arrays, chunksize=1))
    for a, b in zip(arrays, back):
        assert np.array_equal(b, a * 2) and b.flags.writeable
    assert ours() == set()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_that_writes_to_its_argument_changes_only_its_copy(backend):
    a = np.zeros(2 * MiB // 8)
    with SmartExecutor(2, backend=backend) as ex:
        # the same array three times: each task starts from zeros
        assert list(ex.map(bump_then_total, [a, a, a], chunksize=1)) == [a.size] * 3
        assert ex.submit(bump_then_total, a).result(timeout=60) == a.size
        assert ex.submit(is_writable, a).result(timeout=60) is True
    assert a.max() == 0  # the caller's array is untouched


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_only_argument_stays_read_only(backend):
    a = np.zeros(2 * MiB // 8)
    a.flags.writeable = False
    with SmartExecutor(2, backend=backend) as ex:
        assert ex.submit(is_writable, a).result(timeout=60) is False
        error = ex.submit(bump_then_total, a).exception(timeout=60)
    assert isinstance(error, ValueError) and "read-only" in str(error)


def test_the_same_array_in_many_tasks_is_copied_once(sent):
    a = np.ones(4 * MiB // 8)
    with SmartExecutor(2, backend="loky") as ex:
        assert list(ex.map(total, [a] * 20, chunksize=2)) == [float(a.size)] * 20
        # one cached copy in shared memory while the array lives
        assert len(ex._backends["loky"]._cache) == 1
    assert ours() == set()


def test_peak_shared_memory_is_bounded_by_the_window():
    """64 distinct 16 MiB arguments: only the chunks in flight are in /dev/shm."""
    size = 16 * MiB
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            used = sum(_shm.live().values())
            peak[0] = max(peak[0], used)
            stop.wait(0.005)

    def arrays():
        for i in range(64):
            yield np.full(size // 8, i, dtype=np.float64)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with SmartExecutor(2, backend="fork") as ex:
            results = list(ex.map(total, arrays(), chunksize=1, buffersize=4))
    finally:
        stop.set()
        sampler.join()
    assert results == [float(i * size // 8) for i in range(64)]
    # 4 chunks in flight, one more sent before each wait (Python 3.14's
    # buffersize), 1 being sent
    assert 0 < peak[0] <= 6 * size, peak[0] / MiB


def test_items_with_big_arguments_of_their_own_send_one_per_worker_first(monkeypatch):
    # Sending is most of such a map's first cost: before the first figures
    # (which may move the rest to threads), one item per worker, not a window.
    from smartexec import _routed_map as sending_module

    sent: list[int] = []
    real = sending_module.send_chunk

    def counting(backend, target, calls, *args, **kwargs):
        sent.append(len(calls))
        return real(backend, target, calls, *args, **kwargs)

    monkeypatch.setattr(sending_module, "send_chunk", counting)
    arrays = [np.full(2 * MiB // 8, i, dtype=np.float64) for i in range(8)]
    with SmartExecutor(2) as ex:
        assert ex.explain(total).backend == "fork"  # unmeasured: it may hold the GIL
        results = ex.map(total, arrays)
        assert sent == [1, 1]  # the window waits for their figures
        assert list(results) == [float(a.sum()) for a in arrays]
    sent.clear()
    one = np.ones(2 * MiB // 8)
    with SmartExecutor(2) as ex:
        results = ex.map(doubled_total, [one] * 8)  # the same array: sent once per worker
        assert sent == [1] * 6  # the whole first window
        assert list(results) == [2.0 * one.size] * 8
    assert ours() == set()


def doubled_total(a):
    return float((a * 2).sum())


def test_which_items_are_dear_to_send():
    from smartexec._inputs import dear_to_send

    big = [np.zeros(2 * MiB // 8), np.ones(2 * MiB // 8)]
    assert dear_to_send((big,))
    assert dear_to_send((big[:1],))  # one item, big
    assert dear_to_send(([1, 2], big))  # a second argument carries it
    assert not dear_to_send(([big[0]] * 2,))  # the same object each call
    assert not dear_to_send((iter(big),))  # not looked into: it would be read
    assert not dear_to_send(([1, 2],))
    assert not dear_to_send(([],))
    assert dear_to_send((["x" * (2 * MiB), "y"],))
