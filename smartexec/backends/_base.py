"""The backend interface: a few hooks and capability flags.

A backend runs *chunks*: a callable and a list of ``(args, kwargs)`` calls.
:meth:`Backend.submit_chunk` returns a ``concurrent.futures.Future`` whose
result is a :class:`~smartexec._remote.ChunkResult` (one outcome per call).
``SmartExecutor`` builds ``submit`` (a chunk of one) and ``map`` on top of it.

Built-in backends and third-party plugins implement exactly this class and are
found through the same registry (:mod:`smartexec.registry`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar

from .._remote import Call, ChunkResult

__all__ = ["Backend"]


class Backend(abc.ABC):
    """Base class of every backend.

    Capabilities are class attributes that callers read instead of checking
    types:

    Attributes:
        name: the short lowercase name the backend is registered under.
        shares_memory: workers run in the caller's process (threads, inline).
        pickles_closures: lambdas and closures can be sent (cloudpickle).
        copy_on_write: workers inherit the parent's memory at fork time.
        distributed: workers may run on other machines.
        synchronous: chunks run in the submitting thread before
            ``submit_chunk`` returns (inline).
        stops_tasks: the backend honours ``submit_chunk(timeout_s=...)`` by
            stopping the chunk (killing its worker). The executor routes
            callables with a ``task_timeout`` to such a backend where it can.
        worker_startup_s: seconds to start one worker, for the cost model of
            :mod:`smartexec.tuning` (measured by benchmarks/bench_overheads.py).
        chunk_overhead_s: seconds of dispatch per chunk (pickling, pipes,
            wake-ups), likewise.

    Args:
        max_workers: how many workers to run (int >= 1), or None for the
            backend's default (:meth:`default_workers`).
        cpu_count: CPUs this process may use, for the default.
    """

    name: ClassVar[str] = ""
    shares_memory: ClassVar[bool] = False
    pickles_closures: ClassVar[bool] = False
    copy_on_write: ClassVar[bool] = False
    distributed: ClassVar[bool] = False
    synchronous: ClassVar[bool] = False
    stops_tasks: ClassVar[bool] = False
    worker_startup_s: ClassVar[float] = 0.0
    chunk_overhead_s: ClassVar[float] = 0.0

    def __init__(self, max_workers: int | None, cpu_count: int):
        self.max_workers = (
            max_workers if max_workers is not None else self.default_workers(cpu_count)
        )

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        """Workers to run when the user gives no ``max_workers``: one per CPU."""
        return cpu_count

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run here (e.g. a missing package), or None."""
        return None

    def prepare(self, fn: Callable[..., Any], share: bool) -> Any:
        """Return what :meth:`submit_chunk` should send in place of ``fn``.

        Args:
            fn: the user's callable.
            share: the policy asked for ``fn`` to be shared by copy-on-write
                rather than pickled (only backends with ``copy_on_write``
                honour it).
        """
        return fn

    @abc.abstractmethod
    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        """Schedule ``fn`` over ``chunk``; return a future of its ChunkResult.

        Args:
            fn: what :meth:`prepare` returned.
            chunk: ``(args, kwargs)`` pairs.
            budget_s: pass to :func:`smartexec._remote.run_chunk`: the worker
                may stop after this many seconds and return outcomes for a
                prefix of the chunk only; None runs the whole chunk.

        The executor passes a keyword ``timeout_s`` (seconds the chunk may
        run once started) only when the user set a ``task_timeout``; a
        backend that accepts it fails the future with
        :class:`~smartexec.errors.TaskTimeoutError` at the deadline (and
        sets ``stops_tasks`` when it also stops the work).

        Returns:
            A ``concurrent.futures.Future``. Cancelling it before it runs
            cancels the chunk.

        Raises:
            smartexec.errors.PayloadPicklingError: ``fn`` or an argument cannot
                be sent to the workers (backends that pickle eagerly).
        """

    def terminate(self) -> None:
        """Stop now (Ctrl-C): cancel chunks not started, stop running ones if possible.

        Called by ``SmartExecutor`` when a ``with`` block ends with
        ``KeyboardInterrupt`` or ``SystemExit``. The default cancels what has
        not started and returns without waiting; process backends override it
        to kill their workers.
        """
        self.shutdown(wait=False, cancel_futures=True)

    @abc.abstractmethod
    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers; mirrors ``concurrent.futures.Executor.shutdown``.

        Idempotent. With ``cancel_futures`` chunks not yet started are
        cancelled; with ``wait`` the call returns once every worker is gone.
        """
