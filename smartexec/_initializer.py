"""Worker initializers: ``SmartExecutor(initializer=, initargs=)``, checked, run and reported.

A backend runs the user's initializer once in each of its workers before
their first task, as the stdlib pools do: in each thread (thread backend),
in each fork worker after it is forked (never in the zygote), in each loky
worker. When it raises, the backend is *broken*: it fails its pending
futures with an :class:`~smartexec.errors.InitializerError` that names the
initializer and chains its exception, logs the failure as the stdlib does
(``CRITICAL`` on the ``concurrent.futures`` logger, in this process), and the
executor refuses new work.

In a worker process whose initializer set up logging of its own for that
logger (a handler, e.g. a ``QueueHandler`` to the parent, as CPython's tests
do), the worker logs the failure there too, as a stdlib worker does
(:func:`log_in_worker`); the parent's record is logged either way.
"""

from __future__ import annotations

import logging
import multiprocessing.queues
import threading
import traceback
from collections.abc import Callable
from typing import Any

from .errors import InitializerError, ProcessInitializerError, RemoteTraceback

__all__ = [
    "check",
    "check_max_tasks",
    "name_of",
    "Breakage",
    "process_failure",
    "traceback_text",
    "logging_handlers",
    "log_in_worker",
]

#: The stdlib pools log a failed initializer here (at CRITICAL).
LOGGER = logging.getLogger("concurrent.futures")

#: Characters of a worker's traceback sent to the parent at most.
MAX_TRACEBACK_CHARS = 32_000


def check(initializer: Any, initargs: Any) -> tuple[Any, ...]:
    """Validate ``initializer`` / ``initargs`` as the stdlib does; return the arguments as a tuple.

    Raises:
        TypeError: ``initializer`` is not None and not callable (the stdlib's
            message, ``"initializer must be a callable"``), or ``initargs``
            is not iterable.
    """
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    try:
        return tuple(initargs)
    except TypeError as exc:
        raise TypeError(
            f"initargs must be a tuple of arguments for the initializer, got {initargs!r} "
            f"({type(initargs).__qualname__})"
        ) from exc


def check_max_tasks(value: Any) -> int | None:
    """Validate ``max_tasks_per_child`` as the stdlib does (None, or an int >= 1).

    Raises:
        TypeError: not an int (the stdlib's message).
        ValueError: below 1 (the stdlib's message).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("max_tasks_per_child must be an integer")
    if value <= 0:
        raise ValueError("max_tasks_per_child must be >= 1")
    return value


def name_of(initializer: Callable[..., Any]) -> str:
    """The initializer's qualified name, for messages."""
    return str(getattr(initializer, "__qualname__", None) or type(initializer).__qualname__)


def traceback_text(exc: BaseException) -> str:
    """``exc`` formatted with its traceback, cut to :data:`MAX_TRACEBACK_CHARS`."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-MAX_TRACEBACK_CHARS:]


def message(name: str, where: str, what: str) -> str:
    """The broken executor's message: which initializer failed, where, and with what."""
    return (
        f"the initializer {name}() failed in {where}: {what}; the executor is not usable "
        f"anymore (as a stdlib pool is broken by a failing initializer): fix the "
        f"initializer and create a new executor"
    )


def process_failure(name: str, backend: str, where: str, text: str) -> ProcessInitializerError:
    """The error for an initializer that failed in a worker process, from its traceback text."""
    last = text.strip().splitlines()[-1] if text.strip() else "an unknown error"
    error = ProcessInitializerError(message(name, where, last), initializer=name, backend=backend)
    error.__cause__ = RemoteTraceback(text)
    return error


def log_failure(error: InitializerError) -> None:
    """Log a failed initializer as the stdlib pools do (CRITICAL, ``concurrent.futures``)."""
    cause = error.__cause__
    exc_info = (type(cause), cause, cause.__traceback__) if cause is not None else None
    LOGGER.critical("Exception in initializer: %s", error, exc_info=exc_info)


def logging_handlers() -> tuple[logging.Handler, ...]:
    """The handlers a record of :data:`LOGGER` reaches now.

    Its own, then its ancestors' for as long as it propagates.
    """
    found: list[logging.Handler] = []
    logger: logging.Logger | None = LOGGER
    while logger is not None:
        found.extend(logger.handlers)
        if not logger.propagate:
            break
        logger = logger.parent
    return tuple(found)


def log_in_worker(exc: BaseException, before: tuple[logging.Handler, ...]) -> None:
    """In a worker process whose initializer raised ``exc``: log it there, as a stdlib worker does.

    Only when the initializer gave :data:`LOGGER` a handler it did not reach
    before (``before``, from :func:`logging_handlers`): it set up the
    worker's own logging, e.g. a ``QueueHandler`` to the parent, and the
    record goes there (``CRITICAL``, ``"Exception in initializer:"`` with
    the traceback, the stdlib's words). Otherwise the worker's handlers are
    the parent's (inherited by a fork) or none, and the parent's record
    (:func:`log_failure`) is the one: a second copy would only repeat it.

    A ``multiprocessing`` queue behind such a handler is then closed in
    this worker and its feeder thread joined, so the record has reached
    the queue's pipe before the parent hears of the failure (a stdlib
    worker flushes it as it exits; a fork worker leaves through
    ``os._exit``, a loky worker stays up). Nothing else of the user's runs
    in that worker afterwards.

    Args:
        exc: the initializer's exception.
        before: the handlers reached before the initializer ran.
    """
    new = [handler for handler in logging_handlers() if handler not in before]
    if not new:
        return
    try:
        LOGGER.critical("Exception in initializer:", exc_info=exc)
        for handler in new:
            queue = getattr(handler, "queue", None)
            if isinstance(queue, multiprocessing.queues.Queue):
                queue.close()
                queue.join_thread()
    except Exception:  # pragma: no cover - the parent reports the failure anyway
        pass


class Breakage:
    """Whether a backend's initializer has failed: the first failure, kept.

    Shared by a backend and its workers' start-up code (not the backend
    itself, so that worker threads hold no reference to their backend).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: InitializerError | None = None

    def record(self, error: InitializerError) -> bool:
        """Keep a copy of ``error`` unless one is kept already; True when it is the first.

        A copy, never raised: an exception raised by ``result()`` holds the
        caller's frames in its traceback, and those frames the executor
        (the backends outlive it, for its finalizer): kept here, it kept
        the executor alive, and its workers running, once dropped.
        """
        with self._lock:
            if self.error is not None:
                return False
            self.error = error.again()
            return True

    def raise_if_broken(self) -> None:
        """Raise a copy of the kept error, if any (what ``submit`` raises once broken)."""
        error = self.error
        if error is not None:
            raise error.again()


# -- in a loky worker process ---------------------------------------------------

#: Set in a loky worker whose initializer raised: (name, traceback text).
_FAILED: tuple[str, str] | None = None


def start_loky_worker(initializer: Callable[..., Any], initargs: tuple[Any, ...]) -> None:
    """loky's ``initializer`` (runs in each loky worker): run the user's, keep its failure.

    loky itself would let the worker exit, which it reports as a crash that
    names nothing; instead the worker stays up and fails each chunk it is
    given with the error that names the initializer (:func:`serve_loky`).
    """
    global _FAILED
    before = logging_handlers()
    try:
        initializer(*initargs)
    except BaseException as exc:
        _FAILED = (name_of(initializer), traceback_text(exc))
        log_in_worker(exc, before)


def serve_loky(payload: bytes) -> bytes:
    """What a loky worker runs per chunk when an initializer is set.

    Raises:
        ProcessInitializerError: this worker's initializer raised (its
            traceback is the cause).
    """
    if _FAILED is not None:
        name, text = _FAILED
        import os

        raise process_failure(name, "loky", f"loky worker process (pid {os.getpid()})", text)
    from . import transport

    return transport.serve_request(payload)
