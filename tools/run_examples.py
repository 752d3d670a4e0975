"""Run every script in examples/ with a small input; fail if any fails (tox -e examples).

Each script is run in a fresh interpreter as ``python examples/NAME.py --small``
(with ``SMARTEXEC_EXAMPLES_SMALL=1`` set too), from the repository root, and
killed after :data:`TIMEOUT_S` seconds. A new example must accept ``--small``:
that is what keeps this check, and CI, fast.

Usage: python tools/run_examples.py [NAME.py ...]   (default: every example)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

#: Seconds one example may take with ``--small`` before it counts as failed.
#: Each takes one or two seconds on a 2-core machine.
TIMEOUT_S = 120

ROOT = Path(__file__).resolve().parent.parent


def run(script: Path) -> bool:
    """Run one example; print its name, time and (on failure) its output."""
    env = {**os.environ, "SMARTEXEC_EXAMPLES_SMALL": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(script), "--small"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        print(f"FAIL {script.name}: still running after {TIMEOUT_S} s\n{output or ''}")
        return False
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        print(f"FAIL {script.name} (exit {done.returncode}, {elapsed:.1f} s)")
        print(done.stdout + done.stderr)
        return False
    print(f"ok   {script.name} ({elapsed:.1f} s)")
    return True


def main(argv: list[str]) -> int:
    scripts = (
        [ROOT / "examples" / name for name in argv]
        if argv
        else sorted((ROOT / "examples").glob("*.py"))
    )
    if not scripts:
        print("no examples found")
        return 1
    failed = [script.name for script in scripts if not run(script)]
    if failed:
        print(f"{len(failed)} of {len(scripts)} examples failed: {', '.join(failed)}")
        return 1
    print(f"all {len(scripts)} examples ran")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
