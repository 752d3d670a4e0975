"""A future completed from another one (a chunk's), for backends and the executor."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

__all__ = ["ChainedFuture"]


class ChainedFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` whose outcome comes from ``inner``.

    Built with no argument (``type(fut)()``), or before its inner future
    exists, it is a plain ``Future``: ``cancel()`` cancels it while pending.
    Once chained (``inner`` given, or :meth:`_chain`), cancelling it cancels
    ``inner`` (whose done-callback then cancels this one), and ``running()``
    is true while ``inner`` runs. Subclasses set ``_inner`` to None once they
    have taken ``inner``'s outcome (in a done-callback).

    Args:
        inner: the future this one follows, or None for none yet.
    """

    def __init__(self, inner: Future[Any] | None = None):
        super().__init__()
        self._inner: Future[Any] | None = inner
        self._chained = inner is not None

    def __repr__(self) -> str:
        """``<Future at 0x... state=...>``, exactly as a ``concurrent.futures.Future`` reads.

        The futures ``submit`` returns are subclasses (an implementation
        detail): code and doctests that print a future, and the
        ``InvalidStateError`` messages built from its repr, expect the
        stdlib's class name.
        """
        text = Future.__repr__(self)
        mine = "<" + type(self).__name__ + " "
        return "<Future " + text[len(mine) :] if text.startswith(mine) else text

    def _chain(self, inner: Future[Any]) -> None:
        """Follow ``inner`` from now on (the caller adds its done-callback)."""
        self._inner = inner
        self._chained = True

    def cancel(self) -> bool:
        inner = self._inner
        if inner is None:
            if self._chained:
                # Already taken (or being taken): never cancel a finished call here.
                return self.cancelled()
            return super().cancel()
        return inner.cancel()

    def running(self) -> bool:
        inner = self._inner
        return Future.running(self) or (inner is not None and inner.running())
