"""A ``SmartExecutor``'s constructor arguments, checked; each refusal names its fix."""

from __future__ import annotations

import difflib
import inspect
import multiprocessing
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._map_run import require_int as _require_int
from ._system import current_platform
from .backends._base import Backend
from .errors import BackendUnavailableError
from .policy import PREFER_VALUES
from .registry import _accepted_options, get_backend_class, known_backends

__all__ = [
    "WorkerSetup",
    "check_arguments",
    "check_available",
    "check_forced_backend",
    "start_method",
    "start_method_note",
]


def _options_without_backend(options: dict[str, Any]) -> str:
    """The message for keyword arguments ``SmartExecutor()`` does not take, with no ``backend=``.

    Says, for each name: the constructor option it is likely a misspelling
    of, or that it is an argument of ``map()``; then which backends take
    the rest (``backend="dask"`` takes ``address=``), if any do.
    """
    from .executor import SmartExecutor  # this module is the executor's: imported by it

    own = [
        name
        for name, parameter in inspect.signature(SmartExecutor.__init__).parameters.items()
        if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    of_map = ("chunksize", "timeout", "buffersize", "ordered")
    names = ", ".join(f"{name}=" for name in sorted(options))
    hints: list[str] = []
    rest: list[str] = []
    for name in sorted(options):
        match = difflib.get_close_matches(name, own, n=1)
        if name in of_map:
            hint = f"{name}= is an argument of map(): ex.map(fn, items, {name}=...)"
            if name == "timeout":
                hint += "; task_timeout= here limits each task"
            hints.append(hint)
        elif match:
            hints.append(f"did you mean {match[0]}= for {name}=?")
        else:
            rest.append(name)
    takers: dict[str, list[str]] = {}
    for backend in known_backends() if rest else ():
        try:
            accepted = _accepted_options(get_backend_class(backend))
        except Exception:  # its module cannot be imported here: it takes nothing now
            continue
        for name in rest:
            if accepted is not None and name in accepted:
                takers.setdefault(name, []).append(backend)
    for name in rest:
        if name in takers:
            backends = " or ".join(f'backend="{b}"' for b in takers[name])
            hints.append(f"{name}= is an option of {backends}: pass that backend too")
    unknown = [name for name in rest if name not in takers]
    if unknown:
        hints.append(
            f"Backend options need the backend that takes them, e.g. "
            f'SmartExecutor(backend="NAME", {unknown[0]}=...) (python -m smartexec '
            f"backends lists the backends and whether each can be imported here)"
        )
    message = f"SmartExecutor() got unexpected keyword argument(s) {names}"
    return message + (". " + "; ".join(hints) if hints else "")


def check_arguments(
    *,
    backend: Any,
    prefer: Any,
    big_state_bytes: Any,
    max_retries: Any,
    allow_inline: Any,
    backend_options: dict[str, Any],
) -> None:
    """Refuse ``SmartExecutor()`` arguments of the wrong type or value, naming the fix.

    Raises:
        TypeError: a wrong type, or backend options with no ``backend=``.
        ValueError: a value out of range, or an unknown ``prefer``.
    """
    check_route(backend, prefer)
    _require_int("big_state_bytes", big_state_bytes, "an int (bytes)")
    if big_state_bytes < 0:
        raise ValueError(f"big_state_bytes must be >= 0, got {big_state_bytes}")
    if backend_options and backend is None:
        raise TypeError(_options_without_backend(backend_options))
    _require_int("max_retries", max_retries, "an int")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if not isinstance(allow_inline, bool):
        raise TypeError(
            f"allow_inline must be True or False, got {allow_inline!r} "
            f"({type(allow_inline).__qualname__})"
        )


def check_route(backend: Any, prefer: Any) -> None:
    """Refuse a ``backend=`` that is not a name (str) or None, and an unknown ``prefer=``.

    Raises:
        TypeError: ``backend`` is not a str or None.
        ValueError: ``prefer`` is not one of :data:`~smartexec._config.PREFER_VALUES` or None.
    """
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"backend must be a backend name (str) or None, got {backend!r} "
            f'({type(backend).__qualname__}); e.g. backend="thread"'
        )
    if prefer is not None and prefer not in PREFER_VALUES:
        raise ValueError(
            f"prefer must be one of {', '.join(map(repr, PREFER_VALUES))} or None, got {prefer!r}"
        )


def start_method(mp_context: Any) -> str | None:
    """The start method of ``mp_context`` (a multiprocessing context or its name), or None.

    Raises:
        TypeError: neither None, a context nor a string.
        ValueError: a start method this platform does not offer.
    """
    if mp_context is None:
        return None
    if isinstance(mp_context, str):
        method = mp_context
    elif callable(getattr(mp_context, "get_start_method", None)):
        method = mp_context.get_start_method(allow_none=False)
    else:
        raise TypeError(
            f"mp_context must be a multiprocessing context (e.g. "
            f'multiprocessing.get_context("spawn")), a start method name or None, got '
            f"{mp_context!r} ({type(mp_context).__qualname__})"
        )
    offered = multiprocessing.get_all_start_methods()
    if method not in offered:
        raise ValueError(
            f"mp_context: start method {method!r} is not offered here; this platform "
            f"offers {', '.join(map(repr, offered))}"
        )
    return str(method)


def start_method_note(factory: Callable[..., Backend]) -> str | None:
    """How ``factory``'s worker processes start, for explain(); None without processes."""
    method = getattr(factory, "start_method", None)
    if method == "fork":
        if multiprocessing.get_start_method(allow_none=True) in (None, "fork") and (
            sys.platform == "linux" and sys.version_info < (3, 14)
        ):
            return "fork workers (start method: fork, multiprocessing's default here)"
        return (
            "fork workers (start method: fork, asked for by name whatever multiprocessing's "
            "default is: forkserver on Linux from Python 3.14)"
        )
    if method == "loky":
        return (
            "loky workers (start method: loky's own fork+exec, a fresh interpreter as with "
            "spawn; the callable travels by cloudpickle)"
        )
    if method is not None:
        return f"{getattr(factory, 'name', '')} workers (start method: {method})"
    return None


def check_forced_backend(backend: str | None, task_timeout: float | None) -> None:
    """Refuse a ``backend=`` that is unknown, unavailable or cannot honour ``task_timeout``.

    Raises:
        UnknownBackendError, BackendUnavailableError: see :func:`check_available`.
        ValueError: ``task_timeout`` on a backend that cannot stop a task.
    """
    if backend is None:
        return
    factory = check_available(backend)
    if task_timeout is not None and not factory.takes_timeouts:
        raise ValueError(
            f"backend {backend!r} cannot stop or time out one task, so "
            f"task_timeout={task_timeout:g} cannot be honoured there; use "
            f'backend="fork" (stops the task) or backend="thread" (fails the '
            f"future at the deadline), or leave backend unset"
        )


def check_available(name: str) -> type[Backend]:
    """The class of backend ``name``, when it can run here.

    Raises:
        UnknownBackendError: no backend is registered as ``name``.
        BackendUnavailableError: it cannot run here (a missing package), saying why.
    """
    factory = get_backend_class(name)
    reason_of = getattr(factory, "unavailable_reason", None)
    reason = reason_of() if reason_of is not None else None
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} cannot run here: {reason}", backend=name)
    return factory  # type: ignore[return-value]


@dataclass(frozen=True)
class Widths:
    """How many workers each pool gets: ``max_workers``, or a kind's own limit.

    Attributes:
        max_workers: every pool's width, as the stdlib pools take it, or None.
        max_threads: the width of backends that run in this process (threads),
            in place of ``max_workers``, or None.
        max_processes: the width of the others (fork, loky, dask workers), in
            place of ``max_workers``, or None.
    """

    max_workers: int | None = None
    max_threads: int | None = None
    max_processes: int | None = None

    @classmethod
    def checked(cls, max_workers: Any, max_threads: Any, max_processes: Any) -> Widths:
        """The widths the user gave, each None or an int >= 1 (numpy's ints too, as the stdlib takes them).

        Raises:
            TypeError: a width that is not an integer (a bool is refused).
            ValueError: a width under 1.
        """
        given = {
            "max_workers": max_workers,
            "max_threads": max_threads,
            "max_processes": max_processes,
        }
        for name, value in given.items():
            if value is not None:
                given[name] = value = _require_int(name, value, "an int or None")
                if value <= 0:
                    raise ValueError(f"{name} must be greater than 0, got {value}")
        return cls(**given)

    def for_backend(self, name: str) -> int | None:
        """The ``max_workers`` backend ``name`` is made with (None: its own default)."""
        shares_memory = getattr(get_backend_class(name), "shares_memory", False)
        own = self.max_threads if shares_memory else self.max_processes
        return self.max_workers if own is None else own


@dataclass(frozen=True)
class WorkerSetup:
    """What the user asked of worker processes, checked (``initializer``, ``max_tasks_per_child``).

    Attributes:
        initializer: run as ``initializer(*initargs)`` in each worker, or None.
        initargs: its arguments.
        max_tasks_per_child: calls a worker process may run before it is
            replaced, or None.
    """

    initializer: Callable[..., Any] | None = None
    initargs: tuple[Any, ...] = ()
    max_tasks_per_child: int | None = None

    def check(self, backend: str | None, start_method: str | None) -> None:
        """Refuse worker options no backend of this executor could honour.

        Raises:
            ValueError: ``max_tasks_per_child`` without fork workers, or an
                ``mp_context`` that contradicts ``backend="fork"``.
        """
        no_fork = start_method not in (None, "fork")
        if backend == "fork" and no_fork:
            raise ValueError(
                f'backend="fork" contradicts mp_context with start method {start_method!r}; '
                f"leave backend unset (process work then goes to loky) or use a fork context"
            )
        if self.max_tasks_per_child is None:
            return
        if backend is None and not current_platform().has_fork:
            raise ValueError(
                "max_tasks_per_child needs fork workers (loky cannot retire one worker "
                "after a number of tasks), but start method 'fork' is not available "
                "here; drop max_tasks_per_child"
            )

    def for_backend(self, name: str) -> dict[str, Any]:
        """The worker options set by the user, for backend ``name``'s constructor.

        Raises:
            TypeError: an initializer is set and the backend cannot run one.
            ValueError: ``max_tasks_per_child`` is set and the backend runs
                worker processes it cannot retire.
        """
        wanted: dict[str, Any] = {}
        if self.initializer is not None:
            wanted["initializer"] = self.initializer
            wanted["initargs"] = self.initargs
        if self.max_tasks_per_child is not None:
            wanted["max_tasks_per_child"] = self.max_tasks_per_child
        if not wanted:
            return {}
        factory = get_backend_class(name)
        accepted = _accepted_options(factory)
        if accepted is None:
            return wanted
        if "initializer" in wanted and "initializer" not in accepted:
            raise TypeError(
                f"backend {name!r} cannot run an initializer= in its workers; use "
                f'backend="thread", "fork" or "loky", or leave backend unset'
            )
        if "max_tasks_per_child" in wanted and "max_tasks_per_child" not in accepted:
            if not getattr(factory, "shares_memory", False):
                raise ValueError(
                    f"backend {name!r} cannot retire a worker after max_tasks_per_child="
                    f'{self.max_tasks_per_child} tasks; use backend="fork" or leave '
                    f"backend unset"
                )
            del wanted["max_tasks_per_child"]  # threads and inline are no processes
        return wanted
