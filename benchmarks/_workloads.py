"""Work functions for the benchmarks, in an importable module (pickled by reference)."""

from __future__ import annotations

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
