"""Failures on the way to or from a worker, reported as ProcessPoolExecutor reports them.

CPython's test_deadlock.py is the reference: an object that cannot be rebuilt
in the worker, or a result that cannot be rebuilt here, is a
``BrokenProcessPool``; a result that cannot be pickled is a
``PicklingError``; a ``SystemExit`` raised by the task (or while pickling its
result) is re-raised as itself. smartexec's errors are subclasses of those,
name the callable, chain the original error, and leave the executor usable.
"""

from __future__ import annotations

import pickle
import traceback
from concurrent.futures.process import BrokenProcessPool

import pytest

from smartexec import SmartExecutor
from smartexec.errors import ResultPicklingError, WorkerProtocolError

from . import _failure_workloads as w

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["fork", "loky"]


@pytest.fixture(params=BACKENDS)
def ex(request):
    with SmartExecutor(2, backend=request.param) as executor:
        yield executor


def _still_usable(ex):
    assert ex.submit(w.square, 7).result(timeout=60) == 49
    assert list(ex.map(w.square, range(5))) == [0, 1, 4, 9, 16]


def _chain(exc):
    causes = []
    while exc is not None:
        causes.append(exc)
        exc = exc.__cause__
    return causes


@pytest.mark.parametrize("bad", [w.FailsToUnpickle, w.ExitsOnUnpickle])
def test_a_task_the_worker_cannot_unpickle_is_a_broken_process_pool(ex, bad):
    error = ex.submit(w.identity, bad()).exception(timeout=60)
    assert isinstance(error, BrokenProcessPool) and isinstance(error, WorkerProtocolError)
    assert error.stage == "task"
    assert "identity()" in str(error) and "could not unpickle" in str(error)
    original = error.__cause__
    expected = pickle.UnpicklingError if bad is w.FailsToUnpickle else SystemExit
    assert isinstance(original, expected)
    # the worker's traceback comes along, under the original error
    assert "_failure_workloads" in "".join(traceback.format_exception(error))
    _still_usable(ex)


@pytest.mark.parametrize("bad", [w.FailsToUnpickle, w.ExitsOnUnpickle])
def test_a_result_this_process_cannot_unpickle_is_a_broken_process_pool(ex, bad):
    error = ex.submit(w.make, bad).exception(timeout=60)
    assert isinstance(error, BrokenProcessPool) and isinstance(error, WorkerProtocolError)
    assert error.stage == "reply"
    assert "make()" in str(error) and "could not be unpickled" in str(error)
    expected = pickle.UnpicklingError if bad is w.FailsToUnpickle else SystemExit
    assert isinstance(error.__cause__, expected)
    _still_usable(ex)


def test_a_result_the_worker_cannot_pickle_is_a_pickling_error_and_a_broken_pool(ex):
    error = ex.submit(w.make, w.FailsToPickle).exception(timeout=60)
    assert isinstance(error, pickle.PicklingError)  # what the stdlib raises
    assert isinstance(error, BrokenProcessPool) and isinstance(error, ResultPicklingError)
    assert error.where == "result" and "FailsToPickle" in str(error)
    assert any(
        "refuses to be pickled" in str(e) for e in _chain(error)
    ) or "refuses to be pickled" in str(error)
    _still_usable(ex)


def test_only_the_item_whose_result_cannot_be_pickled_fails_in_a_chunk(ex):
    items = [w.FailsToPickle if i == 2 else i for i in range(5)]
    results = ex.map(_make_or_square, items, chunksize=5)
    assert [next(results) for _ in range(2)] == [0, 1]
    with pytest.raises(ResultPicklingError):
        next(results)
    _still_usable(ex)


def _make_or_square(x):
    return x() if isinstance(x, type) else x * x


def test_system_exit_while_pickling_the_result_is_re_raised_as_the_stdlib_does(ex):
    # ProcessPoolExecutor sends back what pickling the result raised.
    error = ex.submit(w.make, w.ExitsOnPickle).exception(timeout=60)
    assert isinstance(error, SystemExit) and error.code == 3
    _still_usable(ex)


@pytest.mark.parametrize(
    "fn, expected",
    [(w.raise_system_exit, SystemExit), (w.raise_keyboard_interrupt, KeyboardInterrupt)],
)
def test_a_tasks_own_base_exception_is_re_raised_as_itself(ex, fn, expected):
    error = ex.submit(fn).exception(timeout=60)
    assert type(error) is expected
    assert not isinstance(error, BrokenProcessPool)
    _still_usable(ex)


def test_an_argument_that_cannot_be_pickled_fails_the_future_not_submit(ex):
    future = ex.submit(w.identity, w.FailsToPickle())  # no raise here
    with pytest.raises(pickle.PicklingError, match="argument 1 "):
        future.result(timeout=60)
    _still_usable(ex)
