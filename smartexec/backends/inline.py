"""The inline backend: run each chunk in the calling thread, at once.

Chosen when parallelism would cost more than it saves, or forced with
``backend="inline"`` (handy under a debugger: breakpoints and tracebacks are
those of a plain loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from .. import _initializer
from .._context import InContext
from .._remote import Call, ChunkResult, run_chunk
from ..errors import InitializerError, ThreadInitializerError
from ._base import Backend

__all__ = ["InlineBackend"]


class InlineBackend(Backend):
    """Runs chunks synchronously in the submitting thread.

    Args:
        max_workers: ignored (one "worker": the caller).
        cpu_count: CPUs this process may use.
        initializer: run as ``initializer(*initargs)`` once, in the calling
            thread, before the first chunk (the caller is this backend's one
            worker). When it raises, the backend is broken (:attr:`broken`)
            and every chunk fails with
            :class:`~smartexec.errors.ThreadInitializerError`.
        initargs: the initializer's arguments (tuple).
    """

    name = "inline"
    shares_memory = True
    pickles_closures = True
    synchronous = True

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ):
        super().__init__(max_workers, cpu_count)
        self._initargs = _initializer.check(initializer, initargs)
        self._initializer = initializer
        self._box = _initializer.Breakage()
        self._init_lock = threading.Lock()

    @property
    def broken(self) -> InitializerError | None:
        """The error of the initializer that failed, or None."""
        return self._box.error

    def initialize(self) -> None:
        """Run the initializer now unless it ran (or failed) already.

        Raises:
            ThreadInitializerError: it raised (now or before).
        """
        initializer = self._initializer
        if initializer is not None:
            with self._init_lock:
                if self._initializer is not None:
                    self._initializer = None
                    try:
                        initializer(*self._initargs)
                    except BaseException as exc:
                        name = _initializer.name_of(initializer)
                        error = ThreadInitializerError(
                            _initializer.message(
                                name,
                                "the calling thread (backend='inline')",
                                f"{type(exc).__qualname__}: {exc}",
                            ),
                            initializer=name,
                            backend=self.name,
                        )
                        error.__cause__ = exc
                        if self._box.record(error):
                            _initializer.log_failure(error)
        self._box.raise_if_broken()

    @classmethod
    def default_workers(cls, cpu_count: int) -> int:
        return 1

    def prepare(self, fn: Callable[..., Any], share: bool) -> Any:
        """``fn`` run in a copy of the caller's context: its changes there stay its own."""
        return InContext(fn)

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> Future[ChunkResult]:
        future: Future[ChunkResult] = Future()
        future.set_running_or_notify_cancel()
        try:
            self.initialize()
        except InitializerError as exc:
            future.set_exception(exc)
            return future
        future.set_result(run_chunk(fn, chunk, False, budget_s))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None
