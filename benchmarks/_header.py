"""What a benchmark's header names: package versions and the commit measured."""

from __future__ import annotations

import contextlib
import importlib.metadata
import subprocess


def version(dist: str) -> str:
    """The installed version of distribution ``dist``, or "not installed"."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def commit(folder: str) -> str:
    """The short git commit of the checkout holding ``folder``, or "?"."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", "-C", folder, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return "?"
