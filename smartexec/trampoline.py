"""Module-level trampolines: how fork workers reach objects without pickling.

A callable with big state (a bound method of an object holding a large array,
a closure over a big table) would be pickled with every chunk if sent to a
process pool. Instead, the parent puts it in this module's table right before
forking a worker; the worker inherits the table by copy-on-write. A task then
carries only a :class:`SharedRef`, a few bytes that unpickle, in the worker, to
the inherited object through the module-level function :func:`resolve`.

The table holds strong references only while a fork is in progress (see
:func:`forking`); between forks the fork backend keeps weak references, so an
object the user drops is freed in the parent as usual.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["SharedRef", "new_token", "resolve", "forking"]

#: token -> object, filled only around a fork (parent) and inherited by the
#: forked worker.
_TABLE: dict[int, Any] = {}
#: What this process inherited (a worker): moved out of _TABLE right after the
#: fork, so that a worker which forks workers of its own (a nested executor)
#: keeps its objects when that fork clears _TABLE. Read by :func:`resolve`.
_INHERITED: dict[int, Any] = {}
_FORK_LOCK = threading.Lock()
_tokens = itertools.count(1)


def _after_fork_in_child() -> None:
    global _FORK_LOCK
    # The parent held the lock while forking us: a fresh one, or any fork we
    # make (a nested executor) would wait for ever.
    _FORK_LOCK = threading.Lock()
    _INHERITED.update(_TABLE)
    _TABLE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def new_token() -> int:
    """Return a token never handed out before in this process."""
    return next(_tokens)


class SharedRef:
    """A stand-in for a shared callable: pickles to its token, resolves in the worker.

    Args:
        token: the table key (int).
        name: the callable's name, for error messages.
    """

    __slots__ = ("token", "name")

    def __init__(self, token: int, name: str):
        self.token = token
        self.name = name

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[int, str]]:
        return resolve, (self.token, self.name)

    def __repr__(self) -> str:
        return f"SharedRef({self.token}, {self.name!r})"


def resolve(token: int, name: str) -> Any:
    """Return the object inherited under ``token`` (runs in the fork worker).

    Raises:
        LookupError: the worker was not forked while the object was shared,
            e.g. the ref was sent to a spawn or loky worker.
    """
    try:
        return _INHERITED[token]
    except KeyError:
        raise LookupError(
            f"{name} (trampoline token {token}) is not in this worker's table: only "
            f"workers forked by smartexec's fork backend after it was shared can reach it"
        ) from None


@contextlib.contextmanager
def forking(objects: Mapping[int, Any]) -> Iterator[None]:
    """Hold ``objects`` in the table while the body forks, then drop them.

    Serialises forks from all threads, so each child sees exactly the objects
    its parent meant it to inherit.

    Args:
        objects: token -> object, strong references kept for the duration.
    """
    with _FORK_LOCK:
        _TABLE.update(objects)
        try:
            yield
        finally:
            _TABLE.clear()
