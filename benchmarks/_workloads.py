"""Work functions for the benchmarks, in an importable module (pickled by reference)."""

from __future__ import annotations

import os
import time

import numpy as np


def noop(x):
    return x


def spin(seconds):
    """Hold the GIL for about ``seconds`` (pure-Python loop); return it."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return seconds


def window_mean(window):
    return float(np.mean(window))


def windows(n, width=21, seed=0):
    data = np.random.default_rng(seed).random(n + width)
    return [data[i : i + width] for i in range(n)]


def lognormal_durations(n, mean_s=0.001, sigma=1.0, seed=0):
    """Heavy-tailed durations with the given mean (fixed seed)."""
    mu = np.log(mean_s) - sigma**2 / 2
    return np.random.default_rng(seed).lognormal(mu, sigma, n).tolist()


# -- GIL workloads (benchmarks/bench_gil.py; issue 4) ---------------------------


def python_loop(n):
    """Pure-Python loop: holds the GIL throughout."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def matrix_product(a):
    return float((a @ a).sum())


def sort_median(a):
    return float(np.sort(a)[len(a) // 2])


def sha256_hex(data):
    import hashlib

    return hashlib.sha256(data).hexdigest()


def compressed_size(data):
    import zlib

    return len(zlib.compress(data))


def sleep_10ms(i):
    time.sleep(0.01)
    return i


def file_size(path):
    """Read a whole file from disk: its pages are dropped from the page cache first."""
    with open(path, "rb") as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return len(f.read())


def half_python_half_numpy(args):
    """About half the time in a Python loop, half in ``np.sort`` (sized by the caller)."""
    n, a = args
    return python_loop(n) + float(np.sort(a)[0])


def loop_size_for(seconds):
    """Iterations of ``python_loop`` that take about ``seconds`` here (best of 3 timings)."""
    n = 20_000
    while True:
        took = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            python_loop(n)
            took = min(took, time.perf_counter() - start)
        if took > 0.005:
            return max(1, int(n * seconds / took))
        n *= 2
