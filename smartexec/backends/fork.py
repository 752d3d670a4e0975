"""The fork backend: worker processes forked from the caller, with trampolines.

Data flow (one *pool* = one generation of workers, all forked together)::

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
* A shared callable first seen after the pool forked starts a new pool that
  inherits it (forking a process costs about a millisecond per 100 MB of
  mapped memory); the old pool finishes the chunks already queued on it, then
  stops. While both run, up to twice ``max_workers`` processes exist.
* Pickling happens in the submitting thread, so a payload that cannot be
  pickled raises from ``submit`` itself, naming the part that failed.
* Workers ignore SIGINT (the parent decides what Ctrl-C stops) and exit on
  their own within :data:`PARENT_CHECK_S` seconds if the parent dies.
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing
import multiprocessing.util  # noqa: F401 - its atexit hook must be registered before ours
import os
import signal
import threading
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait as wait_for
from typing import Any

from .. import trampoline, transport
from .._blas import cap_in_this_process, threads_per_worker
from .._diagnose import pickling_error
from .._identity import WeakCallable, identity_key
from .._remote import Call, ChunkResult, dumps, remote_exception, run_chunk
from ..errors import PayloadPicklingError, RemoteError, WorkerCrashedError
from ..inspection import callable_name
from ._base import Backend

__all__ = ["ForkBackend"]

#: Seconds between a worker's checks that its parent is still alive. Only an
#: idle worker checks; the cost is one getppid() call per interval.
PARENT_CHECK_S = 1.0
#: Seconds a worker gets to exit after being asked before it is killed.
STOP_TIMEOUT_S = 2.0
#: Shared callables that cannot be weakly referenced, kept for reuse at most.
MAX_STRONG_SHARED = 8

_LIVE_POOLS: weakref.WeakSet[_ForkPool] = weakref.WeakSet()


def _worker_main(conn: Any, parent_pid: int, blas_threads: int) -> None:
    """Worker loop (runs in the forked child): receive a chunk, run it, reply."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cap_in_this_process(blas_threads)
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
        result: ChunkResult | None = None
        try:
            fn, chunk, budget_s = transport.loads_request(data)
        except BaseException as exc:
            reply: tuple[str, Any] = ("error", remote_exception(exc))
        else:
            del data
            result = run_chunk(fn, chunk, True, budget_s)
            reply = ("ok", result)
            del fn, chunk
        try:
            payload = transport.dumps_reply(reply)
        except BaseException:
            assert result is not None
            payload = transport.dumps_reply(("ok", _picklable_outcomes(result)))
        del reply, result
        try:
            conn.send_bytes(payload)
        except OSError:
            return


def _picklable_outcomes(result: ChunkResult) -> ChunkResult:
    """Replace each result that cannot be pickled by an error naming it."""
    outcomes = []
    for ok, value in result.outcomes:
        try:
            dumps(value)
        except BaseException as exc:
            error = PayloadPicklingError(
                f"the result ({type(value).__qualname__}) could not be pickled to send it "
                f"back from the worker process: {type(exc).__name__}: {exc}. Return plain "
                f"data (numbers, strings, lists, dicts, numpy arrays), or use "
                f'backend="thread" to keep results in-process',
                where="result",
                reason=str(exc),
            )
            outcomes.append((False, remote_exception(error)))
        else:
            outcomes.append((ok, value))
    return ChunkResult(outcomes, result.compute_s)


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


class _Task:
    __slots__ = ("future", "payload", "keepalive", "name")

    def __init__(self, future: Future[ChunkResult], payload: bytes, keepalive: Any, name: str):
        self.future = future
        self.payload: bytes | None = payload
        self.keepalive = keepalive  # the shared callable, alive until the chunk ends
        self.name = name


class _Worker:
    __slots__ = ("process", "conn", "task")

    def __init__(self, process: Any, conn: Any):
        self.process = process
        self.conn = conn
        self.task: _Task | None = None


class _ForkPool:
    """One generation of fork workers sharing one inherited table.

    Args:
        max_workers: workers to fork.
        live_objects: returns token -> object for every shared callable still
            alive; called (under the backend's lock) before each fork.
    """

    def __init__(
        self,
        max_workers: int,
        live_objects: Callable[[], Mapping[int, Any]],
        blas_threads: int = 1,
    ):
        self._ctx = multiprocessing.get_context("fork")
        self._blas_threads = blas_threads
        self._live_objects = live_objects
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: collections.deque[_Task] = collections.deque()
        self._unsent: collections.deque[_Task] = collections.deque()
        self._closing = False
        self._broken: BaseException | None = None
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        objects = live_objects()
        self.covered = frozenset(objects)
        # Fork every worker now, in the caller's thread, before our dispatcher
        # thread exists.
        self._workers = [self._spawn(objects) for _ in range(max_workers)]
        del objects
        self._thread = threading.Thread(
            target=self._run, name="smartexec-fork-dispatcher", daemon=True
        )
        self._thread.start()
        _LIVE_POOLS.add(self)

    # -- called from any thread ------------------------------------------------

    def submit(self, payload: bytes, keepalive: Any, name: str) -> Future[ChunkResult]:
        future: Future[ChunkResult] = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.append(_Task(future, payload, keepalive, name))
        self._wake()
        return future

    def take_queued(self) -> list[_Task]:
        """Remove and return the tasks no worker has started (for a newer pool)."""
        with self._lock:
            tasks = list(self._queue)
            self._queue.clear()
        return tasks

    def adopt(self, tasks: list[_Task]) -> None:
        """Queue tasks taken from an older pool, ahead of anything newer."""
        with self._lock:
            self._queue.extendleft(reversed(tasks))
        self._wake()

    @property
    def usable(self) -> bool:
        """False once the pool is closing or its dispatcher has stopped."""
        return not self._closing and self._thread.is_alive()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closing = True
            cancelled = []
            if cancel_futures:
                # Tasks an idle worker is about to take are as good as started
                # (the stdlib keeps max_workers + 1 queued): cancel the rest.
                idle = sum(1 for w in self._workers if w.task is None)
                while len(self._queue) > idle:
                    cancelled.append(self._queue.pop())
        for task in cancelled:
            task.future.cancel()
        self._wake()
        if wait and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

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

    def _spawn(self, objects: Mapping[int, Any] | None = None) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        if objects is None:
            objects = self._live_objects()
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, os.getpid(), self._blas_threads),
            name="smartexec-fork-worker",
        )
        with trampoline.forking(objects):
            process.start()
        # Process.start() in any thread reaps every finished child it knows of
        # (multiprocessing.process._children); if it reaped ours while our
        # dispatcher joins them, both would be unsure whether the worker exited.
        # This pool joins its own workers, so take them off that list.
        _mp_children = getattr(multiprocessing.process, "_children", None)
        if _mp_children is not None:
            _mp_children.discard(process)
        child_conn.close()
        return _Worker(process, parent_conn)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            # E.g. forking a replacement worker failed (out of memory). Fail
            # everything this pool holds rather than leave callers waiting.
            self._broken = exc
            self._fail_all(exc)
        finally:
            self._stop_workers()

    def _fail_all(self, cause: BaseException) -> None:
        with self._lock:
            self._closing = True
            tasks = [*self._unsent, *self._queue]
            self._unsent.clear()
            self._queue.clear()
        tasks += [w.task for w in self._workers if w.task is not None]
        for worker in self._workers:
            worker.task = None
        for task in tasks:
            error = BrokenProcessPool(
                f"the fork pool running {task.name} stopped: {type(cause).__name__}: {cause}"
            )
            error.__cause__ = cause
            if task.future.running() or task.future.set_running_or_notify_cancel():
                task.future.set_exception(error)

    def _loop(self) -> None:
        while True:
            self._dispatch()
            with self._lock:
                if (
                    self._closing
                    and not self._queue
                    and not self._unsent
                    and all(w.task is None for w in self._workers)
                ):
                    return
            busy = [w.conn for w in self._workers if w.task is not None]
            sentinels = [w.process.sentinel for w in self._workers]
            ready = set(wait_for([self._wake_r, *busy, *sentinels]))
            if self._wake_r in ready:
                os.read(self._wake_r, 65536)
            for worker in list(self._workers):
                if worker.task is not None and worker.conn in ready:
                    self._receive(worker)
            for worker in list(self._workers):
                if worker.process.sentinel in ready:
                    self._bury(worker)

    def _next_task(self) -> _Task | None:
        with self._lock:
            if self._unsent:
                return self._unsent.popleft()
            while self._queue:
                task = self._queue.popleft()
                if task.future.set_running_or_notify_cancel():
                    return task
        return None

    def _dispatch(self) -> None:
        for worker in self._workers:
            if worker.task is not None:
                continue
            task = self._next_task()
            if task is None:
                return
            worker.task = task
            try:
                worker.conn.send_bytes(task.payload)  # type: ignore[arg-type]
            except OSError:
                # The worker died before taking it; _bury hands it to the next.
                continue
            task.payload = None

    def _receive(self, worker: _Worker) -> None:
        try:
            data = worker.conn.recv_bytes()
        except (EOFError, OSError):
            return  # the worker died; _bury reports it
        task, worker.task = worker.task, None
        assert task is not None
        try:
            status, value = transport.loads_reply(data)
        except BaseException as exc:
            task.future.set_exception(
                RemoteError(
                    type(exc).__qualname__,
                    f"the reply for {task.name} could not be unpickled in the parent: {exc}",
                )
            )
        else:
            if status == "ok":
                task.future.set_result(value)
            else:
                task.future.set_exception(value)
        del task, data

    def _bury(self, worker: _Worker) -> None:
        worker.process.join(0.1)
        exitcode = worker.process.exitcode
        self._workers.remove(worker)
        worker.conn.close()
        task, worker.task = worker.task, None
        if task is not None:
            if task.payload is not None:  # never sent: give it to another worker
                with self._lock:
                    self._unsent.appendleft(task)
            else:
                task.future.set_exception(
                    WorkerCrashedError(
                        f"the worker process (pid {worker.process.pid}) running {task.name} "
                        f"died with {_exit_description(exitcode)}. Only this chunk failed; "
                        f"the worker was replaced.",
                        exitcode=exitcode,
                    )
                )
            del task
        if not self._closing or self._unsent or self._queue:
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
        for worker in self._workers:
            try:
                worker.conn.send_bytes(b"")
            except OSError:
                pass
        for worker in self._workers:
            worker.process.join(STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
            try:
                worker.process.close()
            except ValueError:
                # Another thread's multiprocessing bookkeeping (Process.start()
                # reaps finished children) may have reaped it first, leaving
                # this Process object unsure; it is gone, the object is freed later.
                pass
        self._workers = []


class _Prepared:
    """What :meth:`ForkBackend.prepare` returns for a shared callable."""

    __slots__ = ("ref", "fn")

    def __init__(self, ref: trampoline.SharedRef, fn: Any):
        self.ref = ref
        self.fn = fn


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
    """

    name = "fork"
    pickles_closures = True
    copy_on_write = True
    #: Source: benchmarks/bench_overheads.py (7 ms for 2 workers; 120-150 us
    #: per one-item chunk; 2-core machine, 2026-11-29).
    worker_startup_s = 0.004
    chunk_overhead_s = 150e-6

    def __init__(self, max_workers: int | None, cpu_count: int):
        super().__init__(max_workers, cpu_count)
        self._cpu_count = cpu_count
        self._lock = threading.RLock()
        self._entries: dict[Hashable, _Entry] = {}
        self._pool: _ForkPool | None = None
        self._retired: list[_ForkPool] = []
        self._closed = False
        self._cache = transport.ObjectCache()  # big arguments seen twice: sent once

    @classmethod
    def unavailable_reason(cls) -> str | None:
        from .._system import current_platform

        if not current_platform().has_fork:
            return "start method 'fork' is not available (or not safe) on this platform"
        return None

    def prepare(self, fn: Any, share: bool) -> Any:
        if not share:
            return fn
        key = identity_key(fn)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.handle.matches(fn):
                entry = _Entry(trampoline.new_token(), WeakCallable(fn, lambda: self._forget(key)))
                self._entries[key] = entry
                if not entry.handle.weak:
                    self._bound_strong_entries()
            return _Prepared(trampoline.SharedRef(entry.token, callable_name(fn)), fn)

    def refresh(self, fn: Any) -> bool:
        """Make the next chunks of ``fn`` see its state as it is now.

        Workers hold the copy of a shared callable's object that they
        inherited when they were forked. Dropping its token makes the next
        submit fork a new pool from the parent's current memory.

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

    def _pool_covering(self, token: int | None) -> _ForkPool:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pool = self._pool
            if pool is None or not pool.usable or (token is not None and token not in pool.covered):
                queued = []
                if pool is not None:
                    # The new pool inherits every live object, so it can run what
                    # the old one has not started: at most two pools stay busy.
                    queued = pool.take_queued()
                    pool.shutdown(wait=False)
                    self._retired = [p for p in self._retired if not p.done] + [pool]
                pool = self._pool = _ForkPool(
                    self.max_workers,
                    self._live_objects,
                    threads_per_worker(self._cpu_count, self.max_workers),
                )
                if queued:
                    pool.adopt(queued)
            return pool

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        if isinstance(fn, _Prepared):
            target, keepalive, token = fn.ref, fn.fn, fn.ref.token
            name = fn.ref.name
        else:
            target, keepalive, token, name = fn, None, None, callable_name(fn)
        try:
            payload, lease = transport.dumps_request(target, chunk, budget_s, cache=self._cache)
        except Exception as exc:
            raise pickling_error(
                keepalive if keepalive is not None else fn, chunk, exc, self.name
            ) from exc
        try:
            with self._lock:  # no other thread may retire the pool in between
                future = self._pool_covering(token).submit(payload, keepalive, name)
        except BaseException:
            lease.release()
            raise
        lease.release_when_done(future)  # its shared-memory segments live until then
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            pools = [p for p in (*self._retired, self._pool) if p is not None]
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        self._cache.close()


def _shutdown_all_pools() -> None:
    """At interpreter exit: let every pool of this process finish and stop."""
    for pool in list(_LIVE_POOLS):
        if pool._pid == os.getpid():
            pool.shutdown(wait=True)


def _after_fork_in_child() -> None:
    # A forked child must never drive its parent's pools.
    _LIVE_POOLS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
# A plain atexit hook: it runs after non-daemon threads are joined, so a map
# still streaming in such a thread when the main thread ends can finish.
atexit.register(_shutdown_all_pools)
