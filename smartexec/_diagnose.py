"""Turn a pickling failure into an error that names the object and the fix."""

from __future__ import annotations

import errno
import traceback
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from ._remote import Call
from ._shm import PeerAccessError
from .errors import (
    PayloadPicklingError,
    RemoteTraceback,
    ResultPicklingError,
    WorkerProtocolError,
)
from .inspection import callable_name, locate_unpicklable

__all__ = [
    "pickling_error",
    "explain_pickling",
    "fail_on_pickling",
    "is_pickling_failure",
    "task_unpickling_error",
    "reply_unpickling_error",
    "resource_problem",
    "detach_traceback",
]


def task_unpickling_error(name: str, exc: BaseException, backend: str) -> WorkerProtocolError:
    """Build the error for a chunk its worker could not unpickle.

    Args:
        name: what was called, e.g. ``"Index.query()"``.
        exc: the error the worker raised while unpickling (sent back with its
            traceback text as ``__cause__``); it becomes the ``__cause__``.
        backend: the backend's name, e.g. ``"fork"``.

    Returns:
        A :class:`~smartexec.errors.WorkerProtocolError` (a
        ``BrokenProcessPool``) with ``stage == "task"``.
    """
    problem = resource_problem(exc)
    if problem is not None:
        why = f"its arguments could not be mapped there: {type(exc).__name__}: {exc}. {problem}"
    else:
        why = (
            f"{type(exc).__name__}: {exc}. An object pickled here did not rebuild there "
            f"(its class or module is missing in the worker, or its __reduce__ fails)."
        )
    error = WorkerProtocolError(
        f"a {backend} worker process could not unpickle the call to {name}(): {why} "
        f"Only this call failed; the executor is still usable.",
        stage="task",
    )
    error.__cause__ = exc
    return error


def reply_unpickling_error(name: str, exc: BaseException, backend: str) -> WorkerProtocolError:
    """Build the error for a worker's reply this process could not unpickle.

    Args:
        name: what was called, e.g. ``"Index.query()"``.
        exc: the unpickler's error here; it becomes the ``__cause__``, its
            traceback kept as text (a :class:`~smartexec.errors.RemoteTraceback`
            as its own ``__cause__``).
        backend: the backend's name, e.g. ``"fork"``.

    Returns:
        A :class:`~smartexec.errors.WorkerProtocolError` (a
        ``BrokenProcessPool``) with ``stage == "reply"``.
    """
    problem = resource_problem(exc)
    if problem is not None:
        why = f"this process could not map it: {type(exc).__name__}: {exc}. {problem}"
    else:
        why = (
            f"could not be unpickled in this process: {type(exc).__name__}: {exc}. Return "
            f"plain data (numbers, strings, lists, dicts, numpy arrays) or objects whose "
            f"class this process can import."
        )
    error = WorkerProtocolError(
        f"the result of {name}() came back from a {backend} worker process but {why} "
        f"Only this call failed; the executor is still usable.",
        stage="reply",
    )
    # Its frames lead up into the thread that read the reply (loky's manager
    # thread), whose pool they would keep alive.
    error.__cause__ = detach_traceback(exc)
    return error


def resource_problem(exc: BaseException) -> str | None:
    """What ``exc`` says a process ran out of, or may not open, and the fix; None otherwise.

    Recognises, in ``exc`` or what it was raised from: ``MemoryError`` and
    ``ENOMEM`` (memory or address space), ``EMFILE`` (this process's limit
    on open files, ``RLIMIT_NOFILE``), ``ENFILE`` (the system's), ``ENOSPC``
    (``/dev/shm`` full) and :class:`~smartexec._shm.PeerAccessError` (a
    peer's shared memory hidden by ``/proc``). Mapping a big result or
    argument fails with these; blaming the object's type would mislead.

    Args:
        exc: the error raised while mapping or unpickling.

    Returns:
        One or two sentences: the cause and a fix that works.
    """
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, PeerAccessError):
            return "This process now uses named shared memory instead (/dev/shm)."
        if isinstance(seen, MemoryError) or getattr(seen, "errno", None) == errno.ENOMEM:
            return (
                "This process ran out of memory, or of address space (ulimit -v, "
                "RLIMIT_AS): free memory, raise that limit, or return less data per call."
            )
        code = getattr(seen, "errno", None)
        if code == errno.EMFILE:
            return _open_files_advice()
        if code == errno.ENFILE:
            return "The system's table of open files is full (/proc/sys/fs/file-max)."
        if code == errno.ENOSPC:
            return (
                "Shared memory (/dev/shm) is full: enlarge it (docker run --shm-size=2g) "
                "or return less data per call."
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _open_files_advice() -> str:
    """EMFILE: this process's ``RLIMIT_NOFILE`` and how to raise it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return "This process has as many files open as it may (ulimit -n): raise that limit."
    bigger = max(4096, 2 * soft)
    if hard != resource.RLIM_INFINITY:
        bigger = min(bigger, hard)
    if bigger <= soft:
        return (
            f"This process has as many files open as it may: its RLIMIT_NOFILE limit is "
            f"{soft} (ulimit -n), its hard limit too, which only an administrator can "
            f"raise (limits.conf, systemd's LimitNOFILE=); or keep fewer files open."
        )
    return (
        f"This process has as many files open as it may: its RLIMIT_NOFILE soft limit "
        f"is {soft} (ulimit -n). Raise it before creating the executor: ulimit -n "
        f"{bigger} in the shell, or resource.setrlimit(resource.RLIMIT_NOFILE, "
        f"({bigger}, hard)) in Python; or keep fewer files open."
    )


def detach_traceback(exc: BaseException) -> BaseException:
    """Keep ``exc``'s traceback as text only; return ``exc``.

    For an error caught in one of smartexec's threads (the sender, a
    dispatcher, loky's manager) and set on a future: its traceback's frames
    lead up through that thread's stack, and would keep the thread's objects
    (a pool, the ``Thread``) alive as long as the future. The text becomes a
    :class:`~smartexec.errors.RemoteTraceback`, set as ``exc.__cause__``
    unless it has one.
    """
    if exc.__traceback__ is None:
        return exc
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    exc.__traceback__ = None
    if exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
    return exc


def is_pickling_failure(exc: BaseException) -> bool:
    """Return True when ``exc`` says an object could not be pickled.

    Recognises ``pickle.PicklingError`` and the ``TypeError`` /
    ``AttributeError`` messages pickle raises (``cannot pickle '...' object``,
    ``Can't pickle local object``; Python 3.13's ``Can't get local object``),
    also as the ``__cause__`` of loky's wrapper error.
    """
    import pickle

    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, pickle.PicklingError):
            return True
        text = str(exc).lower()
        if isinstance(exc, (TypeError, AttributeError)) and (
            "pickle" in text or "serializ" in text or "local object" in text
        ):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
        seen += 1
    return False


def explain_pickling(
    fn: Any, chunk: Sequence[Call], exc: BaseException, backend: str
) -> BaseException:
    """``exc`` explained, where it is a pickler's error not explained yet; else ``exc`` itself.

    Arguments as for :func:`pickling_error`. Returns its
    :class:`~smartexec.errors.PayloadPicklingError`, whose ``__cause__`` is
    ``exc``, when :func:`is_pickling_failure` recognises ``exc``; ``exc``
    unchanged when it is a ``PayloadPicklingError`` already (the thread
    that pickled the chunk explained it) or no pickling failure.
    """
    if isinstance(exc, PayloadPicklingError) or not is_pickling_failure(exc):
        return exc
    error = pickling_error(fn, chunk, exc, backend)
    error.__cause__ = exc
    return error


def pickling_error(
    fn: Any, chunk: Sequence[Call], exc: BaseException, backend: str
) -> PayloadPicklingError:
    """Build the error for a callable or argument that cannot be pickled.

    Args:
        fn: the user's callable.
        chunk: the ``(args, kwargs)`` calls that were being sent.
        exc: the pickler's exception.
        backend: the backend that tried to send them, e.g. ``"loky"``.

    Returns:
        A :class:`~smartexec.errors.PayloadPicklingError` naming the part that
        failed, why, and what to do; ``obj`` is that part.
    """
    name = f"{callable_name(fn)}()"
    found = locate_unpicklable(fn, name)
    in_callable = found is not None
    if found is None:
        for args, kwargs in chunk:
            for i, arg in enumerate(args):
                found = locate_unpicklable(arg, f"argument {i + 1} of the call to {name}")
                if found is not None:
                    break
            else:
                for key, arg in kwargs.items():
                    found = locate_unpicklable(
                        arg, f"keyword argument {key!r} of the call to {name}"
                    )
                    if found is not None:
                        break
            if found is not None:
                break
    if found is None:
        # The callable and its arguments pickle here, so what failed was made in
        # the worker: the result (or an exception) on its way back.
        reason = f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None:
            reason += f" ({type(exc.__cause__).__name__}: {exc.__cause__})"
        return ResultPicklingError(
            f"{name} ran on {backend} worker processes but its result could not be sent "
            f"back: {reason}. {name} and its arguments pickle fine, so return plain data "
            f'(numbers, strings, lists, dicts, numpy arrays), or use backend="thread" so '
            f"results are not pickled.",
            obj=fn,
            where="result",
            reason=reason,
        )
    else:
        where, part, reason = found
    what = f"{where} is {_a(part)}, which cannot be pickled ({reason})"
    if in_callable:
        fix = (
            "Create that object inside the function instead of capturing it, or pass "
            'backend="thread" if the work mostly waits on I/O or releases the GIL; '
            'backend="fork" shares the callable with workers by copy-on-write without pickling it.'
        )
    else:
        fix = (
            "Pass something picklable instead (a path rather than an open file, the "
            'data rather than a connection), or use backend="thread" so nothing is pickled.'
        )
    return PayloadPicklingError(
        f"Cannot send {name} to {backend} worker processes: {what}. {fix}",
        obj=part,
        where=where,
        reason=reason,
    )


def _a(obj: Any) -> str:
    name = f"{type(obj).__module__}.{type(obj).__qualname__}".replace("builtins.", "")
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def fail_on_pickling(
    future: Future[Any],
    exc: BaseException,
    fn: Any,
    calls: Sequence[Any],
    backend: str,
    *,
    from_sender: bool,
) -> None:
    """Fail a chunk's ``future`` with the error its request's pickling raised.

    An ``Exception`` becomes :func:`pickling_error`'s clear error (naming the
    part of ``fn`` or ``calls`` that failed), chained from ``exc``; anything
    else (``SystemExit``, ``KeyboardInterrupt`` from a ``__reduce__``) is set
    as it is, as the stdlib's ``result()`` would raise it. Raised on the
    backend's sender thread (``from_sender``), its frames are kept as text
    (:func:`detach_traceback`). A future already cancelled is left so.

    Args:
        future: the chunk's future, not yet finished.
        exc: what pickling raised.
        fn: the user's callable, for the message.
        calls: the chunk's ``(args, kwargs)`` pairs, for the message.
        backend: the backend's name, for the message.
        from_sender: True when pickling ran on the sender thread.
    """
    error: BaseException = exc
    if from_sender:
        detach_traceback(exc)
    if isinstance(exc, Exception):
        error = pickling_error(fn, calls, exc, backend)
        error.__cause__ = exc
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass  # cancelled meanwhile
