"""Await a ``concurrent.futures.Future`` from asyncio code: :meth:`SmartExecutor.run_async`.

``loop.run_in_executor`` bridges with ``asyncio.wrap_future``; this module
does the same job with two differences that matter to smartexec's users:

* the outcome is read in the awaiting coroutine, not copied into an asyncio
  future from a loop callback: a call that raises ``StopIteration`` fails
  the awaiting task (as PEP 479's ``RuntimeError``) instead of leaving it
  pending forever (asyncio futures refuse ``StopIteration``, and
  ``run_in_executor`` then never completes);
* ``submit`` is only called once a running loop is found, so nothing is
  started for a coroutine that cannot be awaited here.

Cancellation is asyncio's: cancelling the awaiting task (``task.cancel()``,
``asyncio.timeout``, ``wait_for``) cancels the executor's future, which stops
a call that no worker has taken yet; a call already running runs on and its
outcome is dropped, as with ``run_in_executor``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

__all__ = ["run_async"]

T = TypeVar("T")


async def run_async(submit: Callable[[], Future[T]]) -> T:
    """Call ``submit()`` and wait for its future without blocking the event loop.

    Args:
        submit: starts the call and returns its future, e.g.
            ``functools.partial(executor.submit, fn, *args)``.

    Returns:
        The call's result.

    Raises:
        RuntimeError: no event loop runs in this thread (``submit`` is not
            called); or the call raised ``StopIteration`` (chained as
            ``__cause__``), which a coroutine cannot raise.
        asyncio.CancelledError: the awaiting task was cancelled (the future is
            cancelled too: a call not yet started never runs), or the future
            was cancelled elsewhere (``shutdown(cancel_futures=True)``).
        BaseException: whatever the call raised, unchanged.
    """
    loop = asyncio.get_running_loop()
    future = submit()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: Future[T]) -> None:
        # In whichever thread completed the future (a worker, a result feeder,
        # or this one when it was already done).
        try:
            loop.call_soon_threadsafe(_resolve, waiter)
        except RuntimeError:  # the loop was closed meanwhile: nobody awaits
            pass

    future.add_done_callback(wake)
    try:
        await waiter
    except BaseException:
        future.cancel()  # False when the call already runs: it runs on
        raise
    if future.cancelled():
        # As run_in_executor: the task ends cancelled, not with
        # concurrent.futures.CancelledError.
        raise asyncio.CancelledError()
    return future.result()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # it is cancelled when the task was
        waiter.set_result(None)
