"""The future ``SmartExecutor.submit`` returns for a call routed to a process backend.

It follows the one-call chunk that runs the call (``ChunkResult`` in, the
call's outcome out), and can be sent again: after a worker died (a retry),
to threads while it waits in a process queue (a *move*), or for the first
time when it waited unsent in this process (a *parked* call, see
:mod:`smartexec._submit_learning`).

One lock per future (``_move_lock``) makes cancel, move and send decide one
at a time, so ``cancel()`` never answers True for a call that is then sent.
No user code runs under it: a done-callback is the user's, and callbacks
that cancel each other's futures from two threads would deadlock on two such
locks. An outcome reached while this thread holds the lock (an inner future
cancelled here, or already done when its callback is added) is set once the
lock is let go.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from ._diagnose import explain_pickling, is_pickling_failure, pickling_error
from ._futures import ChainedFuture
from ._remote import Call, ChunkResult
from .errors import PayloadPicklingError, WorkerCrashedError

__all__ = ["CallFuture"]


def _retryable(exc: BaseException | None) -> bool:
    """A worker death: the call itself may well succeed on a fresh worker."""
    return isinstance(exc, WorkerCrashedError)


class CallFuture(ChainedFuture):
    """The future ``submit`` returns; completed from its one-call chunk.

    A ``concurrent.futures.Future``: built with no argument (``type(fut)()``)
    it is a plain, pending one, as the stdlib's is.

    Args:
        inner: the chunk's future, or None (a plain future, or a parked call).
        fn: the user's callable (for a clear pickling error).
        call: its ``(args, kwargs)``.
        backend: the backend's name.
        resend: sends the call again (a retry after a worker died).
        retries: times to retry, at most.
        learn: called with the call's chunk result when it completed (the
            worker's figures feed :mod:`smartexec._submit_learning`), or None.
        parked: the call is not sent yet (``inner`` is None): it waits in
            this process until :meth:`release` or :meth:`release_to_threads`
            sends it; cancelled meanwhile, it is notified at once (``wait()``
            and ``as_completed()`` see it done).
    """

    def __init__(
        self,
        inner: Future[ChunkResult] | None = None,
        fn: Any = None,
        call: Call | None = None,
        backend: str = "",
        resend: Callable[[], Future[ChunkResult]] | None = None,
        retries: int = 0,
        learn: Callable[[ChunkResult], None] | None = None,
        parked: bool = False,
    ):
        super().__init__(inner)
        self._origin: tuple[Any, Call, str] | None = None if call is None else (fn, call, backend)
        # The submitter's context: a call moved to threads later runs in a copy of it.
        self.context = contextvars.copy_context()
        self._resend = resend
        self._retries = retries
        self._learn = learn
        self._parked = parked and inner is None and call is not None
        self._move_lock = threading.RLock()
        self._holder: int | None = None  # the thread in a _deciding() block
        self._deferred: list[Callable[[], None]] = []  # what it does once out of it
        self._moving: Callable[[], Future[ChunkResult]] | None = None
        self._cancelled_here = False  # cancel() answered True; the state follows
        if inner is not None:
            inner.add_done_callback(self._transfer)

    @contextmanager
    def _deciding(self) -> Iterator[None]:
        """Hold the lock; what this thread completes meanwhile is done once it lets go."""
        me = threading.get_ident()
        later: list[Callable[[], None]] = []
        try:
            with self._move_lock:
                outer = self._holder
                self._holder = me
                try:
                    yield
                finally:
                    self._holder = outer
                    if outer is None:
                        later, self._deferred = self._deferred, []
        finally:
            for step in later:
                step()

    def _when_free(self, step: Callable[[], None]) -> None:
        """Run ``step`` now, or once this thread leaves its :meth:`_deciding` block."""
        if self._holder == threading.get_ident():
            self._deferred.append(step)
        else:
            step()

    def cancel(self) -> bool:
        with self._deciding():
            if self._cancelled_here:
                return True
            inner = self._inner
            if self._parked:
                # Never sent: nothing will reach it to notify, so it is
                # notified here, as a stdlib executor does once it gets there.
                self._parked = False
                self._origin = None
                self._cancelled_here = True
                self._deferred.append(self._cancelled)
                return True
            if inner is not None:
                if not inner.cancel():
                    return False
                self._cancelled_here = True  # its callback set this one's state, or will
                return True
            if self._chained:  # its outcome is taken (or being taken)
                return self.cancelled()
        return Future.cancel(self)  # a plain future: nothing sends or moves it

    def move(
        self, send: Callable[[Call, contextvars.Context], Future[ChunkResult]], backend: str
    ) -> bool:
        """Send the call with ``send(call, context)`` instead, if no worker has taken it yet.

        ``context`` is the submitter's (:mod:`smartexec._context`).

        The chunk queued on the first backend is cancelled there (it never
        runs) and ``send(call)`` makes the one this future follows from now
        on; should that raise, the call goes back to the first backend. For
        submits that a verdict moves to threads while queued on processes
        (``SubmitRoute.move_to_threads``).

        Returns:
            True when the call moved; False when it had started (or ended),
            or was never sent.
        """
        with self._deciding():
            inner, origin = self._inner, self._origin
            if inner is None or origin is None or inner.running() or inner.done():
                return False
            call = origin[1]
            self._moving = functools.partial(send, call, self.context)
            self._origin = (origin[0], call, backend)
            if inner.cancel():  # _transfer, called back here, sends it
                return True
            self._moving, self._origin = None, origin
            return False

    def release(
        self,
        send: Callable[[], Future[ChunkResult]],
        learn: Callable[..., None] | None = None,
    ) -> bool:
        """Send a parked call on its own route with ``send``; False if it was cancelled meanwhile.

        ``learn(result, send_s=seconds)`` is given the call's figures once it
        completes, as a submit sent at once gives them. A send that raises
        fails this future with the error (a pickling failure named as
        ``submit`` names it).
        """
        with self._deciding():
            if not self._parked or self._origin is None:
                return False
            self._parked = False
            self._chained = True
            start = time.perf_counter()
            try:
                inner = send()
            except BaseException as exc:
                self._origin, origin = None, self._origin
                self._deferred.append(functools.partial(self._fail, exc, origin))
                return True
            if learn is not None:
                self._learn = functools.partial(learn, send_s=time.perf_counter() - start)
            self._inner, self._resend = inner, send
            inner.add_done_callback(self._transfer)
            return True

    def release_to_threads(self, submit_call: Callable[..., Future[Any]]) -> bool:
        """Run a parked call on the thread backend; False if it was cancelled meanwhile.

        ``submit_call(fn, args, kwargs, context=...)`` is the thread backend's
        :meth:`~smartexec.backends.thread.ThreadBackend.submit_call`: the
        call is never pickled, and this future follows the pool's own.
        """
        with self._deciding():
            origin = self._origin
            if not self._parked or origin is None:
                return False
            self._parked = False
            self._chained = True
            fn, (args, kwargs), _ = origin
            self._origin = (fn, (args, kwargs), "thread")
            try:
                inner = submit_call(fn, args, kwargs, context=self.context)
            except BaseException as exc:
                self._origin = None
                self._deferred.append(functools.partial(self._fail, exc, origin))
                return True
            self._inner = inner
            inner.add_done_callback(self._copy_outcome)
            return True

    def _fail(self, exc: BaseException, origin: tuple[Any, Call, str] | None) -> None:
        """Fail this future with ``exc``, a send that raised (a pickling failure named)."""
        self._inner = self._resend = None
        error = exc
        if origin is not None and isinstance(exc, Exception):
            error = explain_pickling(origin[0], [origin[1]], exc, origin[2])
        if Future.set_running_or_notify_cancel(self):
            self.set_exception(error)

    def _cancelled(self) -> None:
        Future.cancel(self)
        Future.set_running_or_notify_cancel(self)

    def _copy_outcome(self, inner: Future[Any]) -> None:
        """The outcome of a plain future (a thread backend's call) is this one's."""
        if self._holder == threading.get_ident():
            self._deferred.append(functools.partial(self._copy_outcome, inner))
            return
        self._origin = self._inner = None
        if inner.cancelled():
            self._cancelled()
            return
        error = inner.exception()
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(inner.result())

    def _send_again(self, *sends: Callable[[], Future[ChunkResult]] | None) -> None:
        """Follow the chunk made by the first of ``sends`` that does not raise; else fail with its error.

        For a retry after a worker died (the call's own route) and for a
        move (the new route, then the first one): the one that worked sends
        any later retry.
        """
        error: BaseException | None = None
        for send in sends:
            if send is None:
                continue
            try:
                again = send()
            except BaseException as exc:  # e.g. the executor shut down meanwhile
                error = error or exc
                continue
            self._inner, self._resend = again, send
            again.add_done_callback(self._transfer)
            return
        assert error is not None
        self._origin = None
        self._when_free(functools.partial(self._fail, error, None))

    def _transfer(self, inner: Future[ChunkResult]) -> None:
        moving, self._moving = self._moving, None
        if moving is not None and inner.cancelled():
            self._learn = None  # the figures are the first backend's to learn
            self._send_again(moving, self._resend)
            return
        if self._holder == threading.get_ident():
            # Completed while this thread decides (an inner cancelled here, or
            # done before its callback was added): the outcome, and the
            # user's callbacks with it, once the lock is let go.
            self._deferred.append(functools.partial(self._transfer, inner))
            return
        if (
            self._retries > 0
            and self._resend is not None
            and not inner.cancelled()
            and _retryable(inner.exception())
        ):
            self._retries -= 1
            self._send_again(self._resend)
            return
        origin, self._origin, self._inner, self._resend = self._origin, None, None, None
        if inner.cancelled():
            self._cancelled()
            return
        error = inner.exception()
        if error is not None:
            if (
                origin is not None
                and not isinstance(error, (PayloadPicklingError, BrokenProcessPool))
                and is_pickling_failure(error)
            ):
                # A plugin backend's own pickling error: name the part that failed.
                fn, call, backend = origin
                error = pickling_error(fn, [call], error, backend)
            self.set_exception(error)
            return
        result = inner.result()
        learn, self._learn = self._learn, None
        if learn is not None:
            # Before the result is set: a caller that saw it routes the next
            # submit with this call's figures.
            try:
                learn(result)
            except Exception:  # pragma: no cover - figures are advice, never an error
                pass
        ok, value = result.outcomes[0]
        if ok:
            self.set_result(value)
        else:
            self.set_exception(value)
