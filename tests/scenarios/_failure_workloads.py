"""Objects that fail on one side of the pickle trip (importable, so workers find them)."""

from __future__ import annotations

import os
import pickle
import sys
import time


def _raise_unpickling() -> None:
    raise pickle.UnpicklingError("this object refuses to be rebuilt")


def _exit() -> None:
    sys.exit(3)


class FailsToUnpickle:
    """Pickles fine; rebuilding it raises UnpicklingError (in whichever process)."""

    def __reduce__(self):
        return _raise_unpickling, ()


class ExitsOnUnpickle:
    """Pickles fine; rebuilding it raises SystemExit."""

    def __reduce__(self):
        return _exit, ()


class FailsToPickle:
    """Pickling it raises PicklingError."""

    def __reduce__(self):
        raise pickle.PicklingError("this object refuses to be pickled")


class ExitsOnPickle:
    """Pickling it raises SystemExit."""

    def __reduce__(self):
        _exit()


def identity(x):
    return x


def make(cls):
    """Return a new ``cls()``: the result is what fails on its way back."""
    return cls()


def raise_system_exit():
    sys.exit(5)


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def square(x):
    return x * x


def wait_for_file(path, started=None, limit_s=30.0):
    """Block until ``path`` exists (the test's gate), at most ``limit_s`` seconds.

    With ``started``, first append a line to that file (the test waits for it).
    """
    if started is not None:
        append_line(started, os.getpid())
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def append_line(path, text):
    """Record that this call ran (one line per call)."""
    with open(path, "a") as f:
        f.write(f"{text}\n")
    return text
