"""smartexec.transport and smartexec._shm, without starting a process.

A request is decoded here as a worker would decode it (copy-on-write
mappings); a reply as the parent would (mapped, then unlinked).
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
import threading
import time
import warnings

import numpy as np
import pytest

from smartexec import SmartExecutor, _object_cache, _shm, _wire, transport
from smartexec._remote import ChunkResult
from smartexec.errors import WorkerProtocolError

pytestmark = pytest.mark.timeout(60)  # one test forks a child

MiB = 1 << 20
BIG = _wire.BIG_BUFFER_BYTES


def ours() -> set[str]:
    """Our segments in /dev/shm made by this process (or for it, by a worker)."""
    return set(_shm.live())


@pytest.fixture
def named(monkeypatch):
    """Named /dev/shm segments, the fallback where anonymous memory is missing."""
    monkeypatch.setattr(_shm, "_ANONYMOUS", False)


@pytest.fixture(params=["anonymous", "named"])
def mode(request, monkeypatch):
    if request.param == "anonymous" and not _shm.anonymous():
        pytest.skip("no memfd_create or /proc here")
    monkeypatch.setattr(_shm, "_ANONYMOUS", request.param == "anonymous")
    return request.param


def request(fn, calls, cache=None):
    data, lease = transport.dumps_request(fn, calls, None, cache=cache)
    return data, lease


def add(a, b=0):
    return a + b


# -- the segment layer ------------------------------------------------------------


def test_segment_round_trip_and_unlink(mode):
    data = np.arange(1000, dtype=np.int64)
    name = _shm.create(memoryview(data))
    prefix = f"smx_{os.getpid()}_" if mode == "named" else f"fd:{os.getpid()}:"
    assert name.startswith(prefix) and name in _shm.owned() and name in ours()
    view = _shm.attach(name, data.nbytes, private=False)
    assert np.array_equal(np.frombuffer(view, dtype=np.int64), data)
    _shm.unlink(name)
    assert name not in ours() and name not in _shm.owned()
    # an unlinked segment stays readable through an existing mapping
    assert np.frombuffer(view, dtype=np.int64)[999] == 999
    _shm.unlink(name)  # no error when already gone


def test_private_mapping_keeps_writes_to_itself(mode):
    name = _shm.create(memoryview(np.zeros(4096, dtype=np.uint8)))
    try:
        private = np.frombuffer(_shm.attach(name, 4096, private=True), dtype=np.uint8)
        private[:] = 7
        fresh = np.frombuffer(_shm.attach(name, 4096, private=True), dtype=np.uint8)
        assert fresh.max() == 0
    finally:
        _shm.unlink(name)


def run_elsewhere(code: str) -> None:
    """Run ``code`` in another interpreter (not a fork: this process may have threads)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr


def test_anonymous_memory_is_read_through_proc_and_acknowledged():
    if not _shm.anonymous():
        pytest.skip("no memfd_create or /proc here")
    data = np.arange(BIG // 8, dtype=np.float64)
    name = _shm.create(memoryview(data), owner=os.getpid())  # a reply, as a worker makes it
    assert name.startswith(f"fd:{os.getpid()}:") and name.endswith(":a")
    assert name not in _shm.owned() and _shm.release_acknowledged() == 1  # not read yet
    # the reader: another process maps it through /proc/<maker>/fd
    run_elsewhere(
        "import numpy as np; from smartexec import _shm; "
        f"got = np.frombuffer(_shm.attach({name!r}, {data.nbytes}, private=False)); "
        f"assert got[-1] == {data[-1]!r} and got.size == {data.size}"
    )
    deadline = time.monotonic() + 10  # read: its maker lets go soon, by itself
    while ours() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ours() == set() and _shm.release_acknowledged() == 0
    with pytest.raises(FileNotFoundError):
        _shm.attach(name, data.nbytes, private=False)


def test_a_reply_nobody_will_read_is_let_go_without_unpickling(monkeypatch):
    if not _shm.anonymous():
        pytest.skip("no memfd_create or /proc here")
    monkeypatch.setattr(transport.os, "getppid", os.getpid)
    data = transport.dumps_reply(ChunkResult([(True, np.ones(BIG // 8))], 0.0), memory="shared")
    assert len(ours()) == 1
    run_elsewhere(  # the parent of a cancelled chunk
        f"from smartexec import transport; transport.discard_reply({data!r})"
    )
    assert _shm.release_acknowledged() == 0 and ours() == set()


def test_a_segment_made_for_an_owner_names_the_worker(named):
    name = _shm.create(memoryview(b"x" * 100), owner=os.getpid())
    try:
        assert name.startswith(f"smx_{os.getpid()}_w{os.getpid()}_")
        assert name not in _shm.owned()  # the owner unlinks it, not its maker
    finally:
        _shm.unlink(name)


def test_sweep_removes_the_results_of_dead_workers_only(named):
    alive = _shm.create(memoryview(b"x" * 10), owner=os.getpid())
    pid = os.fork()
    if pid == 0:  # a "worker" that makes a result segment, then dies
        _shm.create(memoryview(b"y" * 10), owner=os.getppid())
        os._exit(0)
    os.waitpid(pid, 0)
    dead = [n for n in ours() if f"_w{pid}_" in n]
    assert len(dead) == 1
    assert _shm.sweep_dead_workers() == dead
    assert alive in ours()
    _shm.unlink(alive)


# -- requests and replies -------------------------------------------------------------


def test_small_payload_is_a_plain_pickle():
    data, lease = request(add, [((1,), {"b": 2})])
    assert pickle.loads(data)[1] == [((1,), {"b": 2})]
    assert lease.segments == []


def test_big_array_goes_through_shared_memory_not_the_stream():
    array = np.random.default_rng(0).random(2 * MiB // 8)
    data, lease = request(add, [((array,), {})])
    try:
        assert len(data) < 4096  # only names and shapes in the stream
        assert len(lease.segments) == 1 and lease.segments[0] in ours()
        fn, calls, budget = transport.loads_request(data)
        got = calls[0][0][0]
        assert fn is add and budget is None
        assert np.array_equal(got, array) and got.flags.writeable
    finally:
        lease.release()
    assert ours() == set()


def test_worker_writes_stay_private_to_the_task():
    array = np.zeros(BIG // 8 + 1)
    data, lease = request(add, [((array,), {})])
    try:
        first = transport.loads_request(data)[1][0][0][0]
        first += 1  # as a worker's in-place update would
        second = transport.loads_request(data)[1][0][0][0]
        assert second.max() == 0 and array.max() == 0
    finally:
        lease.release()


def test_read_only_arrays_stay_read_only():
    array = np.ones(BIG // 8 + 1)
    array.flags.writeable = False
    data, lease = request(add, [((array,), {})])
    try:
        got = transport.loads_request(data)[1][0][0][0]
        assert not got.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            got += 1
    finally:
        lease.release()


@pytest.mark.parametrize(
    "make, out_of_band",
    [
        (lambda: np.ones((600, 600)), True),  # C order
        (lambda: np.asfortranarray(np.ones((600, 600))), True),
        (lambda: np.ones((1200, 600))[::2], False),  # not contiguous: pickled in band
        (lambda: np.empty(BIG // 8 + 1, dtype=object), False),  # objects: in band
        (lambda: np.ones(BIG // 8 - 1), False),  # under the threshold
    ],
)
def test_which_arrays_go_out_of_band(make, out_of_band):
    array = make()
    if array.dtype.hasobject:
        array[:] = 1
    data, lease = request(add, [((array,), {})])
    try:
        assert bool(lease.segments) is out_of_band
        got = transport.loads_request(data)[1][0][0][0]
        assert np.array_equal(got, array) and got.flags.f_contiguous == array.flags.f_contiguous
    finally:
        lease.release()


def test_reply_segments_are_unlinked_once_read(monkeypatch, mode):
    # a reply is made for the worker's parent: here, pretend to be our own worker
    monkeypatch.setattr(transport.os, "getppid", os.getpid)
    result = np.arange(BIG // 8 + 1, dtype=np.float64)
    data = transport.dumps_reply(ChunkResult([(True, result)], 0.0), memory="shared")
    made = ours()
    assert len(made) == 1
    assert (f"_w{os.getpid()}_" if mode == "named" else f"fd:{os.getpid()}:") in made.pop()
    got = transport.loads_reply(data).outcomes[0][1]
    assert np.array_equal(got, result) and got.flags.writeable
    _shm.release_acknowledged()  # the worker's next request does this
    assert ours() == set()


def test_unpicklable_argument_leaves_nothing_behind():
    import threading

    array = np.ones(BIG // 8 + 1)
    with pytest.raises(TypeError):
        request(add, [((array, threading.Lock()), {})])
    assert ours() == set()


def test_full_shared_memory_falls_back_to_the_pipe(monkeypatch):
    def full(data, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_shm, "create", full)
    monkeypatch.setattr(_wire, "_full_warned", False)
    array = np.ones(BIG // 8 + 1)
    with pytest.warns(ResourceWarning, match="shm-size"):
        data, lease = request(add, [((array,), {})])
    assert lease.segments == [] and len(data) > array.nbytes
    assert np.array_equal(transport.loads_request(data)[1][0][0][0], array)


def test_estimate_counts_big_buffers_without_pickling_them():
    array = np.ones(64 * MiB // 8)
    seconds = _wire.estimate_send_s(array)
    assert seconds >= array.nbytes * _wire.SHM_WRITE_S_PER_BYTE


# -- objects sent once ------------------------------------------------------------


class Model:
    unpickled = 0

    def __init__(self, nbytes=2 * MiB):
        self.weights = np.ones(nbytes // 8)

    def __setstate__(self, state):
        type(self).unpickled += 1
        self.__dict__.update(state)

    def score(self, i):
        return float(self.weights[i]) * i


def test_a_cached_callable_is_pickled_once_and_carried_by_reference():
    cache = _object_cache.ObjectCache()
    model = Model()
    try:
        first, lease1 = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
        second, lease2 = request(_object_cache.CachedCallable(model.score), [((2,), {})], cache)
        assert len(first) < 2048 and len(second) < 2048
        assert lease1.segments == [] and len(cache) == 1
        Model.unpickled = 0
        fn1 = transport.loads_request(first)[0]
        fn2 = transport.loads_request(second)[0]
        assert Model.unpickled == 1  # the worker keeps it
        assert fn1.__self__ is fn2.__self__ and fn2(3) == 3.0
        lease1.release()
        lease2.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()
    assert ours() == set()


def test_cache_is_freed_when_the_object_dies_but_not_under_a_chunk():
    cache = _object_cache.ObjectCache()
    model = Model()
    _, lease = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
    segments = ours()
    assert segments
    del model
    gc.collect()
    assert len(cache) == 0
    assert ours() == segments  # a chunk in flight still needs them
    lease.release()
    assert ours() == set()
    cache.close()


def test_workers_drop_entries_the_parent_let_go():
    cache = _object_cache.ObjectCache()
    model = Model()
    data, lease = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
    transport.loads_request(data)
    assert len(_object_cache._OBJECTS) == 1
    lease.release()
    del model
    gc.collect()
    later, lease = request(add, [((1,), {})], cache)
    transport.loads_request(later)  # carries the live entries: none
    assert _object_cache._OBJECTS == {}
    lease.release()
    cache.close()


def test_refresh_sends_the_current_state():
    cache = _object_cache.ObjectCache()
    model = Model()
    try:
        _, lease = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
        lease.release()
        assert cache.refresh(model.score) and not cache.refresh(model.score)
        model.weights = model.weights * 2
        data, lease = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
        assert transport.loads_request(data)[0](1) == 2.0
        lease.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()
    assert ours() == set()


def test_an_argument_repeated_in_many_calls_is_cached():
    cache = _object_cache.ObjectCache()
    table = {"rows": list(range(300_000))}  # ~1.5 MB of pickle, no buffers
    try:
        calls = [((table, i), {}) for i in range(10)]
        data, lease = request(add, calls, cache)
        assert len(cache) == 1
        assert len(data) < 4096  # every call carries a ref, the table went once
        _, calls_back, _ = transport.loads_request(data)
        assert all(c[0][0] == table for c in calls_back)
        lease.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()
    assert ours() == set()


def test_distinct_arguments_are_not_cached():
    cache = _object_cache.ObjectCache()
    arrays = [np.ones(BIG // 8 + 1) for _ in range(4)]
    data, lease = request(add, [((a,), {}) for a in arrays], cache)
    assert len(cache) == 0 and len(lease.segments) == 4
    lease.release()
    # a second pass long after the first is no repeat either
    for _ in range(_object_cache.RECENT_CALLS):
        lease = request(add, [((1,), {})], cache)[1]
        lease.release()
    data, lease = request(add, [((a,), {}) for a in arrays], cache)
    assert len(cache) == 0
    lease.release()
    cache.close()


def test_a_cached_array_gives_each_task_its_own_view():
    cache = _object_cache.ObjectCache()
    array = np.zeros(BIG // 8 + 1)
    try:
        data, lease = request(add, [((array, 1), {}), ((array, 2), {})], cache)
        data2, lease2 = request(add, [((array, 3), {})], cache)
        assert len(cache) == 1 and len(data2) < 4096
        a = transport.loads_request(data2)[1][0][0][0]
        a += 1
        b = transport.loads_request(data2)[1][0][0][0]
        assert b.max() == 0
        lease.release()
        lease2.release()
    finally:
        cache.close()
    assert ours() == set()


def test_strongly_held_entries_are_bounded():
    cache = _object_cache.ObjectCache()
    leases = []
    for _ in range(_object_cache.MAX_STRONG_ENTRIES + 3):
        big = list(range(300_000))  # a list cannot be weakly referenced: held strongly
        leases.append(request(add, [((big,), {}), ((big,), {})], cache)[1])
    assert len(cache) == _object_cache.MAX_STRONG_ENTRIES
    for lease in leases:
        lease.release()
    cache.close()
    assert ours() == set()


def test_a_partial_is_cached_as_a_whole():
    cache = _object_cache.ObjectCache()
    fn = functools.partial(add, np.ones(BIG // 8 + 1))
    try:
        data, lease = request(_object_cache.CachedCallable(fn), [((1,), {})], cache)
        assert len(data) < 2048
        assert transport.loads_request(data)[0](1)[0] == 2.0
        lease.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()


def test_no_warning_is_left_by_the_tracker_registration():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        name = _shm.create(memoryview(b"z" * 10))
        _shm.unlink(name)


def test_small_items_are_timed_as_a_chunk_pickles_them():
    # One pickler per item charged its set-up to every item (~5 us against
    # ~0.2 us in a chunk): maps of 5 us items that a process pool wins stayed inline.
    from smartexec._inputs import measure_pickling
    from smartexec._wire import estimate_send_s
    from smartexec.tuning import Estimate

    args = [(i,) for i in range(64)]
    results = [i * 3 for i in range(64)]
    chunked, one_by_one = [], []
    for _ in range(5):  # the fastest of five each: a loaded machine stalls single runs
        estimate = Estimate()
        measure_pickling(estimate, args, results)
        chunked.append(estimate.pickle_parent_s)
        one_by_one.append(sum(estimate_send_s(pair) for pair in zip(args, results)) / 64)
    assert 0 < min(chunked) < min(one_by_one) / 3, (chunked, one_by_one)


def test_the_first_item_only_paces_the_pickling_sample(monkeypatch):
    # A fresh process's first pickling pays for set-up: 300-380 us of CPU for
    # one ~3 KB JSON document, ~2 us an item after. Priced with it, 13-16
    # documents read 44-67 us an item to send, and the map moved from fork
    # to a loop 1.5x slower.
    from smartexec import _inputs
    from smartexec.tuning import Estimate

    def timed(obj, buffers=None):  # injected figures: 350 us alone, 2 us an item in a batch
        return (350e-6, 0) if isinstance(obj, tuple) else (2e-6 * len(obj), 0)

    monkeypatch.setattr(_inputs, "send_parts", timed)
    estimate = Estimate()
    _inputs.measure_pickling(estimate, [("doc",)] * 64, [1.0] * 64)
    assert estimate.pickle_parent_s == pytest.approx(2 * 2e-6)  # both ends, the first left out
    assert estimate.send_per_chunk_s == 0.0


class _WaitsToPickle:
    """An argument whose pickling waits (for I/O, a lock): 10 ms, no CPU."""

    def __reduce__(self):
        time.sleep(0.01)
        return (int, (0,))


def test_pickling_that_waits_is_priced_by_its_wait():
    # Timed by the CPU clock, a 20 ms wait per argument priced fork's sends
    # at nothing, and the map stayed there, 6x slower than a loop.
    from smartexec._wire import estimate_send_s

    assert estimate_send_s(_WaitsToPickle()) >= 2 * 0.01  # both ends; a sleep lasts at least that


def test_a_big_argument_every_item_shares_is_priced_once_per_chunk():
    # The same 20 MiB array in every call is sent (or proven unchanged) once
    # per chunk: priced 7 ms an item, such maps ran as a loop that a process
    # pool's big chunks beat.
    from smartexec._inputs import measure_pickling
    from smartexec._wire import SHM_WRITE_S_PER_BYTE
    from smartexec.tuning import Estimate

    if not _shm.available():
        pytest.skip("no shared memory: big buffers are pickled in band")
    array = np.zeros(20 * MiB // 8)
    shared = Estimate()
    measure_pickling(shared, [(array, i) for i in range(64)], list(range(64)))
    assert shared.send_per_chunk_s == pytest.approx(array.nbytes * SHM_WRITE_S_PER_BYTE, rel=0.5)
    assert shared.pickle_parent_s < shared.send_per_chunk_s / 20
    # Distinct arrays: each item pays for its own, and nothing per chunk.
    distinct = Estimate()
    arrays = [np.zeros(2 * MiB // 8) for _ in range(8)]
    measure_pickling(distinct, [(a, i) for i, a in enumerate(arrays)], list(range(8)))
    assert distinct.send_per_chunk_s == 0.0
    assert distinct.pickle_parent_s >= 2 * MiB * SHM_WRITE_S_PER_BYTE
    # ... of unequal sizes, the first the biggest: still nothing shared.
    mixed = Estimate()
    arrays = [np.zeros((8 - i) * MiB // 8) for i in range(6)]
    measure_pickling(mixed, [(a,) for a in arrays], list(range(6)))
    assert mixed.send_per_chunk_s == 0.0
    # ... Fortran-ordered: each exports through a temporary transpose, whose
    # id the next one would reuse; they are still told apart.
    fortran = Estimate()
    arrays = [np.asfortranarray(np.full((512, 512), float(i))) for i in range(8)]
    measure_pickling(fortran, [(a,) for a in arrays], list(range(8)))
    assert fortran.send_per_chunk_s == 0.0


# -- never stale (issue 13) ----------------------------------------------------------


def test_same_bytes_is_exact():
    from smartexec._fingerprint import same_bytes

    a = np.arange(3 * MiB + 3, dtype=np.uint8)  # not a whole number of words
    b = a.copy()
    assert same_bytes(a, b)
    b[-1] ^= 1  # the last, odd byte
    assert not same_bytes(a, b)
    b[-1] ^= 1
    b[MiB] ^= 1
    assert not same_bytes(a, b)
    assert not same_bytes(a, a[:-1])
    assert same_bytes(b"", b"")


def test_digest_follows_the_state_not_the_identity():
    from smartexec._fingerprint import digest

    model = Model()
    first = digest(model.score)
    assert digest(model.score) == first
    model.weights[5] = 2.0
    assert digest(model.score) != first
    model.weights[5] = 1.0
    assert digest(model.score) == first  # same bytes again: same state
    lock = threading.Lock()
    with pytest.raises(TypeError):
        digest(lambda: lock)  # cannot be pickled: no proof


def test_a_changed_argument_is_sent_again_and_an_unchanged_one_reused():
    cache = _object_cache.ObjectCache()
    array = np.zeros(BIG // 8 + 1)
    try:
        _, lease = request(add, [((array, 1), {}), ((array, 2), {})], cache)
        (key,) = cache._live
        data, lease2 = request(add, [((array, 0), {})], cache)
        assert set(cache._live) == {key}  # proven unchanged: reused
        array[7] = 5.0
        data, lease3 = request(add, [((array, 0), {})], cache)
        assert len(cache) == 1 and set(cache._live) - {key}  # a new entry
        assert transport.loads_request(data)[1][0][0][0][7] == 5.0
        for held in (lease, lease2, lease3):
            held.release()
    finally:
        cache.close()
    assert ours() == set()


def test_proofs_map_what_was_sent_once_and_unmap_it_with_the_entry():
    cache = _object_cache.ObjectCache()
    array = np.zeros(BIG // 8 + 1)
    try:
        _, lease = request(add, [((array, 1), {}), ((array, 2), {})], cache)
        (entry,) = cache._live.values()
        assert entry.views is None  # nothing proven yet
        _, lease2 = request(add, [((array, 0), {})], cache)
        views = entry.views
        assert views is not None and len(views) == 1 + len(entry.ref.buffers)
        _, lease3 = request(add, [((array, 0), {})], cache)
        assert entry.views is views and set(cache._live) == {entry.key}  # mapped once
        array[3] = 1.0  # a change is still seen through the kept maps
        _, lease4 = request(add, [((array, 0), {})], cache)
        assert entry.key not in cache._live or entry.retired
        for held in (lease, lease2, lease3, lease4):
            held.release()
        assert entry.views is None  # freed with its segments
    finally:
        cache.close()
    assert ours() == set()


def test_an_argument_is_unpickled_afresh_for_each_request():
    cache = _object_cache.ObjectCache()
    rows = list(range(300_000))
    try:
        data, lease = request(add, [((rows, 1), {}), ((rows, 2), {})], cache)
        first = transport.loads_request(data)[1][0][0][0]
        first.append("written by a task")
        again = transport.loads_request(data)[1][0][0][0]
        assert again == rows  # a task's writes never reach the next task
        lease.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()
    assert ours() == set()


def test_a_cached_callable_is_proven_once_per_map_and_resent_when_changed():
    cache = _object_cache.ObjectCache()
    model = Model()
    try:
        one_map = _object_cache.CachedCallable(model.score)
        data, lease = request(one_map, [((1,), {})], cache)
        model.weights[1] = 3.0  # while that map runs: its later chunks keep its snapshot
        later, lease2 = request(one_map, [((1,), {})], cache)
        assert transport.loads_request(later)[0](1) == 1.0
        data, lease3 = request(_object_cache.CachedCallable(model.score), [((1,), {})], cache)
        assert transport.loads_request(data)[0](1) == 3.0  # the next call: sent again
        assert len(cache) == 1
        for held in (lease, lease2, lease3):
            held.release()
    finally:
        cache.close()
        _object_cache._OBJECTS.clear()
    assert ours() == set()


def fill_row(mm, row):
    mm[row] = row
    return mm


def test_a_memmap_is_pickled_as_a_reference_to_its_file(tmp_path):
    from smartexec import _remote

    path = tmp_path / "data.dat"
    mm = np.memmap(path, dtype=np.float64, mode="w+", shape=(4000, 100))
    stream = _remote.dumps(mm)
    assert len(stream) < 1024  # 3.2 MB of data, not copied
    back = _remote.loads(stream)
    assert isinstance(back, np.memmap) and back.shape == mm.shape and back.flags.writeable
    back[3] = 7.0
    back.flush()
    assert (mm[3] == 7.0).all()  # the same file
    for view in (mm[10:20], mm[:, 5], mm.T, mm[2:8, 1::3]):
        copy = _remote.loads(_remote.dumps(view))
        assert copy.shape == view.shape and np.shares_memory(copy, copy) and (copy == view).all()
        copy[...] = 1.5
        assert (view == 1.5).all()  # writes land in the file, where view sees them
    read_only = np.memmap(path, dtype=np.float64, mode="r", shape=(4000, 100))
    assert not _remote.loads(_remote.dumps(read_only)).flags.writeable
    reversed_view = mm[::-1]
    assert len(_remote.dumps(reversed_view)) > mm.nbytes  # by value
    private = np.memmap(path, dtype=np.float64, mode="c", shape=(4000, 100))
    private[0] = 9.0  # not in the file: must travel by value
    assert _remote.loads(_remote.dumps(private))[0, 0] == 9.0
    del back, copy, read_only, private, mm


def _pair(a, b=0, *, c=0):
    return (a, b, c)


@pytest.mark.parametrize(
    "calls",
    [
        [((i,), {}) for i in range(50)],  # one argument each: the bare items travel
        [((i, i + 1), {}) for i in range(50)],  # no keywords: the args tuples travel
        [((i,), {"c": i}) if i % 7 == 0 else ((i,), {}) for i in range(50)],  # as they are
        [((), {"a": 1})],
    ],
    ids=["single", "args", "kwargs", "keywords-only"],
)
def test_calls_travel_packed_and_run_as_sent(calls):
    from smartexec._remote import PackedCalls, pack_calls, run_chunk, unpack_calls

    packed = pack_calls(calls)
    assert isinstance(packed, PackedCalls) == all(not kwargs for _, kwargs in calls)
    data, lease = transport.dumps_request(_pair, calls, None)
    try:
        fn, got, budget = transport.loads_request(data)
        assert got == calls and budget is None
        assert unpack_calls(packed) == calls
        result = transport.loads_reply(transport.serve_request(data))
    finally:
        lease.release()
    assert result.outcomes == [(True, _pair(*args, **kwargs)) for args, kwargs in calls]
    assert run_chunk(_pair, packed).outcomes == result.outcomes


def test_code_sent_by_value_keeps_the_file_it_was_defined_in():
    # cloudpickle names such code "<dynamic-code>": a __main__ function's
    # traceback in a worker lost its file and source lines.
    from smartexec import _remote

    def outer():
        return lambda x: 1 / x  # a lambda goes by value, with its code

    sent = _remote.loads(_remote.dumps(outer()))
    assert sent.__code__.co_filename == __file__
    with pytest.raises(ZeroDivisionError) as caught:
        sent(0)
    assert "1 / x" in str(caught.getrepr())  # the source line is found again


# -- shared memory and limits (issue 32) ------------------------------------------


class _RecordingOs:
    """``os`` as :mod:`smartexec._shm` sees it, with ``pread`` and ``close`` watched.

    Each thread's first ``pread`` waits for the other thread's (a barrier):
    both have then read the same replies as acknowledged before either closes
    one. ``close`` records each call, and closes a descriptor for real only
    the first time (a second close fails with ``EBADF``, as it would, and
    never reaches a descriptor this test process opened meanwhile).
    """

    def __init__(self) -> None:
        self.closed: list[int] = []
        self.barrier = threading.Barrier(2, timeout=30)  # a hang guard, not a timing
        self.waited: set[int] = set()
        self.lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(os, name)

    def pread(self, fd, n, offset):
        if threading.get_ident() not in self.waited:
            self.waited.add(threading.get_ident())
            self.barrier.wait()
        return os.pread(fd, n, offset)

    def close(self, fd):
        with self.lock:
            again = fd in self.closed
            self.closed.append(fd)
        if again:
            raise OSError(9, "Bad file descriptor (closed twice)")
        os.close(fd)


def test_two_threads_releasing_the_same_replies_close_each_descriptor_once(monkeypatch):
    """Issue 32: a worker's two threads closed one reply's descriptor twice.

    The main thread (at its next request) and the releaser thread both read
    the acknowledgement bytes, then both closed the same descriptor: the
    second close failed (the worker exited, its item failed; about 1 call
    in 45,000 with 1 MiB results), or closed a newer reply that had taken
    its number. Forced here: both threads have read every reply as
    acknowledged before either goes on.
    """
    if not _shm.anonymous():
        pytest.skip("no memfd_create or /proc here")
    monkeypatch.setattr(_shm, "_start_releaser", lambda: None)  # no third thread
    names = [_shm.create(memoryview(b"x" * 64), owner=os.getpid()) for _ in range(3)]
    for name in names:
        _shm.attach(name, 64, private=False)  # what the parent does: acknowledges
    fds = sorted(int(name.split(":")[2]) for name in names)
    fake = _RecordingOs()
    monkeypatch.setattr(_shm, "os", fake)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            _shm.release_acknowledged()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=release) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    monkeypatch.setattr(_shm, "os", os)
    assert sorted(fake.closed) == fds and errors == []
    assert _shm.release_acknowledged() == 0 and ours() == set()


def _hide_proc(monkeypatch) -> None:
    """Opening another process's descriptors through /proc fails, as for a non-dumpable one."""
    real = os.open

    def hidden(path, flags, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", hidden)


def test_memory_hidden_by_proc_switches_this_process_to_named_segments(monkeypatch):
    """Issue 32: every big argument or result failed where /proc/<pid>/fd was hidden.

    A peer that is not dumpable (prctl PR_SET_DUMPABLE 0, dropped
    privileges) hides its descriptors; the start-up probe only opened this
    process's own. The first failure now switches this process to named
    segments for good, and its requests tell its workers to switch too.
    """
    if not _shm.anonymous():
        pytest.skip("no memfd_create or /proc here")
    monkeypatch.setattr(_shm, "_denied", False, raising=False)
    name = _shm.create(memoryview(np.ones(BIG // 8)))
    try:
        with pytest.MonkeyPatch.context() as hiding:
            _hide_proc(hiding)
            with pytest.raises(PermissionError, match="not dumpable"):
                _shm.attach(name, BIG, private=True)
    finally:
        _shm.unlink(name)
    assert not _shm.anonymous()
    data, lease = request(add, [((np.ones(BIG // 8),), {})])
    try:
        assert lease.segments and lease.segments[0].startswith(_shm.PREFIX)
        monkeypatch.setattr(_shm, "_denied", False)  # a worker not told yet
        assert transport.loads_request(data)[1][0][0][0].sum() == BIG // 8
        assert _shm.denied()  # told by the request
    finally:
        lease.release()


def test_a_worker_that_cannot_open_our_memory_switches_us_to_named_segments(monkeypatch):
    monkeypatch.setattr(_shm, "_denied", False, raising=False)
    monkeypatch.setattr(transport.os, "getppid", os.getpid)
    hidden = _shm.PeerAccessError(13, "cannot open shared memory fd:1:2:3")
    ok, error = transport.read_reply(transport.dumps_reply(None, hidden), "f", "fork")
    assert not ok and isinstance(error, WorkerProtocolError) and error.stage == "task"
    assert isinstance(error.__cause__, PermissionError)
    assert _shm.denied() and not _shm.anonymous()


def test_a_process_that_is_not_dumpable_makes_named_segments(monkeypatch):
    """Others cannot open its /proc/<pid>/fd: asked at each create, as it may drop privileges late."""
    monkeypatch.setattr(_shm, "_dumpable", lambda: False)
    name = _shm.create(memoryview(b"x" * 100))
    try:
        assert name.startswith(_shm.PREFIX) and not _shm.anonymous()
    finally:
        _shm.unlink(name)


def test_a_mapping_holds_no_file_descriptor(mode):
    """Issue 32: before Python 3.13 each mapped result held a descriptor (EMFILE at ~1,000 kept)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc here")
    name = _shm.create(memoryview(np.arange(BIG // 8, dtype=np.float64)))
    try:
        before = len(os.listdir("/proc/self/fd"))
        views = [_shm.attach(name, BIG, private=private) for private in (False, True) * 50]
        assert len(os.listdir("/proc/self/fd")) == before
        arrays = [np.frombuffer(view, dtype=np.float64) for view in views]
        assert all(a[-1] == BIG // 8 - 1 for a in arrays)
        arrays[1][0] = 5.0  # private: copy-on-write
        assert arrays[0][0] == 0.0 and arrays[2][0] == 0.0
        arrays[0][0] = 7.0  # shared: every shared mapping sees it
        assert arrays[2][0] == 7.0 and arrays[1][0] == 5.0
        del arrays
        _object_cache._release_views(views)  # a mapping closes, as the cache's do
    finally:
        _shm.unlink(name)


def big_ones(n):
    return np.ones(n)


def test_a_fork_workers_big_result_travels_in_band_on_named_memory(named):
    """Issue 32: its named result segments outlived a SIGKILLed parent (3 to 6 a kill).

    A fork worker leaves at once when its parent dies, with no chance to
    unlink them; ``serve_request(owner=...)`` is the fork worker's call.
    """
    data, lease = request(big_ones, [((BIG // 8,), {})])
    try:
        reply = transport.serve_request(data, owner=os.getpid())
    finally:
        lease.release()
    assert ours() == set() and len(reply) > BIG
    assert transport.loads_reply(reply).outcomes[0][1].sum() == BIG // 8


def test_a_worker_unlinks_the_results_its_dead_owner_never_read(named):
    """Issue 32: a loky worker whose parent was killed unlinks its unread results (loky exits)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a dead owner
    orphan = _shm.create(memoryview(b"x" * 100), owner=pid)
    read = _shm.create(memoryview(b"y" * 100), owner=os.getpid())
    _shm.unlink(read)  # what the owner does once it has mapped it
    _shm.release_acknowledged()  # the worker's next request forgets it
    assert _shm.release_orphans() == [orphan]
    assert not [n for n in os.listdir(_shm.SHM_DIR) if n == orphan]
    assert _shm.release_orphans() == []


# -- each call owns its arguments and its result, as one pickled alone does ------------


def _shift(base, by=1.0):
    base += by
    return base


def test_a_repeated_argument_is_a_copy_per_call_in_the_worker():
    from smartexec._remote import PackedCalls, separate_calls

    template = np.zeros(4)
    packed = PackedCalls(True, [template, template, 3, 3])
    items = separate_calls(packed).items
    assert items[0] is template and items[1] is not template
    assert np.array_equal(items[1], template) and items[2:] == [3, 3]
    calls = [((template,), {"by": template}), ((template,), {})]
    fresh = separate_calls(calls)
    seen = {id(fresh[0][0][0]), id(fresh[0][1]["by"]), id(fresh[1][0][0])}
    assert len(seen) == 3


def test_a_result_returned_twice_comes_back_as_two_objects():
    from smartexec._remote import ChunkResult, separate_outcomes

    shared = np.zeros(4)
    result = separate_outcomes(ChunkResult([(True, shared), (True, shared), (True, 1)], 0.0))
    first, second = (value for _, value in result.outcomes[:2])
    assert first is shared and second is not shared and np.array_equal(second, shared)


@pytest.mark.timeout(60)
def test_a_map_over_one_template_gives_each_item_its_own_copy():
    template = np.zeros(1000)
    with SmartExecutor(max_workers=2, backend="fork") as ex:
        got = [float(r.sum()) for r in ex.map(_shift, [template] * 40, chunksize=10)]
    assert got == [1000.0] * 40
    assert not template.any()


def test_only_a_chunk_marked_own_is_separated():
    """A callable that only reads its arguments shares a repeated one (sent once); a writer gets copies."""
    from smartexec._remote import OwnCalls, PackedCalls, own_arguments, pack_calls

    template = np.zeros(4)
    shared = own_arguments(pack_calls([((template,), {}), ((template,), {})]))
    assert isinstance(shared, PackedCalls) and shared.items[1] is template
    owned = own_arguments(pack_calls(OwnCalls([((template,), {}), ((template,), {})])))
    assert isinstance(owned, PackedCalls) and owned.items[1] is not template


def test_a_map_marks_its_chunks_own_only_for_an_argument_writer():
    from smartexec.effects import effects_of

    assert effects_of(_shift).writes_arguments()
    assert not effects_of(np.sum).writes_arguments()


def test_a_reply_for_another_machine_carries_big_buffers_in_band(monkeypatch):
    """memory="none" (dask's, a plugin's default): no segment is made, the reply stands alone."""
    monkeypatch.setattr(transport.os, "getppid", os.getpid)
    data = transport.dumps_reply(ChunkResult([(True, np.ones(BIG // 8))], 0.0))
    assert ours() == set() and len(data) > BIG
    assert transport.loads_reply(data, "f", "dask").outcomes[0][1].sum() == BIG // 8


class _Unloadable:
    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise ImportError("no module named 'gone' here")


def test_a_reply_that_cannot_be_unpickled_here_is_a_worker_protocol_error():
    data = transport.dumps_reply(ChunkResult([(True, _Unloadable())], 0.0))
    ok, error = transport.read_reply(data, "f", "dask")
    assert not ok and isinstance(error, WorkerProtocolError) and error.stage == "reply"
    assert "result of f() came back from a dask worker" in str(error)
    with pytest.raises(WorkerProtocolError):
        transport.loads_reply(data)


_HELD = [1, 2]


def _as_a_worker_returns(make):
    """``(whether snapshot kept the object, what it gave)`` for ``make()``'s result, held as a worker holds one."""
    from smartexec._remote import snapshot

    value = make()
    sent = snapshot(value)
    return sent is value, sent


def test_a_result_that_may_hold_what_a_later_call_writes_is_copied_as_it_is_returned():
    import numpy as np

    made = np.arange(3.0)
    assert _as_a_worker_returns(lambda: np.arange(3.0))[0]  # a new array of numbers: as it is
    assert _as_a_worker_returns(lambda: "x" * 100)[0]  # no call can change a str
    kept, held = _as_a_worker_returns(lambda: _HELD)
    assert not kept and held == _HELD and held is not _HELD  # a module-level object: a copy
    kept, view = _as_a_worker_returns(lambda: made[1:])
    assert not kept and not np.shares_memory(view, made) and view.tolist() == [1.0, 2.0]
    # A new container holding it (a second helper's: 8-16 distinct of 200 rows).
    kept, boxed = _as_a_worker_returns(lambda: (made,))
    assert not kept and not np.shares_memory(boxed[0], made)


def test_only_chunks_marked_for_it_copy_the_results_a_later_call_could_change():
    from smartexec._remote import own_calls, pack_calls, run_chunk

    held = [1]

    def give(i):
        return held

    for snapshots in (False, True):
        chunk = pack_calls(own_calls([((0,), {}), ((1,), {})], snapshots))
        assert chunk.snapshots is snapshots
        result = run_chunk(give, chunk, remote=True)
        # A callable that only writes its own arguments (not marked) gets
        # its results back as they are: copying each costs a pickle.
        assert (result.outcomes[0][1] is held) is (not snapshots)


def _length(data: bytes) -> int:
    return len(data)


def test_a_worker_times_taking_in_a_big_request_only():
    # Big bytes travel in the pickle stream: their cost is copying them in
    # (see Evidence.send_s), which only the worker sees.
    from smartexec._remote import BIG_REQUEST_BYTES

    for blob, timed in ((b"x" * BIG_REQUEST_BYTES, True), (b"x" * 1000, False)):
        data, lease = transport.dumps_request(_length, [((blob,), {})], None)
        try:
            result = transport.loads_reply(transport.serve_request(data, received_s=0.5))
        finally:
            lease.release()
        assert result.outcomes == [(True, len(blob))]
        if timed:
            assert result.receive_s >= 0.5  # the pipe's read, given, and the unpickling
        else:
            assert result.receive_s == 0.0
