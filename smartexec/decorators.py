"""``@parallel_map``: turn a per-item function into a parallel map over an iterable."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, overload

from .executor import SmartExecutor
from .progress import ProgressFactory, progress_factory

__all__ = ["parallel_map"]

T = TypeVar("T")
R = TypeVar("R")


@overload
def parallel_map(fn: Callable[[T], R], /) -> Callable[[Iterable[T]], list[R]]: ...


@overload
def parallel_map(
    *,
    max_workers: int | None = None,
    chunksize: int | None = None,
    backend: str | None = None,
    prefer: Literal["threads", "processes"] | None = None,
    progress: bool | ProgressFactory = False,
) -> Callable[[Callable[[T], R]], Callable[[Iterable[T]], list[R]]]: ...


def parallel_map(
    fn: Callable[[Any], Any] | None = None,
    /,
    *,
    max_workers: int | None = None,
    chunksize: int | None = None,
    backend: str | None = None,
    prefer: Literal["threads", "processes"] | None = None,
    progress: bool | ProgressFactory = False,
) -> Any:
    """Decorate a per-item function so that it maps over an iterable in parallel.

    Usable bare (``@parallel_map``) or with arguments
    (``@parallel_map(max_workers=4, chunksize=100)``). The decorated function
    takes one iterable and returns the list of results in input order, as
    ``[fn(x) for x in items]`` would; the first failing item's exception is
    raised, as in that loop. Each call runs on a fresh :class:`SmartExecutor`
    that is shut down before it returns. The undecorated function stays
    available as ``.__wrapped__``.

    Works on module-level and nested functions: a module-level function that
    the decorator replaced under its own name is no longer importable by that
    name, so it is sent by value (cloudpickle).

    Args:
        fn: the per-item function (when used bare).
        max_workers: workers per backend (int >= 1), None for the default;
            as for :class:`SmartExecutor`.
        backend: a backend name that forces the route, None to let the
            policy choose; as for :class:`SmartExecutor`.
        prefer: ``"threads"``, ``"processes"`` or None; as for
            :class:`SmartExecutor`.
        chunksize: items per chunk (int >= 1), None to choose automatically.
        progress: True for a tqdm bar counting the items of each call, a
            tqdm-like factory for its bars, False for none; as ``progress``
            of :meth:`SmartExecutor.map`.

    Returns:
        The decorated function ``(iterable) -> list``.

    Raises:
        ImportError: ``progress=True`` and tqdm is not installed (raised when
            decorating): ``pip install 'smartexec[progress]'``.
        TypeError: ``progress`` is neither a bool nor callable.
    """
    factory = progress_factory(progress)

    def decorate(func: Callable[[Any], Any]) -> Callable[[Iterable[Any]], list[Any]]:
        @functools.wraps(func)
        def mapped(items: Iterable[Any]) -> list[Any]:
            with SmartExecutor(max_workers, backend=backend, prefer=prefer) as executor:
                return list(
                    executor.map(func, items, chunksize=chunksize, progress=factory or False)
                )

        return mapped

    if fn is not None:
        return decorate(fn)
    return decorate
