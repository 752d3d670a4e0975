"""SmartExecutor: a ``concurrent.futures.Executor`` that routes each callable.

For each callable, :mod:`smartexec.inspection` says what it is and how big its
state is, :func:`smartexec.policy.decide` picks a backend and says why, and the
chosen backend (:mod:`smartexec.backends`) runs it in chunks. Decisions are
cached per callable (weakly: the cache never keeps a callable alive).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Literal, TypeVar

from ._diagnose import is_pickling_failure, pickling_error
from ._identity import WeakCallable, identity_key
from ._remote import Call, ChunkResult
from ._system import current_platform
from .backends._base import Backend
from .errors import BackendUnavailableError
from .inspection import callable_name, inspect_callable, payload_size
from .policy import BIG_STATE_BYTES, PREFER_VALUES, Decision, Options, decide
from .registry import get_backend_class
from .tuning import default_chunksize

__all__ = ["SmartExecutor"]

T = TypeVar("T")


class _CallFuture(Future):  # type: ignore[type-arg]
    """The future ``submit`` returns; completed from its one-call chunk."""

    def __init__(self, inner: Future[ChunkResult], fn: Any, call: Call, backend: str):
        super().__init__()
        self._inner: Future[ChunkResult] | None = inner
        self._origin: tuple[Any, Call, str] | None = (fn, call, backend)
        inner.add_done_callback(self._transfer)

    def _transfer(self, inner: Future[ChunkResult]) -> None:
        origin, self._origin, self._inner = self._origin, None, None
        if inner.cancelled():
            Future.cancel(self)
            self.set_running_or_notify_cancel()
            return
        error = inner.exception()
        if error is not None:
            if origin is not None and is_pickling_failure(error):
                fn, call, backend = origin
                error = pickling_error(fn, [call], error, backend)
            self.set_exception(error)
            return
        ok, value = inner.result().outcomes[0]
        if ok:
            self.set_result(value)
        else:
            self.set_exception(value)

    def cancel(self) -> bool:
        inner = self._inner
        if inner is not None and not inner.cancel():
            return False
        return Future.cancel(self)

    def running(self) -> bool:
        inner = self._inner
        return Future.running(self) or (inner is not None and inner.running())


class SmartExecutor(Executor):
    """An executor that picks threads, fork workers, loky workers or inline per callable.

    Mirrors ``concurrent.futures.Executor``: ``submit``, ``map``,
    ``shutdown`` and the context-manager protocol behave as in the stdlib, so
    it works wherever an executor is expected (``loop.run_in_executor``,
    ``concurrent.futures.wait`` / ``as_completed``).

    Args:
        max_workers: workers per backend (int >= 1). None means one per usable
            CPU for process backends and ``min(32, cpus + 4)`` for threads,
            as ``ThreadPoolExecutor`` does.
        backend: force every call onto one backend: ``"thread"``, ``"fork"``,
            ``"loky"``, ``"inline"`` or a registered plugin name. None lets the
            policy choose per callable.
        prefer: ``"threads"`` or ``"processes"``: a hint the policy follows
            unless the callable's state must not be pickled.
        big_state_bytes: callables whose state (bound object, closure cells,
            partial arguments) pickles to more bytes than this are shared with
            fork workers by copy-on-write instead of pickled. Default 1 MiB.

    Raises:
        ValueError: ``max_workers`` is not positive, or ``prefer`` is not
            one of the accepted values.
        TypeError: ``max_workers`` is not an int.
        smartexec.errors.UnknownBackendError: no backend has the given name.
        smartexec.errors.BackendUnavailableError: the backend cannot run here.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        backend: str | None = None,
        prefer: Literal["threads", "processes"] | None = None,
        big_state_bytes: int = BIG_STATE_BYTES,
    ):
        if max_workers is not None:
            if isinstance(max_workers, bool) or not isinstance(max_workers, int):
                raise TypeError(
                    f"max_workers must be an int or None, got {max_workers!r} "
                    f"({type(max_workers).__qualname__})"
                )
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        if prefer is not None and prefer not in PREFER_VALUES:
            raise ValueError(
                f"prefer must be one of {', '.join(map(repr, PREFER_VALUES))} or None, "
                f"got {prefer!r}"
            )
        if backend is not None:
            self._check_available(backend)
        self._platform = current_platform()
        self._options = Options(backend=backend, prefer=prefer, big_state_bytes=big_state_bytes)
        self._max_workers = max_workers
        self._lock = threading.RLock()
        self._shutdown = False
        self._backends: dict[str, Backend] = {}
        self._decisions: dict[Any, tuple[WeakCallable, Decision]] = {}
        self._log: list[Decision] = []

    @staticmethod
    def _check_available(name: str) -> type[Backend]:
        factory = get_backend_class(name)
        reason_of = getattr(factory, "unavailable_reason", None)
        reason = reason_of() if reason_of is not None else None
        if reason is not None:
            raise BackendUnavailableError(
                f"backend {name!r} cannot run here: {reason}", backend=name
            )
        return factory  # type: ignore[return-value]

    # -- routing -----------------------------------------------------------------

    def _route(self, fn: Callable[..., Any]) -> Decision:
        key = identity_key(fn)
        cached = self._decisions.get(key)
        if cached is not None and cached[0].matches(fn):
            return cached[1]
        decision = decide(inspect_callable(fn), self._platform, self._options)
        decisions = self._decisions  # the weakref callback must not hold self
        handle = WeakCallable(fn, lambda: decisions.pop(key, None))
        if handle.weak:
            decisions[key] = (handle, decision)
        self._log.append(decision)
        return decision

    def _backend(self, name: str) -> Backend:
        backend = self._backends.get(name)
        if backend is None:
            factory = self._check_available(name)
            backend = self._backends[name] = factory(self._max_workers, self._platform.cpu_count)
        return backend

    def explain(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Decision:
        """Return the :class:`~smartexec.policy.Decision` for ``fn``; run nothing.

        Args:
            fn: the callable, as it would be passed to ``submit`` or ``map``.
            *args, **kwargs: an example call's arguments; when given, their
                pickled size is added to the reasons.

        Returns:
            The decision: ``.backend``, ``.reasons``, ``.share``, and
            ``str()`` for people.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        decision = self._route(fn)
        if args or kwargs:
            size = payload_size((args, kwargs))
            note = f"one call's arguments pickle to {size}"
            if self._check_available(decision.backend).shares_memory:
                note += " (not pickled on this backend)"
            decision = Decision(
                decision.backend,
                (*decision.reasons, note),
                share=decision.share,
                chunksize=decision.chunksize,
                profile=decision.profile,
            )
        return decision

    def decisions(self) -> tuple[Decision, ...]:
        """Return every routing decision this executor made, oldest first."""
        return tuple(self._log)

    # -- the Executor contract ---------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            decision = self._route(fn)
            backend = self._backend(decision.backend)
            target = backend.prepare(fn, decision.share)
            call: Call = (args, kwargs)
            inner = backend.submit_chunk(target, [call])
        return _CallFuture(inner, fn, call, backend.name)

    submit.__doc__ = (Executor.submit.__doc__ or "") + """
        smartexec adds: the callable is routed to a backend by
        :meth:`explain`'s policy. Raises
        :class:`~smartexec.errors.PayloadPicklingError` when the callable or
        an argument cannot be sent to the chosen backend's workers, and
        ``RuntimeError`` after :meth:`shutdown`.
        """

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
    ) -> Iterator[T]:
        if chunksize is not None and chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        end_time = None if timeout is None else timeout + time.monotonic()
        items = list(zip(*iterables))
        pending: list[tuple[Future[ChunkResult], list[Call]]] = []
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            decision = self._route(fn)
            backend = self._backend(decision.backend)
            size = chunksize or default_chunksize(
                len(items),
                backend.max_workers,
                in_process=backend.shares_memory,
                synchronous=backend.synchronous,
            )
            target = backend.prepare(fn, decision.share)
            try:
                for start in range(0, len(items), size):
                    chunk: list[Call] = [(args, {}) for args in items[start : start + size]]
                    pending.append((backend.submit_chunk(target, chunk), chunk))
            except BaseException:
                for future, _ in pending:
                    future.cancel()
                raise
        del items
        return _results(pending, end_time, fn, backend.name)

    map.__doc__ = (Executor.map.__doc__ or "") + """
        smartexec adds: items travel in chunks of ``chunksize`` items (None
        picks about four chunks per process worker, one item per chunk on
        threads); each item's exception is raised at its own position, after
        the results of the items before it, even within a chunk.
        """

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            backends = list(self._backends.values())
        for backend in backends:
            backend.shutdown(wait=wait, cancel_futures=cancel_futures)

    shutdown.__doc__ = (Executor.shutdown.__doc__ or "") + """
        smartexec adds: every backend this executor started is shut down;
        no worker process outlives a ``shutdown(wait=True)``. Idempotent.
        """

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        started = ", ".join(sorted(self._backends)) or "none yet"
        return f"<SmartExecutor {state}; backends started: {started}>"


def _results(
    pending: list[tuple[Future[ChunkResult], list[Call]]],
    end_time: float | None,
    fn: Any,
    backend: str,
) -> Iterator[Any]:
    """Yield each item's result in order; on exit cancel what has not run."""
    try:
        pending.reverse()  # pop from the end: drop references as we go
        while pending:
            future, chunk = pending[-1]
            try:
                if end_time is None:
                    result = future.result()
                else:
                    result = future.result(end_time - time.monotonic())
            except BaseException as exc:
                if is_pickling_failure(exc) and not future.cancelled():
                    raise pickling_error(fn, chunk, exc, backend) from exc
                raise
            pending.pop()
            del future, chunk
            for ok, value in result.outcomes:
                if not ok:
                    raise value
                yield value
            del result
    finally:
        for future, _ in pending:
            future.cancel()
