"""A submit loop, side by side: ``ThreadPoolExecutor`` against ``SmartExecutor``.

Each round submits ``N`` calls of ``operator.add`` (trivial: the per-submit
overhead is all there is) and of a function that sleeps 1 ms (waiting: a
thread pool's kind of work), then waits for every future; the contenders run
interleaved, in fresh executors each round, and the median of the rounds is
printed per contender, with its ratio to the thread pool. ``smartexec
(threads)`` is ``SmartExecutor(prefer="threads")``: the thread route's own
overhead, with no learning; ``smartexec`` is the default, which starts both
callables on fork workers and moves them to threads from what their first
submits measured (issue 14).

Timings on a shared machine vary by tens of percent: read the ratios, which
are taken within one round.

Run: ``python benchmarks/bench_submit.py [N] [ROUNDS]`` (default 20000 and 5).
"""

from __future__ import annotations

import operator
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from smartexec import SmartExecutor


def sleep_1ms(x: int) -> int:
    time.sleep(0.001)
    return x


def _loop(make: Callable[[], Executor], fn: Callable[..., Any], n: int) -> float:
    """Seconds from the executor's creation to the end of its ``with`` block."""
    start = time.perf_counter()
    with make() as ex:
        futures = [
            ex.submit(fn, i, 1) if fn is operator.add else ex.submit(fn, i) for i in range(n)
        ]
        for future in futures:
            future.result()
    return time.perf_counter() - start


CONTENDERS: dict[str, Callable[[], Executor]] = {
    "ThreadPoolExecutor": ThreadPoolExecutor,
    "smartexec (threads)": lambda: SmartExecutor(prefer="threads"),
    "smartexec": SmartExecutor,
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    workloads: list[tuple[str, Callable[..., Any], int]] = [
        ("operator.add", operator.add, n),
        ("sleep 1 ms", sleep_1ms, max(1, n // 20)),
    ]
    for label, fn, count in workloads:
        times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        for _ in range(rounds):
            for name, make in CONTENDERS.items():
                times[name].append(_loop(make, fn, count))
        base = statistics.median(times["ThreadPoolExecutor"])
        print(f"{count} submits of {label} (median of {rounds}, interleaved):")
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(
                f"  {name:20} {median * 1e6 / count:8.1f} us/call  "
                f"{median / base:5.2f}x ThreadPoolExecutor"
            )
        with SmartExecutor() as ex:
            for i in range(50):
                (ex.submit(fn, i, 1) if fn is operator.add else ex.submit(fn, i)).result()
            print("  smartexec routes it, after 50 submits:", ex.explain(fn).backend)


if __name__ == "__main__":
    main()
