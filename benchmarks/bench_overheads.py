"""Per-backend start-up and per-chunk costs, the constants behind smartexec.tuning.

Prints, for each process and thread backend: the time to start its workers
and run one chunk; the round trip of a one-item chunk minus the worker's
measured compute (median and minimum of 200); and the per-chunk cost with
many chunks in flight. These figures are the ``worker_startup_s`` /
``chunk_overhead_s`` class attributes of the backends. The dask backend is
measured too when ``smartexec[dask]`` is installed (its start-up includes
starting a LocalCluster of 2 worker processes).

Run: ``python benchmarks/bench_overheads.py``
"""

from __future__ import annotations

import statistics
import time

from smartexec.backends.fork import ForkBackend
from smartexec.backends.loky import LokyBackend
from smartexec.backends.thread import ThreadBackend


def noop(x):
    return x


def _backends() -> list[type]:
    classes: list[type] = [ForkBackend, LokyBackend, ThreadBackend]
    try:
        from smartexec.backends.dask import DaskBackend
    except ImportError:
        print("(dask backend not measured: pip install 'smartexec[dask]')")
    else:
        classes.append(DaskBackend)
    return classes


def main() -> None:
    for cls in _backends():
        start = time.perf_counter()
        backend = cls(2, 2)
        backend.submit_chunk(noop, [((1,), {})]).result()
        startup = time.perf_counter() - start
        trips = []
        for _ in range(200):
            start = time.perf_counter()
            result = backend.submit_chunk(noop, [((1,), {})]).result()
            trips.append(time.perf_counter() - start - result.compute_s)
        start = time.perf_counter()
        futures = [backend.submit_chunk(noop, [((1,), {})]) for _ in range(1000)]
        for future in futures:
            future.result()
        pipelined = (time.perf_counter() - start) / 1000
        backend.shutdown()
        print(
            f"{cls.name:6} start-up {startup * 1000:7.1f} ms | one-item round trip "
            f"median {statistics.median(trips) * 1e6:6.0f} us, min {min(trips) * 1e6:6.0f} us | "
            f"pipelined {pipelined * 1e6:6.0f} us per chunk | "
            f"class figures: worker_startup_s={cls.worker_startup_s}, "
            f"chunk_overhead_s={cls.chunk_overhead_s}"
        )


if __name__ == "__main__":  # the dask backend's workers are spawned: they import this module
    main()
