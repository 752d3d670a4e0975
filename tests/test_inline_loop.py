"""A map run as a loop in the calling thread: C-level batches, timed between them (pure: no workers)."""

from __future__ import annotations

import types

import pytest

from smartexec._mapping import InlineRun, _TimedItems, inline_batches
from smartexec.tuning import Estimate

pytestmark = pytest.mark.timeout(30)


class Clock:
    """A ``perf_counter`` that only the items move: each call costs what it says, never more.

    The loop's batches are timed on it, so no stall of a busy machine enters
    these tests.
    """

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    from smartexec import _mapping

    fake = Clock()
    monkeypatch.setattr(_mapping, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class ColdFirstCalls:
    """``x * x`` in 0.1 us; its first ``n`` calls take ``seconds`` each (cold caches, a first import)."""

    def __init__(self, clock: Clock, n: int, seconds: float):
        self.clock = clock
        self.n = n
        self.seconds = seconds

    def __call__(self, x: int) -> int:
        if self.n:
            self.n -= 1
            self.clock.now += self.seconds
        else:
            self.clock.now += 1e-7
        return x * x


def run_loop(fn, items, per_item_s, slow_s=None):
    """Run ``items`` through the loop; the verdict moves it once the estimate passes ``slow_s``."""
    estimate = Estimate()
    estimate.seed(per_item_s, 1000, 0.0)
    run = InlineRun(fn, iter(items), estimate, star=False)

    def verdict():
        slow = slow_s is not None and (estimate.per_item_s or 0.0) > slow_s
        return types.SimpleNamespace(inline=not slow, reason="slow")

    def switch(reason):  # pragma: no cover - the loop must not move
        raise AssertionError(reason)

    kinds, results = [], []
    for batch in inline_batches([], run, verdict, switch):
        kinds.append(type(batch))
        results.extend(batch)  # each batch is read before the next is made, as map's reader does
    return kinds, results


def test_a_short_first_batch_does_not_send_tiny_items_one_by_one(clock):
    # The loop's first batch is 16 items: three cold calls of 20 us read as
    # ~4 us an item, over the 1 us under which batches run at C speed, and
    # the next 10 ms of 0.1 us items went one by one past the clock (a
    # stored loop took 29-38 ms where a plain loop took 18-20 ms).
    items = list(range(50_000))
    kinds, results = run_loop(ColdFirstCalls(clock, 3, 20e-6), items, per_item_s=1e-7)
    assert results == [x * x for x in items]
    assert _TimedItems not in kinds, kinds


def test_items_slower_than_a_c_batch_allows_are_timed_one_by_one(clock):
    items = list(range(40))
    kinds, results = run_loop(ColdFirstCalls(clock, 40, 200e-6), items, per_item_s=1e-7)
    assert results == [x * x for x in items]
    assert _TimedItems in kinds, kinds  # 16 items of 200 us: 3.2 ms, measured; the rest is timed


class OneStall:
    """``x * x`` in 0.1 us; item ``at`` takes ``seconds`` (a garbage collection, the machine busy elsewhere)."""

    def __init__(self, clock: Clock, at: int, seconds: float):
        self.clock = clock
        self.at = at
        self.seconds = seconds

    def __call__(self, x: int) -> int:
        self.clock.now += self.seconds if x == self.at else 1e-7
        return x * x


def test_one_stalled_batch_does_not_move_the_loop(clock):
    # Under load, one batch of 0.1 us items read ~100 us an item and sent the
    # rest of a loop to threads after 336 items (CI, py310, a busy machine).
    items = list(range(20_000))
    kinds, results = run_loop(OneStall(clock, 1000, 0.06), items, per_item_s=1e-7, slow_s=50e-6)
    assert results == [x * x for x in items]


def test_items_that_turn_slow_for_good_move_the_loop(clock):
    items = list(range(20_000))
    moved = []

    def switch(reason):
        moved.append(reason)
        raise StopIteration  # ends the test's read: where the rest would go is not this test's

    estimate = Estimate()
    estimate.seed(1e-7, 1000, 0.0)
    run = InlineRun(OneStall(clock, -1, 0.0), iter(items), estimate, star=False)
    slow_from = 1000

    def fn(x):
        clock.now += 2e-3 if x >= slow_from else 1e-7
        return x * x

    run.fn = fn

    def verdict():
        return types.SimpleNamespace(inline=(estimate.per_item_s or 0.0) < 50e-6, reason="slow")

    read = []
    with pytest.raises(RuntimeError):  # StopIteration raised inside a generator
        for batch in inline_batches([], run, verdict, switch):
            read.extend(batch)
    # the C batch that held the turn (items 336-1359), then one timed batch confirms
    assert moved and len(read) < 1360 + 16, len(read)
