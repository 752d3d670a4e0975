"""``@parallel_map``: turn a per-item function into a parallel map over an iterable."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast, overload

from ._map_run import check_map_arguments
from ._setup import Widths, check_route
from .executor import SmartExecutor
from .inspection import callable_name
from .policy import Decision
from .progress import ProgressFactory, progress_factory
from .registry import require_known
from .stats import ExecutorStats

__all__ = ["MappedFunction", "parallel_map"]

T = TypeVar("T")
R = TypeVar("R")


class MappedFunction(Protocol[T, R]):
    """What ``@parallel_map`` returns: ``(iterable) -> list``, and its decisions.

    Attributes:
        __wrapped__: the undecorated per-item function.
    """

    __wrapped__: Callable[[T], R]

    def __call__(self, items: Iterable[T], /) -> list[R]:
        """Map the function over ``items``; the results in input order."""

    def explain(self, *args: Any, **kwargs: Any) -> Decision:
        """Where a call would run now, and why; runs nothing.

        Args:
            *args: an example item (with ``**kwargs``), whose pickled size
                is then added to the reasons; none for the decision alone.
            **kwargs: the example call's keyword arguments.

        Returns:
            :meth:`SmartExecutor.explain`'s :class:`~smartexec.policy.Decision`
            for the function, under the decorator's options. It reads what
            earlier calls measured (the profile store): after a call, its
            per-item time and the backend it was measured on.
        """

    def stats(self) -> ExecutorStats:
        """The last finished call's :meth:`SmartExecutor.stats` (empty before any call).

        Returns:
            An :class:`~smartexec.stats.ExecutorStats`: per backend, the
            items, chunks and seconds of that call, and its decisions. A
            call that raised counts too.
        """

    def decisions(self) -> tuple[Decision, ...]:
        """The last finished call's routing decisions, oldest first (``()`` before any call).

        Returns:
            :meth:`SmartExecutor.decisions` of that call's executor: the
            policy's decision, then one entry saying what the map ran on.
        """


@overload
def parallel_map(fn: Callable[[T], R], /) -> MappedFunction[T, R]: ...


@overload
def parallel_map(
    *,
    max_workers: int | None = None,
    chunksize: int | None = None,
    backend: str | None = None,
    prefer: Literal["threads", "processes"] | None = None,
    progress: bool | ProgressFactory = False,
    ordered: bool = True,
    max_threads: int | None = None,
    max_processes: int | None = None,
) -> Callable[[Callable[[T], R]], MappedFunction[T, R]]: ...


def parallel_map(
    fn: Callable[[Any], Any] | None = None,
    /,
    *,
    max_workers: int | None = None,
    chunksize: int | None = None,
    backend: str | None = None,
    prefer: Literal["threads", "processes"] | None = None,
    progress: bool | ProgressFactory = False,
    ordered: bool = True,
    max_threads: int | None = None,
    max_processes: int | None = None,
) -> Any:
    """Decorate a per-item function so that it maps over an iterable in parallel.

    Usable bare (``@parallel_map``) or with arguments
    (``@parallel_map(max_workers=4, chunksize=100)``). The decorated function
    takes one iterable and returns the list of results in input order, as
    ``[fn(x) for x in items]`` would; the first failing item's exception is
    raised, as in that loop. Each call runs on a fresh :class:`SmartExecutor`
    that is shut down before it returns. The undecorated function stays
    available as ``.__wrapped__``; ``.explain()`` says where a call would
    run and why, ``.stats()`` and ``.decisions()`` report the last call
    (see :class:`MappedFunction`).

    Works on module-level and nested functions: a module-level function that
    the decorator replaced under its own name is no longer importable by that
    name, so it is sent by value (cloudpickle).

    Args:
        fn: the per-item function (when used bare).
        max_workers: workers per backend (int >= 1), None for the default;
            as for :class:`SmartExecutor`.
        max_threads: the thread pool's width, in place of ``max_workers``
            for threads; ``max_processes``: the process workers', for them
            (ints >= 1 or None); as for :class:`SmartExecutor`.
        backend: a backend name that forces the route, None to let the
            policy choose; as for :class:`SmartExecutor`.
        prefer: ``"threads"``, ``"processes"`` or None; as for
            :class:`SmartExecutor`.
        chunksize: items per chunk (int >= 1), None to choose automatically.
        progress: True for a tqdm bar counting the items of each call, a
            tqdm-like factory for its bars, False for none; as ``progress``
            of :meth:`SmartExecutor.map`.
        ordered: True for the results in input order; False for the list in
            the order the items completed (the bar then moves as they
            complete, not held back by a slow early item); as ``ordered``
            of :meth:`SmartExecutor.map`.

    Returns:
        The decorated function ``(iterable) -> list``, a
        :class:`MappedFunction` (with ``.explain()``, ``.stats()``,
        ``.decisions()``).

    Raises:
        ImportError: ``progress=True`` and tqdm is not installed (raised when
            decorating): ``pip install 'smartexec[progress]'``.
        TypeError: ``progress`` is neither a bool nor callable, ``ordered``
            is not a bool, ``max_workers``, ``max_threads``,
            ``max_processes`` or ``chunksize`` is not an int,
            or ``fn`` is not callable (``@parallel_map(4)``: the options
            are keyword-only).
        ValueError: one of those ints is below 1, or
            ``prefer`` is not one of its values.
        UnknownBackendError: no backend is registered as ``backend``.

    Every error above is raised when decorating, not at the first call.
    """
    if fn is not None and not callable(fn):
        raise TypeError(
            f"parallel_map() takes the function to decorate as its only positional "
            f"argument, got {fn!r} ({type(fn).__qualname__}); its options are "
            f"keyword-only, e.g. @parallel_map(max_workers=4)"
        )
    factory = progress_factory(progress)
    if not isinstance(ordered, bool):
        raise TypeError(f"ordered must be True or False, got {ordered!r}")
    # Refused when decorating, not at the first call, with SmartExecutor's and map's words.
    widths = Widths.checked(max_workers, max_threads, max_processes)
    check_map_arguments(chunksize, None)
    check_route(backend, prefer)
    if backend is not None:
        require_known(backend)
    options = _Options(widths, chunksize, backend, prefer, factory or False, ordered)
    decorate = functools.partial(_decorate, options=options)
    return decorate(fn) if fn is not None else decorate


@dataclass(frozen=True)
class _Options:
    """The decorator's options, checked; each call makes its executor from them."""

    widths: Widths
    chunksize: int | None
    backend: str | None
    prefer: Literal["threads", "processes"] | None
    progress: ProgressFactory | Literal[False]
    ordered: bool

    def executor(self) -> SmartExecutor:
        w = self.widths
        return SmartExecutor(
            w.max_workers,
            max_threads=w.max_threads,
            max_processes=w.max_processes,
            backend=self.backend,
            prefer=self.prefer,
        )


class _LastCall:
    """The last finished call's stats, read and written from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = ExecutorStats({})

    def keep(self, stats: ExecutorStats) -> None:
        with self._lock:
            self._stats = stats

    def stats(self) -> ExecutorStats:
        with self._lock:
            return self._stats

    def decisions(self) -> tuple[Decision, ...]:
        return tuple(self.stats().decisions)


def _not_one_iterable(func: Callable[..., Any], given: int) -> str:
    """Why a :func:`parallel_map` function called with ``given`` positional arguments is refused."""
    name = getattr(func, "__qualname__", callable_name(func))
    text = f"{name}() takes the one iterable it maps over, got {given} positional arguments"
    if given == 2 and "." in name:
        text += (
            "; on a method, the decorated function gets the instance too: @parallel_map "
            "decorates a function of one item. Map the method with an executor instead: "
            "with SmartExecutor() as ex: list(ex.map(obj.method, items))"
        )
    return text


def _decorate(func: Callable[[Any], Any], *, options: _Options) -> MappedFunction[Any, Any]:
    """``func`` as a :class:`MappedFunction` under ``options``."""
    last = _LastCall()

    @functools.wraps(func)
    def mapped(*args: Any) -> list[Any]:
        if len(args) != 1:
            raise TypeError(_not_one_iterable(func, len(args)))
        (items,) = args
        executor = options.executor()
        try:
            with executor:
                results = executor.map(
                    func,
                    items,
                    chunksize=options.chunksize,
                    progress=options.progress,
                    ordered=options.ordered,
                )
                return list(results)
        finally:
            last.keep(executor.stats())

    def explain(*args: Any, **kwargs: Any) -> Decision:
        executor = options.executor()
        try:
            return executor.explain(func, *args, **kwargs)
        finally:
            executor.shutdown()

    mapped.explain = explain  # type: ignore[attr-defined]
    mapped.stats = last.stats  # type: ignore[attr-defined]
    mapped.decisions = last.decisions  # type: ignore[attr-defined]
    return cast(MappedFunction[Any, Any], mapped)
