"""Results as they complete, with a progress bar (``map(..., ordered=False)``).

The trap: items that take very different times. ``map`` hands results out in
input order, so one slow item early in the input holds back every result
behind it, and a progress bar over it stalls, then jumps. Worse, the window of
chunks in flight fills up behind the slow one and the other workers run out
of work.

What ``ordered=False`` does instead: each chunk's results are handed out as
soon as the chunk completes, and the next chunk is sent in its place, so the
bar moves at the pace of the work and the workers stay busy. The results come
as they are, as ``multiprocessing.Pool.imap_unordered`` gives them; the
function returns its item with its result so the caller knows which is which.

The script runs the same map both ways on the thread backend (the items
sleep, as network calls do), each with a progress bar (tqdm; a plain count
without it), prints when the first result came and how long the whole map
took, and checks both against a serial loop.

Run:
    python examples/progress_unordered.py            # 200 items
    python examples/progress_unordered.py --small    # 60 items

Set SMARTEXEC_EXAMPLES_SMALL=1 to get --small without the flag.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from smartexec import SmartExecutor

#: Every SLOW_EVERY-th item (item 0 included) takes SLOW_S seconds; the others FAST_S.
SLOW_EVERY = 25
SLOW_S = 1.0
FAST_S = 0.01


def fetch(item: int) -> tuple[int, int]:
    """Stand-in for a network call of uneven length; returns ``(item, result)``."""
    time.sleep(SLOW_S if item % SLOW_EVERY == 0 else FAST_S)
    return item, item * item


def _progress() -> Any:
    """A tqdm bar when tqdm is installed (``pip install 'smartexec[progress]'``), else none."""
    try:
        import tqdm  # noqa: F401
    except ImportError:
        print("(tqdm is not installed: no bars drawn)")
        return False
    return True


def run(n_items: int, ordered: bool, progress: Any) -> tuple[float, float, list[tuple[int, int]]]:
    """Map ``fetch`` over ``n_items``; return (first result's s, whole map's s, results)."""
    with SmartExecutor(max_workers=4, backend="thread") as ex:
        start = time.perf_counter()
        first = None
        results = []
        for pair in ex.map(fetch, range(n_items), ordered=ordered, progress=progress):
            if first is None:
                first = time.perf_counter() - start
            results.append(pair)
        total = time.perf_counter() - start
        print(f"ran on: {ex.decisions()[-1].backend}")
    assert first is not None
    return first, total, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="60 items instead of 200")
    args = parser.parse_args()
    small = args.small or os.environ.get("SMARTEXEC_EXAMPLES_SMALL") == "1"
    n_items = 60 if small else 200
    progress = _progress()
    serial = [(x, x * x) for x in range(n_items)]

    figures = {}
    for ordered in (True, False):
        label = "in input order" if ordered else "as completed"
        print(f"-- map(fetch, range({n_items}), ordered={ordered}): {label}")
        first, total, results = run(n_items, ordered, progress)
        figures[label] = (first, total)
        if ordered:
            assert results == serial
        else:
            # Every item once, each result with its own item: sorted, the serial loop's.
            assert sorted(results) == serial
            assert results[0][0] % SLOW_EVERY != 0  # a fast item came first
            squares = dict(results)  # item -> result, for whoever needs them by item
            assert all(squares[x] == x * x for x in range(n_items))

    print()
    for label, (first, total) in figures.items():
        print(f"{label:16} first result after {first * 1e3:7.1f} ms, all after {total:5.2f} s")
    print("results checked against a serial loop: equal")


if __name__ == "__main__":
    main()
