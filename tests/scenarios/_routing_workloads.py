"""Workloads for the route-from-evidence tests (importable: they pickle by reference)."""

from __future__ import annotations

import os
import time

import numpy as np


def meet(x, folder):
    """(pid, met): item 0 and item 1 each wait (up to 20 s) until the other has started.

    ``met`` is True for both only when two workers ran them at the same time;
    items from 2 on return at once.
    """
    if x >= 2:
        return os.getpid(), True
    open(os.path.join(folder, f"started-{x}"), "w").close()
    other = os.path.join(folder, f"started-{1 - x}")
    deadline = time.monotonic() + 20
    while not os.path.exists(other):
        if time.monotonic() > deadline:
            return os.getpid(), False
        time.sleep(0.001)
    return os.getpid(), True


def _nap(seconds):
    """``time.sleep`` through a helper: the code hint reads no further, so
    the waiting workloads here start on processes, as unmeasured waiting
    code does (a socket read, a query), and move from what they measure."""
    time.sleep(seconds)


def wait_10ms(x):
    _nap(0.01)
    return x


def python_5ms(x):
    total = 0
    end = time.thread_time() + 0.005
    while time.thread_time() < end:
        total += 1
    return x


def python_5ms_one_stall(x):
    """5 ms of pure Python, except item 1, which stalls (sleeps) 150 ms."""
    if x == 1:
        time.sleep(0.15)
        return x
    return python_5ms(x)


def square(x):
    return x * x


def doubled(x):
    return x * 2


def square_or_wait(x):
    """``x * x`` for non-negative ``x``; a negative one waits 2 ms first."""
    if x < 0:
        time.sleep(0.002)
    return x * x


class Token:
    """A result that a weak reference can watch."""

    def __init__(self, x):
        self.x = x


def token(x):
    return Token(x)


def array_sum(a):
    return float(a.sum())


def busy_5us(x):
    """``x``, after 5 us of pure-Python work: cheap enough (under 50 us) to decide early."""
    end = time.perf_counter() + 5e-6
    while time.perf_counter() < end:
        pass
    return x


def sleep_once(x):
    """Straight-line code calling ``time.sleep``: the code hint starts it on threads."""
    time.sleep(0.005)
    return x


def einsum_total(a):
    """Straight-line code calling numpy: the code hint starts it on threads."""
    return float(np.einsum("i,i->", a, a))


def misleading(n):
    """Straight-line code calling ``time.sleep(0)``, then ``sum(range(n))``, which holds the GIL.

    The code hint starts it on threads; what its first chunks measure there
    moves it to processes.
    """
    time.sleep(0)
    return sum(range(n))


class PidNumber(int):
    """An int whose products are the pid of the process that computed them."""

    def __mul__(self, other):
        return os.getpid()

    __rmul__ = __mul__
