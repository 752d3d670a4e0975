"""A map run as a loop in the calling thread: C-level batches, timed between them (pure: no workers)."""

from __future__ import annotations

import time
import types

import pytest

from smartexec._mapping import InlineRun, _TimedItems, inline_batches
from smartexec.tuning import Estimate

pytestmark = pytest.mark.timeout(30)


class ColdFirstCalls:
    """``x * x``; its first ``n`` calls spin ``seconds`` each (cold caches, a first import)."""

    def __init__(self, n: int, seconds: float):
        self.n = n
        self.seconds = seconds

    def __call__(self, x: int) -> int:
        if self.n:
            self.n -= 1
            end = time.perf_counter() + self.seconds
            while time.perf_counter() < end:
                pass
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
    for batch in inline_batches([], run, lambda: None, verdict, switch):
        kinds.append(type(batch))
        results.extend(batch)  # each batch is read before the next is made, as map's reader does
    return kinds, results


def test_a_short_first_batch_does_not_send_tiny_items_one_by_one():
    # The loop's first batch is 16 items: three cold calls of 20 us read as
    # ~4 us an item, over the 1 us under which batches run at C speed, and
    # the next 10 ms of 0.1 us items went one by one past the clock (a
    # stored loop took 29-38 ms where a plain loop took 18-20 ms).
    items = list(range(50_000))
    kinds, results = run_loop(ColdFirstCalls(3, 20e-6), items, per_item_s=1e-7)
    assert results == [x * x for x in items]
    assert _TimedItems not in kinds, kinds


def test_items_slower_than_a_c_batch_allows_are_timed_one_by_one():
    items = list(range(40))
    kinds, results = run_loop(ColdFirstCalls(40, 200e-6), items, per_item_s=1e-7)
    assert results == [x * x for x in items]
    assert _TimedItems in kinds, kinds  # 16 items of 200 us: 3.2 ms, measured; the rest is timed


class OneStall:
    """``x * x``; item ``at`` first sleeps ``seconds`` (a garbage collection, the machine busy elsewhere)."""

    def __init__(self, at: int, seconds: float):
        self.at = at
        self.seconds = seconds

    def __call__(self, x: int) -> int:
        if x == self.at:
            time.sleep(self.seconds)
        return x * x


def test_one_stalled_batch_does_not_move_the_loop():
    # Under load, one batch of 0.1 us items read ~100 us an item and sent the
    # rest of a loop to threads after 336 items (CI, py310, a busy machine).
    items = list(range(20_000))
    kinds, results = run_loop(OneStall(1000, 0.06), items, per_item_s=1e-7, slow_s=50e-6)
    assert results == [x * x for x in items]
