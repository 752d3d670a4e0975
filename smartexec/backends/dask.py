"""The dask backend: chunks run on a Dask cluster, on this machine or on many.

Never chosen by the policy, only when named: a cluster is something the user
sets up (and pays for). ``SmartExecutor(backend="dask")`` starts a
``distributed.LocalCluster`` that the executor owns and closes at shutdown;
``SmartExecutor(backend="dask", address="tcp://10.0.0.5:8786")`` connects to a
running scheduler and, at shutdown, disconnects and leaves the cluster running.

Data flow (Dask does the scheduling, transfers and worker management)::

    submit_chunk(target, chunk)  -- in the submitting thread
      |  big argument?  client.scatter(): to one worker; seen before: broadcast, kept
      |  payload = dumps((fn or None, calls, budget_s))      smartexec's pickler
      v
    ClientExecutor.submit(smartexec_chunk, scattered fn | None, payload, *scattered args)
      |                                   | Dask: scheduler -> one worker thread
      |                                   v
      |                         smartexec_chunk: loads, run_chunk, dumps_reply -> bytes
      v
    cf.Future[bytes] --loads_reply--> cf.Future[ChunkResult]   (what the executor waits on)

* Chunks are pickled here, in the submitting thread, with the same pickler as
  the fork backend (cloudpickle): a callable or argument that cannot be
  pickled raises from ``submit``/``map`` itself, naming the part. The worker
  pickles its own reply, so a result that cannot be pickled fails only its
  item, and an exception travels with its traceback text.
* A callable whose state (bound ``__self__``, closure cells, partial
  arguments) pickles to more than :data:`SCATTER_BYTES` is scattered to every
  worker once and then referred to by key: a chunk carries a few bytes, not
  the object. A big argument (anything with an ``nbytes`` over
  :data:`SCATTER_BYTES`, e.g. a numpy array) is scattered too: to one worker,
  for its chunk only, the first time the object is seen; to every worker,
  kept for later chunks, from the second time on. So a repeated argument
  travels about once per worker, and a one-off item is never pinned on the
  cluster after its chunk is done.
* What was scattered is found again by identity and held weakly, as the fork
  backend holds its shared callables: when the user's object dies, its key is
  released and the cluster frees the data. Workers keep the copy sent first:
  after changing the object in place, call ``SmartExecutor.refresh(obj)``.
* Workers need smartexec, and whatever the callable imports, installed.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

try:
    import dask
    import distributed as dask_distributed  # not "distributed": a capability's name
except ImportError as exc:  # the registry adds the install hint
    raise ImportError(f"dask[distributed] is not installed ({exc})") from exc

from .._diagnose import pickling_error
from .._identity import WeakCallable, identity_key
from .._remote import Call, ChunkResult, dumps, loads, run_chunk
from .._threads import own_thread
from ..inspection import callable_name, format_bytes, inspect_callable
from ..policy import BIG_STATE_BYTES
from ..transport import dumps_reply, read_reply
from ._base import Backend

__all__ = ["DaskBackend", "smartexec_chunk", "SCATTER_BYTES"]

#: A callable's state, or an argument, bigger than this is scattered to the
#: workers once instead of being sent with every chunk: the policy's threshold
#: for sharing state with fork workers (1 MiB), for the same reason.
SCATTER_BYTES = BIG_STATE_BYTES

#: The scheduler policy that drops "extra" copies of data every 2 s: it would
#: undo ``scatter(broadcast=True)`` between two maps (Dask's docs say to disable
#: it when broadcasting). Left out of the LocalCluster this backend starts.
_REDUCE_REPLICAS = "distributed.active_memory_manager.ReduceReplicas"


class _Arg:
    """Stands in a chunk's payload for a scattered argument: the index of its key."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return _Arg, (self.index,)


def smartexec_chunk(fn: Any, payload: bytes, *scattered: Any) -> bytes:
    """Run one chunk on a Dask worker; return the pickled reply.

    Module-level so that workers import it by name (it is what the dashboard
    shows as the task's name).

    Args:
        fn: the callable, when it was scattered (Dask passes the worker's
            copy); None when it travels in ``payload``.
        payload: ``dumps((fn or None, calls, budget_s))`` made by
            :meth:`DaskBackend.submit_chunk`; top-level arguments that were
            scattered appear in ``calls`` as ``_Arg(i)``.
        *scattered: the worker's copies of the scattered arguments.

    Returns:
        :func:`smartexec.transport.dumps_reply` bytes: the chunk's outcomes,
        or the error that kept it from running (e.g. a module the worker
        cannot import).
    """
    try:
        target, calls, budget_s = loads(payload)
        if target is None:
            target = fn
        if scattered:
            calls = [_resolve(call, scattered) for call in calls]
    except BaseException as exc:
        return dumps_reply(None, exc)
    del payload, fn
    return dumps_reply(run_chunk(target, calls, True, budget_s))


def _resolve(call: Call, scattered: Sequence[Any]) -> Call:
    args, kwargs = call
    args = tuple(scattered[a.index] if type(a) is _Arg else a for a in args)
    kwargs = {k: scattered[v.index] if type(v) is _Arg else v for k, v in kwargs.items()}
    return args, kwargs


def _buffer_nbytes(obj: Any) -> int:
    """Bytes of a buffer-like argument (numpy array, memoryview, ...); 0 otherwise.

    Reads ``nbytes`` only: sizing every argument of every item by pickling
    would cost more than it saves.
    """
    nbytes = getattr(obj, "nbytes", 0)
    return nbytes if type(nbytes) is int else 0


class _Prepared:
    """What :meth:`DaskBackend.prepare` returns for a callable it scattered."""

    __slots__ = ("future", "fn")

    def __init__(self, future: Any, fn: Any):
        self.future = future  # distributed.Future of the callable, on the cluster
        self.fn = fn  # for error messages; held only while a map or submit runs


class _Kept:
    """A weakly held user object and, once scattered, its key on the cluster."""

    __slots__ = ("handle", "future", "size")

    def __init__(self, handle: WeakCallable | weakref.ref[Any], future: Any, size: str):
        self.handle = handle
        self.future = future  # distributed.Future, or None: seen, not scattered
        self.size = size  # for people, e.g. "100.0 MiB"


class DaskBackend(Backend):
    """Runs chunks as tasks on a Dask cluster (``dask.distributed``).

    Created by ``SmartExecutor(backend="dask", **options)``, never by the
    policy. Connecting (and starting a LocalCluster) happens here, so errors
    come from the executor's constructor. Dask does the scheduling, data
    transfer, worker restarts and retries; this class turns chunks into Dask
    tasks and their replies back into results (see the module docstring).

    Args:
        max_workers: with no ``address``, the number of worker processes of
            the LocalCluster to start (one thread each); None means one per
            usable CPU. With an ``address``, how many chunks the cluster runs
            at once, for chunk sizing only (the cluster keeps its size); None
            means the cluster's worker threads when connecting.
        cpu_count: CPUs this process may use, for the default.
        address: the scheduler to connect to, e.g. ``"tcp://10.0.0.5:8786"``
            (as printed by ``dask scheduler``), or a ``distributed`` cluster
            object; None starts a LocalCluster that this backend owns.
        cluster_options: keyword arguments for ``distributed.LocalCluster``
            when no ``address`` is given, over this backend's defaults
            (``n_workers=max_workers``, ``threads_per_worker=1``,
            ``processes=True``, ``dashboard_address=None``), e.g.
            ``{"memory_limit": "2GiB", "dashboard_address": ":8787"}``.
        connect_timeout_s: seconds to wait for the scheduler to answer; None
            means Dask's ``distributed.comm.timeouts.connect`` (30 s).

    Raises:
        TypeError: ``address`` is neither a string nor a cluster object, or
            ``cluster_options`` is not a mapping.
        ValueError: ``cluster_options`` given with ``address`` (that cluster
            is configured where it was started), or ``n_workers`` given both
            as ``max_workers`` and in ``cluster_options``.
        ConnectionError: the scheduler at ``address`` did not answer within
            ``connect_timeout_s`` (an ``OSError``, chained from Dask's).

    Attributes:
        address: the scheduler's address, e.g. ``"tcp://10.0.0.5:8786"``.
        owns_cluster: True when this backend started the LocalCluster and
            :meth:`shutdown` closes it; False for a cluster reached through
            ``address``, which is never closed.
    """

    name = "dask"
    pickles_closures = True
    distributed = True
    #: The cluster starts with the backend (when the executor is created), so a
    #: map pays nothing more to start it.
    worker_startup_s = 0.0
    #: Source: benchmarks/bench_overheads.py, LocalCluster of 2 worker
    #: processes with the scheduler in this process: 2.7-3.8 ms per one-item
    #: chunk with 1000 in flight, 4-11 ms for one alone (2-core machine, under
    #: other load, 2026-12). Scheduler, two network hops and pickling; on a
    #: real cluster the scheduler has its own machine and the hops are longer.
    chunk_overhead_s = 3e-3

    def __init__(
        self,
        max_workers: int | None,
        cpu_count: int,
        *,
        address: str | Any | None = None,
        cluster_options: Mapping[str, Any] | None = None,
        connect_timeout_s: float | None = None,
    ):
        super().__init__(max_workers, cpu_count)
        if address is not None and not (
            isinstance(address, str) or hasattr(address, "scheduler_address")
        ):
            raise TypeError(
                f"address must be a scheduler address such as 'tcp://10.0.0.5:8786' or a "
                f"distributed cluster object, got {address!r} ({type(address).__qualname__})"
            )
        if cluster_options is not None and not isinstance(cluster_options, Mapping):
            raise TypeError(
                f"cluster_options must be a dict of distributed.LocalCluster arguments, got "
                f"{cluster_options!r} ({type(cluster_options).__qualname__})"
            )
        if address is not None and cluster_options:
            raise ValueError(
                f"cluster_options apply only to the LocalCluster this backend starts when no "
                f"address is given; the cluster at {address!r} is configured where it was "
                f"started (dask scheduler / dask worker options). Pass one or the other"
            )
        if max_workers is not None and cluster_options and "n_workers" in cluster_options:
            raise ValueError(
                f"n_workers is given twice: max_workers={max_workers} and "
                f"cluster_options={{'n_workers': {cluster_options['n_workers']!r}}}; pass one"
            )
        # _lock guards the tables of scattered objects and may be held while
        # scattering (which waits for the client's event loop); _pending_lock
        # is taken on that loop, so it is never held while waiting.
        self._lock = threading.RLock()
        self._pending_lock = threading.Lock()
        self._closed = False
        self._close_lock = threading.Lock()
        self._callables: dict[Hashable, _Kept] = {}
        self._arguments: dict[Hashable, _Kept] = {}
        #: outer future (what the executor sees) -> Dask's concurrent future
        self._pending: dict[cf.Future[ChunkResult], cf.Future[bytes]] = {}
        self._cluster: Any = None
        if address is None:
            self._cluster = self._start_cluster(self.max_workers, cluster_options or {})
        try:
            self._client = self._connect(
                self._cluster if address is None else address, connect_timeout_s
            )
            self.address: str = self._client.scheduler.address
            self.owns_cluster = self._cluster is not None
            if max_workers is None or address is None:
                self.max_workers = max(1, sum(self._client.nthreads().values()))
            self._pool = self._client.get_executor(pure=False)
        except BaseException:
            client = getattr(self, "_client", None)
            if client is not None:
                client.close()
            self._close_cluster()
            raise

    @staticmethod
    def _connect(target: Any, timeout_s: float | None) -> Any:
        try:
            return dask_distributed.Client(
                target,
                set_as_default=False,  # never become the user's default Dask client
                **({} if timeout_s is None else {"timeout": timeout_s}),
            )
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach the Dask scheduler at {target!r}: {exc}. Check that "
                f"`dask scheduler` runs there and that this machine can reach its port "
                f"(docs/distributed.md), or leave out address= to start a LocalCluster "
                f"on this machine"
            ) from exc

    @staticmethod
    def _start_cluster(n_workers: int, options: Mapping[str, Any]) -> Any:
        settings = {
            "n_workers": n_workers,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
            **options,
        }
        policies = dask.config.get("distributed.scheduler.active-memory-manager.policies", [])
        kept = [p for p in policies if p.get("class") != _REDUCE_REPLICAS]
        # The scheduler reads its policies from the config when it starts.
        with dask.config.set({"distributed.scheduler.active-memory-manager.policies": kept}):
            return dask_distributed.LocalCluster(**settings)

    # -- where things run ------------------------------------------------------

    def describe(self, fn: Callable[..., Any]) -> tuple[str, ...]:
        if self._closed:
            return (f"the Dask cluster at {self.address} is no longer in use (shut down)",)
        nthreads = self._client.nthreads()
        whose = (
            "a LocalCluster this executor started; shutdown() closes it"
            if self.owns_cluster
            else "a cluster this executor did not start; shutdown() disconnects and "
            "leaves it running"
        )
        notes = [
            f"chunks run on the Dask cluster at {self.address}: {len(nthreads)} workers, "
            f"{sum(nthreads.values())} threads ({whose})"
        ]
        kept = self._kept_callable(fn)
        if kept is not None and kept.future is not None:
            notes.append(
                f"its state ({kept.size}) is already on every worker "
                f"(scattered once, key {kept.future.key!r})"
            )
        else:
            profile = inspect_callable(fn, cap_bytes=SCATTER_BYTES)
            if profile.state.error is None and self._big(profile.state):
                notes.append(
                    f"{profile.state_holder} ({profile.state}) will be scattered to every "
                    f"worker once and reused while it lives, not sent with each chunk"
                )
        return tuple(notes)

    @staticmethod
    def _big(state: Any) -> bool:
        return bool(state.capped or state.nbytes > SCATTER_BYTES)

    # -- sending callables and arguments once ----------------------------------

    def _kept_callable(self, fn: Any) -> _Kept | None:
        with self._lock:
            kept = self._callables.get(identity_key(fn))
        if kept is not None and isinstance(kept.handle, WeakCallable) and kept.handle.matches(fn):
            return kept
        return None

    def _scatter(self, obj: Any, broadcast: bool) -> Any:
        """Send ``obj`` to the cluster now; return its ``distributed.Future``.

        ``broadcast`` puts a copy on every worker (what many chunks will
        read); otherwise one worker gets it. Dask serialises it (numpy
        buffers without a copy); the key is random (``hash=False``), so
        nothing of ``obj`` is hashed here.
        """
        # A one-element list: scatter() would spread a list's or dict's items.
        [future] = self._client.scatter([obj], broadcast=broadcast, hash=False)
        return future

    def prepare(self, fn: Any, share: bool) -> Any:
        """Scatter ``fn`` once when its state is big; see :meth:`Backend.prepare`.

        ``share`` is ignored: the size of ``fn``'s state decides.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            kept = self._kept_callable(fn)
            if kept is None:
                state = inspect_callable(fn, cap_bytes=SCATTER_BYTES).state
                future = None
                if state.error is None and self._big(state):
                    future = self._scatter(fn, broadcast=True)
                key = identity_key(fn)
                callables = self._callables  # the weakref callback must not hold self
                handle = WeakCallable(fn, lambda: _forget(callables, key))
                kept = _Kept(handle, future, str(state))
                if handle.weak:
                    callables[key] = kept
        return fn if kept.future is None else _Prepared(kept.future, fn)

    def refresh(self, fn: Any) -> bool:
        """Drop the scattered copy of ``fn`` (a callable or a big argument).

        The next chunk that uses it sends its current state. Returns True when
        a copy was dropped.
        """
        key = identity_key(fn)
        with self._lock:
            dropped = [table.pop(key, None) for table in (self._callables, self._arguments)]
        return any(kept is not None and kept.future is not None for kept in dropped)

    def _share_arguments(self, chunk: Sequence[Call]) -> tuple[list[Call], list[Any]]:
        """Replace big top-level arguments by ``_Arg`` stand-ins for keys on the cluster.

        Big arguments never travel inside the chunk's payload, which Dask
        would route through the scheduler (and warn about past 10 MB).

        Returns the calls to pickle and the futures their stand-ins index.
        """
        futures: list[Any] = []
        index: dict[int, int] = {}  # id(argument) -> position in futures

        def stand_in(value: Any) -> Any:
            nbytes = _buffer_nbytes(value)
            if nbytes <= SCATTER_BYTES:
                return value
            position = index.get(id(value))
            if position is None:
                future = self._argument_future(value, nbytes)
                position = index[id(value)] = len(futures)
                futures.append(future)
            return _Arg(position)

        calls = []
        for args, kwargs in chunk:
            calls.append(
                (
                    tuple(stand_in(a) for a in args),
                    {k: stand_in(v) for k, v in kwargs.items()} if kwargs else kwargs,
                )
            )
        return (calls, futures) if futures else (list(chunk), [])

    def _argument_future(self, value: Any, nbytes: int) -> Any:
        """A key on the cluster for a big argument, scattered now or before.

        The first time an object is seen it is scattered to one worker, and
        only the chunk refers to it: the cluster frees it once that chunk is
        done. Seen again, it is broadcast to every worker and kept (weakly, as
        callables are) for every later chunk.
        """
        key = identity_key(value)
        with self._lock:
            kept = self._arguments.get(key)
            if kept is not None and kept.handle() is value:  # type: ignore[operator]
                if kept.future is None:
                    kept.future = self._scatter(value, broadcast=True)
                return kept.future
            arguments = self._arguments
            try:
                handle = weakref.ref(value, lambda _: _forget(arguments, key))
            except TypeError:
                pass  # cannot be held weakly: scattered with each chunk
            else:
                arguments[key] = _Kept(handle, None, format_bytes(nbytes))
        return self._scatter(value, broadcast=False)

    # -- the Backend contract ----------------------------------------------------

    def submit_chunk(
        self, fn: Any, chunk: Sequence[Call], budget_s: float | None = None
    ) -> cf.Future[ChunkResult]:
        if isinstance(fn, _Prepared):
            scattered_fn, target, user_fn = fn.future, None, fn.fn
        else:
            scattered_fn, target, user_fn = None, fn, fn
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        calls, arguments = self._share_arguments(chunk)
        try:
            payload = dumps((target, calls, budget_s))
        except Exception as exc:
            raise pickling_error(user_fn, chunk, exc, self.name) from exc
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        # Not under a lock: submitting may wait for the client's event loop.
        inner = self._pool.submit(smartexec_chunk, scattered_fn, payload, *arguments)
        outer: cf.Future[ChunkResult] = cf.Future()
        with self._pending_lock:
            self._pending[outer] = inner
        name = callable_name(user_fn)
        # outer refers to inner weakly: once the result is transferred, nothing
        # holds Dask's future, so the cluster frees the chunk's reply at once.
        inner_ref = weakref.ref(inner)
        outer.add_done_callback(lambda f: _cancel(inner_ref) if f.cancelled() else None)
        inner.add_done_callback(lambda f: self._transfer(f, outer, name))
        return outer

    def _transfer(self, inner: cf.Future[bytes], outer: cf.Future[ChunkResult], name: str) -> None:
        """Complete ``outer`` from Dask's future.

        Runs on the client's event loop thread (or in ``submit_chunk`` when
        the task was already done), so it never takes ``self._lock``, which
        is held across calls that wait for that loop (``scatter``).
        """
        with self._pending_lock:
            self._pending.pop(outer, None)
        if inner.cancelled():
            outer.cancel()
        if not outer.set_running_or_notify_cancel():
            return  # cancelled; wait() and as_completed() are notified
        error = inner.exception()
        if error is not None:
            outer.set_exception(error)
            return
        ok, value = read_reply(inner.result(), name, "dask")
        if ok:
            outer.set_result(value)
        else:
            outer.set_exception(value)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """See :meth:`Backend.shutdown`.

        Chunks already running on a worker cannot be interrupted: with
        ``cancel_futures`` their futures are cancelled and their results
        dropped. Then the client disconnects and, when this backend started
        the LocalCluster, the cluster is closed (its worker processes are
        gone when ``shutdown(wait=True)`` returns). A cluster reached through
        ``address`` is left running.
        """
        self._closed = True
        with self._pending_lock:
            pending = dict(self._pending)
        if cancel_futures:
            for outer in pending:
                outer.cancel()
        if wait:
            cf.wait(list(pending))
            self._close()
        else:
            # As concurrent.futures does: the program does not exit before
            # pending chunks finish; the cluster closes after them.

            def close_after_pending() -> None:
                cf.wait(list(pending))
                self._close()

            own_thread(close_after_pending, "smartexec-dask-shutdown", daemon=False).start()

    def _close(self) -> None:
        with self._close_lock:
            with self._lock:
                self._callables.clear()
                self._arguments.clear()
            if self._client.status not in ("closing", "closed"):
                self._client.close()
            self._close_cluster()
            with self._pending_lock:
                stranded = list(self._pending.values())
            for inner in stranded:  # can no longer complete: fail them as cancelled
                inner.cancel()

    def _close_cluster(self) -> None:
        if self._cluster is not None and self._cluster.status.name not in ("closing", "closed"):
            self._cluster.close()

    def __repr__(self) -> str:
        whose = "owned LocalCluster" if self.owns_cluster else "connected"
        return f"<DaskBackend {self.address} ({whose}), max_workers={self.max_workers}>"


def _cancel(ref: weakref.ref[cf.Future[bytes]]) -> None:
    future = ref()
    if future is not None:
        future.cancel()


def _forget(table: dict[Hashable, _Kept], key: Hashable) -> None:
    """Weakref callback: the user's object died; release its copy on the cluster."""
    table.pop(key, None)
