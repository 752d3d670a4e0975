"""CPython's own ``concurrent.futures`` executor tests, run against SmartExecutor.

Nothing here re-implements those tests: the test mixins are imported from the
interpreter's ``test.test_concurrent_futures`` (a package with one module per
topic in recent releases, e.g. 3.13; a single module in older ones, e.g. 3.10)
and combined with a mixin that builds a :class:`~smartexec.SmartExecutor`
instead of a stdlib pool, exactly as CPython combines them with
``ThreadPoolMixin`` and ``ProcessPool*Mixin``.

Each generic mixin runs under the default routing (``backend=None``) and with
the route forced to each backend in :data:`PLAN`. A few tests of the stdlib's
pool-specific classes check executor-agnostic behaviour and are borrowed
(:data:`BORROWED`); everything else in those classes inspects stdlib internals
or stdlib-only features and is listed in :data:`EXCLUDED` with the reason (and
in :data:`EXCLUDED_ON_ROUTE` when only one route leaves it out).
``ExecutorDeadlockTest`` (workers that crash or exit, tasks and results that
fail to pickle or unpickle) runs on every process route; ``FutureTests`` runs
once, against the class ``submit`` returns (:func:`_future_tests`).

Many Python builds (several distributions, some pyenv builds) leave the
``test`` package out; this module is then skipped.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import types
import unittest.mock
import weakref
from concurrent.futures import process as _stdlib_process

import pytest

from smartexec import SmartExecutor
from smartexec.errors import RemoteTraceback

pytestmark = pytest.mark.timeout(120)

_cf = pytest.importorskip(
    "test.test_concurrent_futures",
    reason="this Python does not ship CPython's test suite "
    "(test.test_concurrent_futures is missing)",
)


def _stdlib_tests() -> types.SimpleNamespace:
    """The stdlib test classes we use, whichever layout this Python has."""
    if hasattr(_cf, "__path__"):  # a package, one module per topic (e.g. 3.13)

        def module(name: str) -> types.ModuleType:
            return importlib.import_module(f"{_cf.__name__}.{name}")

        util, shutdown = module("util"), module("test_shutdown")
        wait, init = module("test_wait"), module("test_init")
        return types.SimpleNamespace(
            InitializerMixin=init.InitializerMixin,
            FailingInitializerMixin=init.FailingInitializerMixin,
            ExecutorDeadlockTest=module("test_deadlock").ExecutorDeadlockTest,
            FutureTests=module("test_future").FutureTests,
            ExecutorMixin=util.ExecutorMixin,
            BaseTestCase=util.BaseTestCase,
            ExecutorTest=module("executor").ExecutorTest,
            WaitTests=wait.WaitTests,
            ThreadPoolWaitTests=wait.ThreadPoolWaitTests,
            AsCompletedTests=module("test_as_completed").AsCompletedTests,
            ExecutorShutdownTest=shutdown.ExecutorShutdownTest,
            ThreadPoolExecutorTest=module("test_thread_pool").ThreadPoolExecutorTest,
            ProcessPoolExecutorTest=module("test_process_pool").ProcessPoolExecutorTest,
            sleep_and_print_module=shutdown.__name__,
        )
    return types.SimpleNamespace(  # a single module (e.g. 3.10)
        InitializerMixin=_cf.InitializerMixin,
        FailingInitializerMixin=_cf.FailingInitializerMixin,
        ExecutorDeadlockTest=_cf.ExecutorDeadlockTest,
        FutureTests=_cf.FutureTests,
        ExecutorMixin=_cf.ExecutorMixin,
        BaseTestCase=_cf.BaseTestCase,
        ExecutorTest=_cf.ExecutorTest,
        WaitTests=_cf.WaitTests,
        ThreadPoolWaitTests=_cf.ThreadPoolWaitTests,
        AsCompletedTests=_cf.AsCompletedTests,
        ExecutorShutdownTest=_cf.ExecutorShutdownTest,
        ThreadPoolExecutorTest=_cf.ThreadPoolExecutorTest,
        ProcessPoolExecutorTest=_cf.ProcessPoolExecutorTest,
        sleep_and_print_module=_cf.__name__,
    )


_std = _stdlib_tests()
_support = importlib.import_module("test.support")

#: Seconds the stdlib tests may wait for something that should be immediate.
STALE_WAIT_S = 5.0
#: Seconds a child interpreter of the shutdown scenarios may run (they take ~2 s).
CHILD_TIMEOUT_S = 20.0
#: Seconds the adapted del/shutdown(wait=False) tests wait for the executor's
#: threads to end (CPython joins them with no bound; this one only turns a
#: hang into a failure): loky's manager thread ends once its workers have,
#: and five fresh interpreters take seconds to start on a busy 2-core machine.
THREADS_END_S = 60.0
#: Seconds the deadlock tests wait for a result before calling it a deadlock
#: (CPython's support.LONG_TIMEOUT, 5 minutes, is past this module's timeout).
DEADLOCK_WAIT_S = 60.0

#: Generic stdlib mixins run on each route, chosen to keep this module near two
#: minutes on two cores (WaitTests alone sleeps ~15 s per route). None is
#: SmartExecutor's own routing: time.sleep goes to threads and importable
#: functions (mul, divmod, pow) to fork, so the default WaitTests already wait on
#: thread futures and fork futures together; "thread" skips WaitTests. loky
#: starts fresh interpreters (about a second per executor, and every test builds
#: a new executor), so it runs the two mixins that exercise the executor itself
#: rather than the futures it returns. The initializer mixins (test_init.py)
#: run on every route: an initializer runs in every kind of worker.
#: The deadlock tests (workers that crash, exit, or fail to pickle or unpickle
#: a task or result) run on every process route; the thread route pickles
#: nothing and has no worker process to lose.
_INIT = ("InitializerMixin", "FailingInitializerMixin")
PLAN: dict[str | None, tuple[str, ...]] = {
    None: (
        "ExecutorTest",
        "WaitTests",
        "AsCompletedTests",
        "ExecutorShutdownTest",
        "ExecutorDeadlockTest",
        *_INIT,
    ),
    "thread": ("ExecutorTest", "AsCompletedTests", "ExecutorShutdownTest", *_INIT),
    "fork": (
        "ExecutorTest",
        "WaitTests",
        "AsCompletedTests",
        "ExecutorShutdownTest",
        "ExecutorDeadlockTest",
        *_INIT,
    ),
    "loky": ("ExecutorTest", "ExecutorShutdownTest", "ExecutorDeadlockTest", *_INIT),
}

_PROCESS_ROUTES = frozenset({None, "fork", "loky"})

#: The ``ctx`` (start method) of FailingInitializerMixin on the process routes.
#: With one, the stdlib test does what it does for ProcessPoolExecutor: its
#: initializer sends the worker's ``concurrent.futures`` logging to a queue of
#: that context, and the test reads the worker's own record of the failure
#: there. Without (the thread route) it listens in this process, as for
#: ThreadPoolExecutor. loky's workers are fresh interpreters: a fork
#: context's queue cannot reach them, a spawn context's can (and
#: ``mp_context="spawn"`` keeps the default route on loky).
WORKER_LOG_CONTEXT: dict[str | None, str] = {None: "fork", "fork": "fork", "loky": "spawn"}
_ALL_ROUTES = frozenset(PLAN)

#: Tests of the stdlib's pool-specific classes that check behaviour any
#: executor must have: name -> (class holding it, mixin it joins, routes).
#: Routes are restricted where the test itself needs threads (it mutates the
#: test's own objects from the callable) or processes (it checks what happens
#: in a worker process).
BORROWED: dict[str, tuple[str, str, frozenset[str | None]]] = {
    # map(chunksize=...) gives the same results; chunksize < 1 is a ValueError.
    "test_map_chunksize": ("ProcessPoolExecutorTest", "ExecutorTest", _ALL_ROUTES),
    # a worker drops a call's arguments once it has run (needs a process).
    "test_ressources_gced_in_workers": (
        "ProcessPoolExecutorTest",
        "ExecutorTest",
        _PROCESS_ROUTES,
    ),
    # a worker's traceback text reaches the parent as __cause__ (needs a process;
    # run with smartexec's RemoteTraceback standing in for the stdlib-private class).
    "test_traceback": ("ProcessPoolExecutorTest", "ExecutorTest", _PROCESS_ROUTES),
    # map() submits everything before the first next() (the callable appends
    # to a list in the test: threads only; default routing sends closures to loky).
    "test_map_submits_without_iteration": (
        "ThreadPoolExecutorTest",
        "ExecutorTest",
        frozenset({"thread"}),
    ),
    # a map() that times out cancels the items not started (same list: threads only).
    "test_executor_map_current_future_cancel": (
        "ThreadPoolExecutorTest",
        "ExecutorTest",
        frozenset({"thread"}),
    ),
    # wait() on 100 futures released at once (the callable waits on the test's
    # threading.Event: threads only; on fork the worker's copy is never set).
    # It joins ExecutorTest because "thread" does not run WaitTests (see PLAN).
    "test_pending_calls_race": ("ThreadPoolWaitTests", "ExecutorTest", frozenset({"thread"})),
}

#: Tests of the stdlib's concurrent.futures suite not run here, and why.
EXCLUDED: dict[str, str] = {
    # ThreadPoolExecutorTest (test_thread_pool.py)
    "ThreadPoolExecutorTest.test_default_workers": "reads executor._max_workers",
    "ThreadPoolExecutorTest.test_saturation": "counts executor._threads",
    "ThreadPoolExecutorTest.test_idle_thread_reuse": "counts executor._threads",
    "ThreadPoolExecutorTest.test_hang_global_shutdown_lock": "drives stdlib ThreadPoolExecutor/ProcessPoolExecutor directly (bpo-45021 lock)",
    # ProcessPoolExecutorTest (test_process_pool.py)
    "ProcessPoolExecutorTest.test_max_workers_too_large": "Windows-only ProcessPoolExecutor limit",
    "ProcessPoolExecutorTest.test_killed_child": "kills a worker found in executor._processes; expects the whole pool broken",
    "ProcessPoolExecutorTest.test_saturation": "counts executor._processes",
    "ProcessPoolExecutorTest.test_idle_process_reuse_one": "counts executor._processes",
    "ProcessPoolExecutorTest.test_idle_process_reuse_multiple": "counts executor._processes",
    "ProcessPoolExecutorTest.test_max_tasks_per_child": "expects the fork start method to refuse max_tasks_per_child (ours honours it) and counts executor._processes; tests/test_initializer.py checks the replacement by worker pid",
    "ProcessPoolExecutorTest.test_max_tasks_per_child_defaults_to_spawn_context": "reads executor._mp_context; ours keeps fork workers for max_tasks_per_child (docs/reliability.md)",
    "ProcessPoolExecutorTest.test_max_tasks_early_shutdown": "skips itself under the fork start method; the same scenario runs on fork workers in tests/test_initializer.py",
    "ProcessPoolExecutorTest.test_python_finalization_error": "patches threading._start_joinable_thread to break ProcessPoolExecutor's manager thread",
    # ThreadPoolShutdownTest / ProcessPoolShutdownTest (test_shutdown.py)
    "ThreadPoolShutdownTest.test_threads_terminate": "joins executor._threads",
    "ThreadPoolShutdownTest.test_context_manager_shutdown": "builds a stdlib ThreadPoolExecutor and joins its _threads",
    "ThreadPoolShutdownTest.test_thread_names_assigned": "thread_name_prefix and thread names",
    "ThreadPoolShutdownTest.test_thread_names_default": "ThreadPoolExecutor's default thread names",
    "ThreadPoolShutdownTest.test_cancel_futures_wait_false": "runs a stdlib ThreadPoolExecutor in a child interpreter",
    "ProcessPoolShutdownTest.test_processes_terminate": "counts and joins executor._processes",
    "ProcessPoolShutdownTest.test_context_manager_shutdown": "builds a stdlib ProcessPoolExecutor and joins its _processes",
    # ExecutorDeadlockTest (test_deadlock.py)
    "ExecutorDeadlockTest.test_shutdown_deadlock_pickle": "joins executor._executor_manager_thread, ProcessPoolExecutor's private thread",
    "ExecutorDeadlockTest.test_gh105829_should_not_deadlock_if_wakeup_pipe_full": "patches ProcessPoolExecutor's private _ExecutorManagerThread and _ThreadWakeup",
    # Whole classes
    "FailingInitializerResourcesTest (test_init.py)": "runs the stdlib's own ProcessPool*FailingInitializerTest classes and stops multiprocessing's resource tracker",
}

#: Tests left out on one route only: (class, route) -> reason.
EXCLUDED_ON_ROUTE: dict[tuple[str, str | None], str] = {}

#: Tests replaced by an adaptation (:class:`AdaptedShutdownTests`, run with
#: ExecutorShutdownTest on every route), and why. The generic mixin's run a
#: child interpreter that imports ``concurrent.futures.<executor_type.__name__>``;
#: ours runs the same scenario with ``smartexec.SmartExecutor``. The pool
#: classes' ``test_del_shutdown`` and ``test_shutdown_no_wait`` join the
#: stdlib pool's own threads and processes; ours join the threads the
#: executor started (a fork pool's dispatcher ends once it has stopped its
#: workers).
ADAPTED: dict[str, str] = {
    "test_interpreter_shutdown": "child script imports the executor from concurrent.futures",
    "test_submit_after_interpreter_shutdown": "child script imports the executor from concurrent.futures",
    "test_hang_gh83386": "child script imports the executor from concurrent.futures",
    "ThreadPoolShutdownTest.test_del_shutdown / ProcessPoolShutdownTest.test_del_shutdown": "joins the stdlib pool's _threads (or _executor_manager_thread, _processes, _call_queue)",
    "ThreadPoolShutdownTest.test_shutdown_no_wait / ProcessPoolShutdownTest.test_shutdown_no_wait": "joins the stdlib pool's _threads (or _executor_manager_thread, _processes, _call_queue)",
}


def _executor_type(backend: str | None) -> type[SmartExecutor]:
    """SmartExecutor, or a subclass whose route defaults to ``backend``.

    A subclass rather than ``executor_kwargs`` because several stdlib tests
    build their own ``self.executor_type(max_workers=...)``.
    """

    def __init__(self: SmartExecutor, max_workers: int | None = None, **kwargs: object) -> None:
        if backend is not None:
            kwargs.setdefault("backend", backend)
        SmartExecutor.__init__(self, max_workers, **kwargs)  # type: ignore[arg-type]

    return type(
        f"SmartExecutor_{backend or 'default'}",
        (SmartExecutor,),
        {"__init__": __init__, "__module__": __name__},
    )


class SmartExecutorMixin(_std.ExecutorMixin):
    """Like the stdlib's ``ThreadPoolMixin``: ``self.executor`` is a SmartExecutor."""

    executor_type: type[SmartExecutor] = SmartExecutor
    backend: str | None = None

    def setUp(self) -> None:
        # CPython waits up to support.SHORT_TIMEOUT (30 s, sized for slow
        # buildbots) for things that take milliseconds when they work, such as
        # a task's callable being freed; cap it so a regression costs seconds.
        patcher = unittest.mock.patch.object(
            _support, "SHORT_TIMEOUT", min(_support.SHORT_TIMEOUT, STALE_WAIT_S)
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        super().setUp()
        if getattr(self, "log_queue", None) is not None:
            self.addCleanup(self._release_log_queue)

    def _release_log_queue(self) -> None:
        """Let go of FailingInitializerMixin's queue: a spawn context's holds named semaphores."""
        log_queue = self.log_queue
        self.log_queue = None
        self.executor_kwargs = {}  # its initargs hold the queue too
        log_queue.close()
        log_queue.join_thread()

    def get_context(self) -> multiprocessing.context.BaseContext:
        # Borrowed process tests make their Manager / Semaphore from it. Only
        # the classes of WORKER_LOG_CONTEXT have a ``ctx`` attribute, with
        # which ExecutorMixin passes mp_context= to the executor.
        return multiprocessing.get_context(getattr(self, "ctx", "fork"))


class AdaptedShutdownTests:
    """The child-interpreter shutdown scenarios, run with smartexec."""

    def _run_child(self, body: str) -> subprocess.CompletedProcess[bytes]:
        header = (
            "from smartexec import SmartExecutor\n"
            f"from {_std.sleep_and_print_module} import sleep_and_print\n"
            f"BACKEND = {self.backend!r}\n"
        )
        try:
            return subprocess.run(
                [sys.executable, "-c", header + textwrap.dedent(body)],
                capture_output=True,
                timeout=CHILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as exc:
            hung = exc
        raise self.failureException(  # type: ignore[attr-defined]
            f"the child interpreter had not exited after {CHILD_TIMEOUT_S:.0f} s "
            f"(hang at exit); stdout={hung.stdout!r} stderr={hung.stderr!r}"
        )

    def test_interpreter_shutdown(self) -> None:
        # A task still running when the main module ends completes before exit.
        proc = self._run_child(
            """
            t = SmartExecutor(5, backend=BACKEND)
            t.submit(sleep_and_print, 1.0, "apple")
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, b"")
        self.assertEqual(proc.stdout.strip(), b"apple")

    def _check_submit_after_interpreter_shutdown(self, workers_started: bool) -> None:
        proc = self._run_child(
            f"""
            import atexit

            @atexit.register
            def run_last():
                try:
                    t.submit(id, None)
                except RuntimeError:
                    print("runtime-error")
                    raise

            t = SmartExecutor(5, backend=BACKEND)
            if {workers_started!r}:
                t.submit(id, 42).result()
            """
        )
        # A RuntimeError (a subclass will do) saying "cannot schedule new futures".
        self.assertEqual(proc.stdout.strip(), b"runtime-error", proc.stderr)
        self.assertIn("cannot schedule new futures", proc.stderr.decode())

    def test_submit_after_interpreter_shutdown(self) -> None:
        # submit() from an atexit hook, on an executor that never started workers.
        self._check_submit_after_interpreter_shutdown(workers_started=False)

    def test_submit_after_interpreter_shutdown_workers_started(self) -> None:
        # The same once the executor's workers run (the stdlib's mp_context branch).
        self._check_submit_after_interpreter_shutdown(workers_started=True)

    def _new_threads(self, before: set[threading.Thread]) -> list[threading.Thread]:
        """The threads started since ``before``: the executor's workers and helpers."""
        return [thread for thread in threading.enumerate() if thread not in before]

    def _assert_all_end(self, threads: list[threading.Thread], after: str) -> None:
        for thread in threads:
            thread.join(THREADS_END_S)
            self.assertFalse(  # type: ignore[attr-defined]
                thread.is_alive(), f"{thread.name} still ran {THREADS_END_S:g} s after {after}"
            )

    def test_del_shutdown(self) -> None:
        # The stdlib's Thread/ProcessPoolShutdownTest.test_del_shutdown: an
        # executor dropped with a map's results unread is collected, its
        # workers (and the threads that serve them) end, and every result can
        # still be read.
        before = set(threading.enumerate())
        executor = self.executor_type(max_workers=5)  # type: ignore[attr-defined]
        res = executor.map(abs, range(-5, 5))
        threads = self._new_threads(before)
        collected = weakref.ref(executor)
        del executor
        _support.gc_collect()
        self.assertIsNone(collected(), "the map's results hold the executor")  # type: ignore[attr-defined]
        self._assert_all_end(threads, "the executor was collected")
        self.assertEqual(list(res), [abs(v) for v in range(-5, 5)])  # type: ignore[attr-defined]

    def test_shutdown_no_wait(self) -> None:
        # The stdlib's Thread/ProcessPoolShutdownTest.test_shutdown_no_wait:
        # after shutdown(wait=False) the workers (and the threads that serve
        # them) end once the map's items have run; its results can be read.
        before = set(threading.enumerate())
        executor = self.executor_type(max_workers=5)  # type: ignore[attr-defined]
        res = executor.map(abs, range(-5, 5))
        threads = self._new_threads(before)
        executor.shutdown(wait=False)
        self._assert_all_end(threads, "shutdown(wait=False)")
        self.assertEqual(list(res), [abs(v) for v in range(-5, 5)])  # type: ignore[attr-defined]

    def test_hang_gh83386(self) -> None:
        # shutdown(wait=False) with a task running: the interpreter still exits
        # once the task is done, without hanging.
        proc = self._run_child(
            """
            t = SmartExecutor(max_workers=3, backend=BACKEND)
            t.submit(sleep_and_print, 1.0, "apple")
            t.shutdown(wait=False)
            """
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, b"")
        self.assertEqual(proc.stdout.strip(), b"apple")


def _borrowed_traceback_test(test: object) -> object:
    """Run the stdlib's test_traceback with smartexec's RemoteTraceback.

    The test asserts ``type(exc.__cause__) is concurrent.futures.process._RemoteTraceback``,
    a stdlib-private class; smartexec's documented counterpart is
    ``smartexec.errors.RemoteTraceback`` (same ``.tb`` attribute).
    """

    def test_traceback(self: object) -> None:
        with unittest.mock.patch.object(_stdlib_process, "_RemoteTraceback", RemoteTraceback):
            test(self)  # type: ignore[operator]

    test_traceback.__doc__ = _borrowed_traceback_test.__doc__
    return test_traceback


def _route_label(backend: str | None) -> str:
    return "Default" if backend is None else backend.capitalize()


def _make_classes() -> dict[str, type]:
    made: dict[str, type] = {}
    for backend, mixins in PLAN.items():
        for mixin_name in mixins:
            mixin = getattr(_std, mixin_name)
            namespace: dict[str, object] = {
                "__module__": __name__,
                "backend": backend,
                "executor_type": _executor_type(backend),
            }
            bases: tuple[type, ...] = (SmartExecutorMixin, mixin, _std.BaseTestCase)
            if mixin_name == "ExecutorShutdownTest":
                bases = (AdaptedShutdownTests, *bases)
            for test_name, (holder, joins, routes) in BORROWED.items():
                if joins != mixin_name or backend not in routes:
                    continue
                source = getattr(_std, holder)
                test = source.__dict__.get(test_name)
                if test is None:  # not in this Python's version of the suite
                    continue
                if test_name == "test_traceback":
                    namespace["_test_traceback"] = source.__dict__["_test_traceback"]
                    test = _borrowed_traceback_test(test)
                namespace[test_name] = test
            if mixin_name == "ExecutorDeadlockTest":
                namespace["TIMEOUT"] = DEADLOCK_WAIT_S
            if mixin_name == "FailingInitializerMixin" and backend in WORKER_LOG_CONTEXT:
                namespace["ctx"] = WORKER_LOG_CONTEXT[backend]
            for key in (*EXCLUDED, *(k for k, route in EXCLUDED_ON_ROUTE if route == backend)):
                holder, _, test_name = key.partition(".")
                if holder == mixin_name and test_name:
                    namespace[test_name] = None  # left out: see EXCLUDED
            short = mixin_name.removesuffix("Mixin").removesuffix("Tests").removesuffix("Test")
            name = f"Smart{_route_label(backend)}{short}Test"
            made[name] = type(name, bases, namespace)
    made["SmartFutureTest"] = _future_tests()
    return made


def _submit_future_type() -> type:
    """The class of the futures ``SmartExecutor.submit`` returns."""
    with SmartExecutor(1, backend="inline") as ex:
        return type(ex.submit(int))


def _future_tests() -> type:
    """CPython's FutureTests, run against the class ``submit`` returns.

    Those tests build futures with ``Future()`` and ``create_future(...)``
    (and module-level futures made with it), names looked up in their
    module's globals: for each test they are swapped for the submit future's
    class, so every test exercises that class.
    """
    future_type = _submit_future_type()
    tests = _std.FutureTests
    namespace = tests.test_cancel.__globals__

    def create_future(state: str = "PENDING", exception: object = None, result: object = None):
        future = future_type()
        future._state = state
        future._exception = exception
        future._result = result
        return future

    from concurrent.futures._base import (
        CANCELLED,
        CANCELLED_AND_NOTIFIED,
        FINISHED,
        PENDING,
        RUNNING,
    )

    def setUp(self: unittest.TestCase) -> None:
        swapped = {
            "Future": future_type,
            "create_future": create_future,
            "PENDING_FUTURE": create_future(state=PENDING),
            "RUNNING_FUTURE": create_future(state=RUNNING),
            "CANCELLED_FUTURE": create_future(state=CANCELLED),
            "CANCELLED_AND_NOTIFIED_FUTURE": create_future(state=CANCELLED_AND_NOTIFIED),
            "EXCEPTION_FUTURE": create_future(state=FINISHED, exception=OSError()),
            "SUCCESSFUL_FUTURE": create_future(state=FINISHED, result=42),
        }
        patcher = unittest.mock.patch.dict(namespace, swapped)
        patcher.start()
        self.addCleanup(patcher.stop)
        # A failing done-callback is logged to stderr through logging's last
        # resort handler, as the tests expect, not to pytest's log capture.
        quiet = unittest.mock.patch.object(
            logging.getLogger("concurrent.futures"), "propagate", False
        )
        quiet.start()
        self.addCleanup(quiet.stop)
        tests.setUp(self)

    body: dict[str, object] = {"__module__": __name__, "setUp": setUp}
    for key in EXCLUDED:
        holder, _, test_name = key.partition(".")
        if holder == "FutureTests" and test_name:
            body[test_name] = None
    return type("SmartFutureTest", (tests,), body)


globals().update(_make_classes())
