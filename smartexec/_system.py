"""What the host allows: start methods, usable CPU count, GIL state.

Everything here is read from the running interpreter and operating system; the
routing policy receives it as a :class:`Platform` value so that it stays a pure
function that tests can feed any platform they like.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
from dataclasses import dataclass

__all__ = [
    "Platform",
    "current_platform",
    "usable_cpu_count",
    "fork_is_available",
    "mark_worker_process",
    "WORKER_ENV",
]

#: Set to "1" in the environment of every smartexec worker process (and so
#: of the processes it starts).
WORKER_ENV = "SMARTEXEC_WORKER"


def mark_worker_process() -> None:
    """Mark this process as a smartexec worker (called first thing in a worker)."""
    os.environ[WORKER_ENV] = "1"
    current_platform.cache_clear()


@dataclass(frozen=True)
class Platform:
    """The facts about the host that routing depends on.

    Attributes:
        start_methods: multiprocessing start methods this platform offers, e.g.
            ``("fork", "spawn", "forkserver")`` on Linux.
        cpu_count: CPUs this process may use (affinity and cgroup quota applied).
        gil_enabled: False on a free-threaded build running without the GIL.
        python: ``sys.version_info[:2]``.
        in_worker: this process is a smartexec worker (``SMARTEXEC_WORKER=1``
            in its environment): an executor created inside a task runs
            process work inline rather than oversubscribing the cores.
    """

    start_methods: tuple[str, ...]
    cpu_count: int
    gil_enabled: bool
    python: tuple[int, int]
    in_worker: bool = False

    @property
    def has_fork(self) -> bool:
        """True when the "fork" start method is offered and considered safe."""
        return "fork" in self.start_methods


def fork_is_available() -> bool:
    """Return True when worker processes may be started with ``fork``.

    macOS offers ``fork`` but system frameworks are not fork-safe there
    (CPython switched its default to "spawn" in 3.8 for that reason), so it is
    treated as unavailable; Windows has no ``fork``.
    """
    if sys.platform == "darwin":
        return False
    return "fork" in multiprocessing.get_all_start_methods()


def usable_cpu_count() -> int:
    """Return how many CPUs this process may use, at least 1.

    Delegates to loky's ``cpu_count``, which applies the scheduler affinity
    mask and cgroup CPU quotas (as seen in containers), falling back to
    ``os.sched_getaffinity`` and ``os.cpu_count``.
    """
    try:
        from loky import cpu_count

        return max(1, int(cpu_count()))
    except Exception:  # pragma: no cover - loky is a hard dependency
        if hasattr(os, "sched_getaffinity"):
            return max(1, len(os.sched_getaffinity(0)))
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def current_platform() -> Platform:
    """Return the :class:`Platform` of the running interpreter.

    Read once per process (reading cgroup quotas costs tens of microseconds,
    which a tiny map would notice); call ``current_platform.cache_clear()``
    after changing the process's CPU affinity.
    """
    methods = tuple(
        m for m in multiprocessing.get_all_start_methods() if m != "fork" or fork_is_available()
    )
    gil_check = getattr(sys, "_is_gil_enabled", None)
    return Platform(
        start_methods=methods,
        cpu_count=usable_cpu_count(),
        gil_enabled=True if gil_check is None else bool(gil_check()),
        python=(sys.version_info[0], sys.version_info[1]),
        in_worker=os.environ.get(WORKER_ENV) == "1",
    )
