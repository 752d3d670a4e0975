"""Objects that count, in the process that unpickles them, how often they arrived.

The dask tests send them to worker processes and read the counts back with
``client.run(unpickled, token)``: each unpickling in a worker is one transfer
of the object to that worker. (Importable by reference, so workers import
this module rather than receive its code.)
"""

from __future__ import annotations

import uuid
from collections import Counter

import numpy as np

#: token -> times an object with that token was unpickled in this process
UNPICKLED: Counter[str] = Counter()


def unpickled(token: str) -> int:
    """How many times the object with ``token`` was unpickled in this process."""
    return UNPICKLED[token]


class _Counted:
    def __init__(self, nbytes: int):
        self.token = uuid.uuid4().hex
        self.values = np.arange(nbytes // 8, dtype=np.int64)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        UNPICKLED[self.token] += 1


class Model(_Counted):
    """A big object whose bound method is mapped (problem 2 of docs/problems.md)."""

    def score(self, i: int) -> int:
        return int(self.values[(i * 997) % len(self.values)]) + i


class Blob(_Counted):
    """A big argument: ``nbytes`` says how big, as a numpy array's does."""

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)


def lookup(blob: Blob, i: int) -> int:
    return int(blob.values[i])
