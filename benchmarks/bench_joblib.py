"""joblib's own default backend (loky) against the smartexec joblib backend, same Parallel calls.

Three workloads, each a plain ``Parallel(n_jobs)(delayed(f)(x) for x in items)``:

1. **closure**: a lambda over a local variable, about 1 ms of pure Python per
   item (joblib's loky pickles it with cloudpickle; smartexec sends it to fork
   workers by value).
2. **big bound method**: ``delayed(model.score)`` where ``model`` holds a
   100 MB array and each call reads a little of it (loky memmaps the array to a
   file for each call; smartexec's fork workers inherit it by copy-on-write).
3. **tiny items**: 20,000 calls of a one-line function (both auto-batch).
4. **repeated array**: one array of ``--big-mb`` MB passed as the argument of
   16 tasks, each summing a slice of it (loky memmaps it to a file once;
   smartexec's send-once cache gives it to each worker once).

Every contender gets the same items and must return the serial loop's results.
Rounds are interleaved (loky, smartexec, then smartexec, loky, ...) and each
cell is the median; read the ratio column, not the absolute times (the machine
is shared). Before the rounds, each backend's first call on the workload is
timed apart ("first" columns): on the first row, loky's includes starting its
reusable workers, which later calls (as in any process that has called joblib
before) find running. smartexec starts its workers in every call
(``terminate`` shuts them down) and that is inside all its timings.

Run: ``python benchmarks/bench_joblib.py [--rounds N] [--n-jobs N]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import joblib
import numpy as np
from joblib import Parallel, delayed, parallel_config

import smartexec
import smartexec.joblib  # noqa: F401  (registers "smartexec")


def python_work(n: int, salt: int) -> int:
    total = salt
    for i in range(n):
        total = (total * 31 + i) % 1_000_003
    return total


class Model:
    """An object holding a big array; ``score`` reads a thousand of its values."""

    def __init__(self, nbytes: int):
        self.weights = np.linspace(0.0, 1.0, nbytes // 8)

    def score(self, i: int) -> float:
        start = (i * 7919) % (self.weights.size - 1000)
        return float(self.weights[start : start + 1000].sum())


def tiny(x: int) -> int:
    return x * 2 + 1


def slice_sum(array: np.ndarray, i: int) -> float:
    """Sum a thousandth of ``array``, from the ``i``-th part on."""
    step = max(1, array.size // 1000)
    return float(array[i * step : (i + 1) * step].sum())


def loop_for(seconds: float) -> int:
    """Iterations of python_work that take about ``seconds`` here."""
    n = 20_000
    start = time.perf_counter()
    python_work(n, 0)
    per = (time.perf_counter() - start) / n
    return max(1, int(seconds / per))


def workloads(big_bytes: int) -> list[tuple[str, object]]:
    n = loop_for(0.001)
    salt = 3
    model = Model(big_bytes)

    def closure():
        return [delayed(lambda x: python_work(n, salt + x))(x) for x in range(400)]

    def bound():
        return [delayed(model.score)(i) for i in range(200)]

    def tinies():
        return [delayed(tiny)(x) for x in range(20_000)]

    def repeated():
        return [delayed(slice_sum)(model.weights, i) for i in range(16)]

    return [
        ("closure (400 x 1 ms)", closure),
        (f"big bound method ({big_bytes >> 20} MB, 200 items)", bound),
        ("tiny items (20,000)", tinies),
        (f"repeated array ({big_bytes >> 20} MB, 16 tasks)", repeated),
    ]


def run(backend: str, calls, n_jobs: int) -> tuple[float, list]:
    start = time.perf_counter()
    if backend == "loky":
        results = Parallel(n_jobs=n_jobs)(calls())
    else:
        with parallel_config(backend="smartexec", n_jobs=n_jobs):
            results = Parallel()(calls())
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=-1)
    parser.add_argument("--big-mb", type=int, default=100)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, n_jobs={args.n_jobs}, Python {platform.python_version()}, "
        f"joblib {joblib.__version__}, smartexec {smartexec.__version__}, "
        f"{args.rounds} interleaved rounds (median)"
    )
    print(
        f"{'workload':<40} {'loky first':>10} {'smx first':>10} {'loky':>8} {'smartexec':>10} "
        f"{'loky/smx':>9}"
    )
    for title, calls in workloads(args.big_mb << 20):
        expected = [fn(*a, **k) for fn, a, k in calls()]
        first = {}
        for backend in ("loky", "smartexec"):
            t, got = run(backend, calls, args.n_jobs)
            assert got == expected, (title, backend)
            first[backend] = t
        times: dict[str, list[float]] = {"loky": [], "smartexec": []}
        order = ["loky", "smartexec"]
        for _ in range(args.rounds):
            for backend in order:
                t, got = run(backend, calls, args.n_jobs)
                assert got == expected, (title, backend)
                times[backend].append(t)
            order.reverse()
        loky, smx = (statistics.median(times[b]) for b in ("loky", "smartexec"))
        print(
            f"{title:<40} {first['loky']:>9.3f}s {first['smartexec']:>9.3f}s "
            f"{loky:>7.3f}s {smx:>9.3f}s {loky / smx:>8.2f}x"
        )
    from joblib.externals.loky import get_reusable_executor

    get_reusable_executor().shutdown(wait=True)


if __name__ == "__main__":
    main()
