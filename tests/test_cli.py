"""python -m smartexec demo | explain | backends | cache, run as a user would."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def run(*args, timeout=100):
    return subprocess.run(
        [sys.executable, "-m", "smartexec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_explain_a_builtin():
    result = run("explain", "time:sleep")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("sleep -> thread")


def test_explain_a_bad_target():
    result = run("explain", "nosuchmodule:thing")
    assert result.returncode == 2
    assert "cannot load" in result.stderr
    assert run("explain", "json").returncode == 2


@pytest.mark.parametrize("target", [":dumps", ".json:dumps", "json:"])
def test_explain_a_malformed_target_says_the_form(target):
    result = run("explain", target)
    assert result.returncode == 2
    assert "expected MODULE:NAME" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("source", "shown"),
    [("raise RuntimeError('boom at import')", "RuntimeError: boom"), ("def f(:", "SyntaxError")],
)
def test_explain_a_module_that_fails_to_import(tmp_path, monkeypatch, source, shown):
    (tmp_path / "broken_module.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = run("explain", "broken_module:f")
    assert result.returncode == 2
    assert "cannot load broken_module:f" in result.stderr and shown in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (("--workers", "0"), "--workers: must be 1 or more"),
        (("--limit", "-1"), "--limit: must be 0 (all) or more"),
        (("--pattern", "("), "--pattern: not a regular expression"),
    ],
)
def test_demo_rejects_bad_options_before_it_starts(option, said):
    result = run("demo", *option)
    assert result.returncode == 2
    assert said in result.stderr and "Traceback" not in result.stderr


def test_backends_lists_the_builtins():
    result = run("backends")
    assert result.returncode == 0
    for name in ("fork", "inline", "loky", "thread"):
        assert name in result.stdout


def test_demo_on_a_small_tree(tmp_path):
    for i in range(12):
        (tmp_path / f"m{i}.py").write_text(
            textwrap.dedent(
                f"""
                def f{i}(self, x):
                    return [x * k for k in range({i})]

                class C{i}:
                    def __init__(self):
                        self.v = {i}
                """
            )
        )
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 10)
    result = run("demo", str(tmp_path), "--workers", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for routed in [
        "sha256_file -> fork",
        "count_ast_nodes -> fork",
        "make_grep.<locals>.matches -> fork",
        "NgramIndex.rarity -> fork",
    ]:
        assert routed in out
    assert out.count("results equal a serial loop: True") == 4
    assert "reach it by copy-on-write" in out
    assert "all results equal a serial loop" in out


def test_demo_rejects_a_missing_directory(tmp_path):
    result = run("demo", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "not a directory" in result.stderr


def test_cache_shows_and_clears_the_profile_store(profile_store, monkeypatch):
    import time

    from smartexec import _profiles as profiles

    profiles.save(len, profiles.StoredProfile("thread", 1e-6, None, 0.0, 10, time.time()))
    profiles.flush()  # as this process's exit would
    result = run("cache")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{profile_store}: 1 profile of measured callables"
    result = run("cache", "--clear")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"removed 1 profile from {profile_store}"
    assert profiles.entry_count() == 0
    monkeypatch.setenv(profiles.CACHE_ENV, "off")
    result = run("cache")
    assert result.returncode == 0
    assert "profile store is off (SMARTEXEC_CACHE=off)" in result.stdout


def test_version_prints_the_package_version():
    from importlib import metadata

    import smartexec

    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"smartexec {metadata.version('smartexec')}\n"
    assert metadata.version("smartexec") == smartexec.__version__


def test_version_without_installed_metadata(monkeypatch):
    from importlib import metadata

    import smartexec
    from smartexec import cli

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.package_version() == smartexec.__version__


@pytest.mark.timeout(60)
def test_explain_into_a_closed_pipe_stops_quietly():
    import subprocess
    import sys

    shell = f"{sys.executable} -m smartexec explain json:dumps | head -1"
    result = subprocess.run(shell, shell=True, capture_output=True, text=True, timeout=50)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_the_demo_says_when_a_workload_ran_slower_than_the_loop():
    import io

    from smartexec.demo import WorkloadResult, print_result

    slow, fast = io.StringIO(), io.StringIO()
    print_result(WorkloadResult("m", 10, "m -> fork", "fork", 0.7, 1.0, True), slow)
    print_result(WorkloadResult("m", 10, "m -> fork", "fork", 1.5, 1.0, True), fast)
    assert "slower than the serial loop this time (load average" in slow.getvalue()
    assert "slower" not in fast.getvalue()
