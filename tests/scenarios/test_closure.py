"""docs/problems.md, problem 3: lambdas and closures fail in a process pool, not here."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import pickle

import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(60)


def test_stdlib_process_pool_cannot_send_a_lambda():
    # the problem, pinned: with the stdlib the call fails
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=context) as pool:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            pool.submit(lambda x: x, 1).result(timeout=30)


def test_lambda_and_closure_run_on_fork_workers_by_value():
    factor = 7

    def scale(x):
        return x * factor

    with SmartExecutor(2) as ex:
        assert ex.explain(scale).backend == "fork"  # cloudpickle, as loky's workers would
        assert list(ex.map(scale, range(5))) == [0, 7, 14, 21, 28]
        assert ex.submit(lambda: "ran").result(timeout=30) == "ran"
