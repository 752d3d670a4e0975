"""The example plugin package (examples/plugin), found through its entry point.

Runs where the package is installed (``tox -e dask`` installs it; by hand:
``pip install --no-deps -e examples/plugin``) and is skipped elsewhere.
Discovery itself is tested everywhere by tests/test_registry.py, with a
made-up distribution.
"""

from __future__ import annotations

import logging

import pytest

plugin = pytest.importorskip(
    "smartexec_logthreads",
    reason="the example plugin is not installed: pip install --no-deps -e examples/plugin",
)

from smartexec import SmartExecutor, available_backends  # noqa: E402
from smartexec.registry import get_backend_class, known_backends  # noqa: E402

from .test_conformance import BackendConformance, fail_on_three, square  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_found_through_its_entry_point():
    assert known_backends()["logthreads"] == "entry point of smartexec-logthreads"
    assert available_backends()["logthreads"] == "available"
    assert get_backend_class("logthreads") is plugin.LoggingThreadBackend


class TestLoggingThreadsConformance(BackendConformance):
    backend = "logthreads"
    in_process = True


def test_each_chunk_is_logged_and_hooked(caplog):
    records = []
    caplog.set_level(logging.DEBUG, logger="smartexec_logthreads")
    with SmartExecutor(2, backend="logthreads", level=logging.DEBUG, on_chunk=records.append) as ex:
        assert "logged at DEBUG and passed to on_chunk" in "\n".join(ex.explain(square).reasons)
        results = ex.map(fail_on_three, range(6), chunksize=3)
        assert [next(results) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(ValueError):
            next(results)
    assert sorted((r.items, r.errors) for r in records) == [(3, 0), (3, 1)]
    assert all(r.name == "fail_on_three" for r in records)
    logged = [r for r in caplog.records if r.name == "smartexec_logthreads"]
    assert len(logged) == 2 and all(r.levelno == logging.DEBUG for r in logged)


def test_its_options_are_checked():
    with pytest.raises(TypeError, match="on_chunk must be callable"):
        SmartExecutor(backend="logthreads", on_chunk=42)
    with pytest.raises(TypeError, match=r"it takes level=, on_chunk="):
        SmartExecutor(backend="logthreads", address="tcp://x:1")
