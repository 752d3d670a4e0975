"""Cold start of a fork pool for a big bound object: smartexec against a hand-written fork Pool.

The workload of issue 14, item 3: 1,000 calls of a ~1 us method of an object
holding 200 MB, on a fresh executor in a fresh process, timed from the
executor's creation to the end of its ``with`` block. Contenders:

* ``hand``: ``multiprocessing.get_context("fork").Pool`` mapping a module-level
  wrapper that reads the object from a global set before the fork (the best
  known manual fix; ``Pool.map``'s default chunksize);
* ``smart``: ``with SmartExecutor() as ex: list(ex.map(obj.method, items))``.

Each run is a new Python process (the object is built, touched, then timed);
the contenders alternate run by run. Prints the median of each, the ratio
smartexec / hand, the CPU time all processes spent in the timed part (the
workers' and the zygote's included), and where smartexec's time goes (median
of each phase): creation, first result, last result, and the ``with``
block's shutdown.

Run: ``python benchmarks/bench_fork_start.py [--runs 5] [--mb 200] [--items 1000]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

_OBJECT = None  # the hand-written trampoline's global


class Holder:
    """An object holding a big array; ``get`` is about a microsecond of work."""

    def __init__(self, nbytes: int) -> None:
        import numpy as np

        self.data = np.ones(max(1, nbytes // 8))  # written: its pages are mapped
        self.offset = 1

    def get(self, i: int) -> int:
        return i + self.offset


def _wrapper(i: int) -> int:
    assert _OBJECT is not None
    return _OBJECT.get(i)


def _cpu_s() -> float:
    """CPU seconds of this process and of its children reaped so far (workers, zygote)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _child(kind: str, mb: int, items: int) -> dict[str, float]:
    """One timed run in this (fresh) process; returns its phases in seconds."""
    global _OBJECT
    obj = Holder(mb * 1_000_000)
    expected = [i + 1 for i in range(items)]
    if kind == "hand":
        import multiprocessing

        _OBJECT = obj
        cpu = _cpu_s()
        start = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map(_wrapper, range(items))
        end = time.perf_counter()
        assert got == expected
        return {"total": end - start, "cpu": _cpu_s() - cpu}
    from smartexec import SmartExecutor

    cpu = _cpu_s()
    start = time.perf_counter()
    ex = SmartExecutor()
    created = time.perf_counter()
    with ex:
        results = ex.map(obj.get, range(items))
        first = next(results)
        first_at = time.perf_counter()
        got = [first, *results]
        last_at = time.perf_counter()
    end = time.perf_counter()
    assert got == expected
    return {
        "total": end - start,
        "cpu": _cpu_s() - cpu,
        "create": created - start,
        "first": first_at - created,
        "last": last_at - first_at,
        "shutdown": end - last_at,
    }


def _run(kind: str, mb: int, items: int) -> dict[str, float]:
    # Byte-compiled modules as a user has them: without a bytecode cache, each
    # module smartexec imports on the way (lazily) is compiled inside the timing.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--mb", str(mb), "--items", str(items)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--child", choices=["hand", "smart"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.mb, args.items)))
        return
    runs: dict[str, list[dict[str, float]]] = {"hand": [], "smart": []}
    for _ in range(args.runs):
        for kind in runs:
            runs[kind].append(_run(kind, args.mb, args.items))
    hand = statistics.median(r["total"] for r in runs["hand"])
    smart = statistics.median(r["total"] for r in runs["smart"])
    print(
        f"{args.items} calls of a 1 us method, object of {args.mb} MB, median of {args.runs} "
        f"fresh processes"
    )
    print(f"  hand fork Pool.map + wrapper {hand * 1000:7.1f} ms")
    print(f"  SmartExecutor                {smart * 1000:7.1f} ms   ratio {smart / hand:.2f}x")
    hand_cpu = statistics.median(r["cpu"] for r in runs["hand"])
    smart_cpu = statistics.median(r["cpu"] for r in runs["smart"])
    print(
        f"  CPU time, all processes: hand {hand_cpu * 1000:.1f} ms, smartexec "
        f"{smart_cpu * 1000:.1f} ms ({smart_cpu / hand_cpu:.2f}x; less sensitive to a busy machine)"
    )
    phases = ["create", "first", "last", "shutdown"]
    parts = ", ".join(
        f"{p} {statistics.median(r[p] for r in runs['smart']) * 1000:.1f}" for p in phases
    )
    print(f"  smartexec phases (median ms): {parts}")
    ratios = [s["total"] / h["total"] for h, s in zip(runs["hand"], runs["smart"])]
    print("  pairwise ratios: " + " ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
