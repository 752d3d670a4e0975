"""Many tiny items: the cost of sending work to processes (docs/problems.md, problem 4).

The trap: a process pool pays a fixed cost for every submission -- pickling,
two trips through a pipe, waking a worker -- of a few hundred microseconds.
With ``chunksize=1`` (the ``ProcessPoolExecutor.map`` default) a function that
takes a microsecond costs a thousand times more in a pool than in a loop.

What SmartExecutor does instead: with no ``chunksize`` given, ``map`` runs
the first items in the calling thread to measure them; when a plain loop is
predicted to be at least as fast as any worker (as it is here), the whole map
stays there, and otherwise chunks are sized from the measured per-item time
(docs/tuning.md). The script compares that with chunksize=1, with a chunksize
picked by hand, and with ``backend="inline"`` (always the calling thread).

Run:
    python examples/tiny_items.py            # 20,000 calls
    python examples/tiny_items.py --small    # 5,000 calls

Set SMARTEXEC_EXAMPLES_SMALL=1 to get --small without the flag.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from collections.abc import Callable

from smartexec import SmartExecutor


def tiny(x: int) -> int:
    """About a microsecond of work."""
    return (x * x + 7) % 1_000_003


def _timed(
    label: str, run: Callable[[], list], n_items: int, serial_s: float | None = None
) -> tuple[float, list]:
    """Run ``run()``, print how long it took; return (seconds, its results)."""
    start = time.perf_counter()
    results = run()
    elapsed = time.perf_counter() - start
    assert len(results) == n_items
    ratio = "" if serial_s is None else f" {elapsed / serial_s:8,.1f}x the serial time"
    print(f"{label:48} {elapsed * 1e3:8.1f} ms ({elapsed / n_items * 1e6:6.1f} us/item){ratio}")
    return elapsed, results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small",
        action="store_true",
        default=bool(os.environ.get("SMARTEXEC_EXAMPLES_SMALL")),
        help="fewer calls (finishes in a second or two)",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)

    n_items = 5_000 if args.small else 20_000
    # chunksize=1 costs hundreds of microseconds per item: time it on a slice.
    n_slow = 500 if args.small else 2_000
    items = list(range(n_items))
    print(f"{n_items:,} calls of tiny(); {args.workers} workers\n")

    serial_s, expected = _timed("serial loop", lambda: [tiny(x) for x in items], n_items)

    with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        pool.submit(abs, 0).result()  # start the workers outside the timing
        slow_s, _ = _timed(
            f"ProcessPoolExecutor, chunksize=1, {n_slow:,} items",
            lambda: list(pool.map(tiny, items[:n_slow])),
            n_slow,
        )
        print(
            f"{'':48} -> all {n_items:,} items would take "
            f"{slow_s / n_slow * n_items / serial_s:,.0f}x the serial time"
        )
        hand = max(1, n_items // (4 * args.workers))
        _timed(
            f"ProcessPoolExecutor, chunksize={hand:,} (by hand)",
            lambda: list(pool.map(tiny, items, chunksize=hand)),
            n_items,
            serial_s,
        )

    with SmartExecutor(args.workers) as ex:
        print("\nex.explain(tiny):")
        print("  " + str(ex.explain(tiny)).replace("\n", "\n  ") + "\n")
        cold_s, results = _timed(
            "SmartExecutor.map, no chunksize given (cold)",
            lambda: list(ex.map(tiny, items)),
            n_items,
            serial_s,
        )
        assert results == expected, "SmartExecutor results differ from the serial loop"
        warm_s, results = _timed(
            "SmartExecutor.map, same executor again (warm)",
            lambda: list(ex.map(tiny, items)),
            n_items,
            serial_s,
        )
        assert results == expected
        ran = ex.decisions()[-1]
        print(f"{'':48} this map ran on {ran.backend}: {ran.reasons[0]}")

    with SmartExecutor(backend="inline") as ex:
        _, results = _timed(
            'SmartExecutor(backend="inline").map',
            lambda: list(ex.map(tiny, items)),
            n_items,
            serial_s,
        )
        assert results == expected

    print("\nresults equal the serial loop: OK")


if __name__ == "__main__":
    main()
