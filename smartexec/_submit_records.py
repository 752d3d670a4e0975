"""What one executor's submits keep per callable: its record, and its calls while they are learned.

Used by :mod:`smartexec._submit_route` (under ``SubmitRoute.lock``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sized
from concurrent.futures import Future
from typing import Any

from ._call_future import CallFuture
from ._identity import WeakCallable
from ._remote import ChunkResult
from ._submit_learning import MIN_CALLS, Learned, ThreadCalls
from .policy import Decision

__all__ = ["Fast", "LearningCalls", "Parked"]


#: A parked call and what sends it on its process route.
Parked = tuple[CallFuture, Callable[[], "Future[ChunkResult]"]]


class LearningCalls:
    """One callable's submits while its figures are learned (under :attr:`SubmitRoute.lock`).

    Attributes:
        decision: the process decision they were routed by.
        sent: calls sent to processes, oldest first (done ones dropped as
            new ones come): a verdict moves those no worker has taken.
        parked: calls not sent yet, oldest first, each with its sender.
        window: calls that may be sent and not completed at once while
            fewer than ``MIN_CALLS`` have completed (:func:`send_ahead`).
        in_flight: calls sent and not completed.
        completed: calls that completed (any outcome, cancelled included).
        key: the callable's identity key.
    """

    __slots__ = ("key", "decision", "sent", "parked", "window", "in_flight", "completed")

    def __init__(self, key: Any, decision: Decision, window: int):
        self.key = key
        self.decision = decision
        self.sent: collections.deque[CallFuture] = collections.deque()
        self.parked: collections.deque[Parked] = collections.deque()
        self.window = window
        self.in_flight = 0
        self.completed = 0

    def parks(self) -> bool:
        """Whether the next submit waits unsent (FIFO behind any that wait)."""
        if self.parked:
            return True
        return self.completed < MIN_CALLS and self.in_flight >= self.window


#: A fast-submit entry: (the handle, the verdict or None, ``backend.submit_call``,
#: the stats recorder, the calls a cheap verdict re-checks: ``ThreadCalls.calls``, else ()).
Fast = tuple[WeakCallable, "Learned | None", Callable[..., Any], Any, Sized]


class _Known:
    """What one executor's submits know of one callable, behind one weak handle.

    Kept only for callables that can be weakly referenced (a cache must
    never keep a user's object alive); it goes when the callable dies.

    Attributes:
        moved: ``(verdict, the policy's decision, the moved one)`` once its
            submits' figures moved it to threads, else None.
        learning: its calls sent and parked while its figures are learned, else None.
        fast: its submits skip the routing (:meth:`SubmitRoute.fast_path`), else None.
        timed: where pool threads time its calls for a cheap verdict's
            re-check (kept while it lives: the thread backend keeps a call
            loop per log).
    """

    __slots__ = ("handle", "moved", "learning", "fast", "timed")

    def __init__(self) -> None:
        self.handle: WeakCallable = None  # type: ignore[assignment]  # set once made
        self.moved: tuple[Learned, Decision, Decision] | None = None
        self.learning: LearningCalls | None = None
        self.fast: Fast | None = None
        self.timed: ThreadCalls | None = None
