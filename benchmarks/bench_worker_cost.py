"""A settled map's cost per item on process workers, against the stdlib's pools (issue 34, item 2).

Each contender starts its pool, runs one map to warm it (smartexec's first
map also measures and settles its route), then times a second map of the
same work: what a long-running program pays per item once nothing is left
to learn. These are warm figures by design; ``benchmarks/bench_cold.py``
has the cold ones. Contenders are interleaved over the rounds, each round
in a fresh process per contender; the table gives medians and the ratio of
each smartexec backend to the best stdlib pool (and, for its loky route, to
loky's own executor: spawned workers differ from forked ones by themselves).

    python benchmarks/bench_worker_cost.py [--rounds 5] [--items 20000] [--item-us 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _header  # noqa: E402

CONTENDERS = ("mp-pool", "ppe", "loky", "smartexec-fork", "smartexec-loky")


def work(n: int) -> int:
    """Pure Python, about ``n`` loop iterations: the same work for every contender."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def _timed_map(contender: str, items: list[int], chunksize: int) -> tuple[float, float]:
    """(warm-up map seconds, timed map seconds) for one contender, in this process."""
    if contender == "mp-pool":
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
            t0 = time.perf_counter()
            pool.map(work, items, chunksize=chunksize)
            t1 = time.perf_counter()
            pool.map(work, items, chunksize=chunksize)
            return t1 - t0, time.perf_counter() - t1
    if contender == "ppe":
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor() as ex:
            t0 = time.perf_counter()
            list(ex.map(work, items, chunksize=chunksize))
            t1 = time.perf_counter()
            list(ex.map(work, items, chunksize=chunksize))
            return t1 - t0, time.perf_counter() - t1
    if contender == "loky":  # loky's own executor: what its spawned workers cost by themselves
        from loky import get_reusable_executor

        ex = get_reusable_executor(max_workers=os.cpu_count() or 1)
        t0 = time.perf_counter()
        list(ex.map(work, items, chunksize=chunksize))
        t1 = time.perf_counter()
        list(ex.map(work, items, chunksize=chunksize))
        elapsed = time.perf_counter() - t1
        ex.shutdown(wait=True)
        return t1 - t0, elapsed
    from smartexec import SmartExecutor

    backend = contender.split("-", 1)[1]
    with SmartExecutor(backend=backend) as ex:
        t0 = time.perf_counter()
        list(ex.map(work, items))
        t1 = time.perf_counter()
        list(ex.map(work, items))
        return t1 - t0, time.perf_counter() - t1


def child(spec: dict[str, object]) -> None:
    items = [int(spec["loop"])] * int(spec["items"])  # type: ignore[call-overload]
    warm, timed = _timed_map(str(spec["contender"]), items, int(spec["chunksize"]))  # type: ignore[call-overload]
    print(json.dumps({"warm_up_s": warm, "timed_s": timed}), flush=True)


def calibrate(item_us: float) -> int:
    """Loop iterations for about ``item_us`` microseconds of :func:`work`."""
    n = 10_000
    start = time.perf_counter()
    work(n)
    per_iteration = (time.perf_counter() - start) / n
    return max(1, round(item_us * 1e-6 / per_iteration))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh runs per contender (median)")
    parser.add_argument("--items", type=int, default=20_000, help="items per map")
    parser.add_argument("--item-us", type=float, default=50.0, help="microseconds per item")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    loop = calibrate(args.item_us)
    chunksize = max(1, args.items // (4 * cpus))  # multiprocessing.Pool.map's own heuristic
    print(
        f"python {sys.version.split()[0]}, smartexec {_header.version('smartexec')} "
        f"@ {_header.commit(HERE)}, load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"{args.items} items of ~{args.item_us:g} us pure Python ({loop} iterations), "
        f"{cpus} CPUs; stdlib pools at chunksize {chunksize} (len / (4 x workers)); "
        f"smartexec chooses its own; rounds {args.rounds}\n"
    )
    timed: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for round_ in range(args.rounds):
        for contender in CONTENDERS:
            spec = {
                "contender": contender,
                "items": args.items,
                "loop": loop,
                "chunksize": chunksize,
            }
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode != 0:
                print(f"{contender}: failed: {out.stderr.strip()[-300:]}")
                continue
            timed[contender].append(json.loads(out.stdout.strip().splitlines()[-1])["timed_s"])
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    medians = {c: statistics.median(v) for c, v in timed.items() if v}
    best_stdlib = min(medians[c] for c in ("mp-pool", "ppe") if c in medians)
    loky = medians.get("loky")
    print(
        f"\n{'contender':16s} {'settled map s':>13s} {'us per item':>11s} "
        f"{'x best stdlib':>13s} {'x loky':>7s}"
    )
    for contender, seconds in medians.items():
        versus_loky = f"{seconds / loky:6.2f}x" if loky and contender.endswith("loky") else ""
        print(
            f"{contender:16s} {seconds:13.3f} {seconds / args.items * 1e6:11.1f} "
            f"{seconds / best_stdlib:12.2f}x {versus_loky:>7s}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
