"""Workloads for the reliability tests (importable, so they pickle by reference)."""

from __future__ import annotations

import os
import signal
import threading
import time


def kill_self_at(i, victim=3):
    """Item ``victim`` SIGKILLs its own worker; the others sleep 50 ms and return."""
    if i == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    return i


def kill_self_once(i, marker):
    """SIGKILL the worker the first time (``marker`` file absent), succeed after."""
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def sleep_then_return(seconds):
    """Sleep ``seconds`` in naps of at most one second; return ``(seconds, pid)``.

    The naps are a loop, so the code hint (which would start a lone
    ``time.sleep`` on threads) leaves it to processes, where these tests
    stop, kill and count workers.
    """
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return seconds, os.getpid()
        time.sleep(min(left, 1.0))


class NeedsArgs(Exception):
    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")
        self.code = code


def raise_needs_args(code):
    raise NeedsArgs(code, "boom")


def return_a_lock():
    return threading.Lock()


def fail(i):
    raise ValueError(f"item {i}")


def square_by_call(x):
    """``x * x`` through a call: not plain arithmetic, so a first map measures it in workers."""
    return pow(x, 2)


def square(x):
    return x * x


def nested_map(n):
    from smartexec import SmartExecutor

    with SmartExecutor() as ex:
        results = list(ex.map(square, range(n)))
        return results, ex.explain(square).backend, len(ex.decisions())


#: Held by a background thread in test_fork_safety: a worker forked from the
#: parent would inherit it locked.
LOCK = threading.Lock()


def take_the_lock(_):
    got = LOCK.acquire(timeout=5)
    if got:
        LOCK.release()
    return got


def crash_once_each(i, markers):
    """Items listed in ``markers`` (a directory) SIGKILL their worker the first time."""
    marker = os.path.join(markers, str(i))
    if i in (3, 17, 40) and not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return i
