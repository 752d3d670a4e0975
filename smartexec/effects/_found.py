"""What a reading found: :class:`Effect`, :class:`Effects`, and the :func:`thread_safe` opt-in."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: How many levels of calls into the user's own code are read.
MAX_DEPTH = 4
#: How many functions one reading may read in all; past it, the rest is "unread".
MAX_FUNCTIONS = 40

Kind = Literal["shared", "process", "argument", "unread"]

#: The routes each kind of effect keeps a callable off, and why. A write to
#: an object other calls see keeps it out of the calling thread too: there
#: it writes the caller's own object, which outlives the map (a module-level
#: set of items seen, filled by one map in a loop, read 17,605 of the next
#: map's 20,000 items as seen; on processes each worker fills a copy).
OFF_ROUTES: dict[str, tuple[str, ...]] = {
    "shared": ("thread", "inline"),
    "process": ("thread", "inline"),
    "argument": ("thread", "inline"),
    "unread": ("thread", "inline"),
}

DECLARED_ATTRIBUTE = "__smartexec_thread_safe__"


@dataclass(frozen=True)
class Effect:
    """One thing a callable may change, and where its code does it.

    Attributes:
        kind: ``"shared"`` (an object other calls see), ``"process"`` (state
            of the whole process), ``"argument"`` (an argument, in place) or
            ``"unread"`` (code that could not be read).
        what: e.g. ``"writes module-level `_BUF`"``.
        where: ``"file.py:12"``, or ``""`` when not known.
    """

    kind: Kind
    what: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.what} ({self.where})" if self.where else self.what


@dataclass(frozen=True)
class Effects:
    """What :func:`effects_of` found a callable may change.

    Attributes:
        found: the effects, in the order the code has them (at most one per
            kind and object).
        trusted: native or installed-package callables it calls that are not
            in the tables, by name: trusted to change nothing shared.
        declared: the user declared it thread-safe (:func:`thread_safe`).
        in_process: why its whole effect is on an object of this process (a
            queue's ``get``, ``results.append``), or None: a worker process
            would act on a copy, so such a callable belongs on threads
            (:func:`~smartexec.effects._in_process.process_local_reason`).
    """

    found: tuple[Effect, ...] = ()
    trusted: tuple[str, ...] = ()
    declared: bool = False
    in_process: str | None = None

    def blocking(self, route: str) -> Effect | None:
        """The first effect that keeps the callable off ``route``, or None.

        Args:
            route: ``"thread"`` (this process's threads) or ``"inline"`` (a
                loop in the calling thread); any other route (a process
                backend) is never blocked.
        """
        if self.declared or self.in_process is not None:
            return None
        return next((e for e in self.found if route in OFF_ROUTES[e.kind]), None)

    def writes_arguments(self) -> bool:
        """Whether a call may write into its arguments (or its code could not be read).

        Then each call in a worker gets arguments of its own
        (:class:`~smartexec._remote.OwnCalls`), never one object shared by
        several calls of a chunk. A declaration (:func:`thread_safe`) does not
        change what the code writes.
        """
        return any(e.kind in ("argument", "unread") for e in self.found)

    def owns_calls(self) -> bool:
        """Whether each call in a worker needs arguments of its own (and its results, see below).

        So when a call may write into its arguments, or into an object a
        later call reaches (or its code could not be read): a chunk's calls
        travel as one pickle. Its results go back as one, after its last
        call: where :meth:`keeps_writes`, each is copied as it is returned
        if a later call could change it (see :class:`~smartexec._remote.OwnCalls`).
        """
        return self.writes_arguments() or self.keeps_writes()

    def keeps_writes(self) -> bool:
        """Whether a call may write to an object a later call reaches (or its code could not be read).

        Then a worker that ran an earlier call holds a copy that call wrote
        to; a ``ProcessPoolExecutor`` sends each call a fresh copy instead.
        """
        return any(e.kind in ("shared", "unread") for e in self.found)

    def allows(self, route: str) -> bool:
        """Whether ``route`` computes what worker processes would (see :meth:`blocking`)."""
        return self.blocking(route) is None

    def reason(self, route: str) -> str | None:
        """Why the callable is kept off ``route``, with the opt-in, or None when it is not."""
        effect = self.blocking(route)
        if effect is None:
            return None
        where = "threads" if route == "thread" else "the calling thread"
        return (
            f"{effect}: kept off {where}, where calls would see each other's writes or "
            f"change the caller (smartexec.thread_safe(fn), prefer='threads' or "
            f"backend='thread' runs it there all the same)"
        )

    def trust_note(self) -> str | None:
        """Which native calls a threads route trusted, for ``explain()``, or None."""
        if not self.trusted:
            return None
        names = ", ".join(self.trusted[:4]) + (", ..." if len(self.trusted) > 4 else "")
        return f"trusted to change no shared state (native code, not read): {names}"


def thread_safe(fn: F) -> F:
    """Declare that ``fn``'s calls may share this process: threads and a loop are safe for it.

    smartexec keeps a callable off threads when its code writes an object
    other calls see, changes the process or writes into its arguments
    (:func:`effects_of`). Use this when those writes are safe all the same
    (guarded by a lock, or meant to be shared), as you would on a
    ``ThreadPoolExecutor``. Works as a decorator; returns ``fn`` itself.

    Args:
        fn: a Python function, a bound method (the declaration goes on its
            function, so every object's method is declared), a
            ``functools.partial`` (on the partial) or a callable object
            that takes attributes.

    Returns:
        ``fn``, unchanged but for the declaration.

    Raises:
        TypeError: ``fn`` is not callable, or takes no attributes (a
            built-in function): pass ``prefer="threads"`` or
            ``backend="thread"`` to the executor instead.
    """
    if not callable(fn):
        raise TypeError(f"thread_safe() takes a callable, got {type(fn).__name__}")
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    try:
        setattr(target, DECLARED_ATTRIBUTE, True)
    except (AttributeError, TypeError):
        raise TypeError(
            f"thread_safe() cannot mark {fn!r}: it takes no attributes; pass "
            f"prefer='threads' or backend='thread' to the SmartExecutor instead"
        ) from None
    return fn


def is_declared(fn: Any) -> bool:
    """Whether :func:`thread_safe` marked ``fn`` (lookups only: no ``__getattr__`` runs)."""
    found = [fn]
    if isinstance(fn, types.MethodType):
        found.append(fn.__func__)
    elif isinstance(fn, functools.partial):
        found.append(fn.func)
    for obj in found:
        try:
            own = object.__getattribute__(obj, "__dict__")
        except Exception:  # noqa: BLE001 - an odd object: not marked
            continue
        if isinstance(own, dict) and own.get(DECLARED_ATTRIBUTE) is True:
            return True
    return False
