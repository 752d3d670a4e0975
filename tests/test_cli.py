"""python -m smartexec demo | explain | backends, run as a user would."""

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
        "make_grep.<locals>.matches -> loky",
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
