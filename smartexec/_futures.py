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
