"""Callables that act on an object of this process run on threads, never on a copy in a worker."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import io
import queue
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from smartexec import SmartExecutor
from smartexec._system import Platform
from smartexec.effects import process_local_reason
from smartexec.inspection import CallableProfile, PayloadSize, inspect_callable
from smartexec.policy import Options, decide

pytestmark = pytest.mark.timeout(60)

LINUX = Platform(("fork", "spawn", "forkserver"), 2, True, (3, 12))


class Model:
    def __init__(self) -> None:
        self.weights = np.ones(10)

    def score(self, x: float) -> float:
        return float(self.weights.sum() * x)


def _shared_objects() -> list[object]:
    return [
        queue.Queue().get,
        queue.Queue().put,
        queue.SimpleQueue().put,
        queue.PriorityQueue().get,
        threading.Event().wait,
        threading.Event().set,
        threading.Lock().acquire,
        threading.RLock().release,
        threading.Condition().notify_all,
        threading.BoundedSemaphore().acquire,
        threading.Barrier(2).wait,
        cf.Future().set_result,
    ]


def _builtin_mutators() -> list[object]:
    return [
        [].append,
        {}.__setitem__,
        {}.get,
        set().add,
        bytearray().extend,
        collections.deque().append,
        collections.OrderedDict().__setitem__,
        io.StringIO().write,
        np.zeros(3).fill,
        functools.partial([].append),
        functools.partial(list.append, []),  # bound by hand
        collections.Counter().update,  # a standard-library container's Python method
        functools.partial(collections.Counter.update, collections.Counter()),
    ]


def _random_generators() -> list[object]:
    return [
        random.Random(1).random,
        random.Random(1).randint,  # a Python-level method
        random.randint,  # the module's hidden generator
        np.random.default_rng(1).integers,
        np.random.RandomState(1).randint,
    ]


@pytest.mark.parametrize("fn", _shared_objects(), ids=lambda fn: repr(fn)[:40])
def test_methods_of_thread_shared_objects_are_named(fn):
    reason = process_local_reason(fn)
    assert reason is not None and "between this process's threads" in reason


@pytest.mark.parametrize("fn", _builtin_mutators(), ids=lambda fn: repr(fn)[:40])
def test_builtin_methods_of_mutable_objects_are_named(fn):
    reason = process_local_reason(fn)
    assert reason is not None and "would use a copy" in reason


@pytest.mark.parametrize("fn", _random_generators(), ids=lambda fn: repr(fn)[:40])
def test_methods_of_random_generators_are_named(fn):
    reason = process_local_reason(fn)
    assert reason is not None and "the same numbers in every worker" in reason


def test_an_asyncio_event_loop_is_shared_with_this_process():
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        assert process_local_reason(loop.call_soon_threadsafe) is not None
    finally:
        loop.close()


@pytest.mark.parametrize(
    "fn",
    [
        len,
        abs,
        "-".join,
        (3).__add__,
        re.compile("a+").findall,
        Model().score,  # the user's own class: sharing it with fork workers is the point
        Model,
        functools.partial(pow, 2),
        functools.partial(str.upper, "a"),  # an immutable object, bound by hand
        lambda x: x,
    ],
    ids=lambda fn: repr(fn)[:40],
)
def test_pure_and_user_callables_are_not_named(fn):
    assert process_local_reason(fn) is None
    assert inspect_callable(fn).in_process is None


def test_the_policy_puts_them_on_threads_before_every_row_but_backend():
    why = "it is a built-in method of a list of this process"
    big = PayloadSize(1 << 30, capped=True)
    prof = CallableProfile("bound_method", "list.append", True, big, "__self__", in_process=why)
    every = (
        Options(),
        Options(prefer="processes"),
        Options(stoppable=True),
        Options(initializer=True),
        Options(retires_workers=True),
    )
    for options in every:
        decision = decide(prof, LINUX, options)
        assert decision.backend == "thread" and why in decision.reasons, options
    assert decide(prof, LINUX, Options(backend="fork")).backend == "fork"


def test_a_submitted_wait_is_woken_by_this_process():
    # On a fork worker, event.wait() waited for ever on a copy of the event.
    event = threading.Event()
    with SmartExecutor(2) as ex:
        waiting = ex.submit(event.wait, 30)
        event.set()
        assert waiting.result(timeout=30) is True
        assert ex.explain(event.wait).backend == "thread"


def test_a_queue_filled_and_drained_through_the_executor():
    # Consumers wait first, producers come after (a ThreadPoolExecutor's
    # threads are enough for both: as many workers as calls).
    q: queue.Queue[int] = queue.Queue()
    with SmartExecutor(8) as ex:
        getters = [ex.submit(q.get, True, 30) for _ in range(3)]
        for f in [ex.submit(q.put, i) for i in range(3)]:
            f.result(timeout=30)
        assert sorted(f.result(timeout=30) for f in getters) == list(range(3))


def test_a_map_of_append_fills_the_callers_list():
    seen: list[int] = []
    counts: dict[int, int] = {}
    with SmartExecutor(2, prefer="processes") as ex:
        assert list(ex.map(seen.append, range(200))) == [None] * 200
        list(ex.map(counts.__setitem__, range(50), range(50)))
    assert sorted(seen) == list(range(200))
    assert counts == {i: i for i in range(50)}


def test_a_map_of_a_seeded_generator_draws_each_number_once():
    # On fork workers each drew from its own copy of the same state: 9 to
    # 18 distinct values of 40.
    rng = random.Random(0)
    with SmartExecutor(2, prefer="processes") as ex:
        drawn = list(ex.map(rng.randint, [0] * 40, [10**9] * 40))
    assert len(set(drawn)) == 40


def _noop() -> None:
    pass


def test_an_initializer_does_not_send_them_to_processes():
    seen: list[int] = []
    with SmartExecutor(2, initializer=_noop) as ex:
        assert ex.explain(seen.append).backend == "thread"
        list(ex.map(seen.append, range(100)))
    assert sorted(seen) == list(range(100))


def test_a_joblib_batch_that_mixes_them_stays_here():
    # A batch of different callables went to fork on joblib's module-level
    # caller: each item's bound method was pickled, its writes lost.
    joblib = pytest.importorskip("joblib")
    import smartexec.joblib  # noqa: F401  (registers the backend)

    odd: list[int] = []
    even: list[int] = []
    with joblib.parallel_config(backend="smartexec", n_jobs=2):
        joblib.Parallel(batch_size=10)(
            joblib.delayed((odd if i % 2 else even).append)(i) for i in range(100)
        )
    assert sorted(odd) == list(range(1, 100, 2)) and sorted(even) == list(range(0, 100, 2))


def test_the_user_can_still_force_a_process_backend():
    seen: list[int] = []
    with SmartExecutor(2, backend="fork") as ex:
        assert ex.explain(seen.append).backend == "fork"


def test_reading_a_method_imports_nothing_of_numpy_it_had_not():
    # numpy loads numpy.random lazily: a method's first map paid ~10 ms for
    # it, though no object here can be one of its generators before.
    code = (
        "import sys, numpy, smartexec.effects as e\n"
        "class Box:\n"
        "    def get(self, i):\n"
        "        return i\n"
        "assert 'numpy.random' not in sys.modules\n"
        "e.process_local_reason(Box().get)\n"
        "assert 'numpy.random' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
