"""Functions that read module-level values a test changes between maps (see test_stale_data).

Importable, so process workers reach them by reference: a forked worker reads
this module as it was when it forked.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

SCALE = 1
CONFIG = {"factor": 1}
TABLE = np.ones(1 << 20)  # 8 MiB: more than a proof hashes


class Settings:
    factor = 1


def scaled(x):
    return x * SCALE


def configured(x):
    return x * CONFIG["factor"]


def tabled(x):
    return x * float(TABLE[0])


def by_class(x):
    return x * Settings.factor


def through_a_helper(x):
    return scaled(x) + 0


def negated(x):
    return -x


_FILLED = None
_LOCK = threading.Lock()


def filled(x):
    """Fills a module-level cache once per process: its worker's own."""
    global _FILLED
    if _FILLED is None:
        _FILLED = (os.getpid(), time.monotonic_ns())
    return _FILLED


def locked(x):
    with _LOCK:  # a lock cannot be pickled: each worker keeps its own
        return x * SCALE
