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

__all__ = ["InContext", "in_caller", "on_threads"]


class InContext:
    """``fn`` run in a copy of the context current when this was made.

    Args:
        fn: the callable.
        context: the context to copy for each call; None: the calling
            thread's, now.

    Each call gets its own copy, so calls on several threads never share
    one (a context cannot be entered by two threads at once) and what a
    call sets there is gone when it returns. Costs about 0.3 us a call,
    0.8 us when the context holds a decimal context.
    """

    __slots__ = ("fn", "context", "decimal", "__weakref__")

    def __init__(self, fn: Callable[..., Any], context: contextvars.Context | None = None):
        if isinstance(fn, InContext):
            fn = fn.fn
        self.fn: Callable[..., Any] = fn
        self.context = contextvars.copy_context() if context is None else context
        #: the context variable holding a decimal context the calls would share, or None
        self.decimal = _decimal_variable(self.context)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if self.decimal is None:  # 0.3 us a call
            return self.context.copy().run(self.fn, *args, **kwargs)
        return self.context.copy().run(_isolated, self.fn, self.decimal, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # Names in messages and stats (__qualname__, __name__) are fn's.
        if name.startswith("__") and name not in ("__qualname__", "__name__", "__module__"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return repr(self.fn)


def _decimal_variable(context: contextvars.Context) -> contextvars.ContextVar[Any] | None:
    """The decimal module's context variable, when ``context`` holds a decimal context.

    Without one, each call's ``decimal.getcontext()`` makes a fresh context
    of its own: nothing to copy.
    """
    if "decimal" not in sys.modules:
        return None
    for variable in context:
        if variable.name == "decimal_context":
            return variable
    return None


def _isolated(
    fn: Callable[..., Any],
    variable: contextvars.ContextVar[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    # The decimal context object itself is mutable (getcontext().prec = 30):
    # each call gets a copy, as a forked worker has (0.5 us).
    variable.set(variable.get().copy())
    return fn(*args, **kwargs)


def in_caller(fn: Callable[..., Any], effects: Any) -> Callable[..., Any]:
    """``fn`` as a loop in the caller's own thread runs it: itself where nothing needs isolating.

    The caller's thread already has the caller's settings; only a call that
    changes them (the decimal context, a context variable: effects of kind
    ``"process"``) must run in a copy. So ``fn`` itself when its effects
    allow a loop there (``effects.allows("inline")``, not by a declaration),
    which costs nothing per item; else an :class:`InContext`.

    Args:
        fn: the callable.
        effects: its :class:`~smartexec.effects.Effects`, or None (unknown).
    """
    if effects is not None and not effects.declared and effects.allows("inline"):
        return fn
    return InContext(fn)


def on_threads(
    fn: Callable[..., Any], context: contextvars.Context | None = None
) -> Callable[..., Any]:
    """``fn`` as pool threads run it: in a copy of ``context`` (None: this thread's, now).

    ``fn`` itself when the context holds nothing: a pool thread's own empty
    context is then what a worker process would start from, and a call's
    changes there reach only later calls on that thread, as a worker's
    reach its later calls. Else an :class:`InContext`.
    """
    context = contextvars.copy_context() if context is None else context
    return fn if len(context) == 0 else InContext(fn, context)
