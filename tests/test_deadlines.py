"""smartexec._deadlines: one thread keeps every deadline; a cancelled one never runs."""

from __future__ import annotations

import threading
import time

import pytest

from smartexec import SmartExecutor
from smartexec._deadlines import call_later
from smartexec.errors import TaskTimeoutError

pytestmark = pytest.mark.timeout(60)


def _deadline_threads() -> int:
    return sum(t.name == "smartexec-deadline" for t in threading.enumerate())


def test_due_callbacks_run_in_order_and_cancelled_ones_never():
    ran: list[str] = []
    done = threading.Event()
    call_later(0.02, lambda: ran.append("second"))
    call_later(0.0, lambda: ran.append("first"))
    call_later(0.01, lambda: ran.append("never")).cancel()
    call_later(0.03, done.set)
    assert done.wait(10)
    assert ran == ["first", "second"]


def test_a_callback_that_raises_does_not_stop_the_others():
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    call_later(0.0, boom)
    call_later(0.01, done.set)
    assert done.wait(10)


def test_many_pending_deadlines_share_one_thread():
    handles = [call_later(30.0, lambda: None) for _ in range(200)]
    assert _deadline_threads() == 1
    for handle in handles:
        handle.cancel()


def _sleepy(x: float) -> float:
    time.sleep(x)
    return x


def test_chunk_timeouts_on_threads_use_the_deadline_thread():
    with SmartExecutor(max_workers=2, backend="thread", task_timeout=2.0) as ex:
        assert list(ex.map(_sleepy, [0.001] * 40, chunksize=2)) == [0.001] * 40
        assert _deadline_threads() <= 1
    with SmartExecutor(max_workers=2, backend="thread", task_timeout=0.05) as ex:
        with pytest.raises(TaskTimeoutError):
            list(ex.map(_sleepy, [0.5], chunksize=1))
