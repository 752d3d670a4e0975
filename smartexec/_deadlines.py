"""One thread for every deadline: a chunk's ``task_timeout`` on threads, and any other "call this later".

A ``threading.Timer`` per chunk is a thread per chunk: a map of 10,000
items in chunks of 10 with a ``task_timeout`` started 1,000 of them. Here
one daemon thread (``smartexec-deadline``) keeps a heap of due times and
runs each callback when it is due, unless it was cancelled first. The
thread starts with the first deadline and ends once none is left; a forked
child starts with none.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable

from ._threads import own_thread

__all__ = ["Deadline", "call_later"]


class Deadline:
    """A callback due at a time; :meth:`cancel` before it is due and it never runs."""

    __slots__ = ("due", "callback", "cancelled")

    def __init__(self, due: float, callback: Callable[[], None]):
        self.due = due
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        """Never run the callback (a no-op once it ran). Thread-safe, never blocks."""
        self.cancelled = True
        _SCHEDULE.cancelled()


class _Schedule:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.heap: list[tuple[float, int, Deadline]] = []
        self.order = itertools.count()
        self.thread: threading.Thread | None = None
        self.dropped = 0  # cancelled entries still in the heap

    def add(self, delay_s: float, callback: Callable[[], None]) -> Deadline:
        deadline = Deadline(time.monotonic() + max(0.0, delay_s), callback)
        with self.lock:
            heapq.heappush(self.heap, (deadline.due, next(self.order), deadline))
            if self.thread is None:
                self.thread = own_thread(self.run, "smartexec-deadline")
                self.thread.start()
            elif self.heap[0][2] is deadline:
                self.wake.notify()
        return deadline

    def cancelled(self) -> None:
        # Cancelled entries wait in the heap until due; past half of it, sweep.
        with self.lock:
            self.dropped += 1
            if self.dropped * 2 > len(self.heap) > 64:
                self.heap = [e for e in self.heap if not e[2].cancelled]
                heapq.heapify(self.heap)
                self.dropped = 0

    def run(self) -> None:
        while True:
            with self.lock:
                while self.heap and self.heap[0][2].cancelled:
                    heapq.heappop(self.heap)
                    self.dropped = max(0, self.dropped - 1)
                if not self.heap:
                    self.thread = None
                    return
                wait_s = self.heap[0][0] - time.monotonic()
                if wait_s > 0:
                    self.wake.wait(min(wait_s, threading.TIMEOUT_MAX))
                    continue
                deadline = heapq.heappop(self.heap)[2]
            if not deadline.cancelled:
                try:
                    deadline.callback()
                except Exception:  # noqa: BLE001 - a callback must not stop the others
                    pass

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_SCHEDULE = _Schedule()
os.register_at_fork(after_in_child=_SCHEDULE.after_fork)


def call_later(delay_s: float, callback: Callable[[], None]) -> Deadline:
    """Run ``callback()`` on the deadline thread in ``delay_s`` seconds (float >= 0).

    Returns:
        A :class:`Deadline`; its ``cancel()`` stops the call if it has not
        started. An exception the callback raises is dropped.
    """
    return _SCHEDULE.add(delay_s, callback)
