"""What runs in the forked processes: the zygote, and the workers it forks.

The parent side (:mod:`._pool`) forks the zygote once per pool; the zygote
forks the workers (or the parent forks the first one itself). Each worker
serves one chunk at a time on its own pipe and exits on its own when its
parent is gone.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import select
import signal
import socket
import sys
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from ... import _initializer, _threads, transport
from ..._blas import (
    cap_in_this_process,
    controller_for_fork,
)
from ..._system import mark_worker_process
from ...transport import PARENT_CHECK_S

#: Seconds a worker gets to exit after being asked before it is killed.
STOP_TIMEOUT_S = 2.0


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
    started (see :func:`smartexec._threads.native_threads_run`): capping
    OpenBLAS after a fork starts its pool, whose threads spin for ~0.1 s of CPU, so a worker that
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
    _keep_recursion_headroom()
    _threads.forget_inherited_pools()
    try:
        if initializer is not None and not _initialized(initializer, initargs, ctl):
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
            start = time.perf_counter()
            data = conn.recv_bytes()
            received_s = time.perf_counter() - start
        except (EOFError, OSError):
            return
        if not data:
            return
        payload = transport.serve_request(data, owner=owner_pid, received_s=received_s)
        del data
        try:
            conn.send_bytes(payload)
        except OSError:
            return
        if blas_cap is not None and _threads.native_threads_run(settle_s=0.001):
            cap_in_this_process(blas_cap)  # their pool runs: no new threads start
            blas_cap = None


#: Frames between the worker loop and the callable in a chunk of one call
#: (a map's first chunks, a submit): serve_request, run_chunk, the chunk's
#: run and its loop. In a bigger chunk, its first item (watched) runs one
#: frame deeper, its later ones one shallower.
SERVING_FRAMES = 5

#: Frames a ``ProcessPoolExecutor`` fork worker runs a call under, beyond
#: those of the code that called ``map``: 17 on Python 3.10 and 3.11, 15
#: from 3.12 (measured with a call that counts its frames).
STDLIB_WORKER_FRAMES = 17 if sys.version_info < (3, 12) else 15


def _keep_recursion_headroom() -> None:
    """Give the callable the recursion headroom a ``ProcessPoolExecutor`` worker gives it.

    A fork worker runs below the stack of the parent's thread that forked
    it (or its zygote), as a ``ProcessPoolExecutor`` worker does below the
    thread that started it; but the frames from the map's call down to the
    callable (the map's, the zygote's start through ``multiprocessing``,
    the worker's, the serving ones) are 8-15 more than the stdlib's: a
    recursion that ran in a ``ProcessPoolExecutor`` worker (980 deep of a
    limit of 1000) raised ``RecursionError`` here. The limit is raised by
    that difference, counted on this worker's stack: from here up to the
    outermost frame of smartexec's (the map's call), whatever path forked it.
    """
    ours = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frames = below_the_call = 0
    found: types.FrameType | None = sys._getframe(1)  # the worker loop's
    while found is not None:
        frames += 1
        if found.f_code.co_filename.startswith(ours):
            below_the_call = frames
        found = found.f_back
    extra = below_the_call + SERVING_FRAMES - STDLIB_WORKER_FRAMES
    if extra > 0:
        sys.setrecursionlimit(sys.getrecursionlimit() + extra)


def _initialized(
    initializer: Callable[..., Any], initargs: tuple[Any, ...], ctl: socket.socket | None
) -> bool:
    """Run ``initializer(*initargs)`` in this worker; False when it raised.

    A failure is logged here first, where the initializer may have sent this
    worker's logging (as the stdlib's worker logs it), then sent on ``ctl``
    as ``I<pid> <traceback>``.
    """
    handlers = _initializer.logging_handlers()
    try:
        initializer(*initargs)
    except BaseException as exc:
        _initializer.log_in_worker(exc, handlers)
        if ctl is not None:
            text = _initializer.traceback_text(exc).encode("utf-8", "replace")
            with contextlib.suppress(OSError):
                ctl.send(b"I%d " % os.getpid() + text)
        return False
    return True


def _blas_table() -> Any | None:
    """This process's threadpoolctl table for a new pool's forks; None without numpy.

    Built here, in the parent, once for the process (see
    :func:`~smartexec._blas.controller_for_fork`), for every pool, the
    process's first included: the workers forked here directly are capped
    by inheritance (:meth:`_Forker._fork_directly` limits this process's
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
    zygote = _Zygote(ctl, blas_threads, blas, (initializer, initargs), parent_pid)
    for pid in direct:
        with contextlib.suppress(OSError):
            zygote.direct_fds.append(os.pidfd_open(pid))
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    zygote.unforked.extend(fd for _, fd in prefork)
    for ident, worker_fd in prefork:
        zygote.unforked.remove(worker_fd)
        zygote.fork_worker(ident, worker_fd)
    asked = zygote.serve()
    # The parent closed its end: workers were asked to stop (or their parent died).
    zygote.reap(STOP_TIMEOUT_S)
    for pid in list(zygote.children):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not asked:
        # The parent is gone: its own workers too (after the grace above).
        for fd in zygote.direct_fds:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    zygote.reap(STOP_TIMEOUT_S)


class _Zygote:
    """The zygote's state and steps (see :func:`_zygote_main`): fork, reply, reap, serve.

    The zygote never blocks on ``ctl``: its replies wait in an outbox until
    the socket takes them. A new pool's workers (``prefork``) are all
    reported before the parent's dispatcher reads a reply, and replacements
    may be asked for in bursts; about 280 records fill a ``SOCK_SEQPACKET``
    buffer each way, and a zygote blocked in ``send`` would stop reading
    requests, blocking the parent's ``send_fds`` in turn (``max_workers`` in
    the hundreds hung the pool).
    """

    def __init__(
        self,
        ctl: socket.socket,
        blas_threads: int,
        blas: Any,
        init: tuple[Callable[..., Any] | None, tuple[Any, ...]],
        parent_pid: int,
    ) -> None:
        self.ctl = ctl
        self.parent_pid = parent_pid
        self.pid = os.getpid()
        self.init = init
        # Cap BLAS here, once, not in each worker: the workers inherit the cap.
        # Capping OpenBLAS after a fork starts its thread pool, whose threads
        # spin for ~0.1 s of CPU; capped right before the zygote's first fork,
        # they stop at once (OpenBLAS shuts its pool down before a fork), so no
        # process runs a spinning thread: not a worker, and not a zygote that
        # has no worker to fork yet (its first was forked by the parent itself).
        self.blas: tuple[int, Any] | None = (blas_threads, blas)
        self.children: set[int] = set()
        self.direct_fds: list[int] = []  # pidfds of the workers the parent forked
        self.unforked: list[int] = []  # prefork's ends this process holds, not yet a worker's
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        ctl.setblocking(False)
        self.outbox: collections.deque[bytes] = collections.deque()
        self.poller = select.poll()  # not select(): fds past 1024 (a busy server) are fine
        self.poller.register(ctl.fileno(), select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)

    def send(self, message: bytes) -> None:
        """Queue ``message`` for the parent and send what the socket takes."""
        self.outbox.append(message)
        self.flush()

    def flush(self) -> None:
        """Send queued replies until the socket is full (then wait for POLLOUT)."""
        while self.outbox:
            try:
                self.ctl.send(self.outbox[0])
            except BlockingIOError:  # the parent reads on: send the rest when it can
                self.poller.modify(self.ctl.fileno(), select.POLLIN | select.POLLOUT)
                return
            except OSError:
                self.outbox.clear()  # the parent is gone
                break
            self.outbox.popleft()
        self.poller.modify(self.ctl.fileno(), select.POLLIN)

    def drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass

    def reap(self, block_s: float = 0.0) -> None:
        """Report exited workers (``X<pid> <exitcode>``); wait up to ``block_s`` for the rest."""
        deadline = time.monotonic() + block_s
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # Until the next SIGCHLD (its handler writes to wake_w), not a
                # fixed sleep: a stopping pool waits for its workers' exits.
                select.select([self.wake_r], [], [], min(left, 0.05))
                self.drain_wakeups()
                continue
            self.children.discard(pid)
            self.send(b"X%d %d" % (pid, os.waitstatus_to_exitcode(status)))

    def fork_worker(self, ident: int, worker_fd: int) -> None:
        """Fork a worker on ``worker_fd`` and report it (``P<ident> <pid>``)."""
        if self.blas is not None:
            cap_in_this_process(*self.blas)
            self.blas = None
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(self.wake_r)
                os.close(self.wake_w)
                for other_fd in (*self.unforked, *self.direct_fds):
                    os.close(other_fd)  # the ends of siblings not forked yet
                conn = multiprocessing.connection.Connection(worker_fd)
                # ctl stays open through the initializer (to report its
                # failure); _worker_main closes it before the loop.
                _worker_main(conn, self.pid, self.parent_pid, *self.init, self.ctl)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(worker_fd)
        self.children.add(pid)
        self.send(b"P%d %d" % (ident, pid))

    def serve(self) -> bool:
        """Fork workers on request until asked to stop; True when asked (``Q``), not orphaned."""
        ctl = self.ctl.fileno()
        while True:
            events = dict(self.poller.poll(PARENT_CHECK_S * 1000))
            ready = {fd for fd, event in events.items() if event & ~select.POLLOUT}
            if not events and os.getppid() != self.parent_pid:
                return False
            if events.get(ctl, 0) & select.POLLOUT:
                self.flush()
            if self.wake_r in ready:
                self.drain_wakeups()
                self.reap()
            if ctl not in ready:
                continue
            try:
                message, fds, _, _ = socket.recv_fds(self.ctl, 256, 4)
            except BlockingIOError:
                continue
            except OSError:
                message, fds = b"", []
            if not message or message == b"Q":
                for fd in fds:
                    os.close(fd)
                return message == b"Q"
            self.fork_worker(int(message[1:]), fds[0])


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
