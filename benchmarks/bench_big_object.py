"""Big bound object: SmartExecutor against a hand-written fork pool + module-level wrapper.

Two scenarios, each run side by side in one process, alternating contenders
over several rounds (the machine is shared and noisy: read the ratios, not the
absolute times). Every timing includes starting the workers.

1. The anchor from our design notes: an object holding 100 MB, read by 32 tiny tasks.
2. The demo's workload (issue 2): ``NgramIndex.rarity`` of a 256 MiB index,
   one query per ``.py`` file of the stdlib.

Contenders: a hand-written ``multiprocessing`` fork pool whose workers reach
the object through a module-level global and wrapper function (the best known
manual fix); ``SmartExecutor()`` with no hints; and, on a few items only
because it pickles the whole object per task, a stdlib ``ProcessPoolExecutor``
given the bound method.

Run: ``python benchmarks/bench_big_object.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from smartexec import SmartExecutor, demo

_OBJECT = None  # the hand-written trampoline's global


def _hand_call(args):
    method, item = args
    return getattr(_OBJECT, method)(item)


def hand_fork_pool(obj, method, items, workers, chunksize):
    """The manual fix: set a global, fork, call through a module-level function."""
    global _OBJECT
    _OBJECT = obj
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_hand_call, [(method, item) for item in items], chunksize)
    finally:
        _OBJECT = None


class Holder:
    """An object holding a big array; ``read`` is tiny work."""

    def __init__(self, nbytes: int):
        self.data = np.ones(nbytes // 8)

    def read(self, i: int) -> float:
        return float(self.data[i * 1000])


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def compare(title, obj, method, items, workers, rounds, pickling_items):
    bound = getattr(obj, method)
    expected = [bound(item) for item in items]
    chunksize = max(1, -(-len(items) // (workers * 4)))
    times = {"hand fork pool + wrapper": [], "SmartExecutor": []}
    for _ in range(rounds):
        t, got = timed(lambda: hand_fork_pool(obj, method, items, workers, chunksize))
        assert got == expected
        times["hand fork pool + wrapper"].append(t)

        def smart():
            with SmartExecutor(workers) as ex:
                return list(ex.map(bound, items))

        t, got = timed(smart)
        assert got == expected
        times["SmartExecutor"].append(t)
    with SmartExecutor(workers) as ex:
        decision = ex.explain(bound)
    print(f"\n## {title}: {len(items)} items, {workers} workers, {rounds} rounds (median)")
    print(f"   SmartExecutor decision: {decision.backend}, share={decision.share}")
    hand = statistics.median(times["hand fork pool + wrapper"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"   {name:28} {median * 1000:9.1f} ms   ratio to hand {median / hand:5.2f}x")
    if pickling_items:
        sub = items[:pickling_items]
        with ProcessPoolExecutor(workers) as pool:
            t, got = timed(lambda: list(pool.map(bound, sub)))
        assert got == expected[:pickling_items]
        per_item = t / len(sub)
        print(
            f"   {'ProcessPoolExecutor (stdlib)':28} {t * 1000:9.1f} ms for only {len(sub)} items "
            f"= {per_item * 1000:.0f} ms/item; x{len(items)} items ~ {per_item * len(items):.1f} s "
            f"~ {per_item * len(items) / hand:.0f}x the hand pool"
        )
    return statistics.median(times["SmartExecutor"]) / hand


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    ratio1 = compare(
        "100 MB object read by 32 tasks",
        Holder(100_000_000),
        "read",
        list(range(32)),
        args.workers,
        args.rounds,
        pickling_items=4,
    )
    paths = [p for p in demo.list_files(demo.default_root()) if p.endswith(".py")]
    demo.warm_page_cache(paths)
    index = demo.NgramIndex(paths)
    ratio2 = compare(
        "demo index: NgramIndex.rarity over the stdlib .py files",
        index,
        "rarity",
        paths,
        args.workers,
        args.rounds,
        pickling_items=2,
    )
    print(
        f"\nSmartExecutor / hand-written fork + wrapper: {ratio1:.2f}x (100 MB x 32), "
        f"{ratio2:.2f}x (demo index)"
    )


if __name__ == "__main__":
    main()
