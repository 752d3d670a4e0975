"""The demo workloads: real work over a real source tree (the stdlib by default).

Each workload is one of the problems smartexec exists for, run once serially
and once on a :class:`~smartexec.SmartExecutor`, checking that both give the
same results:

* ``sha256``  - hash every file's bytes (a module-level function);
* ``ast``     - parse every ``.py`` file and count its syntax-tree nodes;
* ``grep``    - a closure over a regex from the command line keeps the files
  that match (a closure: must travel by value);
* ``index``   - a bound method of a 256 MiB in-memory 4-gram index scores how
  unusual each file is (big state: must not be pickled per task).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "default_root",
    "list_files",
    "sha256_file",
    "count_ast_nodes",
    "make_grep",
    "NgramIndex",
    "WorkloadResult",
    "run_workload",
]

#: 4-grams hash into 2**25 buckets of int64 counts: a 256 MiB table.
INDEX_BITS = 25


def default_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path) -> list[str]:
    """Every regular file under ``root``, sorted, skipping ``site-packages``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "site-packages")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return found


def sha256_file(path: str) -> str:
    """Hex SHA-256 of the file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def count_ast_nodes(path: str) -> int:
    """Number of nodes in the file's syntax tree; -1 when it does not parse."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return -1  # the stdlib ships deliberately broken files for its tests
    return sum(1 for _ in ast.walk(tree))


def make_grep(pattern: str) -> Callable[[str], bool]:
    """Return a closure that says whether a file's text matches ``pattern``."""
    regex = re.compile(pattern.encode())

    def matches(path: str) -> bool:
        with open(path, "rb") as f:
            return regex.search(f.read()) is not None

    return matches


def _ngram_codes(data: bytes) -> np.ndarray:
    b = np.frombuffer(data, dtype=np.uint8).astype(np.uint32)
    if b.size < 4:
        return np.zeros(0, dtype=np.uint32)
    grams = (b[:-3] << 24) | (b[1:-2] << 16) | (b[2:-1] << 8) | b[3:]
    return (grams * np.uint32(2654435761)) >> np.uint32(32 - INDEX_BITS)


class NgramIndex:
    """Counts of hashed byte 4-grams over a corpus: 2**25 int64 buckets (256 MiB).

    Args:
        paths: the files to count.
    """

    def __init__(self, paths: Sequence[str]):
        codes = []
        for path in paths:
            with open(path, "rb") as f:
                codes.append(_ngram_codes(f.read()))
        self.counts = np.bincount(np.concatenate(codes), minlength=1 << INDEX_BITS).astype(np.int64)
        self.total = int(self.counts.sum())

    def rarity(self, path: str) -> float:
        """Mean surprise (bits) of the file's 4-grams under the corpus counts."""
        with open(path, "rb") as f:
            codes = _ngram_codes(f.read())
        if codes.size == 0:
            return 0.0
        seen = self.counts[codes].astype(np.float64)
        return float(np.mean(np.log2(self.total / np.maximum(seen, 1.0))))


@dataclass
class WorkloadResult:
    """One workload's outcome.

    Attributes:
        name: workload name.
        items: number of items mapped.
        decision: the routing policy's decision for the callable, as text.
        ran: what the map actually did (``ex.decisions()[-1]``), e.g. ran
            inline because the measured items were too small, as text.
        serial_s: seconds for a plain loop.
        parallel_s: seconds for ``SmartExecutor.map`` (worker start included).
        equal: whether both gave the same results.
    """

    name: str
    items: int
    decision: str
    ran: str
    serial_s: float
    parallel_s: float
    equal: bool

    @property
    def speedup(self) -> float:
        """serial_s / parallel_s."""
        return self.serial_s / self.parallel_s if self.parallel_s > 0 else float("inf")


def run_workload(
    executor: Any, name: str, fn: Callable[[str], Any], items: list[str]
) -> WorkloadResult:
    """Run ``fn`` over ``items`` serially, then on ``executor``; compare."""
    decision = executor.explain(fn, items[0]) if items else executor.explain(fn)
    start = time.perf_counter()
    serial = [fn(item) for item in items]
    serial_s = time.perf_counter() - start
    start = time.perf_counter()
    parallel = list(executor.map(fn, items))
    parallel_s = time.perf_counter() - start
    ran = executor.decisions()[-1]
    how = f"{ran.backend}" + (f" (first chunk {ran.chunksize} items)" if ran.chunksize else "")
    return WorkloadResult(
        name,
        len(items),
        str(decision),
        f"{how}: {ran.reasons[0]}",
        serial_s,
        parallel_s,
        serial == parallel,
    )


def warm_page_cache(paths: Sequence[str]) -> int:
    """Read every file once so that neither timed run pays for the disk; return bytes."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def print_result(result: WorkloadResult, out: Any = sys.stdout) -> None:
    """Print one workload's report."""
    print(f"\n== {result.name}: {result.items} items", file=out)
    print(f"   decision: {result.decision}".replace("\n", "\n   "), file=out)
    print(f"   this map ran on {result.ran}", file=out)
    print(
        f"   serial {result.serial_s:.2f} s | smartexec {result.parallel_s:.2f} s | "
        f"speed-up {result.speedup:.2f}x | results equal a serial loop: {result.equal}",
        file=out,
    )
    if result.speedup < 1.0:
        print(
            f"   slower than the serial loop this time ({_load()}): the decision's "
            f"figures above say what each route was predicted to take",
            file=out,
        )


def _load() -> str:
    """The machine's load, as a user would judge a slow run by it."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on this platform
        return f"{os.cpu_count()} CPUs"
    return f"load average {load:.1f} on {os.cpu_count()} CPUs"
