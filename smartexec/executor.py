"""SmartExecutor: a ``concurrent.futures.Executor`` that routes each callable.

For each callable, :mod:`smartexec.inspection` says what it is and how big its
state is, :func:`smartexec.policy.decide` picks a backend and says why, and the
chosen backend (:mod:`smartexec.backends`) runs it in chunks. Decisions are
cached per callable (weakly: the cache never keeps a callable alive).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, Literal, TypeVar

from ._diagnose import is_pickling_failure, pickling_error
from ._identity import WeakCallable, identity_key
from ._mapping import (
    PICKLE_SAMPLE,
    TINY_ITEM_S,
    ChunkStream,
    InlineRun,
    common_length,
    default_buffersize,
    drain,
    inline_batches,
    lazy_inline,
    measure_pickling,
    stream_values,
    then_raise,
)
from ._remote import Call, ChunkResult
from ._system import current_platform
from .backends._base import Backend
from .errors import BackendUnavailableError
from .gil import GIL_PROBE_S, GilProfile, GilSampler, recall, recheck_due, remember
from .inspection import inspect_callable, payload_size
from .policy import BIG_STATE_BYTES, PREFER_VALUES, Decision, Options, decide
from .registry import get_backend_class
from .tuning import PROBE_MAX_ITEMS, PROBE_S, Estimate, Verdict, inline_verdict

__all__ = ["SmartExecutor"]

T = TypeVar("T")

#: Most decisions kept for :meth:`SmartExecutor.decisions`.
DECISION_LOG_SIZE = 1000

_interpreter_exiting = False


def _mark_interpreter_exit() -> None:
    global _interpreter_exiting
    _interpreter_exiting = True


# Runs before atexit handlers, as concurrent.futures' own hook does: from then
# on nothing may start workers (their exit hooks could no longer run).
getattr(threading, "_register_atexit", atexit.register)(_mark_interpreter_exit)


def _check_open(executor: SmartExecutor) -> None:
    if executor._shutdown:
        raise RuntimeError("cannot schedule new futures after shutdown")
    if _interpreter_exiting:
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")


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
        if inner is None:
            # Already transferred (or transferring): the call ran or was
            # cancelled through its chunk; never cancel a finished call here.
            return self.cancelled()
        # Cancelling the chunk runs _transfer, which cancels this future and
        # notifies its waiters.
        return inner.cancel()

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
            fork workers by copy-on-write instead of pickled (without fork:
            sent once to each loky worker and kept there). Default 1 MiB.
            Numpy arrays of 1 MiB or more, arguments and results alike,
            always cross to process workers through shared memory
            (:mod:`smartexec.transport`).

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
        if backend is not None and not isinstance(backend, str):
            raise TypeError(
                f"backend must be a backend name (str) or None, got {backend!r} "
                f'({type(backend).__qualname__}); e.g. backend="thread"'
            )
        if isinstance(big_state_bytes, bool) or not isinstance(big_state_bytes, int):
            raise TypeError(
                f"big_state_bytes must be an int (bytes), got {big_state_bytes!r} "
                f"({type(big_state_bytes).__qualname__})"
            )
        if big_state_bytes < 0:
            raise ValueError(f"big_state_bytes must be >= 0, got {big_state_bytes}")
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
        self._decisions: dict[Any, tuple[WeakCallable, Decision, Estimate]] = {}
        self._log: collections.deque[Decision] = collections.deque(maxlen=DECISION_LOG_SIZE)
        self._started: set[str] = set()

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

    def _route(self, fn: Callable[..., Any]) -> tuple[Decision, Estimate]:
        """The policy's decision for ``fn`` and its per-item estimate, cached weakly."""
        key = identity_key(fn)
        cached = self._decisions.get(key)
        if cached is not None and cached[0].matches(fn):
            return cached[1], cached[2]
        decision = decide(inspect_callable(fn), self._platform, self._options, recall(fn))
        estimate = Estimate()
        decisions = self._decisions  # the weakref callback must not hold self
        handle = WeakCallable(fn, lambda: decisions.pop(key, None))
        if handle.weak:
            decisions[key] = (handle, decision, estimate)
        self._log.append(decision)
        return decision, estimate

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
        decision, estimate = self._route(fn)
        notes = []
        if estimate.per_item_s is not None:
            notes.append(f"measured so far: {estimate!r}")
        if estimate.last_map is not None:
            notes.append(
                f"its last map ran on {estimate.last_map.backend}: {estimate.last_map.reasons[0]}"
            )
        if notes:
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, *notes))
        if args or kwargs:
            size = payload_size((args, kwargs))
            note = f"one call's arguments pickle to {size}"
            if self._check_available(decision.backend).shares_memory:
                note += " (not pickled on this backend)"
            decision = dataclasses.replace(decision, reasons=(*decision.reasons, note))
        return decision

    def refresh(self, fn: Callable[..., Any]) -> bool:
        """Let workers see the current state of a shared callable's object.

        A callable shared by copy-on-write (``explain(fn).share`` on fork)
        reaches each fork worker as the copy of its object that existed when
        that worker was forked; one sent once per worker (``share`` on loky)
        as the copy pickled at its first chunk. Changes the parent makes
        afterwards (``model.bias = 2``) are not seen by later chunks. Call
        ``refresh(fn)`` after such a change: the next chunks of ``fn`` run on
        workers forked from, or sent, the current state.

        Args:
            fn: the callable, e.g. ``model.predict``.

        Returns:
            True when ``fn`` was shared with workers (and is now refreshed),
            False when nothing needed doing.
        """
        with self._lock:
            backends = list(self._backends.values())
        refreshed = False
        for backend in backends:  # fork's copy-on-write, loky's per-worker cache
            refresh = getattr(backend, "refresh", None)
            if refresh is not None and refresh(fn):
                refreshed = True
        return refreshed

    def decisions(self) -> tuple[Decision, ...]:
        """Return the routing decisions this executor made, oldest first.

        Keeps the last :data:`DECISION_LOG_SIZE` (the policy's decision for
        each new callable, and one entry per ``map`` saying what it ran on).
        """
        return tuple(self._log)

    # -- the Executor contract ---------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            _check_open(self)
            decision, _ = self._route(fn)
            backend = self._backend(decision.backend)
            target = backend.prepare(fn, decision.share)
            call: Call = (args, kwargs)
            inner = backend.submit_chunk(target, [call])
            self._started.add(backend.name)
        return _CallFuture(inner, fn, call, backend.name)

    submit.__doc__ = (
        (Executor.submit.__doc__ or "")
        + """
        smartexec adds: the callable is routed to a backend by
        :meth:`explain`'s policy. Raises
        :class:`~smartexec.errors.PayloadPicklingError` when the callable or
        an argument cannot be sent to the chosen backend's workers, and
        ``RuntimeError`` after :meth:`shutdown`.
        """
    )

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int | None = None,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        for name, value in (("chunksize", chunksize), ("buffersize", buffersize)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(
                    f"{name} must be an int or None, got {value!r} ({type(value).__qualname__})"
                )
        if chunksize is not None and chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0.")
        end_time = None if timeout is None else timeout + time.monotonic()
        remaining = common_length(iterables)
        inputs = zip(*iterables)
        with self._lock:
            _check_open(self)
            decision, estimate = self._route(fn)
            backend = self._backend(decision.backend)
        if backend.synchronous:
            return lazy_inline(fn, inputs)

        # Callables shared by copy-on-write never run here: their writes to
        # their own state must stay in the workers, for every item alike.
        # Threads start in microseconds and cost ~20 us a chunk, so measuring
        # in this thread first buys little there, and would block map() on
        # producer/consumer code (items that wait for the caller).
        # A route that rests on whether the callable holds the GIL is measured
        # on its first map, and again every GIL_RECHECK_MAPS maps.
        gil_check = decision.measure or (decision.gil is not None and recheck_due(fn))
        auto = (
            chunksize is None
            and self._options.backend is None
            and timeout is None
            and not decision.share
            and (gil_check or not backend.shares_memory)
        )

        def open_stream(rest: Iterator[tuple[Any, ...]], left: int | None) -> ChunkStream:
            return self._open_stream(
                fn, decision, estimate, backend, rest, left, chunksize, buffersize, end_time
            )

        if not auto:
            stream = open_stream(inputs, remaining)
            why = (
                "chunksize given"
                if chunksize is not None
                else "backend given"
                if self._options.backend is not None
                else "timeout given"
                if timeout is not None
                else "shared by copy-on-write"
                if decision.share and backend.copy_on_write
                else "sent once per worker"
                if decision.share
                else "threads: nothing to measure first"
            )
            self._note(
                decision,
                estimate,
                decision.backend,
                (f"{why}: no items ran in this thread",),
                stream,
            )
            return stream_values([], stream)

        pickled = not backend.shares_memory
        star = len(iterables) != 1
        items: Iterator[Any] = inputs if star else iter(iterables[0])
        head: list[Any] = []
        if pickled and not star and isinstance(iterables[0], (list, tuple, range)):
            head = [(x,) for x in iterables[0][:PICKLE_SAMPLE]]  # a sample, not consumed
        elif pickled:
            head = list(itertools.islice(items, PICKLE_SAMPLE))
            items = itertools.chain(head, items)
            head = head if star else [(x,) for x in head]
        run = InlineRun(fn, items, estimate, star)
        prefix: list[Any] = []
        measured_now = estimate.per_item_s is None
        sampler = GilSampler() if gil_check else None
        try:
            if sampler is not None:
                sampler.start()
            if measured_now or sampler is not None:
                prefix = run.batch(PROBE_S, PROBE_MAX_ITEMS)
            if sampler is not None and self._worth_watching(run, estimate, backend, remaining):
                # Watch long enough to tell.
                while sampler.elapsed_s() < GIL_PROBE_S and len(prefix) < PROBE_MAX_ITEMS:
                    prefix += run.batch(
                        GIL_PROBE_S - sampler.elapsed_s(), PROBE_MAX_ITEMS - len(prefix)
                    )
                    if run.error is not None or run.exhausted:
                        break
                sampler.items = run.items
                measured = sampler.stop()
                if run.error is None:
                    decision = self._measured(fn, decision, measured)
                    with self._lock:
                        _check_open(self)
                        backend = self._backend(decision.backend)
        finally:
            if sampler is not None:
                sampler.stop()
        # Pickling holds the GIL: measured only once the sampler has stopped.
        if measured_now and pickled and prefix and run.error is None:
            measure_pickling(estimate, head[: len(prefix)], prefix[:PICKLE_SAMPLE])
        del head

        def rest() -> Iterator[tuple[Any, ...]]:
            return run.inputs if star else zip(run.inputs)

        def left() -> int | None:
            return None if remaining is None else remaining - run.items

        def verdict() -> Verdict:
            return inline_verdict(
                per_item_s=estimate.per_item_s or 0.0,
                pickle_parent_s=0.0 if backend.shares_memory else estimate.pickle_parent_s,
                pickle_worker_s=0.0 if backend.shares_memory else estimate.pickle_parent_s,
                remaining=left(),
                n_workers=backend.max_workers,
                startup_s=(
                    0.0
                    if backend.name in self._started
                    else backend.worker_startup_s * backend.max_workers
                ),
                overhead_s=backend.chunk_overhead_s,
            )

        if run.error is not None:
            return then_raise(prefix, run.error)
        if run.exhausted:
            self._note(
                decision,
                estimate,
                "inline",
                (
                    f"the whole input ({run.items} items) ran in this thread while measuring "
                    f"it: {run.elapsed_s * 1000:.1f} ms, "
                    f"{run.elapsed_s / max(run.items, 1) * 1e6:.2f} us per item",
                ),
            )
            return drain(prefix)
        first = verdict()
        if not first.inline:
            stream = open_stream(rest(), left())
            self._note(decision, estimate, decision.backend, (first.reason,), stream)
            return stream_values(prefix, stream)
        self._note(decision, estimate, "inline", (first.reason,))

        def switch(reason: str) -> ChunkStream:
            stream = open_stream(rest(), left())
            self._note(
                decision,
                estimate,
                decision.backend,
                (f"after {run.items} items inline: {reason}",),
                stream,
            )
            return stream

        if measured_now and remaining is not None and (estimate.per_item_s or 0.0) < TINY_ITEM_S:
            # Sub-microsecond items of a sized input, just measured: the rest
            # runs as one C-level map, with no re-checks. Should the items turn
            # slow, the map costs what a plain loop costs (never more); the
            # batches below would cost 15-25 ns per item more on every tiny map.
            # (An estimate from an older map is re-checked: it may be stale.)
            rest_items = run.inputs
            return itertools.chain(
                drain(prefix),
                (itertools.starmap if star else map)(fn, rest_items),
            )
        return itertools.chain.from_iterable(inline_batches(prefix, run, left, verdict, switch))

    def _worth_watching(
        self, run: InlineRun, estimate: Estimate, backend: Backend, remaining: int | None
    ) -> bool:
        """Whether the first items of a map are worth a GIL measurement.

        Not when the probe ended the map (an error, the end of the input) or
        when the items are so small that the map will run inline anyway.
        """
        if run.error is not None or run.exhausted:
            return False
        left = None if remaining is None else remaining - run.items
        return not inline_verdict(
            per_item_s=estimate.per_item_s or 0.0,
            pickle_parent_s=0.0,
            pickle_worker_s=0.0,
            remaining=left,
            n_workers=backend.max_workers,
            startup_s=0.0,
            overhead_s=backend.chunk_overhead_s,
        ).inline

    def _measured(self, fn: Callable[..., Any], decision: Decision, gil: GilProfile) -> Decision:
        """Decide again for ``fn`` with a GIL measurement; cache and log the result."""
        assert decision.profile is not None
        new = decide(decision.profile, self._platform, self._options, gil)
        remember(fn, gil)
        key = identity_key(fn)
        with self._lock:
            cached = self._decisions.get(key)
            if cached is not None and cached[0].matches(fn):
                self._decisions[key] = (cached[0], new, cached[2])
            self._log.append(new)
        return new

    def _open_stream(
        self,
        fn: Callable[..., Any],
        decision: Decision,
        estimate: Estimate,
        backend: Backend,
        inputs: Iterator[tuple[Any, ...]],
        remaining: int | None,
        chunksize: int | None,
        buffersize: int | None,
        end_time: float | None,
    ) -> ChunkStream:
        """Start sending ``inputs`` to ``backend`` in chunks; the first window goes now."""
        with self._lock:
            _check_open(self)
            target = backend.prepare(fn, decision.share)
            self._started.add(backend.name)

            def send(calls: list[Call], budget_s: float | None) -> Future[ChunkResult]:
                return backend.submit_chunk(target, calls, budget_s)

            def explain_error(exc: BaseException, calls: list[Call]) -> BaseException:
                if is_pickling_failure(exc):
                    return pickling_error(fn, calls, exc, backend.name)
                return exc

            return ChunkStream(
                send=send,
                calls=((args, {}) for args in inputs),
                remaining=remaining,
                n_workers=backend.max_workers,
                overhead_s=backend.chunk_overhead_s,
                estimate=None if chunksize is not None else estimate,
                fixed_chunksize=chunksize,
                buffersize=buffersize or default_buffersize(backend.max_workers),
                end_time=end_time,
                on_chunk_error=explain_error,
                in_process=backend.shares_memory,
            )

    map.__doc__ = (
        (Executor.map.__doc__ or "")
        + """
        smartexec adds:

        * the input is read lazily and at most ``buffersize`` chunks are in
          flight (default ``2 * workers + 2``), so ``map`` over an endless
          generator streams in flat memory (``buffersize`` as in Python
          3.14's ``Executor.map``, counted in chunks);
        * with no ``chunksize``, chunks are sized from per-item time measured
          in the workers, re-tuned as chunks finish; workers stop a chunk that
          runs far past its expected time and the rest is re-chunked;
        * when the executor chose the backend (no ``backend=``), no
          ``chunksize`` and no ``timeout`` are given, the first items run in
          the calling thread for about 10 ms to measure them (their results
          are kept, and their side effects happen in this process); if a
          plain loop is predicted to be at least as fast, the whole map runs
          inline (see :meth:`decisions` for the figures). Callables shared
          with fork workers by copy-on-write never run in the calling thread;
        * each item's exception is raised at its own position, after the
          results of the items before it, even within a chunk; closing the
          iterator early cancels every chunk not yet started.
        """
    )

    def _note(
        self,
        decision: Decision,
        estimate: Estimate,
        backend: str,
        reasons: tuple[str, ...],
        stream: ChunkStream | None = None,
    ) -> None:
        """Log what a map did, with its measured figures, before the policy's reasons."""
        size = stream.sizes[0] if stream is not None and stream.sizes else None
        done = dataclasses.replace(
            decision,
            backend=backend,
            reasons=(*reasons, *decision.reasons),
            share=decision.share and backend == decision.backend,
            chunksize=size,
            measure=False,
        )
        estimate.last_map = done
        self._log.append(done)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            backends = list(self._backends.values())
        for backend in backends:
            backend.shutdown(wait=wait, cancel_futures=cancel_futures)

    shutdown.__doc__ = (
        (Executor.shutdown.__doc__ or "")
        + """
        smartexec adds: every backend this executor started is shut down;
        no worker process outlives a ``shutdown(wait=True)``. Idempotent.
        """
    )

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "running"
        started = ", ".join(sorted(self._started)) or "none yet"
        return f"<SmartExecutor {state}; backends started: {started}>"
