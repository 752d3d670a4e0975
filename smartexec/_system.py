"""What the host allows: start methods, usable CPU count, GIL state.

Everything here is read from the running interpreter and operating system; the
routing policy receives it as a :class:`Platform` value so that it stays a pure
function that tests can feed any platform they like.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal without its enum wrappers
import atexit
import contextlib
import functools
import multiprocessing
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Platform",
    "current_platform",
    "usable_cpu_count",
    "fork_is_available",
    "mark_worker_process",
    "deferred_interrupts",
    "interpreter_exiting",
    "alive",
    "sched_times",
    "SchedReader",
    "IDLE_TICK_S",
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


#: cgroup v2's CPU bandwidth file, then v1's quota and period (microseconds).
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"
CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def _read_words(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii") as file:
            return file.read().split()
    except (OSError, ValueError):
        return []


def cgroup_cpu_limit() -> int | None:
    """CPUs the process's cgroup CPU quota allows (rounded up), or None without a quota.

    Reads cgroup v2's ``cpu.max`` (``"<quota> <period>"`` or ``"max ..."``),
    else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (a quota of -1:
    none). None where neither exists (not Linux, or no cgroup mounted).
    """
    words = _read_words(CGROUP_CPU_MAX)
    if len(words) != 2:
        words = _read_words(CGROUP_V1_QUOTA)[:1] + _read_words(CGROUP_V1_PERIOD)[:1]
    if len(words) != 2 or words[0] == "max":
        return None
    try:
        quota, period = int(words[0]), int(words[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return -(-quota // period)


def usable_cpu_count() -> int:
    """Return how many CPUs this process may use, at least 1.

    The least of ``os.cpu_count()``, the scheduler affinity mask, the cgroup
    CPU quota (as set in containers, :func:`cgroup_cpu_limit`) and the
    ``LOKY_MAX_CPU_COUNT`` environment variable when set (loky's ``cpu_count``
    counts the same; not imported for it, as importing loky costs ~10 ms
    on the way to a fork pool's first result).
    """
    counts = [os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):
        with contextlib.suppress(OSError):
            counts.append(len(os.sched_getaffinity(0)))
    limit = cgroup_cpu_limit()
    if limit is not None:
        counts.append(limit)
    with contextlib.suppress(ValueError):
        counts.append(int(os.environ.get("LOKY_MAX_CPU_COUNT", counts[0])))
    return max(1, min(counts))


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


class _DeferredInterrupts:
    """The context manager :func:`deferred_interrupts` returns (one per block)."""

    __slots__ = ("previous", "frame", "held")

    def __enter__(self) -> None:
        self.previous: Any = None
        self.held = False
        if threading.current_thread() is not threading.main_thread():
            return
        # _signal, not signal: the latter's enum conversions cost ~3 us a call,
        # and this runs for every chunk pickled in the caller's thread.
        previous = _signal.getsignal(_signal.SIGINT)
        if not callable(previous) or isinstance(getattr(previous, "__self__", None), type(self)):
            return  # no Python handler, or an outer block holds it already
        self.previous = previous
        _signal.signal(_signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: Any) -> None:
        if not self.held:
            self.held, self.frame = True, frame

    def __exit__(self, *exc: Any) -> None:
        previous = self.previous
        if previous is None:
            return
        if _signal.getsignal(_signal.SIGINT) == self._hold:  # else the program changed it
            _signal.signal(_signal.SIGINT, previous)
        if self.held:
            previous(_signal.SIGINT, self.frame)


def deferred_interrupts() -> contextlib.AbstractContextManager[None]:
    """Hold a Ctrl-C that arrives inside the block until the block ends.

    For the few steps that make a resource and hand it to its owner (a
    shared-memory segment to its registry, a chunk's segments to its future):
    a ``KeyboardInterrupt`` raised between two of them (Python raises it at any
    bytecode, and inside any lock wait of the main thread) would leave the
    resource with no owner until the interpreter exits. Python runs signal
    handlers in the main thread only, so elsewhere this does nothing; so too
    when SIGINT has no Python handler (``SIG_IGN``, ``SIG_DFL``). The
    program's own handler is put back, and called once the block ends if
    SIGINT arrived meanwhile, whatever the block raised. Nested blocks defer
    to the outermost. About 2 us a block in the main thread.

    Returns:
        A context manager; use it once, in ``with``.
    """
    return _DeferredInterrupts()


_exiting = False


def interpreter_exiting() -> bool:
    """Whether the interpreter's shutdown has begun (``threading``'s exit hooks run).

    From then on nothing may start workers: their exit hooks could no longer run.
    """
    return _exiting


def _mark_interpreter_exit() -> None:
    global _exiting
    _exiting = True


# Runs before atexit handlers, as concurrent.futures' own hook does.
getattr(threading, "_register_atexit", atexit.register)(_mark_interpreter_exit)


def alive(pid: int) -> bool:
    """Return True while process ``pid`` runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat[stat.rfind(")") + 2 :][:1] != "Z"


# -- Linux scheduler statistics: a thread's CPU and queued time, the machine's idle time


def sched_times(native_id: int | None = None) -> tuple[float, float] | None:
    """A thread's seconds on a CPU and seconds queued for one (default: the caller's).

    Linux reports both in ``/proc/self/task/<tid>/schedstat`` (nanoseconds:
    time on a CPU, time runnable but waiting for one); None where that file
    cannot be read.
    """
    tid = threading.get_native_id() if native_id is None else native_id
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _tick_s() -> float:
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 0.01


#: Seconds per tick of the idle time in ``/proc/stat`` (``USER_HZ``, 10 ms
#: on Linux): its first line sums the CPUs' idle (and I/O wait) time and
#: rounds it to whole ticks, so a difference of two readings is off by up
#: to a tick each.
IDLE_TICK_S = _tick_s()


class SchedReader:
    """:func:`sched_times` of several threads, read through descriptors kept open.

    A map on threads reads its pool threads' figures at each of its first
    results. ``open()`` makes about seven system calls a file, each letting
    go of the GIL, and getting it back waits behind the pool's threads: six
    threads' files cost the caller 0.4-0.7 ms a reading (6-10 ms over a map
    of 64 numpy items, a fifth of the map). One ``pread`` per thread on a
    kept descriptor costs about 1 us. Thread-safe; :meth:`close` when done.
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self._stat_fd: int | None = None
        self._lock = threading.Lock()
        self._closed = False

    def idle_s(self) -> float | None:
        """Seconds the machine's CPUs spent idle since boot, summed over them, or None.

        The idle and I/O-wait ticks of the first line of ``/proc/stat``
        (Linux), in whole ticks of :data:`IDLE_TICK_S`. The whole machine: a
        competing process's CPU time is not idle, nor are this process's
        threads'. None where that file cannot be read (then not tried
        again), and once :meth:`close` was called.
        """
        with self._lock:
            if self._closed or self._stat_fd == -1:
                return None
            try:
                if self._stat_fd is None:
                    self._stat_fd = os.open("/proc/stat", os.O_RDONLY)
                fields = os.pread(self._stat_fd, 256, 0).split(b"\n", 1)[0].split()
                if fields[0] != b"cpu":
                    raise ValueError(fields[0])
                return (int(fields[4]) + int(fields[5])) * IDLE_TICK_S
            except (OSError, ValueError, IndexError):
                if self._stat_fd is not None and self._stat_fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(self._stat_fd)
                self._stat_fd = -1  # not here: not tried again
                return None

    def read(self, native_id: int) -> tuple[float, float] | None:
        """``(seconds on a CPU, seconds queued for one)`` of a thread of this process, or None.

        None too once :meth:`close` was called (no descriptor is opened then).
        """
        with self._lock:
            if self._closed:
                return None
            fd = self._fds.get(native_id)
            try:
                if fd is None:
                    fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
                    self._fds[native_id] = fd
                fields = os.pread(fd, 128, 0).split()
                return int(fields[0]) / 1e9, int(fields[1]) / 1e9
            except (OSError, ValueError, IndexError):
                self._forget(native_id)  # the thread ended (its file is gone), or no schedstat
                return None

    def keep_only(self, native_ids: set[int]) -> None:
        """Close the descriptors of threads not in ``native_ids`` (they ended)."""
        with self._lock:
            for native_id in [n for n in self._fds if n not in native_ids]:
                self._forget(native_id)

    def _forget(self, native_id: int) -> None:
        fd = self._fds.pop(native_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Close every descriptor; read no more (idempotent)."""
        with self._lock:
            self._closed = True
            for native_id in list(self._fds):
                self._forget(native_id)
            if self._stat_fd is not None and self._stat_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self._stat_fd)
            self._stat_fd = None
