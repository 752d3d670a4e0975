"""Starting a fork pool's processes: the zygote, the workers forked directly, and their reaping.

A :class:`_Forker` belongs to one :class:`~smartexec.backends.fork._pool._ForkPool`;
it holds what the pool's processes hang on (the zygote, its control socket,
the workers' list and their idents) and makes them; the pool's dispatcher
runs them.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import wait as wait_for
from typing import Any

from ... import _threads, trampoline
from ..._blas import thread_env
from ._children import _as_multiprocessing_child, _blas_table, _worker_main, _zygote_main
from ._parts import (
    _OWNER_LOCK,
    DIRECT_WORKERS,
    PRESEND_MAX_BYTES,
    _may_fork_directly,
    _quiesced,
    _Task,
    _Worker,
)

__all__ = ["_Forker", "hand_over", "reap_directly", "reaped"]


class _Forker:
    """Makes one pool's processes; see :meth:`start`.

    Attributes:
        ctl: the parent's end of the zygote's control socket.
        zygote: the zygote's process (set by :meth:`start`).
        workers: the pool's workers (the pool's dispatcher owns the list
            once :meth:`start` returns).
        forked_directly: whether the first worker(s) were forked by this
            process itself.
        took_first: whether ``first`` went straight to the first worker
            (else: the pool queues it).
    """

    def __init__(self, blas_threads: int) -> None:
        self._ctx = multiprocessing.get_context("fork")
        self._blas_threads = blas_threads
        self._idents = itertools.count()
        self.ctl, self._zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.workers: list[_Worker] = []
        self.zygote: Any = None
        self.forked_directly = False
        self.took_first = False

    def start(
        self,
        objects: Mapping[int, Any],
        init: tuple[Callable[..., Any] | None, tuple[Any, ...]],
        first: _Task | None,
        pool: Any,
    ) -> None:
        """Fork the zygote (and, where safe, the first workers) with ``objects`` in the trampoline table.

        Forks now, in the caller's thread, before the pool's dispatcher
        thread exists. When no other thread runs (ours paused), the first
        :data:`DIRECT_WORKERS` are forked here directly, as a hand-written
        fork Pool's are: no thread can hold a lock they copy, and the first
        chunk does not wait for a zygote to start and fork in turn. The
        zygote is forked either way, last: it forks every other worker (all
        of them when another thread runs; replacements always), the first
        ones as soon as it starts, on pipes it inherits.

        Args:
            objects: token -> object, the trampoline table the forks inherit.
            init: ``(initializer, initargs)``, run in each worker after its fork.
            first: a task to hand to the first worker forked here, or None
                (see :attr:`took_first`).
            pool: the pool these processes serve (``first.pool`` once handed).

        Raises:
            BaseException: a fork failed (``EAGAIN``): nothing of this pool
                is left running, and ``first``, if it was handed over, fails.
        """
        blas = _blas_table()
        pending: list[tuple[int, Any, Any]] = []  # (ident, our end, the worker's end)
        try:
            with _quiesced(), trampoline.forking(objects), _threads.fork_warning_checked():
                if _may_fork_directly(init[0]):
                    self.forked_directly = True
                    self._fork_directly(blas, first, pool)
                # The zygote forks the others as soon as it starts (prefork).
                if not self.workers:
                    pending.append((next(self._idents), *self._ctx.Pipe(duplex=True)))
                self.zygote = self._ctx.Process(
                    target=_zygote_main,
                    args=(
                        self._zygote_end,
                        self.ctl.fileno(),
                        os.getpid(),
                        self._blas_threads,
                        blas,
                        *init,
                        [w.conn.fileno() for w in self.workers]
                        + [ours.fileno() for _, ours, _ in pending],
                        [(ident, theirs.fileno()) for ident, _, theirs in pending],
                        [w.pid for w in self.workers if w.pid is not None],
                    ),
                    name="smartexec-fork-zygote",
                )
                self.zygote.start()
        except BaseException as exc:
            reap_directly(self.workers, 0.0)  # a fork failed (EAGAIN): none is left
            self.ctl.close()
            self._zygote_end.close()
            for _, ours, theirs in pending:
                ours.close()
                theirs.close()
            if first is not None and self.took_first and first.future.running():
                first.future.set_exception(exc)  # handed over: nobody else will end it
            raise
        # Process.start() in any thread reaps every finished child it knows of
        # (multiprocessing.process._children); the pool joins its own zygote.
        _mp_children = getattr(multiprocessing.process, "_children", None)
        if _mp_children is not None:
            _mp_children.discard(self.zygote)
        self._zygote_end.close()
        for ident, ours, theirs in pending:
            theirs.close()  # the zygote holds it now
            self.workers.append(_Worker(ident, ours))

    def _fork_directly(self, blas: Any, first: _Task | None, pool: Any) -> None:
        """Fork :data:`DIRECT_WORKERS` workers from this process (the caller's thread, no other running).

        They are capped at the pool's BLAS threads by inheritance: the
        loaded pools are limited here, through ``blas`` (threadpoolctl's
        table, see :func:`_blas_table`), for the length of the forks
        (capping in a worker would start its OpenBLAS pool, ~50 ms of
        spinning CPU). Restoring this process's limits starts its OpenBLAS
        pool again; the zygote's fork, next, stops it (OpenBLAS shuts its
        pool down before a fork), as the zygote's fork alone did before.
        Without ``blas``, each caps its pools itself once it has started
        them.
        """
        limiter = blas.limit(limits=self._blas_threads) if blas is not None else None
        try:
            for _ in range(DIRECT_WORKERS):
                self.workers.append(self._fork_worker(lazy=blas is None))
                if first is not None and not self.took_first:
                    self.took_first = hand_over(pool, self.workers[0], first)
        finally:
            if limiter is not None:
                limiter.restore_original_limits()

    def _fork_worker(self, lazy: bool) -> _Worker:
        """Fork one worker from this process; it is this process's child, reaped here.

        ``lazy``: it caps its BLAS pools itself, once it has started them
        (``blas_cap`` of :func:`_worker_main`); else they come capped.
        """
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        siblings = [w.conn for w in self.workers]
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
                self.ctl.close()
                self._zygote_end.close()
                _as_multiprocessing_child()
                os.environ.update(thread_env(self._blas_threads))  # libraries loaded later
                cap = self._blas_threads if lazy else None
                _worker_main(child_conn, owner, owner, blas_cap=cap)
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

    def spawn(self) -> _Worker:
        """Ask the zygote for a worker; its pid arrives later on :attr:`ctl`."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        ident = next(self._idents)
        try:
            socket.send_fds(self.ctl, [b"S%d" % ident], [child_conn.fileno()])
        finally:
            child_conn.close()
        return _Worker(ident, parent_conn)


def reaped(worker: _Worker, block: bool = False) -> tuple[bool, int | None]:
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


def reap_directly(workers: Sequence[_Worker], grace_s: float) -> None:
    """Wait up to ``grace_s`` seconds for the workers forked here to exit, kill the rest, reap all."""
    left = [w for w in workers if w.pidfd is not None]
    deadline = time.monotonic() + grace_s
    while left:
        wait_s = deadline - time.monotonic()
        if wait_s <= 0:
            break
        ready = set(wait_for([w.pidfd for w in left if w.pidfd is not None], wait_s))
        left = [w for w in left if w.pidfd not in ready or not reaped(w)[0]]
    for worker in left:
        worker.kill()
        reaped(worker, block=True)


def hand_over(pool: Any, worker: _Worker, task: _Task) -> bool:
    """Send ``task`` to the idle ``worker`` of ``pool`` now, from this thread; False if it must queue."""
    payload = task.payload
    if payload is None or len(payload) > PRESEND_MAX_BYTES:
        return False
    with _OWNER_LOCK:
        task.pool = pool
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
