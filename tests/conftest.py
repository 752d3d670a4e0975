"""Suite-wide guards (no test may leave worker processes or shared memory behind) and shared fixtures."""

from __future__ import annotations

import gc
import os
import re
import time

import pytest

from smartexec import _profiles as profiles
from smartexec import _shm as shm
from smartexec import transport

from ._children import child_processes, kill_all

#: Long-lived helper processes that libraries keep on purpose for the whole
#: interpreter (loky's and multiprocessing's resource trackers).
_ALLOWED = ("resource_tracker",)


def _leftovers() -> dict[int, str]:
    return {
        pid: cmd
        for pid, cmd in child_processes(os.getpid()).items()
        if not any(mark in cmd for mark in _ALLOWED)
    }


_OWNER = re.compile(r"(?:loky|joblib_memmapping_folder|^smx)[-_](\d+)[-_]")


def _shm() -> set[str]:
    """Segments in /dev/shm, less those that name another process as their owner.

    loky names its semaphores ``sem.loky-<pid>-...`` and smartexec its segments
    ``smx_<owner pid>_...`` (smartexec/_shm.py): those of other processes (a
    concurrent test run) are not ours to judge.
    """
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return set()
    ours = {os.getpid(), *child_processes(os.getpid())}
    kept = set()
    for name in names:
        owner = _OWNER.search(name)
        if owner is None or int(owner.group(1)) in ours:
            kept.add(name)
    return kept


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves child processes or /dev/shm segments behind."""
    before_children = set(_leftovers())
    before_shm = _shm() | set(shm.live())
    yield
    start = time.monotonic()
    deadline = start + 5.0
    collected = False
    while True:
        extra = {p: c for p, c in _leftovers().items() if p not in before_children}
        # memfds show nowhere else; loky's semaphores go once its executor's
        # finalizers have run, a moment after shutdown on a busy machine.
        new_shm = (_shm() | set(shm.live())) - before_shm
        if (not extra and not new_shm) or time.monotonic() > deadline:
            break
        if new_shm and not collected and time.monotonic() - start > 0.5:
            # Semaphores of a spawn context's queues go when their objects are
            # freed; objects in a reference cycle wait for a collection, which
            # nothing here forces (CI once saw 12 sem.mp-* of an interrupted
            # loky map still there after 5 s). A collection frees them; a
            # segment something still holds stays, and fails the test.
            gc.collect()
            collected = True
        time.sleep(0.05)
    if extra:
        kill_all(extra)
        pytest.fail(f"test left child processes running: {extra}")
    if new_shm:
        pytest.fail(f"test left shared-memory segments: {sorted(new_shm)}")


@pytest.fixture(autouse=True)
def profile_store(tmp_path_factory, monkeypatch):
    """Point the profile store at a fresh directory: no test reads the user's, or another test's."""
    directory = tmp_path_factory.mktemp("smartexec-cache")
    monkeypatch.setenv(profiles.CACHE_DIR_ENV, str(directory))
    monkeypatch.delenv(profiles.CACHE_ENV, raising=False)
    profiles.clear()  # this process's view of the store, too
    return directory


@pytest.fixture
def sent(monkeypatch):
    """Sizes (bytes) of every request the backends pickle."""
    sizes: list[int] = []
    real = transport.dumps_request

    def spy(*args, **kwargs):
        data, lease = real(*args, **kwargs)
        sizes.append(len(data))
        return data, lease

    monkeypatch.setattr(transport, "dumps_request", spy)
    return sizes
