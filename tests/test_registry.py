"""Backend discovery and registration."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from smartexec import SmartExecutor, available_backends, register_backend
from smartexec._remote import run_chunk
from smartexec.backends import Backend
from smartexec.errors import BackendUnavailableError, UnknownBackendError
from smartexec.registry import get_backend_class, known_backends


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
