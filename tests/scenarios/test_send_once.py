"""Issue 5: without copy-on-write (loky), a big object is sent once to each worker.

The object's state is pickled once, its arrays into shared memory; each
worker unpickles it at its first chunk and keeps it; chunks carry a reference.
"""

from __future__ import annotations

import functools
import gc
import os

import numpy as np
import pytest

from smartexec import SmartExecutor, _object_cache, _shm

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
PICKLED: list[int] = []  # one entry each time the parent pickles a Model


class Model:
    """8 MiB of weights; counts its pickles (parent) and unpickles (worker)."""

    unpickled_here = 0

    def __init__(self, nbytes=8 * MiB, scale=1.0):
        self.weights = np.ones(nbytes // 8)
        self.scale = scale

    def __getstate__(self):
        PICKLED.append(1)
        return self.__dict__

    def __setstate__(self, state):
        type(self).unpickled_here += 1
        self.__dict__.update(state)

    def score(self, i):
        return float(self.weights[i]) * self.scale * i

    def whoami(self, _):
        return os.getpid(), type(self).unpickled_here


def cached_here(_=None):
    return len(_object_cache._OBJECTS)


def pid(_=None):
    return os.getpid()


def lookup(table, i):
    return table["rows"][i]


def ours() -> set[str]:
    return set(_shm.live())


def test_a_bound_object_is_pickled_once_and_unpickled_once_per_worker():
    model = Model()
    with SmartExecutor(2, backend="loky") as ex:
        decision = ex.explain(model.whoami)
        assert decision.share and "sent once to each worker" in str(decision)
        ex.explain(model.score)  # sizing the state to route it pickles it too
        PICKLED.clear()
        seen = list(ex.map(model.whoami, range(200), chunksize=1))
        assert len(PICKLED) == 1  # once, into shared memory
        counts = {}
        for worker, count in seen:
            counts.setdefault(worker, set()).add(count)
        assert all(c == {1} for c in counts.values()), counts  # each worker: once
        segments = ours()
        assert list(ex.map(model.score, range(10))) == [float(i) for i in range(10)]
        # another method of the same object: pickled once more, in band only, to
        # prove the cached copy current; nothing new is sent
        assert len(PICKLED) == 2
        assert ours() == segments
    assert ours() == set()  # shutdown freed it


def test_chunks_carry_a_reference_only(sent):
    model = Model()
    with SmartExecutor(2, backend="loky") as ex:
        list(ex.map(model.score, range(50), chunksize=5))
    assert sent and max(sent) < 4096


def test_the_cache_is_freed_when_the_object_dies():
    model = Model()
    with SmartExecutor(2, backend="loky") as ex:
        list(ex.map(model.score, range(20), chunksize=1))
        assert ours()  # the cached copy
        del model
        gc.collect()
        assert ours() == set()  # unlinked in the parent at once
        # each later chunk tells its worker to drop it too
        after = list(ex.map(cached_here, range(40), chunksize=1))
        assert after[-10:] == [0] * 10


def test_refresh_sends_the_new_state():
    model = Model()
    with SmartExecutor(2, backend="loky") as ex:
        assert ex.submit(model.score, 3).result(timeout=60) == 3.0
        model.scale = 2.0
        assert ex.refresh(model.score)
        assert list(ex.map(model.score, range(4), chunksize=1)) == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("kind", ["partial", "closure"])
def test_partials_and_closures_with_big_state_are_sent_once(kind):
    weights = np.arange(2 * MiB // 8, dtype=np.float64)
    if kind == "partial":
        fn = functools.partial(np.take, weights)
    else:

        def fn(i):
            return weights[i]

    with SmartExecutor(2, backend="loky") as ex:
        assert ex.explain(fn).share
        assert list(ex.map(fn, range(30), chunksize=1)) == list(weights[:30])
        assert len(ex._backends["loky"]._cache) == 1


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_an_argument_object_repeated_across_submits_is_sent_once(backend):
    table = {"rows": list(range(400_000))}  # ~2 MB pickled, no buffers
    with SmartExecutor(2, backend=backend) as ex:
        futures = [ex.submit(lookup, table, i) for i in range(20)]
        assert [f.result(timeout=60) for f in futures] == list(range(20))
        assert len(ex._backends[backend]._cache) == 1


def test_distinct_workers_share_one_copy_in_memory():
    """Both loky workers map the same segment: no worker holds a private copy."""
    model = Model(64 * MiB)
    with SmartExecutor(2, backend="loky") as ex:
        list(ex.map(model.score, range(40), chunksize=1))
        assert sum(_shm.live().values()) < 65 * MiB
