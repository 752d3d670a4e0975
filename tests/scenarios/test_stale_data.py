"""Issue 13: no result ever comes from stale data.

Whatever a process backend sends once and reuses (a repeated big argument, a
big callable's state on loky, a fork pool's copy-on-write snapshot of a
shared callable) must be proven unchanged before reuse, or sent again. Each
test mutates one cached kind in place between calls and checks that the next
``submit`` and ``map`` see the change; the send-once win stays where nothing
changed. Plus memory-mapped arguments (by reference to their file) and
methods of ``__slots__`` objects without ``__weakref__``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from smartexec import SmartExecutor, transport
from smartexec.backends.fork import _backend as fork_backend
from smartexec.tuning import digest_pays

from . import _module_values

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
KINDS = ["array", "list", "dict", "attribute"]


class Holder:
    """A big object with one of each cached kind inside."""

    def __init__(self):
        self.array = np.zeros(MiB)  # 8 MiB
        self.list = list(range(300_000))
        self.dict = {i: i for i in range(300_000)}
        self.attribute = 1.0

    def value(self, kind):
        return measure(kind, self if kind == "attribute" else getattr(self, kind))


def measure(kind, obj):
    if kind == "array":
        return float(obj.sum())
    if kind in ("list", "dict"):
        return len(obj)
    return obj.attribute  # a Holder passed as an argument


def argument_of(kind):
    holder = Holder()
    return holder if kind == "attribute" else getattr(holder, kind)


def check_submit_and_map(ex, fn, args, before, change):
    """Two calls of each API see ``before``; after ``change()`` both see its result."""
    assert ex.submit(fn, *args).result(timeout=60) == before
    assert ex.submit(fn, *args).result(timeout=60) == before
    assert list(ex.map(fn, *[[a] * 6 for a in args], chunksize=2)) == [before] * 6
    after = change()
    assert ex.submit(fn, *args).result(timeout=60) == after
    assert list(ex.map(fn, *[[a] * 6 for a in args], chunksize=2)) == [after] * 6
    again = change()  # changed between two maps, with no submit in between
    assert list(ex.map(fn, *[[a] * 6 for a in args], chunksize=2)) == [again] * 6
    assert ex.submit(fn, *args).result(timeout=60) == again


def changer(kind, obj):
    state = {"n": 0}

    def change():
        state["n"] += 1
        if kind == "array":
            obj[:] = float(state["n"])
            return float(obj.size * state["n"])
        if kind == "list":
            obj.append(-1)
            return len(obj)
        if kind == "dict":
            obj[f"new{state['n']}"] = 0
            return len(obj)
        obj.attribute = 1.0 + state["n"]
        return obj.attribute

    return change


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_repeated_argument_changed_in_place_is_sent_again(backend, kind):
    obj = argument_of(kind)
    with SmartExecutor(2, backend=backend) as ex:
        check_submit_and_map(ex, measure, (kind, obj), measure(kind, obj), changer(kind, obj))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["fork", "loky", None])
def test_a_big_callables_state_changed_in_place_is_seen(backend, kind):
    holder = Holder()
    target = holder if kind == "attribute" else getattr(holder, kind)
    with SmartExecutor(2, backend=backend) as ex:
        decision = ex.explain(holder.value)
        assert decision.share  # sent once (loky) or by copy-on-write (fork, default)
        if backend is None:
            assert decision.backend == "fork"
        check_submit_and_map(ex, holder.value, (kind,), holder.value(kind), changer(kind, target))


@pytest.fixture
def big_segments(monkeypatch):
    """Sizes of the shared-memory segments of 1 MiB or more the parent creates."""
    sizes: list[int] = []
    real = transport._shm.create

    def spy(data, *args, **kwargs):
        name = real(data, *args, **kwargs)
        if memoryview(data).nbytes >= MiB:
            sizes.append(memoryview(data).nbytes)
        return name

    monkeypatch.setattr(transport._shm, "create", spy)
    return sizes


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_an_unchanged_repeated_array_is_still_put_in_shared_memory_once(backend, big_segments):
    arr = np.zeros(MiB)
    with SmartExecutor(2, backend=backend) as ex:
        for _ in range(6):
            assert ex.submit(measure, "array", arr).result(timeout=60) == 0.0
        assert list(ex.map(measure, ["array"] * 8, [arr] * 8, chunksize=2)) == [0.0] * 8
        # its first sighting travels with its request, the second is cached: no more
        assert big_segments == [arr.nbytes] * 2
        arr[:] = 1.0
        assert ex.submit(measure, "array", arr).result(timeout=60) == arr.size
        assert ex.submit(measure, "array", arr).result(timeout=60) == arr.size
        assert big_segments == [arr.nbytes] * 3  # sent again once, then reused


def test_an_unchanged_big_state_is_still_sent_once_on_loky(big_segments):
    holder = Holder()
    with SmartExecutor(2, backend="loky") as ex:
        for _ in range(4):
            assert ex.submit(holder.value, "array").result(timeout=60) == 0.0
        assert list(ex.map(holder.value, ["array"] * 8, chunksize=1)) == [0.0] * 8
        assert len(ex._backends["loky"]._cache) == 1
        assert big_segments.count(holder.array.nbytes) == 1


@pytest.fixture
def proof_by_digest(monkeypatch):
    """Injected figures: a digest always costs less than a fresh pool (the pool is reused)."""
    monkeypatch.setattr(fork_backend, "digest_pays", lambda *figures: True)


@pytest.fixture
def proof_by_fork(monkeypatch):
    """Injected figures: a digest always costs more than a fresh pool (each submit forks)."""
    monkeypatch.setattr(fork_backend, "digest_pays", lambda *figures: False)


def test_fork_submits_of_an_unchanged_object_reuse_their_pool(proof_by_digest):
    holder = Holder()
    with SmartExecutor(2, backend="fork") as ex:
        assert ex.submit(holder.value, "attribute").result(timeout=60) == 1.0
        pool = ex._backends["fork"]._pool
        for _ in range(5):  # a digest proves the pool's snapshot current
            assert ex.submit(holder.value, "attribute").result(timeout=60) == 1.0
        assert ex._backends["fork"]._pool is pool
        holder.attribute = 5.0
        assert ex.submit(holder.value, "attribute").result(timeout=60) == 5.0
        assert ex._backends["fork"]._pool is not pool


def test_fork_submits_whose_digest_costs_more_than_a_pool_fork_anew_and_see_each_change(
    proof_by_fork,
):
    holder = Holder()
    with SmartExecutor(2, backend="fork") as ex:
        seen = []
        for value in (1.0, 1.0, 2.0, 3.0):
            holder.attribute = value
            seen.append(ex.submit(holder.value, "attribute").result(timeout=60))
            seen.append(ex._backends["fork"]._pool)
        assert seen[0::2] == [1.0, 1.0, 2.0, 3.0]
        assert len({id(pool) for pool in seen[1::2]}) == 4  # no digest: a pool each


def test_a_submits_proof_follows_the_measured_costs():
    assert digest_pays(None, None) and digest_pays(None, 0.01) and digest_pays(0.5, None)
    assert digest_pays(0.001, 0.01)  # a small state: the digest is cheaper
    assert not digest_pays(0.14, 0.013)  # 200 MiB digested against a fresh pool
    assert digest_pays(0.14, 0.013, pool_busy=True)  # a fresh pool would run beside it


class Sleeper(Holder):
    def nap(self, seconds):
        time.sleep(seconds)
        return os.getpid()


def test_submits_fork_anew_only_while_the_pool_runs_no_call(monkeypatch):
    # Injected: a digest always costs more than a fresh pool, unless the pool is busy.
    monkeypatch.setattr(fork_backend, "digest_pays", lambda d, f, busy=False: busy)
    sleeper = Sleeper()
    with SmartExecutor(max_processes=1, backend="fork") as ex:
        assert ex.explain(sleeper.nap).share
        first = ex.submit(sleeper.nap, 0).result(timeout=60)
        again = ex.submit(sleeper.nap, 0).result(timeout=60)
        assert first != again  # the pool was idle: a fresh one each (no digest)
        futures = [ex.submit(sleeper.nap, 0.2) for _ in range(6)]
        # The first finds the pool idle and forks; the second, busy, digests
        # and forks one pool that records it; the rest are proven by digest
        # and reuse it: two processes, not six (max_processes=1 each).
        assert len({f.result(timeout=60) for f in futures}) <= 2


class Counter:
    """Over big_state_bytes, with a method that writes to its object."""

    def __init__(self):
        self.array = np.zeros(MiB // 4)  # 2 MiB: digests in about a millisecond
        self.calls = 0

    def bump(self):
        self.calls += 1
        return self.calls


def test_a_submit_never_sees_what_a_workers_earlier_call_wrote(proof_by_digest):
    # A digest proves this process's copy unchanged, not the worker's, which
    # the earlier calls wrote to; ProcessPoolExecutor sends each call a fresh
    # copy: 1 every time.
    counter = Counter()
    with SmartExecutor(max_processes=1, backend="fork") as ex:
        assert ex.explain(counter.bump).share
        assert [ex.submit(counter.bump).result(timeout=60) for _ in range(4)] == [1] * 4
    assert counter.calls == 0


# -- memory-mapped arguments -----------------------------------------------------


def fill(mm, row):
    mm[row] = row + 1.0
    return type(mm).__name__


def describe(mm):
    return type(mm).__name__, os.path.basename(mm.filename), bool(mm.flags.writeable)


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_task_writes_into_the_r_plus_memmap_it_was_given(backend, tmp_path):
    path = tmp_path / "out.dat"
    np.zeros((64, 1000)).tofile(path)
    mm = np.memmap(path, dtype=np.float64, mode="r+", shape=(64, 1000))
    with SmartExecutor(2, backend=backend) as ex:
        assert ex.submit(fill, mm, 0).result(timeout=60) == "memmap"
        assert set(ex.map(fill, [mm] * 63, range(1, 64), chunksize=4)) == {"memmap"}
    on_disk = np.fromfile(path).reshape(64, 1000)
    assert (on_disk == np.arange(1.0, 65.0)[:, None]).all()
    assert (mm == on_disk).all()  # the caller's own mapping sees it too


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_read_only_memmap_is_sent_by_reference(backend, tmp_path):
    path = tmp_path / "in.dat"
    np.arange(4 * MiB, dtype=np.float64).tofile(path)  # 32 MiB
    mm = np.memmap(path, dtype=np.float64, mode="r")
    with SmartExecutor(2, backend=backend) as ex:
        assert ex.submit(describe, mm).result(timeout=60) == ("memmap", "in.dat", False)
        assert ex.submit(measure, "array", mm[10:20]).result(timeout=60) == sum(range(10, 20))


def rows(mm, start):
    return mm[start : start + 2]


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_memmap_result_comes_back_as_a_memmap_of_the_same_file(backend, tmp_path):
    path = tmp_path / "rows.dat"
    np.arange(64 * 1000, dtype=np.float64).tofile(path)
    mm = np.memmap(path, dtype=np.float64, mode="r+", shape=(64, 1000))
    with SmartExecutor(2, backend=backend) as ex:
        back = ex.submit(rows, mm, 10).result(timeout=60)
    assert isinstance(back, np.memmap) and os.path.samefile(back.filename, path)
    assert (back == mm[10:12]).all()
    back[0, 0] = -1.0  # the same bytes of the same file
    assert mm[10, 0] == -1.0


# -- __slots__ without __weakref__ ----------------------------------------------------


class Slotted:
    __slots__ = ("weights", "scale")

    def __init__(self, nbytes):
        self.weights = np.ones(nbytes // 8)
        self.scale = 1.0

    def score(self, i):
        return float(self.weights[i]) * self.scale * i


@pytest.mark.parametrize("nbytes", [8_000, 2 * MiB], ids=["small", "big"])
@pytest.mark.parametrize("backend", ["fork", "loky", None])
def test_a_method_of_a_slots_object_without_weakref_runs(backend, nbytes):
    obj = Slotted(nbytes)
    with SmartExecutor(2, backend=backend) as ex:
        assert ex.submit(obj.score, 3).result(timeout=60) == 3.0
        assert list(ex.map(obj.score, range(5))) == [0.0, 1.0, 2.0, 3.0, 4.0]
        obj.scale = 2.0
        assert ex.submit(obj.score, 3).result(timeout=60) == 6.0
        assert list(ex.map(obj.score, range(5))) == [0.0, 2.0, 4.0, 6.0, 8.0]


class SlowModel:
    """Big state (shared with fork workers) and a bias read by every call."""

    def __init__(self):
        self.big = np.zeros(2 * MiB // 8)
        self.bias = 0

    def f(self, x):
        if x < 0:
            import time

            time.sleep(1.0)  # keeps the only worker busy: later calls queue
            return -1
        return self.bias + x


@pytest.mark.parametrize("trigger", ["submit of the changed object", "map of another object"])
def test_a_queued_submit_runs_on_the_state_at_its_call(trigger):
    # Found by an adversarial pass: a submit queued behind a busy worker was
    # moved to the newer pool forked for a later call, and computed on the
    # state changed after it was submitted (101 instead of 1).
    m, other = SlowModel(), SlowModel()
    with SmartExecutor(max_workers=1, backend="fork") as ex:
        busy = ex.submit(m.f, -1)
        queued = ex.submit(m.f, 1)  # bias == 0 at this call
        m.bias = 100
        if trigger == "submit of the changed object":
            later = ex.submit(m.f, 1)
            assert later.result(timeout=60) == 101
        else:
            assert list(ex.map(other.f, [1])) == [1]
        assert busy.result(timeout=60) == -1
        assert queued.result(timeout=60) == 1


# -- module-level values a pickled function reads in a forked worker ----------


def _rebind_scale(n):
    _module_values.SCALE = n


def _change_config(n):
    _module_values.CONFIG["factor"] = n


def _change_class(n):
    _module_values.Settings.factor = n


def _change_table(n):
    _module_values.TABLE[0] = n


def _by_module_attribute(x):
    return _module_values.SCALE * x  # a function of this module: sent by value


CHANGES = {
    "rebound": (_module_values.scaled, _rebind_scale),
    "changed in place": (_module_values.configured, _change_config),
    "class attribute": (_module_values.by_class, _change_class),
    "big array changed in place": (_module_values.tabled, _change_table),
    "through a helper": (_module_values.through_a_helper, _rebind_scale),
    "through a module attribute": (_by_module_attribute, _rebind_scale),
    "an instance's inherited attribute": (
        _module_values.by_instance,
        lambda n: setattr(_module_values.Base, "factor", n),
    ),
    "a function kept in a table": (_module_values.by_table, _rebind_scale),
    "an import in its body": (_module_values.by_import_in_body, _rebind_scale),
    "a default argument changed in place": (_module_values.by_default, _change_config),
    "a name as a string": (_module_values.by_name, _rebind_scale),
    "a function given to a partial": (_module_values.by_partial, _rebind_scale),
    "a singledispatch function": (_module_values.dispatched, _rebind_scale),
    "a function given as a default argument": (_module_values.by_default_rule, _rebind_scale),
    "a small value it rebinds, changed in place": (
        _module_values.by_its_own_cache,
        lambda n: _module_values.STATE.__setitem__("factor", n),
    ),
}


@pytest.fixture
def module_values():
    yield
    _rebind_scale(1)
    _change_config(1)
    _change_class(1)
    _change_table(1)
    _module_values.Base.factor = 1
    _module_values.STATE["factor"] = 1


@pytest.mark.parametrize("case", CHANGES)
def test_a_module_level_value_changed_between_maps_is_read_as_it_is_now(case, module_values):
    # ProcessPoolExecutor's fork workers, reused, keep the values they forked
    # with; threads and a loop read the value as it is now: a route must not decide.
    fn, change = CHANGES[case]
    with SmartExecutor(2, backend="fork") as ex, SmartExecutor(2, backend="thread") as threads:
        for n in (3, 1, 3, 3, 5):
            change(n)
            expected = [fn(x) for x in range(8)]
            assert list(ex.map(fn, range(8), chunksize=2)) == expected
            assert ex.submit(fn, 7).result(timeout=60) == fn(7)
            assert list(threads.map(fn, range(8))) == expected


def test_maps_whose_reads_are_unchanged_reuse_their_pool(module_values):
    one, two = _module_values.scaled, _module_values.configured
    with SmartExecutor(2, backend="fork") as ex:
        assert list(ex.map(one, range(4))) == [0, 1, 2, 3]
        assert list(ex.map(two, range(4))) == [0, 1, 2, 3]  # one new pool: records both
        pool = ex._backends["fork"]._pool
        for _ in range(3):  # alternating maps of both, nothing changed: no new pool
            assert list(ex.map(one, range(4))) == [0, 1, 2, 3]
            assert ex.submit(two, 2).result(timeout=60) == 2
        assert ex._backends["fork"]._pool is pool
        _change_config(2)
        assert list(ex.map(one, range(4))) == [0, 1, 2, 3]  # reads no CONFIG
        assert ex._backends["fork"]._pool is pool
        assert list(ex.map(two, range(4))) == [0, 2, 4, 6]
        assert ex._backends["fork"]._pool is not pool


def test_a_function_rebound_by_its_name_runs_as_the_caller_holds_it(module_values):
    # By reference a worker looks the function up by name, and would find the
    # one it forked with: the caller's object is what must run.
    old = _module_values.scaled
    with SmartExecutor(2, backend="fork") as ex:
        assert list(ex.map(old, range(4))) == [0, 1, 2, 3]
        _module_values.scaled = _module_values.negated
        try:
            assert list(ex.map(_module_values.scaled, range(4))) == [0, -1, -2, -3]
            assert list(ex.map(old, range(4))) == [0, 1, 2, 3]
        finally:
            _module_values.scaled = old


def test_a_value_that_cannot_be_pickled_is_proven_by_its_parts(module_values, monkeypatch):
    # A lock cannot be pickled: it is compared by identity, the rest of the
    # dict holding it by digest; a map does not fork a pool for it each time.
    import threading

    monkeypatch.setattr(_module_values, "CONFIG", {"factor": 1, "lock": threading.Lock()})
    with SmartExecutor(2, backend="fork") as ex:
        for _ in range(3):
            assert list(ex.map(_module_values.configured, range(4))) == [0, 1, 2, 3]
        pool = ex._backends["fork"]._pool
        assert list(ex.map(_module_values.configured, range(4))) == [0, 1, 2, 3]
        assert ex._backends["fork"]._pool is pool
        _change_config(3)
        assert list(ex.map(_module_values.configured, range(4))) == [0, 3, 6, 9]


def test_odd_module_level_objects_never_fail_a_map(module_values):
    # A lazy proxy whose __class__ raises, a tuple 5,000 levels deep and a
    # dict whose len() raises sit in a module of the user's: proving the
    # pool current must not raise, whichever function is mapped.
    from . import _odd_values

    with SmartExecutor(2, backend="fork") as ex:
        for _ in range(2):
            assert list(ex.map(_odd_values.unrelated, range(3))) == [0, 2, 4]
            assert list(ex.map(_odd_values.reads_them, range(3))) == [1, 2, 3]


class ScaledHolder(Holder):
    def scaled(self, x):
        return _module_values.scaled(x) + self.attribute


def test_a_shared_objects_submit_reads_module_values_as_they_are_now(
    proof_by_digest, module_values
):
    # Its digest proves the object unchanged; the module its method reads
    # changed beside it.
    holder = ScaledHolder()
    with SmartExecutor(2, backend="fork") as ex:
        assert ex.explain(holder.scaled).share
        assert ex.submit(holder.scaled, 2).result(timeout=60) == 3.0
        assert ex.submit(holder.scaled, 2).result(timeout=60) == 3.0
        pool = ex._backends["fork"]._pool
        _rebind_scale(10)
        assert ex.submit(holder.scaled, 2).result(timeout=60) == 21.0
        assert ex._backends["fork"]._pool is not pool
        assert list(ex.map(holder.scaled, [1, 2])) == [11.0, 21.0]


def test_a_function_first_seen_on_a_running_pool_joins_it(module_values):
    # The pool recorded, as it forked, every binding of the user's modules
    # whose object is its whole state: a function reading only such bindings
    # is proven current at once, and waits for those workers instead of
    # forking a second pool beside them.
    with SmartExecutor(2, backend="fork") as ex:
        assert list(ex.map(_module_values.scaled, range(4))) == [0, 1, 2, 3]
        pool = ex._backends["fork"]._pool
        assert ex.submit(_module_values.negated, 3).result(timeout=60) == -3
        assert list(ex.map(_module_values.through_a_helper, range(3))) == [0, 1, 2]
        assert ex._backends["fork"]._pool is pool
        _rebind_scale(2)  # through_a_helper reads it: not proven any more
        assert list(ex.map(_module_values.through_a_helper, range(3))) == [0, 2, 4]
        assert ex._backends["fork"]._pool is not pool
