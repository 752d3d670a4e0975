"""How often one map's measurements settle a route right: the checks a unit test cannot make.

The test suite asserts what holds on every run (right results, the start
route, no move the wrong way) and tests the routes each measured kind gives
with fixed figures. Whether a real measurement reads a callable's GIL use
right on the first map depends on the machine: a busy one (a VM's stolen
time, another test run) delays the GIL sampler's wake-ups, which reads as
held GIL, and a map then stays undecided or starts on processes. This
script runs each scenario ``--runs`` times, each from a clean start (no
stored profile, no GIL measurement), and prints how many came out as
expected; run it alone, and again beside a competing load, to see what
holds under load.

Scenarios (from tests/scenarios, where each was once a retry loop):

* ``holds on fork``: 5 ms of pure Python per item, on fork: the watches
  agree it holds the GIL (the map stays on fork).
* ``holds on threads``: the same started on threads by a stale "releases":
  read as holding the GIL, never as waiting.
* ``hint proven wrong``: straight-line code calling ``time.sleep(0)`` then
  ``sum(range(n))``: started on threads by its code, moved to fork.
* ``first map: NAME``: issue 4's workloads, with ``allow_inline=True``: the
  first map measures the GIL kind and routes by it.
* ``loop turns slow``: 2,000 items of 10 us then 400 of 2 ms: a loop in the
  calling thread that moves to fork.

Run: ``python benchmarks/soak_routing.py [--runs 5] [--only TEXT]``
Prints one line per scenario: runs as expected out of runs, and seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import _header  # noqa: E402

from smartexec import SmartExecutor, _profiles, gil  # noqa: E402
from tests.scenarios import _routing_workloads as rw  # noqa: E402
from tests.scenarios.test_chunksize import fast_then_slow  # noqa: E402
from tests.scenarios.test_gil import _inputs  # noqa: E402

#: Issue 4's workloads: (name, the route their kind gives, the kinds accepted).
FIRST_MAPS = [
    ("python_loop", "fork", {"holds"}),
    ("half_python_half_numpy", "fork", {"holds"}),
    ("matrix_product", "thread", {"releases"}),
    ("sort_median", "thread", {"releases"}),
    ("sha256_hex", "thread", {"releases"}),
    ("compressed_size", "thread", {"releases"}),
    ("sleep_10ms", "thread", {"waits"}),
    ("file_size", "thread", {"waits", "releases"}),
]


def _fresh(fn: Callable[..., object]) -> None:
    gil.forget(fn)
    _profiles.clear()


def holds_on_fork() -> bool:
    _fresh(rw.python_5ms)
    with SmartExecutor(max_workers=2) as ex:
        list(ex.map(rw.python_5ms, range(80)))
        last = ex.decisions()[-1]
    return last.backend == "fork" and "holds" in last.reasons[0]


def holds_on_threads() -> bool:
    _fresh(rw.python_5ms)
    gil.remember(rw.python_5ms, gil.GilProfile("releases", 10, 0.05, 1.0, 0.0, 100))
    try:
        with SmartExecutor() as ex:
            list(ex.map(rw.python_5ms, range(120)))
            log = "\n".join(map(str, ex.decisions()))
    finally:
        gil.forget(rw.python_5ms)
    return "kind: holds" in log and "kind: waits" not in log


def hint_proven_wrong() -> bool:
    _fresh(rw.misleading)
    with SmartExecutor(max_workers=2) as ex:
        list(ex.map(rw.misleading, [300_000] * 80))
        ended = ex.decisions()[-1]
    return ended.backend == "fork"


def first_map(name: str, backend: str, kinds: set[str], tmp: Path) -> Callable[[], bool]:
    def run() -> bool:
        fn, items = _inputs(name, tmp)
        _fresh(fn)
        with SmartExecutor(2, allow_inline=True) as ex:
            list(ex.map(fn, items))
            after = ex.explain(fn)
        return after.gil is not None and after.gil.kind in kinds and after.backend == backend

    return run


def loop_turns_slow() -> bool:
    _fresh(fast_then_slow)
    with SmartExecutor(2, allow_inline=True) as ex:
        list(ex.map(fast_then_slow, range(2400)))
        moved = [d for d in ex.decisions() if "items inline" in d.reasons[0]]
    return bool(moved) and moved[-1].backend == "fork"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="clean runs per scenario")
    parser.add_argument("--only", default="", help="scenarios whose name contains this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        scenarios: list[tuple[str, Callable[[], bool]]] = [
            ("holds on fork", holds_on_fork),
            ("holds on threads", holds_on_threads),
            ("hint proven wrong", hint_proven_wrong),
            *((f"first map: {n}", first_map(n, b, k, tmp)) for n, b, k in FIRST_MAPS),
            ("loop turns slow", loop_turns_slow),
        ]
        print(
            f"# smartexec {_header.version('smartexec')} at {_header.commit(HERE)}, "
            f"{os.cpu_count()} CPUs, {args.runs} clean runs per scenario"
        )
        print(f"{'scenario':<36} {'as expected':>12} {'seconds':>8}")
        for label, scenario in scenarios:
            if args.only not in label:
                continue
            start = time.perf_counter()
            hits = sum(scenario() for _ in range(args.runs))
            seconds = time.perf_counter() - start
            print(f"{label:<36} {f'{hits}/{args.runs}':>12} {seconds:8.1f}")


if __name__ == "__main__":
    main()
