"""Backend discovery and registration."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from smartexec import SmartExecutor, available_backends, register_backend
from smartexec._remote import run_chunk
from smartexec.backends import Backend
from smartexec.errors import BackendUnavailableError, UnknownBackendError
from smartexec.registry import create_backend, get_backend_class, known_backends

from ._children import run_python


class RecordingBackend(Backend):
    """A minimal plugin: runs chunks inline and records them."""

    name = "recording"
    shares_memory = True
    chunks: list = []

    def submit_chunk(self, fn, chunk, budget_s=None):
        RecordingBackend.chunks.append(len(chunk))
        future = Future()
        future.set_result(run_chunk(fn, chunk))
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        pass


def test_builtins_are_known_and_available():
    report = available_backends()
    for name in ("inline", "thread", "fork", "loky"):
        assert report[name] == "available"
    assert known_backends()["fork"] == "built-in"


def test_register_a_backend_class_and_use_it():
    register_backend("recording", RecordingBackend, replace=True)
    RecordingBackend.chunks.clear()
    with SmartExecutor(backend="recording") as ex:
        assert list(ex.map(abs, [-1, -2, -3], chunksize=2)) == [1, 2, 3]
    assert RecordingBackend.chunks == [2, 1]


def test_a_name_is_never_silently_replaced():
    register_backend("recording2", RecordingBackend)
    register_backend("recording2", RecordingBackend)  # same factory: fine
    with pytest.raises(ValueError, match="already registered"):
        register_backend("recording2", "tests.test_registry:Other")


def test_register_by_import_path_imports_on_first_use():
    register_backend("lazy-recording", "tests.test_registry:RecordingBackend", replace=True)
    assert get_backend_class("lazy-recording") is RecordingBackend


def test_import_failure_names_the_backend_and_chains():
    register_backend("broken", "no_such_package.mod:Backend", replace=True)
    with pytest.raises(BackendUnavailableError) as info:
        get_backend_class("broken")
    assert "'broken'" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    assert "cannot be imported" in available_backends()["broken"]


def test_unknown_name():
    with pytest.raises(UnknownBackendError, match="known backends are"):
        get_backend_class("nope")


def test_factory_must_be_callable_or_a_path():
    with pytest.raises(TypeError, match="Backend subclass"):
        register_backend("bad", 42)  # type: ignore[arg-type]


class OptionsBackend(RecordingBackend):
    """A plugin that takes backend options."""

    def __init__(self, max_workers, cpu_count, *, label="", verbose=False):
        super().__init__(max_workers, cpu_count)
        self.label = label


def test_backend_options_reach_the_factory():
    register_backend("with-options", OptionsBackend, replace=True)
    backend = create_backend("with-options", 2, 4, {"label": "x"})
    assert backend.label == "x" and backend.max_workers == 2
    with SmartExecutor(backend="with-options", label="y") as ex:
        assert ex.submit(abs, -3).result(timeout=10) == 3


def test_an_option_the_backend_does_not_take_lists_those_it_does():
    register_backend("with-options", OptionsBackend, replace=True)
    with pytest.raises(TypeError) as info:
        create_backend("with-options", None, 2, {"lable": "x"})
    message = str(info.value)
    assert "unexpected option(s) lable=" in message
    assert "it takes label=, verbose=" in message
    assert "did you mean label= for lable=?" in message
    with pytest.raises(TypeError, match="it takes no options"):
        create_backend("inline", None, 2, {"label": "x"})


def test_a_factory_taking_any_keyword_gets_every_option():
    def factory(max_workers, cpu_count, **options):
        backend = RecordingBackend(max_workers, cpu_count)
        backend.options = options
        return backend

    register_backend("any-options", factory, replace=True)
    assert create_backend("any-options", 1, 1, {"a": 1, "b": 2}).options == {"a": 1, "b": 2}


@pytest.mark.timeout(60)
def test_dask_missing_names_the_extra():
    # Runs with or without dask installed: the child hides it.
    result = run_python(
        """
        import subprocess, sys
        sys.modules["distributed"] = None  # as if dask were not installed
        import smartexec
        from smartexec import BackendUnavailableError, SmartExecutor
        print(smartexec.available_backends()["dask"])
        try:
            SmartExecutor(backend="dask")
        except BackendUnavailableError as exc:
            print("raised:", exc.hint)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status, raised = result.stdout.strip().splitlines()
    assert status.startswith("backend 'dask' (built-in) cannot be imported: dask[distributed]")
    assert status.endswith("To install it: pip install 'smartexec[dask]'")
    assert raised == "raised: pip install 'smartexec[dask]'"


@pytest.mark.timeout(60)
def test_entry_points_are_found_by_name(tmp_path):
    # A made-up installed distribution, as pip would leave it, declaring three
    # backends: a working one, one that tries to take a built-in's name, and
    # one whose module is missing.
    dist = tmp_path / "fakeplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[smartexec.backends]\n"
        "fakeplug = fakeplug_backend:FakeBackend\n"
        "thread = fakeplug_backend:FakeBackend\n"
        "ghost = no_such_module:Ghost\n"
    )
    (tmp_path / "fakeplug_backend.py").write_text(
        "from smartexec.backends.thread import ThreadBackend\n"
        "class FakeBackend(ThreadBackend):\n"
        "    name = 'fakeplug'\n"
    )
    result = run_python(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from smartexec import SmartExecutor, available_backends
        from smartexec.registry import get_backend_class, known_backends
        print(known_backends()["fakeplug"])
        print(known_backends()["thread"], get_backend_class("thread").__module__)
        print(available_backends()["ghost"])
        with SmartExecutor(2, backend="fakeplug") as ex:
            print(ex.submit(abs, -7).result(timeout=10), repr(ex))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    source, thread, ghost, ran = result.stdout.strip().splitlines()
    assert source == "entry point of fakeplug"
    assert thread == "built-in smartexec.backends.thread"  # a plugin never replaces a built-in
    assert "'ghost' (entry point of fakeplug) cannot be imported" in ghost
    assert "reinstall fakeplug, which declares entry point ghost = no_such_module:Ghost" in ghost
    assert ran.startswith("7 ") and "fakeplug" in ran


class TimingBackend(RecordingBackend):
    """A plugin that says it takes timeouts: it gets the user's task_timeout as timeout_s."""

    name = "timing"
    takes_timeouts = True
    timeouts: list = []

    def submit_chunk(self, fn, chunk, budget_s=None, *, timeout_s=None):
        TimingBackend.timeouts.append(timeout_s)
        return super().submit_chunk(fn, chunk, budget_s)


def test_task_timeout_goes_only_to_a_backend_that_takes_timeouts():
    register_backend("recording", RecordingBackend, replace=True)
    with pytest.raises(ValueError, match="cannot stop or time out one task"):
        SmartExecutor(backend="recording", task_timeout=5)
    register_backend("timing", TimingBackend, replace=True)
    TimingBackend.timeouts.clear()
    with SmartExecutor(backend="timing", task_timeout=5) as ex:
        assert list(ex.map(abs, [-1, -2], chunksize=2)) == [1, 2]
    assert TimingBackend.timeouts == [10.0]  # a chunk of 2 calls: 2 x task_timeout
