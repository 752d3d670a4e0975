"""Named shared-memory segments: created once, mapped by name, always unlinked.

:mod:`smartexec.transport` puts big buffers here so that only a segment's
name crosses a pipe. A segment is a POSIX shared-memory object (a file in
``/dev/shm`` on Linux), made with the same primitives as
:class:`multiprocessing.shared_memory.SharedMemory` (``_posixshmem``) but not
through that class, because:

* ``SharedMemory`` maps a segment shared and writable. We map what a worker
  receives copy-on-write (``MAP_PRIVATE``), so a worker's writes stay its own
  and never reach the parent or another task mapping the same segment.
* Before Python 3.13 ``SharedMemory`` registers every *attach* with the
  resource tracker; a loky worker has its own tracker, which unlinks the
  parent's segment when the worker exits and warns about a "leak"
  (CPython gh-82300; 3.13 added ``track=False``). We never register in workers.
* It fills a segment through a mapping: on a full ``/dev/shm`` (Docker gives
  64 MiB by default) a write to a mapped page kills the process with SIGBUS.
  We fill with ``os.write``, which fails with ``ENOSPC`` instead; the caller
  then sends the bytes through the pipe as before.

Names say who must unlink a segment, so that nothing outlives its owner:

* ``smx_<owner pid>_<n>_<random>``: made by the owner (the process that runs
  the executor) for arguments and cached objects. The owner keeps every such
  name in a registry, unlinks it when the chunk (or cached object) is done,
  unlinks whatever is left at interpreter exit, and registers it with the
  stdlib resource tracker, whose separate process unlinks it should the owner
  be killed outright.
* ``smx_<owner pid>_w<worker pid>_<n>_<random>``: made by a worker for a
  result. The owner unlinks it as soon as it has mapped it. If the worker dies
  before the owner reads its reply, :func:`sweep_dead_workers` finds it by the
  dead pid in its name (Linux lists ``/dev/shm``).

An unlinked segment stays readable by every process that has it mapped; its
memory is freed when the last mapping goes away, i.e. when the last array
viewing it dies.
"""

from __future__ import annotations

import atexit
import itertools
import mmap
import os
import secrets
import threading

__all__ = [
    "PREFIX",
    "available",
    "create",
    "attach",
    "unlink",
    "owned",
    "sweep_dead_workers",
    "sweep_owner",
]

try:  # the C helpers behind multiprocessing.shared_memory (POSIX only)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

#: Every segment name starts with this; tests and sweeps look for it.
PREFIX = "smx_"
#: Where Linux shows POSIX shared memory; listed only to sweep.
SHM_DIR = "/dev/shm"
#: Bytes per os.write call (Linux writes at most ~2 GiB at once).
_WRITE_BYTES = 1 << 30

_counter = itertools.count(1)
_lock = threading.Lock()
#: Names this process created for itself and has not unlinked yet.
_owned: set[str] = set()


def available() -> bool:
    """Return True when this platform has POSIX shared memory we can use."""
    return _posixshmem is not None


def _new_name(owner: int | None) -> str:
    tail = f"{next(_counter):x}_{secrets.token_hex(3)}"
    if owner is None:
        return f"{PREFIX}{os.getpid()}_{tail}"
    return f"{PREFIX}{owner}_w{os.getpid()}_{tail}"


def create(data: memoryview, *, owner: int | None = None) -> str:
    """Copy ``data`` into a new segment and return its name.

    Args:
        data: the bytes to store (a C-contiguous memoryview, any format).
        owner: None when this process owns the segment (it will unlink it);
            otherwise the pid of the process that will map and unlink it
            (a worker's result for its parent).

    Returns:
        The segment's name (no leading slash).

    Raises:
        OSError: the segment could not be made or filled, e.g. ``ENOSPC``
            when ``/dev/shm`` is full; nothing is left behind.
        RuntimeError: shared memory is not available (see :func:`available`).
    """
    if _posixshmem is None:
        raise RuntimeError("POSIX shared memory is not available on this platform")
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    while True:
        name = _new_name(owner)
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:  # a leftover of a dead process with our pid
            continue
        break
    if owner is None:
        with _lock:
            _owned.add(name)  # before filling it: an interrupt still finds it
        _track(name)
    try:
        try:
            done = 0
            while done < view.nbytes:
                done += os.write(fd, view[done : done + _WRITE_BYTES])
        finally:
            os.close(fd)
    except BaseException:
        unlink(name)
        raise
    return name


def attach(name: str, nbytes: int, *, private: bool) -> memoryview:
    """Map the first ``nbytes`` of segment ``name``.

    Args:
        name: as returned by :func:`create`.
        nbytes: bytes to map (int > 0).
        private: True maps copy-on-write (``MAP_PRIVATE``): writes stay in
            this process and cost a page copy each; False maps it shared.

    Returns:
        A writable memoryview of the mapping; the mapping is released when
        the view and everything built on it (numpy arrays) are gone.

    Raises:
        FileNotFoundError: the segment no longer exists.
        ValueError: the segment is shorter than ``nbytes``.
    """
    if _posixshmem is None:  # pragma: no cover - nothing could have created one
        raise RuntimeError("POSIX shared memory is not available on this platform")
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY if private else os.O_RDWR, mode=0o600)
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise ValueError(f"shared-memory segment {name} holds {size} bytes, not {nbytes}")
        access = mmap.ACCESS_COPY if private else mmap.ACCESS_WRITE
        mapping = mmap.mmap(fd, nbytes, access=access)
    finally:
        os.close(fd)
    return memoryview(mapping)


def unlink(name: str) -> None:
    """Remove segment ``name``; mappings of it stay valid. No error if gone."""
    if _posixshmem is None:  # pragma: no cover
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    with _lock:
        mine = name in _owned
        _owned.discard(name)
    if mine:
        _untrack(name)


def owned() -> frozenset[str]:
    """Names this process created for itself and has not unlinked yet."""
    with _lock:
        return frozenset(_owned)


def _listed(owner: int) -> list[str]:
    """Segment names in /dev/shm that belong to ``owner`` (empty off Linux)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    start = f"{PREFIX}{owner}_"
    return [n for n in names if n.startswith(start)]


def _worker_pid(name: str) -> int | None:
    parts = name[len(PREFIX) :].split("_")
    if len(parts) > 1 and parts[1].startswith("w") and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return None


def _alive(pid: int) -> bool:
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
    return stat[stat.rfind(")") + 2 :][:1] != "Z"  # a zombie has exited


def sweep_dead_workers(owner: int | None = None) -> list[str]:
    """Unlink the result segments that dead workers made for ``owner``.

    A worker that dies between making a result segment and the owner reading
    its reply leaves the segment behind; its name carries the worker's pid.

    Args:
        owner: the owner's pid; None means this process.

    Returns:
        The names unlinked.
    """
    owner = os.getpid() if owner is None else owner
    gone = []
    for name in _listed(owner):
        pid = _worker_pid(name)
        if pid is not None and not _alive(pid):
            unlink(name)
            gone.append(name)
    return gone


def sweep_owner(owner: int | None = None) -> None:
    """Unlink every segment of ``owner``: its own and its workers' results.

    Only safe once no worker of ``owner`` can still send a reply (at
    interpreter exit, after the backends' exit hooks stopped their workers).
    """
    owner = os.getpid() if owner is None else owner
    if owner == os.getpid():
        for name in owned():
            unlink(name)
    for name in _listed(owner):
        unlink(name)


def _track(name: str) -> None:
    """Let the stdlib resource tracker unlink ``name`` should we be killed."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.register("/" + name, "shared_memory")
    except Exception:  # pragma: no cover - the tracker is only a safety net
        pass


def _untrack(name: str) -> None:
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:  # pragma: no cover
        pass


def _at_exit() -> None:
    # Registered when this module is first imported, before the backends
    # register theirs, so it runs after them (atexit is last-in, first-out):
    # by then their workers have stopped and no reply is still on its way.
    sweep_owner()


atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    # A forked child must not unlink its parent's segments at its own exit.
    with _lock:
        _owned.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
