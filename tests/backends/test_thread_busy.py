"""The thread backend's figures for the router: busy thread-seconds, CPU clocks read or not.

The map's router reads them beside the cores the pool's threads wanted
(see ``Evidence.busy_threads``): a pool fed fewer chunks than it has
threads has fewer threads to be runnable.
"""

from __future__ import annotations

import time

import pytest

from smartexec.backends.thread import ThreadBackend

pytestmark = pytest.mark.timeout(60)


def test_busy_seconds_count_chunks_and_calls_not_idle_threads():
    backend = ThreadBackend(4, 2)
    try:
        assert backend.threads_busy_s() == 0.0
        futures = [backend.submit_chunk(time.sleep, [((0.2,), {})]) for _ in range(2)]
        time.sleep(0.1)
        running = backend.threads_busy_s()  # two chunks under way: counted to now
        assert running >= 0.1
        for future in futures:
            future.result(timeout=30)
        done = backend.threads_busy_s()
        assert done >= 0.4 and done >= running
        time.sleep(0.2)  # idle threads add nothing
        assert backend.threads_busy_s() == pytest.approx(done)
        backend.submit_call(time.sleep, (0.1,), {}).result(timeout=30)
        assert backend.threads_busy_s() - done >= 0.1
    finally:
        backend.shutdown(wait=True)


def test_an_unclocked_chunk_reads_no_cpu_clock_and_is_no_evidence():
    # Reading a thread's CPU clock costs it its turn on a busy machine: chunks
    # whose CPU seconds no router reads skip it, and say so (-1.0).
    from smartexec._rerouting import Evidence

    backend = ThreadBackend(2, 2)
    try:
        calls = [((x,), {}) for x in range(3)]
        clocked = backend.submit_chunk(abs, calls).result(timeout=30)
        plain = backend.submit_chunk(backend.unclocked(abs), calls).result(timeout=30)
        timed = backend.submit_chunk(backend.unclocked(abs), calls, timeout_s=30).result(timeout=30)
    finally:
        backend.shutdown(wait=True)
    assert clocked.cpu_s >= 0.0
    assert plain.cpu_s == timed.cpu_s == -1.0
    assert [v for _, v in plain.outcomes] == [v for _, v in timed.outcomes] == [0, 1, 2]
    found = Evidence(2)
    found.add(3, plain.compute_s, plain.cpu_s, None)
    assert found.items == 0 and not found.per_item


class _Wrapping(ThreadBackend):
    """A plugin's thread backend that wraps the callable it is sent."""

    name = "wrapping-threads"

    def submit_chunk(self, fn, chunk, budget_s=None, **kwargs):
        def traced(*args, **kw):
            return fn(*args, **kw)

        return super().submit_chunk(traced, chunk, budget_s, **kwargs)


def test_a_subclass_that_overrides_submit_chunk_gets_the_callable_itself():
    # Backend.submit_chunk promises what prepare() returned: a subclass that
    # wraps it must not get the unclocked marker.
    backend = _Wrapping(2, 2)
    try:
        assert backend.unclocked(abs) is abs
        result = backend.submit_chunk(backend.unclocked(abs), [((-2,), {})]).result(timeout=30)
    finally:
        backend.shutdown(wait=True)
    assert result.outcomes == [(True, 2)]
    assert result.cpu_s >= 0.0
