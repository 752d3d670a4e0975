"""docs/problems.md, problem 1: GIL-releasing work goes to threads, GIL-holding work to processes."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib

import numpy as np
import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(60)


def python_loop(n):
    total = 0
    for i in range(n):
        total += i * i
    return total, os.getpid()


@pytest.mark.parametrize("fn", [time.sleep, hashlib.sha256, zlib.compress, np.sqrt])
def test_gil_releasing_callables_run_on_threads_in_this_process(fn):
    with SmartExecutor(2) as ex:
        assert ex.explain(fn).backend == "thread"


def test_sleeps_overlap_on_threads():
    seen = set()

    def record_thread(seconds):
        seen.add(threading.get_ident())
        time.sleep(seconds)

    with SmartExecutor(4, prefer="threads") as ex:
        list(ex.map(record_thread, [0.2] * 8))
    assert len(seen) > 1


def test_pure_python_loop_runs_in_other_processes():
    with SmartExecutor(2) as ex:
        assert ex.explain(python_loop).backend == "fork"
        results = list(ex.map(python_loop, [10_000] * 6, chunksize=1))
    assert all(total == python_loop(10_000)[0] for total, _ in results)
    assert os.getpid() not in {pid for _, pid in results}


def test_prefer_processes_overrides_the_gil_hint():
    with SmartExecutor(2, prefer="processes") as ex:
        assert ex.explain(zlib.compress).backend == "fork"
