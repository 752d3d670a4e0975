"""Pickle chunks off the caller's thread, in order: one background thread per backend.

``submit()`` must return at once, as ``ProcessPoolExecutor.submit`` does, even
when an argument takes seconds to pickle; and a pickling error belongs on the
future, not raised by ``submit``. The process backends therefore reserve the
chunk's place (its future) first, then pickle it:

* **inline**, in the submitting thread, when :func:`quick_to_pickle` says the
  callable and arguments are plain data of bounded size (numbers, strings and
  bytes up to :data:`MAX_QUICK_BYTES`, containers of those up to
  :data:`MAX_QUICK_NODES` objects, numpy arrays of plain dtype up to
  :data:`MAX_QUICK_ARRAY_BYTES`) and nothing is waiting in the sender: such a
  pickle takes microseconds, less than waking another thread for it, and an
  error is still set on the future (2000 ``submit(abs, -i)`` on fork cost
  110-290 us each before and after this change, the same within the noise
  of a busy 2-core machine, 2026-12);
* otherwise by the backend's :class:`Sender`, a thread named
  ``smartexec-<backend>-sender`` that runs jobs in the order they came, so
  chunks reach workers in submission order. Anything that is not plain data
  (an instance of the user's class, whose ``__reduce__`` may do anything, a
  bound method, a callable sent once per worker) goes this way.

The sender thread exists only while it has jobs; around a fork
(``backends/fork/_parts.py``'s ``_quiesced``) it is paused between two jobs, like the fork
pools' dispatchers: a job still pickling after :data:`PAUSE_TIMEOUT_S` seconds
keeps running, and the fork goes on.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import types
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ._remote import Call, ChunkResult
from ._threads import own_thread

if TYPE_CHECKING:
    from .backends._base import Backend
    from .stats import StatsRecorder

__all__ = ["Sender", "quick_to_pickle", "pause_senders", "send_chunk"]

#: Objects :func:`quick_to_pickle` looks at, at most, per chunk.
MAX_QUICK_NODES = 256
#: Longest ``str`` / ``bytes`` pickled in the submitting thread (a memory copy
#: of 1 MiB takes ~0.1 ms).
MAX_QUICK_BYTES = 1 << 20
#: Biggest numpy array pickled in the submitting thread: arrays of 1 MiB or
#: more are copied once into shared memory, ~3 GB/s, so ~20 ms at this size.
MAX_QUICK_ARRAY_BYTES = 64 << 20
#: Seconds to wait for a sender or a dispatcher to pause before a fork goes
#: on without (a dispatcher may be running a future's done-callback, user
#: code that may wait on us).
PAUSE_TIMEOUT_S = 0.5

_ATOMS = frozenset(
    {type(None), bool, int, float, complex, range, slice, type(Ellipsis), type(NotImplemented)}
)
_SEQUENCES = frozenset({tuple, list, set, frozenset})
_FUNCTIONS = (types.BuiltinFunctionType, types.BuiltinMethodType, type)

_LIVE: weakref.WeakSet[Sender] = weakref.WeakSet()


def quick_to_pickle(fn: Any, chunk: Sequence[Call]) -> bool:
    """Whether ``fn`` and ``chunk`` surely pickle in well under a millisecond.

    Looks at types only (no pickling): True for plain data of bounded size,
    a builtin, a class, or a plain function whose closure holds such data.
    False for anything else, whose pickling cost nobody can bound in advance.

    Args:
        fn: what the backend sends in place of the callable; None when the
            backend knows it is small (a fork worker's reference to a
            callable it inherited).
        chunk: the ``(args, kwargs)`` calls.
    """
    budget = MAX_QUICK_NODES
    stack: list[Any] = []
    if isinstance(fn, types.FunctionType):
        for cell in fn.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    elif fn is not None and not isinstance(fn, _FUNCTIONS):
        return False
    for args, kwargs in chunk:
        stack.extend(args)
        stack.extend(kwargs.values())
        if len(stack) > budget:
            return False  # more nodes than the budget: no need to list them all
    while stack:
        budget -= 1
        if budget < 0:
            return False
        obj = stack.pop()
        kind = type(obj)
        if kind in _ATOMS:
            continue
        if kind is str or kind is bytes or kind is bytearray:
            if len(obj) > MAX_QUICK_BYTES:
                return False
            continue
        if kind in _SEQUENCES:
            if len(obj) > budget:
                return False
            stack.extend(obj)
            continue
        if kind is dict:
            if 2 * len(obj) > budget:
                return False
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if kind.__name__ == "ndarray" and kind.__module__ == "numpy":
            if obj.dtype.hasobject or obj.nbytes > MAX_QUICK_ARRAY_BYTES:
                return False
            continue
        return False
    return True


class Sender:
    """Runs jobs (pickle one chunk, hand it on) in order on one background thread.

    Jobs never raise: each sets its outcome on its own future. The thread
    starts with the first job and exits when none is left.

    Args:
        backend: the backend's name, for the thread's name.
    """

    def __init__(self, backend: str):
        self._thread_name = f"smartexec-{backend}-sender"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._paused = False
        _LIVE.add(self)

    def idle(self) -> bool:
        """True when no job is queued or running (an inline pickle keeps the order)."""
        with self._lock:
            return not self._jobs and not self._busy

    def put(self, job: Callable[[], None]) -> None:
        """Queue ``job`` after every job queued before it."""
        with self._lock:
            self._jobs.append(job)
            self._start()

    def wait_idle(self) -> None:
        """Block until every queued job has run."""
        if self._thread is threading.current_thread():
            return
        with self._changed:
            self._changed.wait_for(lambda: not self._jobs and not self._busy)

    def _start(self) -> None:
        # Under the lock.
        if self._thread is None and self._jobs and not self._paused:
            self._thread = own_thread(self._run, self._thread_name)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._busy = False
                if self._paused or not self._jobs:
                    self._thread = None
                    self._changed.notify_all()
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                job()
            except BaseException:  # pragma: no cover - jobs catch their own errors
                pass
            del job

    def pause(self) -> bool:
        """Stop the thread between two jobs (up to :data:`PAUSE_TIMEOUT_S`); True if none runs."""
        with self._lock:
            thread = self._thread
            if thread is threading.current_thread():
                return False
            self._paused = True
        if thread is not None:
            thread.join(PAUSE_TIMEOUT_S)
        with self._lock:
            return self._thread is None

    def resume(self) -> None:
        """Let the thread run again after :meth:`pause`."""
        with self._lock:
            self._paused = False
            self._start()


def pause_senders() -> list[Sender]:
    """Pause every sender of this process for a fork; resume those returned after it."""
    senders = list(_LIVE)
    for sender in senders:
        sender.pause()
    return senders


def _after_fork_in_child() -> None:
    # A forked child never runs its parent's jobs.
    for sender in list(_LIVE):
        sender._lock = threading.Lock()
        sender._changed = threading.Condition(sender._lock)
        sender._jobs.clear()
        sender._thread = None
        sender._busy = False
        sender._paused = False
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def send_chunk(
    backend: Backend,
    target: Any,
    calls: list[Call],
    budget_s: float | None,
    timeout_s: float | None,
    recorder: StatsRecorder,
) -> Future[ChunkResult]:
    """Send one chunk to ``backend`` now and count it for ``stats()``.

    With a time limit only when ``timeout_s`` is set (a backend without
    ``timeout_s`` never gets the keyword). Raises what ``submit_chunk``
    raises (``RuntimeError`` after shutdown).
    """
    start = time.perf_counter()
    if timeout_s is None:
        future = backend.submit_chunk(target, calls, budget_s)
    else:
        future = backend.submit_chunk(target, calls, budget_s, timeout_s=timeout_s)  # type: ignore[call-arg]
    recorder.track(
        backend.name, backend.max_workers, len(calls), future, time.perf_counter() - start
    )
    return future
