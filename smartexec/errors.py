"""Every exception smartexec raises, each a subclass of the builtin it refines.

Callers can catch either the smartexec class or the builtin: a payload that
cannot be pickled is a :class:`pickle.PicklingError`, a dead worker is a
:class:`concurrent.futures.process.BrokenProcessPool`, an unknown backend name
is a :class:`ValueError`.
"""

from __future__ import annotations

import pickle
from concurrent import futures
from concurrent.futures import BrokenExecutor
from concurrent.futures.process import BrokenProcessPool
from concurrent.futures.thread import BrokenThreadPool
from typing import Any

__all__ = [
    "PayloadPicklingError",
    "WorkerCrashedError",
    "InitializerError",
    "ProcessInitializerError",
    "ThreadInitializerError",
    "WorkerProtocolError",
    "ResultPicklingError",
    "TaskTimeoutError",
    "RemoteError",
    "RemoteTraceback",
    "UnknownBackendError",
    "BackendUnavailableError",
]


class PayloadPicklingError(pickle.PicklingError):
    """A callable or argument cannot be sent to worker processes.

    As with ``ProcessPoolExecutor``, it is set on the future, never raised by
    ``SmartExecutor.submit``: ``result()`` raises it, and ``map`` raises it
    while its results are iterated, at the item whose argument could not be
    sent, after the results of the items before it (at the first item when
    the callable itself cannot be sent). A result that cannot be pickled back from a worker is a
    :class:`ResultPicklingError` (a subclass, ``where == "result"``).

    Attributes:
        obj: the object that could not be pickled (the callable, an argument,
            or the part of either that failed).
        where: where that object sits, e.g. ``"argument 1"`` or
            ``"cell 'conn' of score()"``.
        reason: the concrete cause, as the pickler reported it.
    """

    def __init__(self, message: str, *, obj: Any = None, where: str = "", reason: str = ""):
        super().__init__(message)
        self.obj = obj
        self.where = where
        self.reason = reason


class WorkerCrashedError(BrokenProcessPool):
    """The worker process running this task died before returning a result.

    Only the task(s) the worker was running fail; the worker is replaced and the
    executor stays usable.

    Attributes:
        exitcode: the process exit code; negative ``-N`` means killed by signal N.
        shared_fate: True when the backend fails every chunk it holds once one
            of its workers dies (loky), so this chunk may have died of another
            item's crash; a map then runs a lone item once more for free.
    """

    def __init__(self, message: str, *, exitcode: int | None = None, shared_fate: bool = False):
        super().__init__(message)
        self.exitcode = exitcode
        self.shared_fate = shared_fate


class WorkerProtocolError(BrokenProcessPool):
    """A chunk, or its reply, could not cross between this process and a worker.

    What ``ProcessPoolExecutor`` reports as ``BrokenProcessPool``: the worker
    could not unpickle the task (``stage == "task"``), or this process could
    not unpickle the worker's reply (``stage == "reply"``), e.g. a class
    missing on one side or an object whose ``__reduce__`` raises, even
    ``SystemExit``. The original error is the ``__cause__`` (for ``"task"``,
    raised in the worker: its traceback text is the cause's cause). Only that
    chunk fails: unlike the stdlib's pool, the executor stays usable.

    Attributes:
        stage: ``"task"`` or ``"reply"``.
    """

    def __init__(self, message: str, *, stage: str = ""):
        super().__init__(message)
        self.stage = stage


class ResultPicklingError(PayloadPicklingError, WorkerProtocolError):
    """A task's result could not be pickled in the worker to send it back.

    Both a :class:`pickle.PicklingError` (what ``ProcessPoolExecutor``'s
    ``result()`` raises in this case) and a :class:`BrokenProcessPool` (a
    :class:`WorkerProtocolError` with ``stage == "result"``), so either
    ``except`` clause catches it. Only that item fails; the items of the same
    chunk whose results pickle keep them.
    """

    def __init__(self, message: str, *, obj: Any = None, where: str = "result", reason: str = ""):
        super().__init__(message, obj=obj, where=where, reason=reason)
        self.stage = "result"


# concurrent.futures.TimeoutError is the builtin TimeoutError from Python 3.11
# on; before, a class of its own: subclass both, so either except clause works.
_TIMEOUT_BASES: tuple[type[Exception], ...] = (
    (TimeoutError,)
    if futures.TimeoutError is TimeoutError
    else (futures.TimeoutError, TimeoutError)
)


class TaskTimeoutError(*_TIMEOUT_BASES):  # type: ignore[misc]
    """A task ran longer than its ``task_timeout``.

    On process backends that can stop a task (``fork``) its worker was killed
    and replaced, so nothing else was affected. On the thread backend the
    call cannot be stopped: the future fails at the deadline while the call
    runs on in its thread. A subclass of the builtin ``TimeoutError``, which
    is ``concurrent.futures.TimeoutError`` from Python 3.11 on (on 3.10 it
    subclasses both).

    Attributes:
        timeout_s: the limit that was passed, seconds.
        items: how many items the timed-out chunk held.
    """

    def __init__(self, message: str, *, timeout_s: float, items: int = 1):
        super().__init__(message)
        self.timeout_s = timeout_s
        self.items = items


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; set as ``__cause__`` of the error."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class RemoteError(Exception):
    """A worker raised an exception that could not be sent back as itself.

    Happens when the exception object cannot be pickled in the worker or
    unpickled in the parent (e.g. a constructor that needs extra arguments).

    Attributes:
        type_name: qualified name of the original exception type.
        message: ``str()`` of the original exception.
        traceback_text: the worker's formatted traceback.
    """

    def __init__(self, type_name: str, message: str, traceback_text: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, self.message, self.traceback_text))


class UnknownBackendError(ValueError):
    """No backend is registered under the given name.

    Attributes:
        name: the name asked for.
        known: the sorted names that are registered.
    """

    def __init__(self, message: str, *, name: str, known: tuple[str, ...]):
        super().__init__(message)
        self.name = name
        self.known = known


class BackendUnavailableError(ImportError):
    """A registered backend cannot be loaded (its package is not installed).

    Attributes:
        backend: the backend name.
        hint: how to make it available, e.g. ``pip install 'smartexec[dask]'``.
    """

    def __init__(self, message: str, *, backend: str, hint: str = ""):
        super().__init__(message)
        self.backend = backend
        self.hint = hint


class InitializerError(BrokenExecutor):
    """The ``initializer=`` given to ``SmartExecutor`` raised in a worker.

    As with the stdlib pools, the executor is then broken: the futures
    pending on that backend fail with it, and ``submit`` / ``map`` raise it
    from then on. The initializer's own exception is the ``__cause__`` (for
    a worker process, a :class:`RemoteTraceback` with its traceback).
    Catch :class:`ProcessInitializerError` /
    :class:`ThreadInitializerError`, or the stdlib's ``BrokenProcessPool`` /
    ``BrokenThreadPool`` (``concurrent.futures.BrokenExecutor`` for both).

    Attributes:
        initializer: the initializer's qualified name.
        backend: the backend whose worker ran it, e.g. ``"fork"``.
    """

    def __init__(self, message: str, *, initializer: str, backend: str):
        super().__init__(message)
        self.initializer = initializer
        self.backend = backend

    def again(self) -> InitializerError:
        """A new error like this one, its cause chained (raised by later submits)."""
        error = type(self)(str(self), initializer=self.initializer, backend=self.backend)
        error.__cause__ = self.__cause__
        return error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.initializer, self.backend))


def _rebuild(cls: type[InitializerError], message: str, initializer: str, backend: str) -> Any:
    return cls(message, initializer=initializer, backend=backend)


class ProcessInitializerError(InitializerError, BrokenProcessPool):
    """The initializer failed in a worker process (fork, loky): a ``BrokenProcessPool``."""


class ThreadInitializerError(InitializerError, BrokenThreadPool):
    """The initializer failed in a worker thread (or inline): a ``BrokenThreadPool``."""
