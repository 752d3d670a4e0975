"""Shared memory for big buffers: anonymous files passed by descriptor, named segments as a fallback.

:mod:`smartexec.transport` puts big buffers here so that only a short handle
crosses a pipe. :func:`create` returns the handle, :func:`attach` maps it in
another process, :func:`unlink` lets go of it.

**Anonymous memory (Linux, the default).** :func:`create` makes a
``memfd_create`` file, fills it with ``os.write`` and keeps its descriptor;
the handle is ``fd:<pid>:<fd>:<inode>``. The reader opens
``/proc/<pid>/fd/<fd>`` (allowed between processes of one user), checks the
inode, maps the file and closes its descriptor: from then on its mapping
holds the memory. The memory is freed by the kernel when its last descriptor
and its last mapping are gone, so **nothing is left to clean up, whichever of
our processes are killed, and however** (``SIGKILL`` of the parent, a
process group killed with its resource tracker, a crash): there is no name
anywhere to sweep.

* A request's buffers (the parent writes, a worker reads) live while the
  parent keeps their descriptors: until the chunk's :class:`~smartexec._object_cache.Lease`
  is released (its future is done), or a cached object is let go.
* A reply's buffers (a worker writes, the parent reads) are made with an
  acknowledgement byte after the data, which :func:`attach` sets once the
  parent has the file open (or, for a reply it will never read,
  :func:`discard`). The worker closes the acknowledged ones within
  :data:`RELEASE_CHECK_S` (a daemon thread checks while it holds some), and
  at its next :func:`create` or :func:`release_acknowledged`. A worker whose
  parent died before reading exits, and its memory goes with it.
* A forked child closes the descriptors it inherited (``register_at_fork``).
* A mapping holds no descriptor (:func:`_map`), on any Python: keeping
  thousands of results needs no open file each.

**Named segments (the fallback)**, where ``os.memfd_create`` or ``/proc``
is missing, ``SMARTEXEC_SHM=named`` is set, this process is not dumpable
(``prctl(PR_SET_DUMPABLE, 0)``, or it dropped privileges: nobody without
``CAP_SYS_PTRACE`` may open its ``/proc/<pid>/fd``; asked at each
:func:`create`), or once a peer's ``/proc/<pid>/fd`` could not be opened
(:func:`use_named`, for the rest of the process's life): a POSIX shared-memory object
(a file in ``/dev/shm``), made with ``_posixshmem`` like
:class:`multiprocessing.shared_memory.SharedMemory`, whose names say who
must unlink it:

* ``smx_<owner pid>_<n>_<random>``: made by the owner (the process that runs
  the executor) for arguments and cached objects. The owner keeps every such
  name in a registry, unlinks it when the chunk (or cached object) is done,
  unlinks whatever is left at interpreter exit, and registers it with the
  stdlib resource tracker, whose separate process unlinks it should the owner
  be killed outright (not when the tracker is killed too).
* ``smx_<owner pid>_w<worker pid>_<n>_<random>``: made by a loky worker for
  a result (a fork worker sends its results in band on this fallback: it
  exits at once when its parent dies, with no chance to unlink them). The
  owner unlinks it as soon as it has mapped it. If the worker dies before the
  owner reads its reply, :func:`sweep_dead_workers` finds it by the dead pid
  in its name (Linux lists ``/dev/shm``); if the owner dies first, the worker
  unlinks it (:func:`release_orphans`) when it notices, or at its exit. Only
  a process group killed at once (workers included) leaves them.

Both kinds are mapped copy-on-write (``MAP_PRIVATE``) by a worker, so its
writes stay its own, and both are filled with ``os.write``, which fails with
``ENOSPC`` on a full ``/dev/shm`` (Docker gives 64 MiB) where a write through a
mapping would kill the process with SIGBUS; the caller then sends the bytes
through the pipe. We never register an *attach* with the resource tracker
(before 3.13 ``SharedMemory`` did, and a loky worker's tracker then unlinked
the parent's segment, CPython gh-82300).
"""

from __future__ import annotations

import atexit
import errno
import itertools
import mmap
import os
import sys
import threading
import time
from typing import Any

from ._system import alive, deferred_interrupts
from ._threads import own_thread

__all__ = [
    "PREFIX",
    "available",
    "anonymous",
    "create",
    "attach",
    "unlink",
    "discard",
    "owned",
    "live",
    "release_acknowledged",
    "sweep_dead_workers",
    "sweep_owner",
]

try:  # the C helpers behind multiprocessing.shared_memory (POSIX only)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

#: Every named segment starts with this; tests and sweeps look for it.
PREFIX = "smx_"
#: Every anonymous handle starts with this.
FD_PREFIX = "fd:"
#: Where Linux shows POSIX shared memory; listed only to sweep.
SHM_DIR = "/dev/shm"
#: Bytes per os.write call (Linux writes at most ~2 GiB at once).
_WRITE_BYTES = 1 << 30
#: The acknowledgement byte a reader sets after a reply's data.
_ACK = b"\x01"

#: Python 3.13+: ``mmap.mmap`` can map a file without keeping a copy of its
#: descriptor. Before, :func:`_map` maps it through the C library, so that no
#: mapped buffer (every result array kept) holds an open file.
_TRACKFD = sys.version_info >= (3, 13)
#: ``mmap(2)``'s flag to map at a given address (the same on Linux, macOS, BSDs).
_MAP_FIXED = 0x10
#: ``prctl(2)``'s option to read whether this process is dumpable.
_PR_GET_DUMPABLE = 3

_counter = itertools.count(1)
_lock = threading.Lock()
#: Named segments and anonymous handles this process created for itself and
#: has not let go of yet; for anonymous ones, handle -> descriptor.
_owned: dict[str, int] = {}


class _Reply:
    """An anonymous reply buffer waiting for its reader: where its acknowledgement byte is."""

    __slots__ = ("offset", "nbytes")

    def __init__(self, offset: int, nbytes: int):
        self.offset = offset
        self.nbytes = nbytes


#: Anonymous reply buffers this process made for another: descriptor -> its
#: :class:`_Reply`. Whoever pops a descriptor from here (under ``_lock``)
#: closes it; nobody else does.
_replies: dict[int, _Reply] = {}
#: Named segments this process made for another (a loky worker's results):
#: name -> the owner's pid, until the owner has unlinked them (see
#: :func:`release_orphans`).
_made_for_others: dict[str, int] = {}
#: Set once a peer's ``/proc/<pid>/fd`` could not be opened: from then on this
#: process makes named segments, and tells its workers to (see :func:`use_named`).
_denied = False


def _anonymous_usable() -> bool:
    if os.environ.get("SMARTEXEC_SHM", "").lower() == "named":
        return False
    if not hasattr(os, "memfd_create"):
        return False
    try:  # a reader opens /proc/<pid>/fd/<fd>: make sure that works here
        fd = os.memfd_create("smx-probe", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(os.open(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDWR))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


_ANONYMOUS = _anonymous_usable()


_UNSET: Any = object()
_libc_functions: Any = _UNSET


def _libc() -> Any:
    """``(mmap, prctl)`` of the C library through ctypes, each None where missing; loaded once."""
    global _libc_functions
    if _libc_functions is _UNSET:
        found: list[Any] = [None, None]
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            mapper = libc.mmap
            mapper.restype = ctypes.c_void_p
            mapper.argtypes = [
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_long,
            ]
            found[0] = mapper
            prctl = getattr(libc, "prctl", None)  # Linux only
            if prctl is not None:
                prctl.restype = ctypes.c_int
                prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
                found[1] = prctl
        except (ImportError, OSError, AttributeError):  # pragma: no cover - no ctypes
            pass
        _libc_functions = tuple(found)
    return _libc_functions


def _dumpable() -> bool:
    """Whether other processes of this user may open this process's ``/proc/<pid>/fd``.

    A process made not dumpable (``prctl(PR_SET_DUMPABLE, 0)``, or by
    changing its user: daemons dropping privileges) hides its descriptors
    from every process without ``CAP_SYS_PTRACE``; its forked children
    inherit that. Asked at each :func:`create` (a system call, ~1 us): a
    process may drop privileges after its executor started. True where
    ``prctl`` is missing (not Linux: no anonymous memory there anyway).
    """
    prctl = _libc()[1]
    return prctl is None or prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 1


def available() -> bool:
    """Return True when this platform has shared memory we can use."""
    return _ANONYMOUS or _posixshmem is not None


def anonymous() -> bool:
    """Return True when :func:`create` makes anonymous memory now (nothing to sweep).

    False where ``memfd_create`` or ``/proc`` is missing, ``SMARTEXEC_SHM=named``
    is set, this process is not dumpable, or a peer's memory could not be
    opened once (:func:`use_named`).
    """
    return _ANONYMOUS and not _denied and _dumpable()


def use_named() -> None:
    """Make named segments from now on, for the rest of this process's life.

    Called when a peer's ``/proc/<pid>/fd/<n>`` could not be opened (a peer
    that is not dumpable, runs as another user, or a security module's
    rule): anonymous memory this process makes would fail its peers the
    same way. :mod:`smartexec.transport` passes it on to the workers with
    each request.
    """
    global _denied
    _denied = True


def denied() -> bool:
    """Whether :func:`use_named` was called in this process (or before its fork)."""
    return _denied


class PeerAccessError(PermissionError):
    """Another process's anonymous memory cannot be opened through ``/proc``.

    That process is not dumpable (``prctl(PR_SET_DUMPABLE, 0)``, or it changed
    user), runs as another user, or a security module forbids it. This
    process has switched to named segments (:func:`use_named`).
    """


def create(data: memoryview, *, owner: int | None = None, named: bool = True) -> str:
    """Copy ``data`` into new shared memory and return its handle.

    Args:
        data: the bytes to store (a C-contiguous memoryview, any format).
        owner: None when this process owns the memory (it lets go of it with
            :func:`unlink`); otherwise the pid of the process that will map
            it (a worker's result for its parent).
        named: False to make anonymous memory only: ``OSError`` rather than
            a named segment where it cannot be made.

    Returns:
        The handle: ``fd:...`` for anonymous memory, else a segment name (no
        leading slash).

    Raises:
        OSError: the memory could not be made or filled, e.g. ``ENOSPC``
            when ``/dev/shm`` is full, ``EMFILE`` with too many open files;
            nothing is left behind.
        RuntimeError: shared memory is not available (see :func:`available`).
    """
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    if owner is not None:
        release_acknowledged()
    handle = None
    try:
        with deferred_interrupts():  # a Ctrl-C waits until the registry holds it
            handle = _make(view, owner, named)
    except BaseException:
        if handle is not None:  # made, then a Ctrl-C held meanwhile: let it go
            unlink(handle)
        raise
    return handle


def _make(view: memoryview, owner: int | None, named: bool) -> str:
    if anonymous():
        try:
            return _create_anonymous(view, reply=owner is not None)
        except OSError:
            if _posixshmem is None or not named:
                raise
            # EMFILE, say: a named segment holds no descriptor once made.
    elif not named:
        raise OSError(errno.ENOTSUP, "anonymous shared memory is not usable in this process")
    return _create_named(view, owner)


def _fill(fd: int, view: memoryview) -> None:
    done = 0
    while done < view.nbytes:
        done += os.write(fd, view[done : done + _WRITE_BYTES])


def _create_anonymous(view: memoryview, *, reply: bool) -> str:
    fd = os.memfd_create("smx", os.MFD_CLOEXEC)
    try:
        _fill(fd, view)
        if reply:
            os.write(fd, b"\0")
        ino = os.fstat(fd).st_ino
    except BaseException:
        os.close(fd)
        raise
    handle = f"{FD_PREFIX}{os.getpid()}:{fd}:{ino}"
    with _lock:
        if reply:
            _replies[fd] = _Reply(view.nbytes, view.nbytes)
            _start_releaser()
        else:
            _owned[handle] = fd
    return handle + (":a" if reply else "")


#: Seconds between a worker's checks that its replies were read.
RELEASE_CHECK_S = 0.2
_releaser: threading.Thread | None = None


def _start_releaser() -> None:
    """Close acknowledged replies soon, not only at the next request (under ``_lock``).

    An idle worker would otherwise hold its last replies' memory after the
    parent has dropped its arrays, or discarded the replies (a cancelled
    chunk).
    """
    global _releaser
    if _releaser is None or not _releaser.is_alive():
        _releaser = own_thread(_release_while_held, "smartexec-shm-release")
        _releaser.start()


def _release_while_held() -> None:
    global _releaser
    me = threading.current_thread()
    while True:
        time.sleep(RELEASE_CHECK_S)
        release_acknowledged()
        with _lock:
            if not _replies or _releaser is not me:
                if _releaser is me:
                    _releaser = None
                return


def _new_name(owner: int | None) -> str:
    tail = f"{next(_counter):x}_{os.urandom(3).hex()}"  # not secrets: hmac, 3+ ms of import
    if owner is None:
        return f"{PREFIX}{os.getpid()}_{tail}"
    return f"{PREFIX}{owner}_w{os.getpid()}_{tail}"


def _create_named(view: memoryview, owner: int | None) -> str:
    if _posixshmem is None:
        raise RuntimeError("POSIX shared memory is not available on this platform")
    while True:
        name = _new_name(owner)
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:  # a leftover of a dead process with our pid
            continue
        break
    with _lock:  # before filling it: an interrupt still finds it
        if owner is None:
            _owned[name] = -1
        else:
            _made_for_others[name] = owner
    if owner is None:
        _track(name)
    try:
        try:
            _fill(fd, view)
        finally:
            os.close(fd)
    except BaseException:
        unlink(name)
        raise
    return name


def _parse(handle: str) -> tuple[int, int, int, bool]:
    """``(pid, fd, inode, acknowledge)`` of an anonymous handle."""
    parts = handle[len(FD_PREFIX) :].split(":")
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3:] == ["a"]


def attach(name: str, nbytes: int, *, private: bool) -> memoryview:
    """Map the first ``nbytes`` of the shared memory ``name`` (a handle).

    The mapping holds no file descriptor (:func:`_map`): a program may keep
    any number of results.

    Args:
        name: as returned by :func:`create`.
        nbytes: bytes to map (int > 0).
        private: True maps copy-on-write (``MAP_PRIVATE``): writes stay in
            this process and cost a page copy each; False maps it shared.

    Returns:
        A writable memoryview of the mapping; the mapping is released when
        the view and everything built on it (numpy arrays) are gone.

    Raises:
        FileNotFoundError: the memory is gone (its maker let go of it, or
            died).
        PeerAccessError: its maker's ``/proc/<pid>/fd`` cannot be opened
            (this process switches to named segments: :func:`use_named`).
        ValueError: it holds fewer than ``nbytes`` bytes.
        OSError: this process is out of a resource: ``EMFILE`` (open
            files), ``ENOMEM`` (memory or address space).
    """
    flags = os.O_RDONLY if private else os.O_RDWR
    if name.startswith(FD_PREFIX):
        pid, number, ino, acknowledge = _parse(name)
        fd = _open_peer(name, pid, number, os.O_RDWR if acknowledge else flags)
    elif _posixshmem is None:  # pragma: no cover - nothing could have created one
        raise RuntimeError("POSIX shared memory is not available on this platform")
    else:
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        ino, acknowledge = -1, False
    try:
        stat = os.fstat(fd)
        if ino >= 0 and stat.st_ino != ino:  # the number was reused by another file
            raise FileNotFoundError(f"shared memory {name} is gone")
        if stat.st_size < nbytes:
            raise ValueError(f"shared memory {name} holds {stat.st_size} bytes, not {nbytes}")
        view = _map(fd, nbytes, private)
        if acknowledge:
            os.pwrite(fd, _ACK, nbytes)  # its maker may close it now
    finally:
        os.close(fd)
    return view


def _open_peer(name: str, pid: int, number: int, flags: int) -> int:
    """Open descriptor ``number`` of process ``pid`` through ``/proc`` (see :func:`attach`)."""
    try:
        return os.open(f"/proc/{pid}/fd/{number}", flags)
    except FileNotFoundError as exc:  # its maker closed it, or exited
        raise FileNotFoundError(f"shared memory {name} is gone ({exc})") from exc
    except PermissionError as exc:  # EACCES, EPERM
        use_named()
        raise PeerAccessError(
            exc.errno,
            f"cannot open shared memory {name} of process {pid} through /proc/{pid}/fd "
            f"({exc.strerror}): that process is not dumpable (prctl PR_SET_DUMPABLE 0, or it "
            f"changed user), runs as another user, or a security module forbids it. "
            f"smartexec uses named shared memory from now on",
        ) from exc


def _map(fd: int, nbytes: int, private: bool) -> memoryview:
    """Map ``nbytes`` of file ``fd`` and return a view; the mapping keeps no descriptor.

    Before Python 3.13, ``mmap.mmap`` keeps a copy of ``fd`` open for as long
    as the mapping lives, so each result array kept held an open file (1,100
    kept results failed with ``EMFILE`` under the usual limit of 1024). There
    this maps anonymous memory with ``mmap.mmap`` (no descriptor), then the
    file over it with the C library's ``mmap(MAP_FIXED)``: the ``mmap.mmap``
    object owns the region, exports it and unmaps it when closed or freed.

    Raises:
        OSError: the mapping failed (``ENOMEM``, say).
    """
    if _TRACKFD:
        access = mmap.ACCESS_COPY if private else mmap.ACCESS_WRITE
        untracked: dict[str, Any] = {"trackfd": False}  # a keyword of 3.13+
        return memoryview(mmap.mmap(fd, nbytes, access=access, **untracked))
    mapper = _libc()[0]
    if mapper is None:  # pragma: no cover - no ctypes: one descriptor per mapping
        access = mmap.ACCESS_COPY if private else mmap.ACCESS_WRITE
        return memoryview(mmap.mmap(fd, nbytes, access=access))
    import ctypes

    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    kind = mmap.MAP_PRIVATE if private else mmap.MAP_SHARED
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if mapper(address, nbytes, prot, kind | _MAP_FIXED, fd, 0) != address:
        code = ctypes.get_errno()
        region.close()
        raise OSError(code, f"cannot map shared memory: {os.strerror(code)}")
    return memoryview(region)


def discard(name: str, nbytes: int) -> None:
    """Let go of ``name`` without mapping it: a reply that will never be read.

    A named segment is unlinked; an anonymous reply is acknowledged, so its
    maker closes it. No error if it is gone, or cannot be opened.
    """
    if not name.startswith(FD_PREFIX):
        unlink(name)
        return
    pid, number, ino, acknowledge = _parse(name)
    if not acknowledge or pid == os.getpid():
        unlink(name)
        return
    try:
        fd = _open_peer(name, pid, number, os.O_RDWR)
    except OSError:
        return  # its maker is gone (and the memory with it), or hidden from us
    try:
        if os.fstat(fd).st_ino == ino:
            os.pwrite(fd, _ACK, nbytes)
    finally:
        os.close(fd)


def unlink(name: str) -> None:
    """Let go of ``name``: mappings of it stay valid. No error if gone.

    A named segment is removed; this process's own anonymous memory has its
    descriptor closed (its memory is freed with the last mapping); another
    process's anonymous handle is left to its maker (a reply's maker closes
    it once :func:`attach` acknowledged it).
    """
    if name.startswith(FD_PREFIX):
        pid, number, _, reply = _parse(name)
        with _lock:
            if reply and pid == os.getpid():  # never sent (a reply that failed to pickle)
                fd = number if _replies.pop(number, None) is not None else None
            else:
                fd = _owned.pop(name, None)
        if fd is not None:
            os.close(fd)
        return
    if _posixshmem is None:  # pragma: no cover
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    with _lock:
        mine = _owned.pop(name, None) is not None
        _made_for_others.pop(name, None)
    if mine:
        _untrack(name)


def release_acknowledged() -> int:
    """Close the reply buffers this process made that their readers have mapped.

    Safe from several threads at once (a worker's own and its releaser
    thread): each descriptor is closed by the one thread that took it out of
    the registry, under the lock, and only if it still holds the reply that
    thread saw acknowledged. Closing one twice once made a worker exit (about
    1 call in 45,000 with 1 MiB results): the second ``close`` failed, or
    closed the descriptor of a newer reply that had taken its number.

    Also forgets the named segments made for others that their owner has
    unlinked (read, see :func:`release_orphans`).

    Returns:
        The number of anonymous replies still waiting for their reader.
    """
    with _lock:
        held = list(_replies.items())
    seen = []
    for fd, reply in held:
        try:
            acknowledged = os.pread(fd, 1, reply.offset) == _ACK
        except OSError:  # closed meanwhile (by another thread): its number may be reused
            acknowledged = True
        if acknowledged:
            seen.append((fd, reply))
    mine = []
    with _lock:
        for fd, reply in seen:
            if _replies.get(fd) is reply:  # nobody took it since: ours to close
                del _replies[fd]
                mine.append(fd)
        left = len(_replies)
    for fd in mine:
        os.close(fd)
    if _made_for_others:
        _forget_taken()
    return left


def _forget_taken() -> None:
    """Drop from ``_made_for_others`` the segments their owner has unlinked."""
    with _lock:
        names = list(_made_for_others)
    taken = [name for name in names if not _exists(name)]
    with _lock:
        for name in taken:
            _made_for_others.pop(name, None)


def _exists(name: str) -> bool:
    """Whether the named segment ``name`` is still there."""
    if _posixshmem is None:  # pragma: no cover
        return False
    try:
        os.close(_posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600))
    except FileNotFoundError:
        return False
    except OSError:  # EMFILE, say: keep it, look again later
        return True
    return True


def release_orphans() -> list[str]:
    """Unlink the named segments this process made for an owner that is gone.

    A worker's result segment is unlinked by its owner once read; an owner
    killed first (``SIGKILL``) never reads it. A loky worker calls this when
    it finds its parent gone, and at its exit (see
    :mod:`smartexec.transport`). Fork workers make no named result segments:
    their results travel in band on the named fallback.

    Returns:
        The names unlinked.
    """
    with _lock:
        made = dict(_made_for_others)
    owners = {owner: alive(owner) for owner in set(made.values())}
    gone = [name for name, owner in made.items() if not owners[owner]]
    for name in gone:
        unlink(name)
    return gone


def owned() -> frozenset[str]:
    """Handles this process created for itself and has not let go of yet."""
    with _lock:
        return frozenset(_owned)


def live() -> dict[str, int]:
    """Shared memory this process holds or is owed, handle -> bytes.

    Its own (:func:`owned`), the anonymous replies it made that wait for
    their reader, and (for named segments) what ``/dev/shm`` lists under
    its pid, its workers' results included. For tests and diagnostics.
    """
    found: dict[str, int] = {}
    with _lock:
        own = dict(_owned)
        replies = dict(_replies)
    for handle, fd in own.items():
        if fd >= 0:
            try:
                found[handle] = os.fstat(fd).st_size
            except OSError:
                pass
    for fd, reply in replies.items():
        found[f"{FD_PREFIX}{os.getpid()}:{fd}:reply"] = reply.nbytes
    for name in _listed(os.getpid()):
        try:
            found[name] = os.stat(f"{SHM_DIR}/{name}").st_size
        except OSError:
            pass
    return found


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


def sweep_dead_workers(owner: int | None = None) -> list[str]:
    """Unlink the named result segments that dead workers made for ``owner``.

    A worker that dies between making a result segment and the owner reading
    its reply leaves the segment behind; its name carries the worker's pid.
    (Anonymous memory needs no sweep: it dies with its maker.)

    Args:
        owner: the owner's pid; None means this process.

    Returns:
        The names unlinked.
    """
    owner = os.getpid() if owner is None else owner
    gone = []
    for name in _listed(owner):
        pid = _worker_pid(name)
        if pid is not None and not alive(pid):
            unlink(name)
            gone.append(name)
    return gone


def sweep_owner(owner: int | None = None) -> None:
    """Let go of all shared memory of ``owner``: its own and its workers' results.

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
    # A loky worker whose parent was killed leaves through here too (loky
    # exits when its call queue ends): the results that parent never read go.
    release_orphans()
    sweep_owner()


atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    # A forked child must not unlink its parent's segments at its own exit,
    # nor keep its parent's anonymous memory alive by the descriptors it inherited.
    # Another thread may have held the lock at the fork: this child's copy
    # stays held for ever, so it gets a new one (this child has one thread).
    global _lock, _releaser
    _lock = threading.Lock()
    _releaser = None  # threads do not survive a fork
    inherited = [fd for fd in (*_owned.values(), *_replies) if fd >= 0]
    _owned.clear()
    _replies.clear()
    _made_for_others.clear()  # the parent's to let go of, not this child's
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
