"""Mapping a method of an object that holds a big array (docs/problems.md, problem 2).

The trap: ``pool.map(obj.method, items)`` on a process pool pickles ``obj``
-- array and all -- for every task, so a cheap method becomes slower than a
serial loop by orders of magnitude.

What SmartExecutor does instead: ``explain()`` shows that it measures the bound
object, sees that it is far over the 1 MiB threshold, and sends the method to
*fork* workers through a trampoline. The workers inherit the object by
copy-on-write when they are forked; each task carries a token of a few bytes.
The object is never pickled, which this script checks by counting calls to
``__getstate__``.

Run:
    python examples/big_object.py            # ~200 MB array, 20,000 items
    python examples/big_object.py --small    # ~50 MB array, 2,000 items
    python examples/big_object.py --no-baseline   # skip the ProcessPoolExecutor timing

Set SMARTEXEC_EXAMPLES_SMALL=1 to get --small without the flag.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time

import numpy as np

from smartexec import SmartExecutor

#: Elements each item averages: enough to be real work, little enough that a
#: single item stays in the microseconds.
WINDOW = 20_000


class PriceTable:
    """A stand-in for any heavy object: a model, an index, a lookup table.

    Args:
        n_bytes: how big the array of prices should be (bytes).
        seed: seed for the random prices, so that runs are repeatable.
    """

    #: How many times an instance was pickled (in this process).
    pickled = 0

    def __init__(self, n_bytes: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.prices = rng.random(n_bytes // 8)

    def __getstate__(self) -> dict:
        type(self).pickled += 1
        return self.__dict__

    def window_mean(self, item: int) -> float:
        """Mean price over a window that depends on ``item``."""
        start = (item * 7919) % (self.prices.size - WINDOW)
        return float(self.prices[start : start + WINDOW].mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small",
        action="store_true",
        default=bool(os.environ.get("SMARTEXEC_EXAMPLES_SMALL")),
        help="a ~50 MB object and fewer items (finishes in a few seconds)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip timing concurrent.futures.ProcessPoolExecutor",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)

    n_bytes = (50 if args.small else 200) * 1_000_000
    n_items = 2_000 if args.small else 20_000
    n_baseline = 2 if args.small else 4

    table = PriceTable(n_bytes)
    items = range(n_items)
    print(
        f"PriceTable holds {table.prices.nbytes / 1e6:.0f} MB; mapping "
        f"table.window_mean over {n_items:,} items with {args.workers} workers\n"
    )

    start = time.perf_counter()
    expected = [table.window_mean(i) for i in items]
    serial_s = time.perf_counter() - start
    print(f"serial loop:          {serial_s:7.3f} s")

    with SmartExecutor(args.workers) as ex:
        # explain() runs nothing; it says where the call would go and why.
        print("\nex.explain(table.window_mean):")
        print("  " + str(ex.explain(table.window_mean)).replace("\n", "\n  ") + "\n")

        PriceTable.pickled = 0  # explain() sized the object; only count from here
        start = time.perf_counter()
        results = list(ex.map(table.window_mean, items))
        smart_s = time.perf_counter() - start
    assert results == expected, "SmartExecutor results differ from the serial loop"
    assert PriceTable.pickled == 0, f"the table was pickled {PriceTable.pickled} times"
    smart_per_item = smart_s / n_items
    print(
        f"SmartExecutor.map:    {smart_s:7.3f} s  ({n_items / smart_s:,.0f} items/s, "
        f"worker start included); the table was pickled {PriceTable.pickled} times"
    )
    print(f"                      {serial_s / smart_s:7.2f}x the speed of the serial loop")

    if not args.no_baseline:
        # The stdlib pool on only a few items: each one pickles the whole table.
        with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
            pool.submit(abs, 0).result()  # start the workers outside the timing
            PriceTable.pickled = 0
            start = time.perf_counter()
            baseline = list(pool.map(table.window_mean, range(n_baseline)))
            ppe_s = time.perf_counter() - start
        assert baseline == expected[:n_baseline]
        ppe_per_item = ppe_s / n_baseline
        print(
            f"ProcessPoolExecutor:  {ppe_s:7.3f} s  for only {n_baseline} items "
            f"({ppe_per_item * 1e3:,.0f} ms per item); the table was pickled "
            f"{PriceTable.pickled} times"
        )
        print(
            f"\nper item, ProcessPoolExecutor is {ppe_per_item / smart_per_item:,.0f}x slower "
            f"than SmartExecutor; at that rate {n_items:,} items would take "
            f"{ppe_per_item * n_items / 60:,.1f} minutes"
        )

    print("\nresults equal the serial loop: OK")


if __name__ == "__main__":
    main()
