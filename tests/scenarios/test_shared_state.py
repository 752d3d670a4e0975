"""docs/problems.md, problem 5: a worker process's writes stay in the worker; results come back."""

from __future__ import annotations

import numpy as np
import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(60)


class Counter:
    def __init__(self):
        self.hits = np.zeros(4 << 18, dtype=np.int64)  # 8 MiB: shared by copy-on-write

    def hit(self, i):
        self.hits[i] += 1
        return int(self.hits[i])


def test_writes_in_fork_workers_are_private_results_are_returned():
    counter = Counter()
    with SmartExecutor(2) as ex:
        assert ex.explain(counter.hit).backend == "fork"
        returned = list(ex.map(counter.hit, range(10)))
    assert returned == [1] * 10  # each worker saw its own copy
    assert counter.hits.sum() == 0  # the parent's array is untouched


def test_threads_share_the_callers_memory():
    counter = Counter()
    with SmartExecutor(2, backend="thread") as ex:
        list(ex.map(counter.hit, range(10)))
    assert counter.hits[:10].tolist() == [1] * 10
