"""What a fork pool is made of: its tasks, its workers, its poller, and the locks and limits its pools share."""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..._remote import ChunkResult
from ..._sender import PAUSE_TIMEOUT_S, pause_senders

if TYPE_CHECKING:
    from ._pool import _ForkPool

#: Longest single wait of the dispatcher, seconds (it loops after it).
MAX_WAIT_S = 3600.0

_LIVE_POOLS: weakref.WeakSet[_ForkPool] = weakref.WeakSet()


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


@contextlib.contextmanager
def _quiesced() -> Iterator[None]:
    """Stop every thread of ours that can be stopped, for the length of a fork.

    Python 3.12+ warns when a process with several threads forks, because
    the child gets a copy of every lock another thread held at that instant.
    The fork pools' dispatcher threads pause (they hold no state on their
    stack) and the thread backends let their idle threads exit; all restart
    after the fork. A dispatcher or idle pool thread busy in a done-callback
    past :data:`PAUSE_TIMEOUT_S`, a thread pool with work, and threads that are not
    ours (the user's, loky's) stay: the policy routes away from fork when the
    user's threads run (see :func:`smartexec.policy.decide`).
    """
    # No thread backend exists before its module is imported: not importing
    # it here spares a fresh process's first fork pool ~0.5 ms.
    thread_module = sys.modules.get("smartexec.backends.thread")

    with _QUIESCE_LOCK:
        me = os.getpid()
        paused = [pool for pool in list(_LIVE_POOLS) if pool._pid == me and pool.pause()]
        senders = pause_senders()
        try:
            if thread_module is not None:
                thread_module.release_idle_thread_pools(PAUSE_TIMEOUT_S)
            yield
        finally:
            for sender in senders:
                sender.resume()
            for pool in paused:
                pool.resume()


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
