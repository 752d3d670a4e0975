"""smartexec._sender: which chunks pickle in the caller's thread, and the ordered sender."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from smartexec._sender import MAX_QUICK_BYTES, Sender, quick_to_pickle

pytestmark = pytest.mark.timeout(30)


def square(x):
    return x * x


class Point:
    def __init__(self, x):
        self.x = x


def calls(*args, **kwargs):
    return [(args, kwargs)]


@pytest.mark.parametrize(
    "args",
    [
        (1, 2.5, "text", b"bytes", None, True),
        ([1, 2, (3, 4)], {"a": [1.0, 2.0]}, frozenset({1})),
        (np.arange(1000),),
    ],
)
def test_plain_data_pickles_in_the_callers_thread(args):
    assert quick_to_pickle(square, calls(*args))
    assert quick_to_pickle(None, calls(*args))  # a fork worker's shared reference


@pytest.mark.parametrize(
    "args",
    [
        (Point(1),),  # the user's class: its __reduce__ may do anything
        ([Point(1)],),
        ("x" * (MAX_QUICK_BYTES + 1),),
        (list(range(10_000)),),  # too many objects to look at
        (np.array([Point(1)], dtype=object),),
    ],
)
def test_anything_else_goes_to_the_sender(args):
    assert not quick_to_pickle(square, calls(*args))


def test_a_callable_that_is_not_a_plain_function_goes_to_the_sender():
    assert not quick_to_pickle(Point(1).__init__, calls(1))
    big = Point(1)
    assert not quick_to_pickle(lambda: big, calls())  # its closure holds an object
    assert quick_to_pickle(len, calls([1]))


def test_the_sender_runs_jobs_in_order_on_a_named_thread_that_ends_when_idle():
    seen: list[tuple[int, str]] = []
    sender = Sender("test")
    for i in range(20):
        sender.put(lambda i=i: seen.append((i, threading.current_thread().name)))
    sender.wait_idle()
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"smartexec-test-sender"}
    assert sender.idle()
    assert sender._thread is None  # it exited once nothing was left


def test_a_paused_sender_runs_nothing_until_resumed():
    ran = threading.Event()
    sender = Sender("test")
    assert sender.pause()
    sender.put(ran.set)
    assert not ran.wait(0.2)
    sender.resume()
    assert ran.wait(10)
