"""Workloads for the GIL classification tests (importable: they pickle by reference).

Sizes follow issue 4: a ~10 ms pure-Python loop, numpy matrix product and
sort on arrays of several MB, sha256 and zlib over 4 MiB, a 10 ms sleep, a
file read, and an item that is half Python loop, half numpy.
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib

import numpy as np


def python_loop(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def matrix_product(a):
    return float((a @ a).sum())


def sort_median(a):
    return float(np.sort(a)[len(a) // 2])


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def compressed_size(data):
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


def sort_seconds(a, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.sort(a)
        best = min(best, time.perf_counter() - start)
    return best
