"""A fork pool: one generation of workers forked from one snapshot of this process.

See :mod:`smartexec.backends.fork` for the data flow.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait as wait_for
from typing import Any

from ... import _initializer, transport
from ..._module_reads import Record
from ..._remote import ChunkResult
from ..._sender import PAUSE_TIMEOUT_S
from ..._threads import own_thread
from ...errors import InitializerError, TaskTimeoutError, WorkerCrashedError
from .._base import forced_by, next_ready
from ._children import (
    STOP_TIMEOUT_S,
    _exit_description,
)
from ._forking import _Forker, reap_directly, reaped
from ._parts import (
    _JOINED,
    _LIVE_POOLS,
    _OWNER_LOCK,
    _QUIESCE_LOCK,
    GROW_BACKLOG_S,
    GROW_BLIND_S,
    GROW_WORK_S,
    MAX_WAIT_S,
    PRESEND_MAX_BYTES,
    _Poller,
    _Task,
    _Worker,
)


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
        self._initializer_name = (
            _initializer.name_of(initializer) if initializer is not None else ""
        )
        self._max_tasks = max_tasks_per_child
        self._box = box if box is not None else _initializer.Breakage()
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
        #: The module-level values the callables run lately read, as they
        #: were before this pool forked (see :mod:`smartexec._module_reads`).
        self.reads: Record = {}
        objects = live_objects()
        self.covered = frozenset(objects)
        self._forker = _Forker(blas_threads)
        self._forker.start(objects, (initializer, initargs), first, self)
        del objects
        self._ctl, self._zygote = self._forker.ctl, self._forker.zygote
        self._workers = self._forker.workers
        #: Whether this pool's first worker(s) were forked by this process itself.
        self.forked_directly = self._forker.forked_directly
        #: Whether ``first`` went straight to the first worker (else: queue it).
        self.took_first = self._forker.took_first
        self._max_workers = max(1, max_workers)
        #: Compute seconds and count of the chunks finished here (see _grow).
        self._work_s = 0.0
        self._chunks_done = 0
        #: When the dispatcher first ran: a chunk's wait for it is not its work.
        self._dispatching_since: float | None = None
        #: Since when chunks have waited with every worker busy, or None.
        self._backlog_since: float | None = None
        self._thread = own_thread(self._run, "smartexec-fork-dispatcher")
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

    @property
    def bound_calls(self) -> int:
        """Calls (maps, submits) bound to this pool's snapshot and not over."""
        return self._pins

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
        self._thread = own_thread(self._run, "smartexec-fork-dispatcher")
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
                    exited, exitcode = reaped(worker)
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
            return next_ready(self._queue, _future_of, _pickled)

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
            worker = self._forker.spawn()
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
        ok, value = transport.read_reply(data, task.name, "fork")
        if ok:
            self._work_s += value.compute_s
            self._chunks_done += 1
            task.future.set_result(value)
        else:
            task.future.set_exception(value)
        del task, data, value

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
            self._workers.append(self._forker.spawn())

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
        reap_directly(direct, STOP_TIMEOUT_S)  # those forked here
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


def _future_of(task: _Task) -> Future[ChunkResult]:
    return task.future


def _pickled(task: _Task) -> bool:
    return task.payload is not None
