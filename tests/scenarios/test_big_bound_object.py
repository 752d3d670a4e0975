"""docs/problems.md, problem 2: a method of an object holding a big array is never pickled."""

from __future__ import annotations

import numpy as np
import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(60)

PICKLED = []


class Model:
    def __init__(self, nbytes):
        self.weights = np.ones(nbytes // 8)

    def __getstate__(self):
        PICKLED.append(1)  # runs in the parent whenever the object is pickled (or sized)
        return self.__dict__

    def score(self, i):
        return float(self.weights[i] * i)


def test_hundred_megabyte_object_reaches_workers_without_pickling():
    model = Model(100_000_000)
    with SmartExecutor(2) as ex:
        decision = ex.explain(model.score)  # sizes it once, buffers counted not copied
        assert decision.backend == "fork" and decision.share
        PICKLED.clear()
        assert list(ex.map(model.score, range(32))) == [float(i) for i in range(32)]
    assert PICKLED == []


def test_small_object_is_simply_pickled():
    model = Model(8_000)
    with SmartExecutor(2) as ex:
        decision = ex.explain(model.score)
        assert decision.backend == "fork" and not decision.share
        assert list(ex.map(model.score, range(5))) == [float(i) for i in range(5)]
