"""Sending a closure or a lambda to worker processes (docs/problems.md, problem 3).

The trap: the standard library pickles a function *by reference* (module name
plus qualified name), and a function created inside another function, or a
lambda, has no name a worker could import. ``ProcessPoolExecutor`` therefore
fails with a pickling error before any work runs.

What SmartExecutor does instead: ``explain()`` shows that it recognises the
closure and the lambda, and routes them to *loky* workers, which receive the
function *by value* (cloudpickle serialises its code and captured cells).

Run:
    python examples/closure.py           # 20,000 items
    python examples/closure.py --small   # 2,000 items

Set SMARTEXEC_EXAMPLES_SMALL=1 to get --small without the flag.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import time
from collections.abc import Callable

from smartexec import SmartExecutor

WORDS = "alpha beta gamma delta error warning timeout retry ok done".split()


def make_scorer(weights: dict[str, int], n_words: int) -> Callable[[int], int]:
    """Return a function that scores one simulated log; ``weights`` and
    ``n_words`` are captured in closure cells.

    The returned ``score(seed)`` draws ``n_words`` random words from ``seed``
    and adds up their weights: a few hundred microseconds of pure Python for
    an argument of a few bytes, the kind of work processes speed up.
    """

    def score(seed: int) -> int:
        rng = random.Random(seed)
        return sum(weights.get(word, 0) for word in rng.choices(WORDS, k=n_words))

    return score


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small",
        action="store_true",
        default=bool(os.environ.get("SMARTEXEC_EXAMPLES_SMALL")),
        help="fewer items (finishes in a second or two)",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)

    n_words = 1_000
    seeds = list(range(2_000 if args.small else 20_000))
    score = make_scorer({"error": 5, "warning": 2, "timeout": 3, "retry": 1}, n_words)
    per_word = lambda seed: score(seed) / n_words  # noqa: E731 - the point is a lambda

    print(
        f"mapping a closure and a lambda over {len(seeds):,} simulated logs "
        f"of {n_words:,} words each\n"
    )

    # 1. The standard library cannot send either of them.
    with concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        for fn in (score, per_word):
            try:
                list(pool.map(fn, seeds[:10]))
            except Exception as exc:  # AttributeError or PicklingError, by Python version
                print(
                    f"ProcessPoolExecutor.map({fn.__qualname__}) failed:\n"
                    f"  {type(exc).__name__}: {exc}\n"
                )
            else:  # pragma: no cover - a start method that pickles by value
                print(f"ProcessPoolExecutor.map({fn.__qualname__}) worked here\n")

    # 2. SmartExecutor sends them by value.
    with SmartExecutor(args.workers) as ex:
        for fn in (score, per_word):
            print(f"ex.explain({fn.__qualname__}):")
            print("  " + str(ex.explain(fn)).replace("\n", "\n  "))

            start = time.perf_counter()
            expected = [fn(seed) for seed in seeds]
            serial_s = time.perf_counter() - start

            start = time.perf_counter()
            results = list(ex.map(fn, seeds))
            smart_s = time.perf_counter() - start
            assert results == expected, f"{fn.__qualname__}: results differ from the serial loop"
            ran = ex.decisions()[-1]
            print(f"  this map ran on {ran.backend}: {ran.reasons[0]}")
            print(
                f"  serial loop {serial_s:.2f} s | SmartExecutor.map {smart_s:.2f} s "
                f"({serial_s / smart_s:.2f}x the serial speed) | results equal: OK\n"
            )
        if any(d.backend == "loky" and d.chunksize for d in ex.decisions()):
            print("(the first map that reached loky also paid for starting its workers)")


if __name__ == "__main__":
    main()
