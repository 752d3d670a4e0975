"""Calls run in this process see the caller's settings, as a worker process does, and keep their own.

A worker process starts from its parent's decimal context, numpy error and
print options and context variables; a pool thread starts from none of them
(``smartexec._context``). Each in-process route (threads for map and
submit, a loop in the caller) must compute what the process routes do.
"""

from __future__ import annotations

import contextvars
import decimal

import numpy as np
import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(60)

RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("RUN_ID", default="unset")


def seventh(n: int) -> str:
    return str(decimal.Decimal(1) / decimal.Decimal(7 + n))


def run_id(i: int) -> str:
    return f"{RUN_ID.get()}/{i}"


def inverse_sum(i: int) -> float:
    return float((1.0 / (np.arange(4.0) - i)).sum())


def sets_its_own_precision(digits: int) -> str:
    decimal.getcontext().prec = digits
    RUN_ID.set(f"call-{digits}")
    return str(decimal.Decimal(1) / decimal.Decimal(7))


@pytest.fixture
def settings():
    """The caller's settings, as a program sets them at start-up; restored after."""
    saved = decimal.getcontext().copy()
    token = RUN_ID.set("run-7")
    decimal.getcontext().prec = 40
    try:
        yield
    finally:
        decimal.setcontext(saved)
        RUN_ID.reset(token)


ROUTES = ("thread", "inline", "fork")


@pytest.mark.parametrize("backend", ROUTES)
def test_map_sees_the_callers_decimal_context_and_context_variables(settings, backend):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        assert list(ex.map(seventh, range(6))) == [seventh(n) for n in range(6)]
        assert list(ex.map(run_id, range(6))) == [f"run-7/{i}" for i in range(6)]


@pytest.mark.parametrize("backend", ROUTES)
def test_submit_sees_the_callers_context(settings, backend):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        assert ex.submit(seventh, 3).result(timeout=30) == seventh(3)
        assert ex.submit(run_id, 3).result(timeout=30) == "run-7/3"


@pytest.mark.parametrize("backend", ROUTES)
def test_numpy_error_options_reach_the_calls(backend):
    with np.errstate(divide="raise"), SmartExecutor(max_workers=2, backend=backend) as ex:
        with pytest.raises(FloatingPointError):
            list(ex.map(inverse_sum, range(3)))


@pytest.mark.parametrize("backend", ROUTES)
def test_a_calls_own_changes_stay_its_own(settings, backend):
    with SmartExecutor(max_workers=2, backend=backend) as ex:
        got = list(ex.map(sets_its_own_precision, [5, 12, 30]))
    assert got == [str(decimal.Context(prec=p).divide(1, 7)) for p in (5, 12, 30)]
    assert decimal.getcontext().prec == 40
    assert RUN_ID.get() == "run-7"


def test_an_empty_context_costs_nothing_on_threads():
    from smartexec._context import InContext, on_threads

    assert on_threads(seventh, contextvars.Context()) is seventh
    assert isinstance(on_threads(seventh, contextvars.copy_context()), InContext) == (
        len(contextvars.copy_context()) > 0
    )
