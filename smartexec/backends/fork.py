"""The fork backend: worker processes forked from the caller, with trampolines.

Data flow (one *pool* = one generation of workers, forked from one snapshot)::

    submit_chunk ──pickle──> queue ──dispatcher thread──> worker i (own pipe)
         │                                  ▲                    │
         └── SharedRef(token) for shared    └──── ChunkResult ───┘
             callables: a few bytes              (or its death: sentinel)

* Each worker has its own duplex pipe and runs one chunk at a time, so the
  dispatcher always knows which chunk a worker holds: a worker that dies fails
  only that chunk (:class:`~smartexec.errors.WorkerCrashedError`) and is
  replaced; the pool stays usable.
* A callable the policy marks *shared* is never pickled: the parent puts it in
  :mod:`smartexec.trampoline`'s table for the duration of each fork, the worker
  inherits it by copy-on-write, and tasks carry a :class:`SharedRef`.
* Workers see a shared callable's object as it was when ``map()`` or
  ``submit()`` was called, never an older copy. A ``map`` runs on a pool
  forked after it was called: the first chunk of each map of a shared
  callable starts a new pool (forking a process costs about a millisecond
  per 100 MB of mapped memory; hashing 100 MB, 40-80 ms), and its later
  chunks use that snapshot. A ``submit`` reuses the current pool when a
  SHA-1 digest of the object's pickled state (numpy buffers hashed in place,
  :func:`smartexec._fingerprint.digest`) equals the one taken when that pool
  forked; otherwise it starts a new pool too. The old pool finishes the
  chunks already running on it, then stops, and the new one takes over
  those queued; while both run, up to twice ``max_workers`` processes exist.
* ``submit_chunk`` returns at once: it queues the chunk's task, then pickles
  it in the submitting thread when it is plain data, or on the backend's
  sender thread (:mod:`smartexec._sender`), in order. A payload that cannot
  be pickled fails the chunk's future (naming the part that failed); the
  dispatcher starts tasks in queue order once they are pickled.
* A pool starts with one worker and forks more, up to ``max_workers``, when
  chunks wait behind busy workers (see :data:`GROW_WORK_S`).
* Workers ignore SIGINT (the parent decides what Ctrl-C stops) and exit on
  their own within :data:`PARENT_CHECK_S` seconds if the parent dies.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import itertools
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401 - its atexit hook must be registered before ours
import os
import select
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait as wait_for
from typing import Any

from .. import _fingerprint, _initializer, _threads, trampoline, transport
from .._blas import (
    cap_in_this_process,
    controller_for_fork,
    thread_env,
    threads_per_worker,
)
from .._diagnose import (
    fail_on_pickling,
    reply_unpickling_error,
    task_unpickling_error,
)
from .._identity import WeakCallable, identity_key
from .._remote import Call, ChunkResult, copy_calls
from .._sender import Sender, pause_senders, quick_to_pickle
from .._system import deferred_interrupts, mark_worker_process
from ..errors import InitializerError, TaskTimeoutError, WorkerCrashedError
from ..inspection import callable_name
from ._base import Backend, check_open_files, forced_by

__all__ = ["ForkBackend"]

#: Seconds between a worker's checks that its parent is still alive. Only an
#: idle worker checks; the cost is one getppid() call per interval.
PARENT_CHECK_S = 1.0
#: Seconds a worker gets to exit after being asked before it is killed.
STOP_TIMEOUT_S = 2.0
#: Longest single wait of the dispatcher, seconds (it loops after it).
MAX_WAIT_S = 3600.0
#: Shared callables that cannot be weakly referenced, kept for reuse at most.
MAX_STRONG_SHARED = 8

_LIVE_POOLS: weakref.WeakSet[_ForkPool] = weakref.WeakSet()

#: Set once the exit hook (:func:`_shutdown_all_pools`) has begun: no new pool starts.
_EXITING = False


class _Joined:
    """Stands in for a pool's dispatcher thread once it was joined at shutdown.

    A pool and its backend refer to each other, so they go only when the
    garbage collector runs; the stopped ``Thread`` they held went with them,
    at an unpredictable later time. CPython's ``threading_cleanup()`` (run
    after each of its ``concurrent.futures`` tests) waits for the count of
    live ``Thread`` objects to come back to what it was, gc-collecting up
    to 100 times: a count that drops late cost 5-20 s a test on 3.10.
    """

    name = "smartexec-fork-dispatcher (joined)"

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        return None


_JOINED: Any = _Joined()

#: Held while a task moves to another pool, so that whoever pickled it wakes
#: the pool that holds it now.
_OWNER_LOCK = threading.Lock()

#: Held while a zygote is forked with the other pools' dispatchers paused;
#: shutdown() takes it too, so it never mistakes a paused dispatcher for a
#: finished one.
_QUIESCE_LOCK = threading.RLock()

#: Workers a new pool forks from this process itself when no other thread
#: runs (see _ForkPool): the first, which takes the chunk that started the
#: pool at once. The zygote forks the others when chunks wait for them (see
#: GROW_WORK_S): forking each here costs the parent about a millisecond per
#: 100 MB mapped, on the way to everything else it does.
DIRECT_WORKERS = 1

#: A new pool forks one worker; it forks another (up to ``max_workers``) when
#: chunks wait while every worker is busy, and either the chunks that wait
#: hold at least GROW_WORK_S seconds of work per worker (judged from the
#: compute time of the pool's finished chunks), or chunks have waited so,
#: without a break, for GROW_BACKLOG_S seconds (a map's chunks come a window
#: at a time), or every worker has been on its chunk for GROW_BLIND_S seconds
#: (no figure yet, or a chunk that waits on another). A map of 1,000
#: one-microsecond calls of a 200 MB object's method ran on the first worker
#: alone before the second was up; forking that second worker, and its exit,
#: cost 3.4 ms of its 19 ms. Seconds.
GROW_WORK_S = 0.005
GROW_BACKLOG_S = 0.005
GROW_BLIND_S = 0.002

#: Largest request sent to a worker before the zygote has reported its fork
#: (a pipe holds 64 KiB on Linux; a bigger write would block the dispatcher).
PRESEND_MAX_BYTES = 32 * 1024

#: Seconds to wait for a dispatcher to pause (it may be running a future's
#: done-callback, user code that may wait on us); past it, the fork goes on.
PAUSE_TIMEOUT_S = 0.5


@contextlib.contextmanager
def _quiesced() -> Iterator[None]:
    """Stop every thread of ours that can be stopped, for the length of a fork.

    Python 3.12+ warns when a process with several threads forks, because
    the child gets a copy of every lock another thread held at that instant.
    The fork pools' dispatcher threads pause (they hold no state on their
    stack) and the thread backends let their idle threads exit; all restart
    after the fork. A dispatcher busy in a done-callback past
    :data:`PAUSE_TIMEOUT_S`, a thread pool with work, and threads that are not
    ours (the user's, loky's) stay: the policy routes away from fork when the
    user's threads run (see :func:`smartexec.policy.decide`).
    """
    # No thread backend exists before its module is imported: not importing
    # it here spares a fresh process's first fork pool ~0.5 ms.
    thread_module = sys.modules.get(__package__ + ".thread")

    with _QUIESCE_LOCK:
        me = os.getpid()
        paused = [pool for pool in list(_LIVE_POOLS) if pool._pid == me and pool.pause()]
        senders = pause_senders()
        try:
            if thread_module is not None:
                thread_module.release_idle_thread_pools()
            yield
        finally:
            for sender in senders:
                sender.resume()
            for pool in paused:
                pool.resume()


def _as_multiprocessing_child() -> None:
    """In a worker forked by ``os.fork``: what ``multiprocessing`` does in a child it forks.

    The zygote is a ``multiprocessing`` child, so its workers inherit this;
    a worker forked from the parent directly does it itself: stdin closed
    (reopened on ``os.devnull``), no inherited child processes or
    finalizers, and the after-fork hooks of ``multiprocessing`` objects (an
    inherited ``multiprocessing.Queue`` resets its feeder thread).
    """
    mp_util: Any = multiprocessing.util
    mp_process: Any = multiprocessing.process
    with contextlib.suppress(Exception):
        mp_process._children = set()
        mp_util._close_stdin()
        mp_util._finalizer_registry.clear()
        mp_util._run_after_forkers()


def _may_fork_directly(initializer: Callable[..., Any] | None) -> bool:
    """Whether a new pool may fork its first worker(s) from this process itself.

    Only when no thread but the calling one runs (call it with ours paused,
    :func:`_quiesced`): a forked child gets a copy of every lock another
    thread held at that instant. Not with an initializer (its failure is
    reported through the zygote), nor where ``os.pidfd_open`` is missing
    (Linux 5.3+): the dispatcher learns that such a worker exited from it.
    """
    if initializer is not None or not hasattr(os, "pidfd_open"):
        return False
    current = threading.current_thread()
    return all(thread is current for thread in threading.enumerate())


def _worker_main(
    conn: Any,
    parent_pid: int,
    owner_pid: int,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
    ctl: socket.socket | None = None,
    blas_cap: int | None = None,
) -> None:
    """Worker loop (runs in the forked child): receive a chunk, run it, reply.

    Its BLAS thread cap comes from the zygote (see :func:`_zygote_main`)
    or from the parent that forked it, which limited its own pools for the
    fork. Or, with ``blas_cap``, it caps them itself at that many threads,
    after the first chunk during which a thread pool of a native library
    started (see :func:`_native_threads_run`): capping OpenBLAS after a fork
    starts its pool, whose threads spin for ~0.1 s of CPU, so a worker that
    never calls it never caps it. A worker forked directly when this
    process had no table (no numpy loaded, see :func:`_blas_table`) is
    forked so.

    ``parent_pid`` is the zygote's (the worker exits when it is gone);
    ``owner_pid`` the executor's process, which owns the shared-memory
    segments of the replies (:mod:`smartexec._shm`).

    ``initializer(*initargs)`` runs first, here, after the fork (never in the
    zygote). When it raises, the worker logs it where the initializer set
    up this worker's logging, if it did (see
    :func:`smartexec._initializer.log_in_worker`), sends
    ``I<pid> <traceback>`` on ``ctl`` (the zygote's end, which reaches the
    parent's dispatcher) and exits without taking a chunk. ``ctl`` is
    closed before the loop.

    Every object inherited from the parent is frozen out of this process's
    garbage collector (``gc.freeze()``, which touches none of them): a
    collection would write to each object it scans, copying their pages
    (a worker's first chunk copied ~2 MB, 2.5 ms of its CPU, for a method
    on a 200 MB object). Cycles among inherited objects that the worker
    drops are then not collected in this worker.
    """
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mark_worker_process()
    _threads.forget_inherited_pools()
    try:
        if initializer is not None:
            handlers = _initializer.logging_handlers()
            try:
                initializer(*initargs)
            except BaseException as exc:
                # Logged here first, where the initializer may have sent this
                # worker's logging (as the stdlib's worker logs it).
                _initializer.log_in_worker(exc, handlers)
                if ctl is not None:
                    text = _initializer.traceback_text(exc).encode("utf-8", "replace")
                    with contextlib.suppress(OSError):
                        ctl.send(b"I%d " % os.getpid() + text)
                return
    finally:
        if ctl is not None:
            ctl.close()
    while True:
        try:
            if not conn.poll(PARENT_CHECK_S):
                if os.getppid() != parent_pid:
                    return
                continue
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not data:
            return
        payload = transport.serve_request(data, owner=owner_pid)
        del data
        try:
            conn.send_bytes(payload)
        except OSError:
            return
        if blas_cap is not None and _native_threads_run():
            cap_in_this_process(blas_cap)  # their pool runs: no new threads start
            blas_cap = None


def _native_threads_run() -> bool:
    """Whether threads that Python does not know (a BLAS or OpenMP pool's) run in this process.

    ~5 us when none does. Otherwise read again 1 ms later, and only the
    threads listed both times count: a thread Python has just joined (the
    GIL watch's, after a chunk) may still be listed the first time.
    """
    first = _threads.foreign_thread_ids()
    if not first:
        return False
    time.sleep(0.001)
    return bool(set(first) & set(_threads.foreign_thread_ids()))


def _blas_table() -> Any | None:
    """This process's threadpoolctl table for a new pool's forks; None without numpy.

    Built here, in the parent, once for the process (see
    :func:`~smartexec._blas.controller_for_fork`), for every pool, the
    process's first included: the workers forked here directly are capped
    by inheritance (:meth:`_ForkPool._fork_directly` limits this process's
    pools for the length of their forks), and the zygote's through it, so
    every worker starts capped. A process's first pool once went without
    (importing threadpoolctl and scanning the loaded libraries costs 4-5
    ms, before the first result), its first worker capping its pools only
    after a chunk had started them: a worker that had not run BLAS yet read
    the parent's threads (2 on 2 CPUs beside another worker's 1), and the
    chunk that started them ran on all of them. Without numpy nothing is
    loaded to cap: the workers' environment caps the libraries they load
    (:func:`~smartexec._blas.thread_env`).
    """
    return controller_for_fork()


def _zygote_main(
    ctl: socket.socket,
    parent_end: int,
    parent_pid: int,
    blas_threads: int,
    blas: Any,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
    inherited_fds: Sequence[int] = (),
    prefork: Sequence[tuple[int, int]] = (),
    direct: Sequence[int] = (),
) -> None:
    """The zygote (runs in a child forked once per pool): forks the pool's workers.

    The parent's dispatcher thread never forks: it asks the zygote, which is
    single-threaded, holds the objects inherited at its own fork, and takes
    no lock any other thread could hold. Messages on ``ctl`` (a
    ``SOCK_SEQPACKET`` pair, one record per message):

    * parent -> zygote: ``S<ident>`` with one file descriptor attached (the
      worker's end of its pipe): fork a worker on it.
    * parent -> zygote: ``Q``: the pool is stopping.
    * zygote -> parent: ``P<ident> <pid>`` once forked; ``X<pid> <exitcode>``
      when a worker exits (negative: killed by that signal).
    * worker -> parent: ``I<pid> <traceback>`` when ``initializer`` raised in
      that worker (it runs in each worker after its fork, see
      :func:`_worker_main`), just before the worker exits.

    The zygote never blocks on ``ctl``: its replies wait in an outbox until
    the socket takes them. A new pool's workers (``prefork``) are all
    reported before the parent's dispatcher reads a reply, and replacements
    may be asked for in bursts; about 280 records fill a ``SOCK_SEQPACKET``
    buffer each way, and a zygote blocked in ``send`` would stop reading
    requests, blocking the parent's ``send_fds`` in turn (``max_workers`` in
    the hundreds hung the pool).

    ``inherited_fds``: the parent's ends of the pipes of the workers it forked
    itself and of those in ``prefork`` (see :class:`_ForkPool`), closed here
    at once.

    ``prefork``: ``(ident, fd)`` of the pool's first worker (when the parent
    did not fork it itself), forked here at once, before the first message
    is read, as if ``S<ident>`` had come with ``fd`` (inherited by this
    process's fork, not sent): it starts while the parent goes on to start
    its dispatcher, rather than after a request that follows the zygote's
    start (about 10 ms later on a 2-core machine).

    On ``Q``, on end-of-file, or once the parent is gone (checked every
    :data:`PARENT_CHECK_S` seconds: other processes forked from the parent
    may hold a copy of its end of ``ctl``, so end-of-file alone is not
    enough), the zygote gives its workers :data:`STOP_TIMEOUT_S` seconds to
    exit, kills the rest and exits.

    ``direct``: the pids of the pool's workers the parent forked itself.
    Should the parent die (no ``Q`` came), the zygote kills them too, through
    pidfds opened now (a pid alone may name another process by then): a
    worker busy in a long call checks for its parent only between chunks,
    and outlived a killed parent (holding its stdout open) for as long as
    the call ran.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(parent_end)  # the parent's end of ctl, inherited by the fork
    direct_fds: list[int] = []
    for pid in direct:
        with contextlib.suppress(OSError):
            direct_fds.append(os.pidfd_open(pid))
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    # Cap BLAS here, once, not in each worker: the workers inherit the cap.
    # Capping OpenBLAS after a fork starts its thread pool, whose threads spin
    # for ~0.1 s of CPU; capped right before the zygote's first fork, they stop
    # at once (OpenBLAS shuts its pool down before a fork), so no process runs
    # a spinning thread: not a worker, and not a zygote that has no worker to
    # fork yet (its pool's first worker was forked by the parent itself).
    capped = False
    zygote_pid = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: set[int] = set()
    ctl.setblocking(False)
    outbox: collections.deque[bytes] = collections.deque()
    poller = select.poll()  # not select(): fds past 1024 (a busy server) are fine
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)

    def send(message: bytes) -> None:
        outbox.append(message)
        flush()

    def flush() -> None:
        while outbox:
            try:
                ctl.send(outbox[0])
            except BlockingIOError:  # the parent reads on: send the rest when it can
                poller.modify(ctl.fileno(), select.POLLIN | select.POLLOUT)
                return
            except OSError:
                outbox.clear()  # the parent is gone
                break
            outbox.popleft()
        poller.modify(ctl.fileno(), select.POLLIN)

    def reap(block_s: float = 0.0) -> None:
        deadline = time.monotonic() + block_s
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # Until the next SIGCHLD (its handler writes to wake_w), not a
                # fixed sleep: a stopping pool waits for its workers' exits.
                select.select([wake_r], [], [], min(left, 0.05))
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                continue
            children.discard(pid)
            send(b"X%d %d" % (pid, os.waitstatus_to_exitcode(status)))

    unforked: list[int] = []  # prefork's ends this process holds, not yet a worker's

    def fork_worker(ident: int, worker_fd: int) -> None:
        nonlocal capped
        if not capped:
            cap_in_this_process(blas_threads, blas)
            capped = True
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                for other_fd in (*unforked, *direct_fds):
                    os.close(other_fd)  # the ends of siblings not forked yet
                conn = multiprocessing.connection.Connection(worker_fd)
                # ctl stays open through the initializer (to report its
                # failure); _worker_main closes it before the loop.
                _worker_main(conn, zygote_pid, parent_pid, initializer, initargs, ctl)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(worker_fd)
        children.add(pid)
        send(b"P%d %d" % (ident, pid))

    unforked.extend(fd for _, fd in prefork)
    for ident, worker_fd in prefork:
        unforked.remove(worker_fd)
        fork_worker(ident, worker_fd)
    asked = False  # whether the parent asked the pool to stop (Q), rather than died
    while True:
        events = dict(poller.poll(PARENT_CHECK_S * 1000))
        ready = {fd for fd, event in events.items() if event & ~select.POLLOUT}
        if not events and os.getppid() != parent_pid:
            break
        if events.get(ctl.fileno(), 0) & select.POLLOUT:
            flush()
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            reap()
        if ctl.fileno() not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(ctl, 256, 4)
        except BlockingIOError:
            continue
        except OSError:
            message, fds = b"", []
        if not message or message == b"Q":
            for fd in fds:
                os.close(fd)
            asked = message == b"Q"
            break
        fork_worker(int(message[1:]), fds[0])
    # The parent closed its end: workers were asked to stop (or their parent died).
    reap(STOP_TIMEOUT_S)
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not asked:
        # The parent is gone: its own workers too (after the grace above).
        for fd in direct_fds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    reap(STOP_TIMEOUT_S)


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"{name} (signal {-exitcode})"
        if -exitcode == signal.SIGKILL:
            text += (
                "; SIGKILL is what the kernel's out-of-memory killer sends, so check "
                "the worker's memory use"
            )
        return text
    return f"exit code {exitcode}"


class _Poller:
    """``multiprocessing.connection.wait`` for one thread that waits on the same files again and again.

    ``wait()`` builds and fills a new selector on every call (7 us against
    2 us for a kept poll, five files, a quiet 2-core machine; twice a chunk,
    on cores the workers need). This keeps one ``select.poll`` and registers
    only the files that changed since the last wait (a worker replaced, a
    pipe closed).
    """

    __slots__ = ("_poll", "_fds")

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: set[int] = set()

    def wait(self, objects: Iterable[Any], timeout_s: float | None) -> list[Any]:
        """The ``objects`` ready to read (or closed at the other end), as ``wait()`` returns them.

        Args:
            objects: connections, sockets (anything with ``fileno()``) and
                plain file descriptors (ints), all open.
            timeout_s: seconds to wait at most (rounded up to a millisecond);
                None waits until one is ready.
        """
        by_fd = {obj if isinstance(obj, int) else obj.fileno(): obj for obj in objects}
        fds = by_fd.keys()
        if fds != self._fds:
            for fd in self._fds - fds:
                self._poll.unregister(fd)
            for fd in fds - self._fds:
                self._poll.register(fd, select.POLLIN)
            self._fds = set(fds)
        timeout_ms = None if timeout_s is None else math.ceil(timeout_s * 1000)
        # Any event counts: POLLHUP or POLLERR is a worker gone, read as EOF.
        return [by_fd[fd] for fd, _ in self._poll.poll(timeout_ms) if fd in by_fd]


class _Task:
    """A queued chunk: its future, and its request once pickled.

    ``payload`` is None until the chunk is pickled (the dispatcher waits for
    it), and again once it was sent (``sent``). ``pool`` is the pool whose
    queue holds it.
    """

    __slots__ = ("future", "payload", "keepalive", "name", "timeout_s", "items", "sent", "pool")

    def __init__(
        self,
        future: Future[ChunkResult],
        payload: bytes | None,
        keepalive: Any,
        name: str,
        timeout_s: float | None = None,
        items: int = 1,
    ):
        self.future = future
        self.payload: bytes | None = payload
        self.keepalive = keepalive  # the shared callable, alive until the chunk ends
        self.name = name
        self.timeout_s = timeout_s
        self.items = items
        self.sent = False
        self.pool: _ForkPool | None = None

    def wake_pool(self) -> None:
        """Tell the pool holding this task that it was pickled (or failed to be)."""
        with _OWNER_LOCK:
            pool = self.pool
        if pool is not None:
            pool._wake()


class _Worker:
    __slots__ = (
        "ident",
        "conn",
        "pid",
        "task",
        "deadline",
        "lost",
        "calls",
        "doomed",
        "pidfd",
        "since",
        "grown",
    )

    def __init__(self, ident: int, conn: Any):
        self.ident = ident
        self.conn = conn
        self.pid: int | None = None  # known once the zygote reports the fork
        self.task: _Task | None = None
        self.deadline: float | None = None  # time.monotonic() when its chunk times out
        self.lost = False  # its pipe closed: it is exiting; its exit code is on the way
        self.calls = 0  # calls sent to it, for max_tasks_per_child
        #: Signalled before its pid was known (0: not): the signal goes once it is.
        self.doomed = 0
        #: Forked by this process itself (not the zygote): a pidfd, readable once
        #: it has exited; this process reaps it. None for the zygote's workers.
        self.pidfd: int | None = None
        #: time.monotonic() when its chunk was sent (see _ForkPool._grow).
        self.since = 0.0
        #: Asked for because chunks waited (see _ForkPool._grow): it takes
        #: none before its fork is reported (the busy ones may free first).
        self.grown = False

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.pid is None:
            # It may hold a chunk already (sent before the zygote reported
            # the fork): the signal goes when its pid arrives.
            self.doomed = signum
            return
        try:
            os.kill(self.pid, signum)
        except OSError:
            pass  # exited already


class _ForkPool:
    """One generation of fork workers sharing one inherited table.

    Args:
        max_workers: workers to fork at most (one at first, see :meth:`_grow`).
        live_objects: returns token -> object for every shared callable still
            alive; called (under the backend's lock) before each fork.
        blas_threads: BLAS threads per worker.
        initializer: run as ``initializer(*initargs)`` in each worker after
            its fork, before its first chunk (None: nothing).
        initargs: its arguments; inherited by the zygote, never pickled.
        max_tasks_per_child: calls a worker may run before it is replaced
            (None: no limit). A chunk that would take a worker past it goes
            to a fresh worker (the executor sends chunks of at most this many).
        box: where a failed initializer is recorded (shared with the backend).
        first: the task that starts this pool (None: none). When the first
            worker is forked directly (see :attr:`forked_directly`) and the
            task is pickled, its request is written to that worker's pipe
            before the others fork: it runs while they do. Taken (then
            ``first.pool`` is this pool) or not, see :attr:`took_first`.
    """

    def __init__(
        self,
        max_workers: int,
        live_objects: Callable[[], Mapping[int, Any]],
        blas_threads: int = 1,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_child: int | None = None,
        box: _initializer.Breakage | None = None,
        first: _Task | None = None,
    ):
        self._ctx = multiprocessing.get_context("fork")
        self._initializer_name = (
            _initializer.name_of(initializer) if initializer is not None else ""
        )
        self._max_tasks = max_tasks_per_child
        self._box = box if box is not None else _initializer.Breakage()
        self._blas_threads = blas_threads
        self._live_objects = live_objects
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: collections.deque[_Task] = collections.deque()
        self._unsent: collections.deque[_Task] = collections.deque()
        self._closing = False
        #: Retired: a newer pool serves new calls; this one runs what its calls
        #: still send (their snapshot is this pool's), then stops.
        self._retiring = False
        self._pins = 0  # calls (a map, a submit and its retries) bound to this snapshot
        self._drain_at_exit = False  # shutdown(wait=False) was asked: run the queue out
        self._pause_requested = False
        self._paused = False
        self._broken: BaseException | None = None
        # Futures to stop (see abort()): appended without a lock, as abort() may
        # run in a generator's finalizer, in a thread that holds self._lock.
        self._aborting: collections.deque[Future[ChunkResult]] = collections.deque()
        #: The signal terminate_workers() / kill_workers() asked for (0: none);
        #: the dispatcher sends it to every worker and replaces none.
        self._forced = 0
        self._forced_sent = False
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._poller = _Poller()
        os.set_blocking(self._wake_w, False)
        #: The backend's epoch just before this pool forked (see ForkBackend).
        self.born = 0
        #: token -> digest of that object's state when this pool forked, when known.
        self.digests: dict[int, bytes] = {}
        objects = live_objects()
        self.covered = frozenset(objects)
        # Fork now, in the caller's thread, before this pool's dispatcher
        # thread exists. When no other thread runs (ours paused), the first
        # DIRECT_WORKERS are forked here directly, as a hand-written fork
        # Pool's are: no thread can hold a lock they copy, and the first
        # chunk does not wait for a zygote to start and fork in turn. The
        # zygote is forked either way, last: it forks every other worker (all
        # of them when another thread runs; replacements always), the first
        # ones as soon as it starts, on pipes it inherits.
        self._ctl, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._idents = itertools.count()
        self._workers: list[_Worker] = []
        #: Whether this pool's first worker(s) were forked by this process itself.
        self.forked_directly = False
        #: Whether ``first`` went straight to the first worker (else: queue it).
        self.took_first = False
        blas = _blas_table()
        pending: list[tuple[int, Any, Any]] = []  # (ident, our end, the worker's end)
        try:
            with _quiesced(), trampoline.forking(objects), _threads.fork_warning_checked():
                if _may_fork_directly(initializer):
                    self.forked_directly = True
                    self._fork_directly(DIRECT_WORKERS, blas_threads, blas, zygote_end, first)
                # The zygote forks the others as soon as it starts (prefork).
                if not self._workers:
                    pending.append((next(self._idents), *self._ctx.Pipe(duplex=True)))
                self._zygote = self._ctx.Process(
                    target=_zygote_main,
                    args=(
                        zygote_end,
                        self._ctl.fileno(),
                        os.getpid(),
                        blas_threads,
                        blas,
                        initializer,
                        initargs,
                        [w.conn.fileno() for w in self._workers]
                        + [ours.fileno() for _, ours, _ in pending],
                        [(ident, theirs.fileno()) for ident, _, theirs in pending],
                        [w.pid for w in self._workers if w.pid is not None],
                    ),
                    name="smartexec-fork-zygote",
                )
                self._zygote.start()
        except BaseException as exc:
            self._reap_directly(self._workers, 0.0)  # a fork failed (EAGAIN): none is left
            self._ctl.close()
            zygote_end.close()
            for _, ours, theirs in pending:
                ours.close()
                theirs.close()
            if first is not None and first.pool is self and first.future.running():
                first.future.set_exception(exc)  # handed over: nobody else will end it
            raise
        del objects
        # Process.start() in any thread reaps every finished child it knows of
        # (multiprocessing.process._children); this pool joins its own zygote.
        _mp_children = getattr(multiprocessing.process, "_children", None)
        if _mp_children is not None:
            _mp_children.discard(self._zygote)
        zygote_end.close()
        for ident, ours, theirs in pending:
            theirs.close()  # the zygote holds it now
            self._workers.append(_Worker(ident, ours))
        del pending
        self._max_workers = max(1, max_workers)
        #: Compute seconds and count of the chunks finished here (see _grow).
        self._work_s = 0.0
        self._chunks_done = 0
        #: When the dispatcher first ran: a chunk's wait for it is not its work.
        self._dispatching_since: float | None = None
        #: Since when chunks have waited with every worker busy, or None.
        self._backlog_since: float | None = None
        self._thread = threading.Thread(
            target=self._run, name="smartexec-fork-dispatcher", daemon=True
        )
        self._thread.start()
        _LIVE_POOLS.add(self)

    # -- called from any thread ------------------------------------------------

    def submit(self, task: _Task, pinned: bool = False) -> None:
        """Queue ``task``; it starts once pickled and a worker is free.

        A retired pool takes only ``pinned`` tasks: chunks of calls whose
        snapshot of a shared object is this pool's.
        """
        with self._lock:
            self._box.raise_if_broken()
            if self._closing or (self._retiring and not pinned):
                raise RuntimeError("cannot schedule new futures after shutdown")
            with _OWNER_LOCK:
                task.pool = self
            self._queue.append(task)
        self._wake()

    def abort(self, futures: Iterable[Future[ChunkResult]]) -> None:
        """Cancel these chunks; the dispatcher kills the workers running any of them.

        Futures of other pools are ignored. Returns at once; takes no lock of
        this pool (it may be called by a generator's finalizer, anywhere).
        """
        started = [future for future in futures if not future.cancel() and not future.done()]
        if not started:
            return
        self._aborting.extend(started)
        self._wake()

    @property
    def usable(self) -> bool:
        """False once the pool is retired or closing, or its dispatcher has stopped."""
        return not self._retiring and self.takes_pinned

    @property
    def takes_pinned(self) -> bool:
        """Whether calls bound to this pool's snapshot can still send chunks here."""
        return not self._closing and (self._paused or self._thread.is_alive())

    def pin(self) -> None:
        """Bind one more call to this pool's snapshot (undone by :meth:`unpin`)."""
        with self._lock:
            self._pins += 1

    def unpin(self) -> None:
        """A call bound to this pool is over; a retired pool may stop once none is left."""
        with self._lock:
            self._pins -= 1
        self._wake()

    def retire(self) -> None:
        """Serve no new call; stop once the calls bound here are over and idle."""
        with self._lock:
            self._retiring = True
        self._wake()

    def pause(self) -> bool:
        """Stop the dispatcher thread for a while (the pool stays); True if it stopped.

        Called under :data:`_QUIESCE_LOCK`; :meth:`resume` starts it again.
        """
        if self._thread is threading.current_thread():
            return False
        with self._lock:
            if not self._thread.is_alive():
                return False
            self._pause_requested = True
        self._wake()
        self._thread.join(PAUSE_TIMEOUT_S)
        with self._lock:
            self._pause_requested = False
            if not self._paused:
                return False  # busy (in a callback): it carries on
        self._thread.join()
        return True

    def resume(self) -> None:
        """Start the dispatcher thread again after :meth:`pause`."""
        with self._lock:
            self._paused = False
        self._thread = threading.Thread(
            target=self._run, name="smartexec-fork-dispatcher", daemon=True
        )
        self._thread.start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closing = True
            if not wait and not cancel_futures:
                self._drain_at_exit = True
            cancelled = []
            if cancel_futures:
                # Tasks an idle worker is about to take are as good as started
                # (the stdlib keeps max_workers + 1 queued): cancel the rest.
                # Workers not forked yet count as idle (see _grow): they
                # would be, for these tasks.
                idle = sum(1 for w in self._workers if w.task is None)
                idle += max(0, self._max_workers - len(self._workers))
                while len(self._queue) > idle:
                    cancelled.append(self._queue.pop())
        for task in cancelled:
            task.future.cancel()
        self._wake()
        if wait and self._thread is not threading.current_thread():
            while True:
                with _QUIESCE_LOCK:  # not while paused: the dispatcher is about to resume
                    thread = self._thread
                thread.join()
                with _QUIESCE_LOCK:
                    if self._thread is thread:
                        self._thread = _JOINED
                        break
                # Another pool's start paused this one meanwhile (the join saw
                # that thread stop) and resumed it on a new thread: wait for that.

    @property
    def done(self) -> bool:
        return not self._paused and not self._thread.is_alive()

    def terminate(self, grace_s: float = 0.0) -> None:
        """Cancel queued chunks; kill workers still running after ``grace_s`` seconds.

        Their chunks fail with :class:`~smartexec.errors.WorkerCrashedError`.
        """
        self.shutdown(wait=False, cancel_futures=True)
        if self._thread is threading.current_thread():
            return
        with _QUIESCE_LOCK:
            thread = self._thread
        thread.join(grace_s)
        if thread.is_alive():
            with self._lock:
                queued = list(self._queue)  # nothing more may start
                self._queue.clear()
            for task in queued:
                if task.future.cancel():
                    task.future.set_running_or_notify_cancel()  # tells wait() / as_completed()
            for worker in list(self._workers):
                worker.kill()
            thread.join()

    def signal_workers(self, signum: int) -> None:
        """Cancel queued chunks and send ``signum`` to every worker; replace none.

        ``terminate_workers()`` (SIGTERM) and ``kill_workers()`` (SIGKILL),
        as Python 3.14's ``ProcessPoolExecutor`` does them: the pool closes,
        chunks no worker has taken are cancelled, and the dispatcher (which
        alone hands chunks to workers and reaps them, so no signal reaches a
        reused pid) signals each worker. A chunk whose worker dies of it
        fails with ``BrokenProcessPool``; one whose worker outlives it (a
        handler for SIGTERM) ends as it would have. The zygote is then
        stopped as at shutdown. Returns at once.
        """
        with self._lock:
            self._closing = True
            if not self._forced:
                self._forced = signum
            queued = list(self._queue)
            self._queue.clear()
        for task in queued:
            if task.future.cancel():
                task.future.set_running_or_notify_cancel()  # tells wait() / as_completed()
        self._wake()

    def _wake(self) -> None:
        # Under the lock: once the dispatcher has closed the pipe, its fd number
        # may belong to someone else's file (writing there corrupted loky's pipes).
        with self._wake_lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # the pipe is full: the dispatcher is awake anyway

    # -- dispatcher thread ---------------------------------------------------------

    def _fork_directly(
        self,
        count: int,
        blas_threads: int,
        blas: Any,
        zygote_end: socket.socket,
        first: _Task | None = None,
    ) -> None:
        """Fork ``count`` workers from this process (the caller's thread, no other running).

        They are capped at ``blas_threads`` BLAS threads by inheritance: the
        loaded pools are limited here, through ``blas`` (threadpoolctl's
        table, see :func:`_blas_table`), for the length of the forks
        (capping in a worker would start its OpenBLAS pool, ~50 ms of
        spinning CPU). Restoring this process's limits starts its OpenBLAS
        pool again; the zygote's fork, next, stops it (OpenBLAS shuts its
        pool down before a fork), as the zygote's fork alone did before.
        Without ``blas``, each caps its pools itself once it has started
        them.
        """
        limiter = blas.limit(limits=blas_threads) if blas is not None else None
        try:
            for _ in range(count):
                self._workers.append(self._fork_worker(blas_threads, zygote_end, blas is None))
                if first is not None and not self.took_first:
                    self.took_first = self._hand_over(self._workers[0], first)
        finally:
            if limiter is not None:
                limiter.restore_original_limits()

    def _fork_worker(self, blas_threads: int, zygote_end: socket.socket, lazy: bool) -> _Worker:
        """Fork one worker from this process; it is this process's child, reaped here.

        ``lazy``: it caps its BLAS pools itself, once it has started them
        (``blas_cap`` of :func:`_worker_main`); else they come capped.
        """
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        siblings = [w.conn for w in self._workers]
        owner = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                with contextlib.suppress(ValueError):
                    signal.set_wakeup_fd(-1)  # the caller's (asyncio's) is not ours to write to
                parent_conn.close()
                for conn in siblings:
                    conn.close()
                self._ctl.close()
                zygote_end.close()
                _as_multiprocessing_child()
                os.environ.update(thread_env(blas_threads))  # libraries loaded later
                _worker_main(child_conn, owner, owner, blas_cap=blas_threads if lazy else None)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        child_conn.close()
        worker = _Worker(next(self._idents), parent_conn)
        worker.pid = pid
        try:
            worker.pidfd = os.pidfd_open(pid)
        except BaseException:
            worker.kill()
            os.waitpid(pid, 0)
            parent_conn.close()
            raise
        return worker

    def _hand_over(self, worker: _Worker, task: _Task) -> bool:
        """Send ``task`` to the idle ``worker`` now, from this thread; False if it must queue."""
        payload = task.payload
        if payload is None or len(payload) > PRESEND_MAX_BYTES:
            return False
        with _OWNER_LOCK:
            task.pool = self
        if not task.future.set_running_or_notify_cancel():
            return True  # cancelled already: nothing to run (wait() was told)
        worker.task = task
        worker.calls += task.items
        worker.since = time.monotonic()
        try:
            worker.conn.send_bytes(payload)
        except OSError:
            # It died at once: the dispatcher reaps it, and _bury gives the
            # chunk (never sent, its request kept) to another worker.
            worker.lost = True
            return True
        task.payload, task.sent = None, True
        if task.timeout_s is not None:
            worker.deadline = time.monotonic() + task.timeout_s
        return True

    def _reaped(self, worker: _Worker, block: bool = False) -> tuple[bool, int | None]:
        """Reap a worker forked here: (whether it has exited, its exit code or None)."""
        assert worker.pid is not None
        try:
            pid, status = os.waitpid(worker.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:  # someone else reaped it (os.wait(), SIGCHLD ignored)
            exitcode = None
        else:
            if pid == 0:
                return False, None
            exitcode = os.waitstatus_to_exitcode(status)
        if worker.pidfd is not None:
            os.close(worker.pidfd)
            worker.pidfd = None
        return True, exitcode

    def _reap_directly(self, workers: Sequence[_Worker], grace_s: float) -> None:
        """Wait up to ``grace_s`` seconds for the workers forked here to exit, kill the rest, reap all."""
        left = [w for w in workers if w.pidfd is not None]
        deadline = time.monotonic() + grace_s
        while left:
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                break
            ready = set(wait_for([w.pidfd for w in left if w.pidfd is not None], wait_s))
            left = [w for w in left if w.pidfd not in ready or not self._reaped(w)[0]]
        for worker in left:
            worker.kill()
            self._reaped(worker, block=True)

    def _spawn(self) -> _Worker:
        """Ask the zygote for a worker; its pid arrives later on ``_ctl``."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        ident = next(self._idents)
        try:
            socket.send_fds(self._ctl, [b"S%d" % ident], [child_conn.fileno()])
        finally:
            child_conn.close()
        return _Worker(ident, parent_conn)

    def _read_ctl(self) -> None:
        """Handle the zygote's messages (one at least): workers forked or exited, or a worker's initializer failed.

        Reads every message already there: a new pool's replies arrive in a
        burst, one per worker, and one wait per message would cost a poll of
        every worker's pipe each.
        """
        try:
            message = self._ctl.recv(2 * _initializer.MAX_TRACEBACK_CHARS + 64)
        except OSError:
            message = b""
        while True:
            self._handle_ctl(message)
            try:
                message = self._ctl.recv(
                    2 * _initializer.MAX_TRACEBACK_CHARS + 64, socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                return
            except OSError:
                message = b""

    def _handle_ctl(self, message: bytes) -> None:
        if not message:
            raise BrokenProcessPool(
                f"the fork pool's zygote process (pid {self._zygote.pid}) died with "
                f"{_exit_description(self._zygote.exitcode)}"
            )
        if message[:1] == b"I":
            pid_text, _, text = message[1:].partition(b" ")
            self._initializer_failed(int(pid_text), text.decode("utf-8", "replace"))
            return
        first, second = message[1:].split()
        if message[:1] == b"P":
            ident, pid = int(first), int(second)
            for worker in self._workers:
                if worker.ident == ident:
                    worker.pid = pid
                    if worker.doomed:
                        # Its chunk timed out or was aborted meanwhile, or
                        # terminate_workers() / kill_workers() came.
                        worker.kill(worker.doomed)
            return
        pid, exitcode = int(first), int(second)
        for worker in self._workers:
            if worker.pid == pid:
                self._bury(worker, exitcode)
                return

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            # E.g. the zygote died. Fail everything this pool holds rather than
            # leave callers waiting.
            self._broken = exc
            self._fail_all(exc)
        finally:
            if not self._paused:
                self._stop_workers()

    def _initializer_failed(self, pid: int, text: str) -> None:
        """A worker's initializer raised: break the pool as the stdlib's breaks.

        Every chunk not finished fails with the error (which names the
        initializer and chains the worker's traceback), the failure is
        logged as the stdlib logs it, and no new chunk is taken.
        """
        error = _initializer.process_failure(
            self._initializer_name, "fork", f"fork worker process (pid {pid})", text
        )
        if self._box.record(error):
            _initializer.log_failure(error)
        self._break(self._box.error or error)

    def _take_all_tasks(self) -> list[_Task]:
        """Close the pool and take every task it holds: queued, unsent and running."""
        with self._lock:
            self._closing = True
            tasks = [*self._unsent, *self._queue]
            self._unsent.clear()
            self._queue.clear()
        tasks += [w.task for w in self._workers if w.task is not None]
        for worker in self._workers:
            worker.task, worker.deadline = None, None
        return tasks

    def _break(self, error: InitializerError) -> None:
        for task in self._take_all_tasks():
            if task.future.running() or task.future.set_running_or_notify_cancel():
                task.future.set_exception(error.again())  # one each (see Breakage.record)

    def _fail_all(self, cause: BaseException) -> None:
        for task in self._take_all_tasks():
            if task.future.done():  # its pickling failed, or it was cancelled
                continue
            error = BrokenProcessPool(
                f"the fork pool running {task.name} stopped: {type(cause).__name__}: {cause}"
            )
            error.__cause__ = cause
            if task.future.running() or task.future.set_running_or_notify_cancel():
                task.future.set_exception(error)

    def _loop(self) -> None:
        while True:
            if self._forced and not self._forced_sent:
                self._signal_all()
            self._dispatch()
            with self._lock:
                if self._pause_requested:
                    self._paused = True
                    return
                if (
                    (self._closing or (self._retiring and self._pins <= 0))
                    and not self._queue
                    and not self._unsent
                    and all(w.task is None for w in self._workers)
                ):
                    self._closing = True  # a retired pool stops as a shut-down one
                    return
            grow_in = self._grow()
            # Every live worker's pipe: a reply, or EOF when it dies.
            conns = [w.conn for w in self._workers if not w.lost]
            pidfds = {w.pidfd: w for w in self._workers if w.pidfd is not None}
            deadlines = [w.deadline for w in self._workers if w.deadline is not None]
            # Capped: a far deadline (task_timeout of a year) overflows the poll.
            wait_s = (
                None
                if not deadlines
                else min(MAX_WAIT_S, max(0.0, min(deadlines) - time.monotonic()))
            )
            if grow_in is not None:
                wait_s = grow_in if wait_s is None else min(wait_s, grow_in)
            ready = set(self._poller.wait([self._wake_r, self._ctl, *conns, *pidfds], wait_s))
            if self._wake_r in ready:
                os.read(self._wake_r, 65536)
            replies = []
            for worker in list(self._workers):
                if worker.conn in ready and not worker.lost:
                    reply = self._take_reply(worker)
                    if reply is not None:
                        replies.append(reply)
                    del reply  # a chunk (and the callable) must not outlive its map here
            for fd, worker in pidfds.items():
                if fd in ready:
                    # A worker forked here has exited (after its last reply, read above).
                    exited, exitcode = self._reaped(worker)
                    if exited:
                        worker.lost = True
                        self._bury(worker, exitcode)
            if replies:
                # The freed workers take their next chunks first; then the
                # replies are unpickled and their futures' callbacks run (a
                # map's bookkeeping): the other way round, each worker also
                # waited for those (sha256 of 4 MiB on fork: gaps of 0.6-1 ms
                # between a worker's chunks, 16-18 ms in a 0.29 s map).
                try:
                    self._dispatch()
                finally:  # taken from their workers: nothing else would end them
                    for task, data in replies:
                        self._complete(task, data)
                    del replies, task, data
            if deadlines:
                self._stop_overdue()
            if self._aborting:
                self._stop_aborted()
            if self._ctl in ready:
                self._read_ctl()

    def _signal_all(self) -> None:
        """Send the signal :meth:`signal_workers` asked for to every worker (dispatcher only)."""
        self._forced_sent = True
        signum = self._forced
        with self._lock:
            unsent = list(self._unsent)  # taken by the dispatcher already: running
            self._unsent.clear()
            queued = list(self._queue)
            self._queue.clear()
        for task in queued:
            if task.future.cancel():
                task.future.set_running_or_notify_cancel()
        for task in unsent:
            task.future.set_exception(
                BrokenProcessPool(
                    f"{task.name} did not start: {forced_by(signum)} stopped the pool"
                )
            )
        for worker in list(self._workers):
            worker.kill(signum)

    def _stop_overdue(self) -> None:
        """Kill each worker whose chunk ran past its timeout; fail that chunk."""
        now = time.monotonic()
        for worker in list(self._workers):
            task = worker.task
            if task is None or worker.deadline is None or worker.deadline > now:
                continue
            worker.task, worker.deadline = None, None
            worker.kill()
            worker.lost = True  # no chunk goes to it; the zygote reports its exit
            timeout_s = task.timeout_s or 0.0
            task.future.set_exception(
                TaskTimeoutError(
                    f"{task.name} ran longer than its task_timeout of {timeout_s:g} s "
                    f"(a chunk of {task.items} item{'s' if task.items != 1 else ''}); its "
                    f"worker process (pid {worker.pid}) was killed and replaced",
                    timeout_s=timeout_s,
                    items=task.items,
                )
            )

    def _stop_aborted(self) -> None:
        """Kill each worker running a chunk passed to :meth:`abort`; fail that chunk.

        Run by the dispatcher, which alone hands chunks to workers: a worker
        that has moved on to another map's chunk is never killed for this one.
        """
        aborting = set()
        while self._aborting:
            aborting.add(self._aborting.popleft())
        with self._lock:
            unsent = [task for task in self._unsent if task.future in aborting]
            for task in unsent:
                self._unsent.remove(task)
        stopped: list[tuple[_Task, int | None]] = [(task, None) for task in unsent]
        for worker in list(self._workers):
            running = worker.task
            if running is None or running.future not in aborting:
                continue
            worker.task, worker.deadline = None, None
            worker.kill()
            worker.lost = True  # no chunk goes to it; the zygote reports its exit
            stopped.append((running, worker.pid))
        for task, pid in stopped:
            where = "before it started" if pid is None else f"and its worker (pid {pid}) killed"
            task.future.set_exception(
                WorkerCrashedError(
                    f"{task.name} was stopped {where}: the map it belonged to was "
                    f"interrupted (KeyboardInterrupt, SystemExit or close())",
                    exitcode=None if pid is None else -signal.SIGKILL,
                )
            )

    def _next_task(self) -> _Task | None:
        """The next task to send: the queue's first, once it is pickled.

        Tasks start in the order they were queued, so one still being
        pickled holds the ones behind it (as the stdlib's feeder thread
        does). Only here does a task's future start running: until then it
        can be cancelled.
        """
        with self._lock:
            if self._unsent:
                return self._unsent.popleft()
            while self._queue:
                task = self._queue[0]
                future = task.future
                if future.cancelled():
                    self._queue.popleft()
                    future.set_running_or_notify_cancel()  # tells wait() / as_completed()
                    continue
                if future.done():  # its pickling failed: the error is on the future
                    self._queue.popleft()
                    continue
                if task.payload is None:
                    return None  # still being pickled; it wakes us when done
                self._queue.popleft()
                if future.set_running_or_notify_cancel():
                    return task
        return None

    def _retire(self, worker: _Worker) -> None:
        """Ask an idle worker to exit (max_tasks_per_child); _bury forks its replacement."""
        with contextlib.suppress(OSError):
            worker.conn.send_bytes(b"")
        worker.lost = True  # no chunk goes to it; the zygote reports its exit

    def _dispatch(self) -> None:
        # A worker the zygote has not reported yet takes a chunk too: it waits
        # in the worker's pipe, read as soon as the worker runs (the first
        # chunks of a new pool do not wait for the zygote's reply). Only a
        # request the pipe's buffer surely holds: a bigger one would block
        # this thread until the fork.
        if self._forced:
            return  # terminate_workers() / kill_workers(): nothing more starts
        for worker in self._workers:
            if worker.task is not None or worker.lost or (worker.grown and worker.pid is None):
                continue
            if self._max_tasks is not None and worker.calls >= self._max_tasks:
                self._retire(worker)  # done its share: go now, freeing its memory
                continue
            task = self._next_task()
            if task is None:
                return
            if worker.pid is None and len(task.payload or b"") > PRESEND_MAX_BYTES:
                with self._lock:
                    self._unsent.appendleft(task)  # for a worker that is up
                continue
            if (
                self._max_tasks is not None
                and worker.calls > 0
                and worker.calls + task.items > self._max_tasks
            ):
                # max_tasks_per_child: the chunk would take this worker past
                # its share; a fresh worker takes it instead.
                with self._lock:
                    self._unsent.appendleft(task)
                self._retire(worker)
                continue
            worker.calls += task.items
            worker.task = task
            worker.since = time.monotonic()
            try:
                worker.conn.send_bytes(task.payload)
            except OSError:
                # The worker died before taking it; _bury hands it to the next.
                worker.lost = True
                continue
            task.payload, task.sent = None, True
            if task.timeout_s is not None:
                worker.deadline = time.monotonic() + task.timeout_s

    def _grow(self) -> float | None:
        """Fork more workers if chunks wait behind busy ones (see GROW_WORK_S); dispatcher only.

        Returns the seconds until the rule should be looked at again while
        chunks wait (a worker's chunk may reach GROW_BLIND_S by then), or
        None.
        """
        now = time.monotonic()
        if self._dispatching_since is None:
            self._dispatching_since = now
        # A lost worker counts until _bury forks its replacement (or not).
        room = self._max_workers - len(self._workers)
        if self._forced or room <= 0:
            self._backlog_since = None  # a full pool's (its usual state): nothing to look at
            return None
        live = [w for w in self._workers if not w.lost]
        waiting = len(self._queue) + len(self._unsent)
        if not live or not waiting or any(w.task is None for w in live):
            # None left (a dead worker's replacement comes from _bury), no
            # chunk waits, or a worker is idle (or about to be: its fork is
            # on its way): no backlog.
            self._backlog_since = None
            return None
        if self._backlog_since is None:
            self._backlog_since = now
        if any(w.grown and w.pid is None for w in live):
            return None  # one asked for is not up yet
        # The youngest chunk running: every worker has been busy that long.
        busy_s = now - max(max(w.since for w in live), self._dispatching_since)
        # A map's chunks come a window at a time, small ones first: the
        # queue shows little of its work, but keeps the workers busy.
        backlog_s = now - self._backlog_since
        work_s = self._work_s / self._chunks_done if self._chunks_done else 0.0
        if (
            busy_s < GROW_BLIND_S
            and backlog_s < GROW_BACKLOG_S
            and waiting * work_s < GROW_WORK_S * len(live)
        ):
            return min(GROW_BLIND_S - busy_s, GROW_BACKLOG_S - backlog_s)
        if wait_for([w.conn for w in live], 0):
            # A reply is in, not read yet (this thread waited for the GIL
            # while the caller sent chunks): that worker is free, not busy.
            return None
        for _ in range(min(room, waiting)):
            worker = self._spawn()
            worker.grown = True
            self._workers.append(worker)
        return None

    def _take_reply(self, worker: _Worker) -> tuple[_Task, bytes] | None:
        """Read ``worker``'s reply and free the worker; the chunk and its reply, or None.

        None when the worker died (EOF) or its chunk had timed out; the
        caller completes the chunk with :meth:`_complete`.
        """
        try:
            data = worker.conn.recv_bytes()
        except (EOFError, OSError):
            worker.lost = True  # it died; the zygote reports its exit code to _bury
            return None
        task, worker.task, worker.deadline = worker.task, None, None
        if task is None:
            return None  # a reply after its chunk timed out
        return task, data

    def _complete(self, task: _Task, data: bytes) -> None:
        """Unpickle a chunk's reply and set its future (its callbacks run here)."""
        try:
            status, value = transport.loads_reply(data)
        except BaseException as exc:  # SystemExit from a __reduce__ included
            task.future.set_exception(reply_unpickling_error(task.name, exc, "fork"))
        else:
            if status == "ok":
                compute_s = getattr(value, "compute_s", None)
                if isinstance(compute_s, float):
                    self._work_s += compute_s
                    self._chunks_done += 1
                task.future.set_result(value)
            else:  # the worker could not unpickle the request
                task.future.set_exception(task_unpickling_error(task.name, value, "fork"))
            del value
        del task, data

    def _bury(self, worker: _Worker, exitcode: int | None) -> None:
        self._workers.remove(worker)
        worker.conn.close()
        task, worker.task, worker.deadline = worker.task, None, None
        if task is not None:
            if self._forced:
                died = (
                    "of it" if exitcode == -self._forced else f"with {_exit_description(exitcode)}"
                )
                task.future.set_exception(
                    BrokenProcessPool(
                        f"{task.name} did not finish: {forced_by(self._forced)} signalled "
                        f"its worker process (pid {worker.pid}), which died {died}"
                    )
                )
            elif not task.sent:  # never sent: give it to another worker
                with self._lock:
                    self._unsent.appendleft(task)
            else:
                task.future.set_exception(
                    WorkerCrashedError(
                        f"the worker process (pid {worker.pid}) running {task.name} "
                        f"died with {_exit_description(exitcode)}. Only this chunk failed; "
                        f"the worker was replaced.",
                        exitcode=exitcode,
                    )
                )
            del task
        if not self._forced and (not self._closing or self._unsent or self._queue):
            self._workers.append(self._spawn())

    def _stop_workers(self) -> None:
        try:
            self._stop_each_worker()
        finally:
            with self._wake_lock:
                if self._wake_w >= 0:
                    os.close(self._wake_r)
                    os.close(self._wake_w)
                    self._wake_r = self._wake_w = -1
            _LIVE_POOLS.discard(self)

    def _stop_each_worker(self) -> None:
        """Ask every worker to exit, then the zygote, which reaps them (or kills the slow ones).

        The zygote exits once its workers are gone (it gives them
        :data:`STOP_TIMEOUT_S` seconds, kills the rest, and reaps them), so
        joining it is joining them; their exits are not reported here one by
        one first (a round trip per worker on the way out of a ``with``).
        """
        for worker in self._workers:
            try:
                worker.conn.send_bytes(b"")
            except OSError:
                pass
        try:
            self._ctl.send(b"Q")  # the zygote reaps its workers and exits
        except OSError:
            pass
        self._ctl.close()
        direct = [w for w in self._workers if w.pidfd is not None]
        self._reap_directly(direct, STOP_TIMEOUT_S)  # those forked here
        self._zygote.join(2 * STOP_TIMEOUT_S + 1)
        for worker in self._workers:
            if self._zygote.is_alive() and worker not in direct:
                worker.kill()  # a zygote that does not exit: kill its workers ourselves
            worker.conn.close()
        self._workers = []
        if self._zygote.is_alive():
            self._zygote.kill()
            self._zygote.join()
        try:
            self._zygote.close()
        except ValueError:
            pass


class _Prepared:
    """What :meth:`ForkBackend.prepare` returns for a shared callable.

    Attributes:
        ref: the trampoline reference chunks carry.
        fn: the user's callable (kept alive while the call runs).
        since: the backend's epoch when ``map``/``submit`` was called: only a
            pool born later holds a current snapshot; None when the current
            pool's snapshot was proven current by digest.
        digest: the state's digest at that moment (a submit), recorded by
            the pool forked for it; None when unknown.
    """

    __slots__ = ("ref", "fn", "since", "digest", "pool", "_unbind", "__weakref__")

    def __init__(
        self,
        ref: trampoline.SharedRef,
        fn: Any,
        since: int | None,
        digest: bytes | None = None,
    ):
        self.ref = ref
        self.fn = fn
        self.since = since
        self.digest = digest
        self.pool: _ForkPool | None = None  # the pool whose snapshot this call runs on
        self._unbind: weakref.finalize[Any, Any] | None = None

    def bind(self, pool: _ForkPool) -> None:
        """Run this call's chunks on ``pool``, which stays up (retired or not) while it lives."""
        pool.pin()
        if self._unbind is not None:
            self._unbind()  # the old pool can no longer run chunks (broken, closed)
        self.pool = pool
        self._unbind = weakref.finalize(self, pool.unpin)


class _Entry:
    __slots__ = ("token", "handle")

    def __init__(self, token: int, handle: WeakCallable):
        self.token = token
        self.handle = handle


class ForkBackend(Backend):
    """Runs chunks on worker processes forked from this process.

    Callables prepared with ``share=True`` reach workers by copy-on-write
    through :mod:`smartexec.trampoline` and are never pickled. Other callables
    and all arguments are pickled by :mod:`smartexec.transport` (cloudpickle,
    protocol 5): numpy buffers of 1 MiB or more, both ways, through shared
    memory; an argument object repeated across calls, once.

    Args:
        max_workers: worker processes (None: one per CPU).
        cpu_count: CPUs this process may use.
        initializer: run as ``initializer(*initargs)`` once in each worker
            process, after its fork and before its first chunk (replacement
            workers too); None runs nothing. It and ``initargs`` reach the
            workers by inheritance, never pickled. When it raises, the
            backend is broken (:attr:`broken`): pending and later chunks fail
            with :class:`~smartexec.errors.ProcessInitializerError`, a
            ``BrokenProcessPool``.
        initargs: the initializer's arguments (tuple).
        max_tasks_per_child: calls (not chunks) a worker process may run
            before it exits and is replaced (int >= 1); None: no limit.
    """

    name = "fork"
    pickles_closures = True
    copy_on_write = True
    stops_tasks = True
    #: Asked for by name (multiprocessing.get_context("fork"), os.fork):
    #: never the interpreter's default, forkserver on Linux from Python 3.14.
    start_method = "fork"
    #: Source: benchmarks/bench_overheads.py (7 ms for 2 workers; 120-150 us
    #: per one-item chunk; 2-core machine, 2026-11-29).
    worker_startup_s = 0.004
    chunk_overhead_s = 150e-6

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        max_tasks_per_child: int | None = None,
    ):
        super().__init__(max_workers, cpu_count)
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self.max_tasks_per_child = _initializer.check_max_tasks(max_tasks_per_child)
        self._box = _initializer.Breakage()
        check_open_files(self.max_workers, self.name)
        self._cpu_count = cpu_count
        self._lock = threading.RLock()
        self._entries: dict[Hashable, _Entry] = {}
        self._pool: _ForkPool | None = None
        self._retired: list[_ForkPool] = []
        self._closed = False
        self._cache = transport.ObjectCache()  # big arguments seen twice: sent once
        #: Orders calls and forks: a pool born after a call's epoch forked
        #: after that call, so its snapshot is at least as new as the call.
        self._epochs = itertools.count(1)
        self._sender = Sender(self.name)  # pickles what is not plain data, in order

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed in a worker, or None."""
        return self._box.error

    @classmethod
    def unavailable_reason(cls) -> str | None:
        from .._system import current_platform

        if not current_platform().has_fork:
            return "start method 'fork' is not available (or not safe) on this platform"
        return None

    def prepare(self, fn: Any, share: bool) -> Any:
        """For a ``map``: a shared callable runs on a pool forked after this call.

        Checking that an existing pool's snapshot is current would cost a
        digest of the whole state (40-80 ms per 100 MB); forking a new pool
        costs about a millisecond per 100 MB mapped, so a map always gets a
        fresh snapshot. Its chunks all use that snapshot.
        """
        if not share:
            return fn
        with self._lock:
            token = self._token(fn)
            return _Prepared(trampoline.SharedRef(token, callable_name(fn)), fn, next(self._epochs))

    def prepare_call(self, fn: Any, share: bool) -> Any:
        """For a ``submit``: reuse the current pool when a digest proves its snapshot current.

        A loop of submits would otherwise fork a pool per call. The digest
        (:func:`smartexec._fingerprint.digest`) pickles the callable with its
        buffers out of band and hashes them in place; the pool forked for a
        submit records it. A state that cannot be pickled (one reason to
        share it) cannot be proven current: each such submit forks a new pool.
        """
        if not share:
            return fn
        try:
            digest: bytes | None = _fingerprint.digest(fn)
        except Exception:
            digest = None
        with self._lock:
            token = self._token(fn)
            pool = self._pool
            since: int | None = next(self._epochs)
            if (
                digest is not None
                and pool is not None
                and pool.usable
                and token in pool.covered
                and pool.digests.get(token) == digest
            ):
                since = None
            return _Prepared(trampoline.SharedRef(token, callable_name(fn)), fn, since, digest)

    def _token(self, fn: Any) -> int:
        """The trampoline token of shared callable ``fn`` (under the lock)."""
        key = identity_key(fn)
        entry = self._entries.get(key)
        if entry is None or not entry.handle.matches(fn):
            entry = _Entry(trampoline.new_token(), WeakCallable(fn, lambda: self._forget(key)))
            self._entries[key] = entry
            if not entry.handle.weak:
                self._bound_strong_entries()
        return entry.token

    def refresh(self, fn: Any) -> bool:
        """Forget ``fn``'s trampoline token; its next chunks fork a new pool.

        Not needed for correctness: every ``map`` or ``submit`` already sees
        the state as it was when it was called (see :meth:`prepare`). Kept
        for explicit control, e.g. to drop a state a long-running map holds.

        Returns:
            True when ``fn`` was shared with this backend's workers.
        """
        with self._lock:
            return self._entries.pop(identity_key(fn), None) is not None

    def _bound_strong_entries(self) -> None:
        """Keep at most MAX_STRONG_SHARED callables that cannot be weakly referenced.

        They are held strongly (a list's method, a ``__slots__`` class without
        ``__weakref__``); the oldest are let go, so they cannot pile up. A let-go
        callable still running keeps itself alive through its tasks.
        """
        strong = [k for k, e in self._entries.items() if not e.handle.weak]
        for key in strong[: max(0, len(strong) - MAX_STRONG_SHARED)]:
            del self._entries[key]

    def _forget(self, key: Hashable) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.handle.get() is None:
                del self._entries[key]

    def _live_objects(self) -> dict[int, Any]:
        with self._lock:
            live = {}
            for entry in self._entries.values():
                obj = entry.handle.get()
                if obj is not None:
                    live[entry.token] = obj
            return live

    def _pool_covering(
        self,
        token: int | None,
        since: int | None = None,
        digest: bytes | None = None,
        first: _Task | None = None,
    ) -> _ForkPool:
        """The pool to run on: one that inherited ``token`` after epoch ``since``.

        Starts a new pool when the current one cannot serve (none, stopping,
        ``token`` not inherited, or forked before ``since``); the old one runs
        its queued chunks out. A new pool records ``digest`` for ``token``,
        and may take ``first`` at its start (:attr:`_ForkPool.took_first`:
        then it must not be submitted).
        """
        with self._lock:
            self._box.raise_if_broken()
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pool = self._pool
            if _EXITING and (pool is None or not pool.usable):
                # The exit hook stops the pools: a pool forked now would
                # outlive it, and hold the exit until its workers end.
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            if (
                pool is None
                or not pool.usable
                or (token is not None and token not in pool.covered)
                or (since is not None and pool.born <= since)
            ):
                if pool is not None:
                    # Its queued chunks stay and run there: chunks of a call whose
                    # snapshot is that pool's must not run on a newer one (a
                    # submit queued before a change returned the changed state).
                    pool.retire()
                    self._retired = [p for p in self._retired if not p.done] + [pool]
                born = next(self._epochs)  # taken before the fork: no later call is older
                pool = self._pool = _ForkPool(
                    self.max_workers,
                    self._live_objects,
                    threads_per_worker(self._cpu_count, self.max_workers),
                    initializer=self._initializer,
                    initargs=self._initargs,
                    max_tasks_per_child=self.max_tasks_per_child,
                    box=self._box,
                    first=first,
                )
                pool.born = born
                if token is not None and digest is not None:
                    pool.digests[token] = digest
            return pool

    def submit_chunk(
        self,
        fn: Any,
        chunk: Sequence[Call],
        budget_s: float | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Future[ChunkResult]:
        """Queue a chunk and return its future at once; with ``timeout_s``, a time limit.

        See :meth:`Backend.submit_chunk`. Never raises for a payload that
        cannot be pickled: the future fails with
        :class:`~smartexec.errors.PayloadPicklingError`. Plain data is pickled
        before this returns (microseconds); anything else on the sender
        thread (:mod:`smartexec._sender`). A chunk over ``timeout_s`` seconds
        (counted from when a worker takes it) fails with
        :class:`~smartexec.errors.TaskTimeoutError`; its worker is killed and
        replaced.
        """
        since: int | None = None
        digest: bytes | None = None
        if isinstance(fn, _Prepared):
            target, keepalive, token = fn.ref, fn.fn, fn.ref.token
            name, since, digest, plain = fn.ref.name, fn.since, fn.digest, None
        else:
            target, keepalive, token, name, plain = fn, None, None, callable_name(fn), fn
        calls = copy_calls(chunk)  # an OwnCalls chunk stays one
        task = _Task(Future(), None, keepalive, name, timeout_s, len(calls))
        blame = keepalive if keepalive is not None else fn
        inline = self._sender.idle() and quick_to_pickle(plain, calls)
        # Pickled before it is queued: one wake-up, nothing to wait for. A
        # Ctrl-C waits until the chunk's segments are its future's.
        with deferred_interrupts() if inline else contextlib.nullcontext():
            if inline:
                self._pickle(task, target, calls, budget_s, blame, inline=True)
                if task.future.done():
                    return task.future  # it could not be pickled
            self._queue_task(fn, task, token, since, digest, inline)
        if not inline:
            self._sender.put(lambda: self._pickle(task, target, calls, budget_s, blame))
        return task.future

    def _queue_task(
        self,
        fn: Any,
        task: _Task,
        token: Any,
        since: int | None,
        digest: bytes | None,
        inline: bool,
    ) -> None:
        """Hand ``task`` to the pool that covers its snapshot (forking it here if new)."""
        try:
            with self._lock:  # no other thread may retire the pool in between
                # In this thread: a new pool forks its zygote here, never in the sender.
                if isinstance(fn, _Prepared):
                    # Every chunk of one call (a map's, a retry) on one snapshot.
                    pool = fn.pool
                    if pool is None or not pool.takes_pinned:
                        pool = self._pool_covering(token, since, digest, task)
                        fn.bind(pool)
                    if task.pool is None:  # not taken by a new pool at its start
                        pool.submit(task, pinned=True)
                else:
                    pool = self._pool_covering(token, since, digest, task)
                    if task.pool is None:
                        pool.submit(task)
        except BaseException:
            if inline:
                task.future.cancel()  # releases its lease
            raise

    def _pickle(
        self,
        task: _Task,
        target: Any,
        calls: list[Call],
        budget_s: float | None,
        blame: Any,
        inline: bool = False,
    ) -> None:
        """Pickle a queued task's request; on failure, fail its future with a clear error."""
        future = task.future
        if future.done():  # cancelled before its turn: nothing to pickle
            task.wake_pool()
            return
        try:
            payload, lease = transport.dumps_request(target, calls, budget_s, cache=self._cache)
        except BaseException as exc:
            fail_on_pickling(future, exc, blame, calls, self.name, from_sender=not inline)
            task.wake_pool()
            if inline and not isinstance(exc, Exception):
                raise  # Ctrl-C while pickling in the caller's thread: the caller's to handle
            return
        lease.release_when_done(future)  # its shared-memory segments live until then
        task.payload = payload
        task.wake_pool()

    def abort(self, futures: Sequence[Future[ChunkResult]]) -> None:
        """Cancel these chunks and kill the workers running any of them.

        See :meth:`Backend.abort`. Each killed worker is replaced; its chunk
        fails with :class:`~smartexec.errors.WorkerCrashedError`. Takes no
        lock (a generator's finalizer may call it in a thread holding one).
        """
        pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.abort(futures)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            self._sender.wait_idle()  # a cancelled task may still be pickling
            self._cache.close()
        elif self._sender.idle():
            self._cache.close()
        else:
            self._sender.put(self._cache.close)  # after the pickles queued before it

    def signal_workers(self, signum: int) -> None:
        """Send ``signum`` to every worker of every pool; cancel what has not started.

        See :meth:`Backend.signal_workers`. No worker is replaced, and each
        pool's zygote (which forks the workers and runs no user code) is
        stopped as at shutdown once its workers are gone. Returns at once.
        """
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.signal_workers(signum)
        self.shutdown(wait=False, cancel_futures=True)  # the pickles and the cache

    def terminate(self) -> None:
        """Stop now: cancel queued chunks and kill the workers running chunks."""
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.terminate()


def _shutdown_all_pools() -> None:
    """At interpreter exit: stop every pool of this process.

    A pool whose executor called ``shutdown(wait=False)`` runs its queued
    chunks out first, as ``concurrent.futures`` does. Otherwise (the
    executor was never shut down) nothing can receive a result any more
    (every non-daemon thread has ended), so queued chunks are cancelled,
    running chunks get :data:`STOP_TIMEOUT_S` seconds, and workers still
    busy are then killed: a forgotten ``shutdown()`` never holds the exit.
    """
    global _EXITING
    _EXITING = True
    for pool in list(_LIVE_POOLS):
        if pool._pid != os.getpid():
            continue
        if pool._drain_at_exit:
            pool.shutdown(wait=True)  # shutdown(wait=False) was called: finish the queue
        else:
            pool.terminate(STOP_TIMEOUT_S)


def _after_fork_in_child() -> None:
    # A forked child must never drive its parent's pools.
    _LIVE_POOLS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
# A plain atexit hook: it runs after non-daemon threads are joined, so a map
# still streaming in such a thread when the main thread ends can finish.
atexit.register(_shutdown_all_pools)
