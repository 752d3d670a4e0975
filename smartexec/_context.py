"""Calls run in this process see the caller's settings, as a worker process would, and keep their own changes to themselves.

A worker process starts from its parent's state: the decimal context, numpy's
error and print options, every :class:`contextvars.ContextVar` the program
set. A pool thread starts from none of it (a new thread has an empty
context), and a call run in the caller's own thread writes its changes into
the caller's. Either way a route would change what a function computes:
``decimal.getcontext().prec = 50`` set at start-up would be ignored on
threads, and a call that sets the precision itself would change it for the
program.

:class:`InContext` closes both gaps, the way ``asyncio`` runs its callbacks:
each call runs in a copy of the context of the thread that handed it over
(``map`` or ``submit``'s caller), with a copy of its decimal context (a
mutable object the copied context would otherwise share).
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["InContext"]


class InContext:
    """``fn`` run in a copy of the context current when this was made.

    Args:
        fn: the callable.
        context: the context to copy for each call; None: the calling
            thread's, now.

    Each call gets its own copy, so calls on several threads never share
    one (a context cannot be entered by two threads at once) and what a
    call sets there is gone when it returns. Costs about a microsecond a
    call.
    """

    __slots__ = ("fn", "context", "__weakref__")

    def __init__(self, fn: Callable[..., Any], context: contextvars.Context | None = None):
        if isinstance(fn, InContext):
            fn = fn.fn
        self.fn: Callable[..., Any] = fn
        self.context = contextvars.copy_context() if context is None else context

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.context.copy().run(_isolated, self.fn, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # Names in messages and stats (__qualname__, __name__) are fn's.
        if name.startswith("__") and name not in ("__qualname__", "__name__", "__module__"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return repr(self.fn)


def _isolated(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    decimal = sys.modules.get("decimal")
    if decimal is not None:
        # The context object itself is mutable (getcontext().prec = 30): a
        # copy, as a forked worker has.
        decimal.setcontext(decimal.getcontext().copy())
    return fn(*args, **kwargs)
