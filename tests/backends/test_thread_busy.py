"""The thread backend's busy thread-seconds: time in chunks and calls, not time idle.

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
