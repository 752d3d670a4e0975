"""An input error met while a map moves backend is raised at its place (found by a breaker).

A map that moves the rest of its items (``RoutedMap.move``) opens a stream on the
new backend, whose first read may meet the input's error. That error belongs
to the map at its position: raised after every result before it, whichever
backend ran them, never swallowed (the old code stayed on the old backend and
read on: a generator's map ended early with no error, an iterator's skipped
the failed item). With ``ordered=False`` too, the old backend's chunks still
running come out before it.
"""

from __future__ import annotations

import sys
import time

import pytest

from smartexec import SmartExecutor, gil
from smartexec import _routed_map as routed_map
from smartexec._chunk_stream import ChunkStream
from smartexec._rerouting import Reroute

pytestmark = pytest.mark.timeout(120)


class Boom(Exception):
    pass


def sleepy(x):
    # Items 2-5 (the first window, on fork) run long: the move's stream meets
    # the input's error while they still run.
    time.sleep(0.5 if 2 <= x <= 5 else 0.002)
    return x


def _in_the_move() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "move":
            return True
        frame = frame.f_back
    return False


def failing_at_the_move(n, after=0):
    """Yield 0..n-1; raise Boom ``after`` items into the move's first read."""
    moved_at = None
    for i in range(n):
        if moved_at is None and _in_the_move():
            moved_at = i
        if moved_at is not None and i == moved_at + after:
            raise Boom(i)
        yield i


class FailingIterator:
    """As failing_at_the_move(n), but it goes on after raising (a bad record skipped)."""

    def __init__(self, n):
        self.i, self.n, self.failed = 0, n, None

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        if self.failed is None and _in_the_move():
            self.failed = self.i
            self.i += 1
            raise Boom(self.failed)
        self.i += 1
        return self.i - 1


def _after_two_chunks(self):
    """Evidence.ready after two chunks of one item each, a worker's first call (a warm-up) or not."""
    return len(self.per_item) + len(self.lone_firsts) + len(self.warm_ups) >= 2


@pytest.fixture
def forced_move(monkeypatch):
    """The next routed map starts on fork and moves to threads after its first two chunks."""
    gil.forget(sleepy)  # an earlier test's measurement would start it on threads
    # The new stream's first read must reach the input: chunks taken back
    # from the old one (ChunkStream.take_back) would fill its first window.
    monkeypatch.setattr(ChunkStream, "take_back", lambda self: [])
    monkeypatch.setattr(routed_map.Evidence, "ready", _after_two_chunks)
    monkeypatch.setattr(
        routed_map,
        "reroute",
        lambda evidence, **kw: Reroute("thread", {}, "moved by the test"),
    )


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("after", [0, 3])
def test_a_generator_failing_as_the_map_moves_raises_after_the_results_before_it(
    forced_move, ordered, after
):
    got = []
    with SmartExecutor(max_workers=2) as ex:
        assert ex.explain(sleepy).backend == "fork"
        with pytest.raises(Boom) as raised:
            for value in ex.map(sleepy, failing_at_the_move(2000, after), ordered=ordered):
                got.append(value)
        log = "\n".join(map(str, ex.decisions()))
    assert "moved by the test" in log, log
    failed_at = raised.value.args[0]
    assert sorted(got) == list(range(failed_at))  # every result before it, none after
    if ordered:
        assert got == list(range(failed_at))


def test_an_iterator_failing_as_the_map_moves_is_not_skipped(forced_move):
    items = FailingIterator(2000)
    got = []
    with SmartExecutor(max_workers=2) as ex:
        assert ex.explain(sleepy).backend == "fork"
        with pytest.raises(Boom):
            for value in ex.map(sleepy, items):
                got.append(value)
    assert items.failed is not None
    assert got == list(range(items.failed))
