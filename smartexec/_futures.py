"""A future completed from another one (a chunk's), for backends and the executor."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

__all__ = ["ChainedFuture"]


class ChainedFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` whose outcome comes from ``inner``.

    Subclasses set ``_inner`` to None once they have taken ``inner``'s
    outcome (in a done-callback). Until then, cancelling this future cancels
    ``inner`` (whose callback then cancels this one), and ``running()`` is
    true while ``inner`` runs.
    """

    def __init__(self, inner: Future[Any]):
        super().__init__()
        self._inner: Future[Any] | None = inner

    def cancel(self) -> bool:
        inner = self._inner
        if inner is None:
            # Already taken (or being taken): never cancel a finished call here.
            return self.cancelled()
        return inner.cancel()

    def running(self) -> bool:
        inner = self._inner
        return Future.running(self) or (inner is not None and inner.running())
