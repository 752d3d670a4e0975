"""DESIGN.md problem 4: tiny items travel in chunks, not one by one."""

from __future__ import annotations

import pytest

from smartexec import SmartExecutor
from smartexec.backends.fork import ForkBackend
from smartexec.tuning import CHUNKS_PER_WORKER, default_chunksize

pytestmark = pytest.mark.timeout(60)


def noop(x):
    return x


def test_default_chunksize_gives_a_few_chunks_per_worker():
    assert default_chunksize(20_000, 2) == 20_000 // (2 * CHUNKS_PER_WORKER)
    assert default_chunksize(3, 2) == 1
    assert default_chunksize(0, 2) == 1
    assert default_chunksize(10_000, 4, in_process=True) == 1


def test_map_sends_few_chunks_for_many_tiny_items(monkeypatch):
    sizes = []
    original = ForkBackend.submit_chunk

    def spy(self, fn, chunk):
        sizes.append(len(chunk))
        return original(self, fn, chunk)

    monkeypatch.setattr(ForkBackend, "submit_chunk", spy)
    with SmartExecutor(2) as ex:
        assert list(ex.map(noop, range(20_000))) == list(range(20_000))
    assert len(sizes) == 2 * CHUNKS_PER_WORKER
    assert sum(sizes) == 20_000


def test_explicit_chunksize_is_honoured(monkeypatch):
    sizes = []
    original = ForkBackend.submit_chunk

    def spy(self, fn, chunk):
        sizes.append(len(chunk))
        return original(self, fn, chunk)

    monkeypatch.setattr(ForkBackend, "submit_chunk", spy)
    with SmartExecutor(2) as ex:
        list(ex.map(noop, range(10), chunksize=4))
    assert sizes == [4, 4, 2]
