"""Test helpers: list child processes, run a child interpreter with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path


def _live_processes() -> dict[int, tuple[list[str], str]]:
    """pid -> (stat fields after the command name, command line), zombies left out."""
    found: dict[int, tuple[list[str], str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie has exited; its parent only has to reap it
            found[int(entry)] = (fields, cmd)
    return found


def child_processes(pid: int) -> dict[int, str]:
    """Return pid -> command line of every live descendant of ``pid`` (Linux /proc)."""
    live = _live_processes()
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (fields, cmd) in live.items():
            if int(fields[1]) == parent and child not in found:
                found[child] = cmd
                frontier.append(child)
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run_python(
    code: str, *, timeout: float = 60, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter as ``__main__``; kill it at ``timeout``.

    The child's whole process group is killed on timeout, and its output is put
    in the failure message, so a hang fails the test instead of the suite.
    """
    proc = start_python(code, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"child interpreter did not finish in {timeout} s\n--- stdout\n{out}\n--- stderr\n{err}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def session_processes(sid: int) -> dict[int, str]:
    """Return pid -> command line of every live process in session ``sid``.

    A child started with ``start_new_session=True`` leads its own session, and
    its workers stay in it even when orphaned (re-parented to init), so this
    finds leftovers after the child itself has exited.
    """
    return {pid: cmd for pid, (fields, cmd) in _live_processes().items() if int(fields[3]) == sid}


def start_python(code: str, cwd: str | None = None) -> subprocess.Popen:
    """Start ``code`` in a fresh interpreter, in a new session, output piped.

    The repository root is put on ``PYTHONPATH``, so ``tests.*`` modules import.
    """
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )
