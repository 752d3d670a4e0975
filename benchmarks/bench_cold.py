"""The cold benchmark: a fresh executor's first map, in a fresh process (issue 14, item 9).

A script creates one executor, maps one workload and exits: that first map
is what a user sees. So every run here is a new Python process
(``benchmarks/_cold_child.py``) that builds the workload, then times one
contender from creating its executor to the end of its ``with`` block, and
prints the wall time (and, for smartexec, where the items ran).

Contenders: a serial loop; ``ThreadPoolExecutor()``; ``ProcessPoolExecutor()``
with chunksize 1 and ``len / (4 x workers)`` (the better one is reported);
joblib ``Parallel(n_jobs=-1)`` (loky) and with ``prefer="threads"``; mpire
``WorkerPool(n_jobs=cpus, start_method="fork").map`` (skipped when mpire is
not installed); a hand-written ``multiprocessing`` fork ``Pool.map`` through a
module-level wrapper (big-object rows only); ``SmartExecutor()`` with defaults.
A contender that cannot run a workload (a closure in a process pool) shows
as "fails"; one over ``--timeout`` shows as "timeout" and is not run again
for that row; neither can be the best.

Rounds are interleaved (each round runs every contender once per workload,
in an order rotated from round to round); each cell is the median of the
rounds. The table gives smartexec's ratio to the best other contender (the
serial loop included) and to the serial loop, and the routes it took.

``--stability N`` runs smartexec alone, N fresh processes per workload, and
prints each run's route and whether all N agree. ``--compete`` runs a
CPU-bound busy loop in another process for the whole benchmark.

Every child runs in its own session: after it ends (or is killed on a
timeout or Ctrl-C) its leftover processes are killed, and /dev/shm entries
named after one of its processes are removed; both are reported.

Run: ``python benchmarks/bench_cold.py [--rounds 3] [--scale 1] [--quick]
[--only sleep,closure] [--stability [N]] [--compete] [--timeout 30] [--json out.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_cold_child.py")
sys.path.insert(0, HERE)

import _cold_workloads as cw  # noqa: E402
import _header  # noqa: E402
from _cold_child import MARKER  # noqa: E402

SHM = "/dev/shm"

#: Column order of the table; "process" is the better of process-1 and process-n.
COLUMNS = (
    "serial",
    "threads",
    "threads-64",
    "process",
    "joblib",
    "joblib-threads",
    "mpire",
    "hand-fork",
    "smartexec",
)


ALL_CONTENDERS = (
    "serial",
    "threads",
    "threads-64",
    "process-1",
    "process-n",
    "joblib",
    "joblib-threads",
    "mpire",
    "hand-fork",
    "smartexec",
)


def contenders(workload: cw.Workload, n_items: int, cpus: int, have: set[str]) -> list[str]:
    """The contenders that run ``workload`` (child contender names)."""
    if workload.kind.startswith("submit"):
        return ["serial", "threads", "threads-64", "process-1", "smartexec"]
    names = ["serial", "threads", "threads-64", "process-1"]
    if n_items // (4 * cpus) > 1:
        names.append("process-n")
    if "joblib" in have:
        names += ["joblib", "joblib-threads"]
    if "mpire" in have:
        names.append("mpire")
    if workload.bound:
        names.append("hand-fork")
    names.append("smartexec")
    return names


# -- one child run, cleaned up after ------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return found


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a reused pid apart), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie: gone but for its parent's wait
        return None
    return fields[19]


class Tree:
    """Watches a child's process tree (every 20 ms) to find its leftovers afterwards."""

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def scan(self) -> None:
        todo = [self.root]
        while todo:
            pid = todo.pop()
            start = _start_time(pid)
            if start is None:
                continue
            self.seen.setdefault(pid, start)
            todo += _children(pid)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.scan()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()

    def alive(self) -> list[int]:
        return [
            pid
            for pid, start in self.seen.items()
            if pid != self.root and _start_time(pid) == start
        ]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Run:
    """One child run's outcome."""

    workload: str
    contender: str
    round: int
    wall_s: float | None = None
    digest: str | None = None
    error: str | None = None
    timeout: bool = False
    routes: dict[str, Any] = field(default_factory=dict)
    leftover_processes: int = 0
    leftover_shm: list[str] = field(default_factory=list)


def run_child(spec: dict[str, Any], timeout_s: float, env: dict[str, str]) -> Run:
    """Run one contender on one workload in a fresh process; clean up after it."""
    run = Run(spec["workload"], spec["contender"], spec["round"])
    shm_before = set(_listdir(SHM))
    # Files, not pipes: a leftover worker holding a pipe would keep us waiting.
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen(
            [sys.executable, CHILD, json.dumps(spec)],
            stdout=out_f,
            stderr=err_f,
            text=True,
            start_new_session=True,
            env=env,
        )
        tree = Tree(proc.pid)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            run.timeout = True
        finally:  # on Ctrl-C too: the child and its workers go
            tree.stop()
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
            run.leftover_processes = _reap(tree)
            _kill_group(proc.pid)  # anything in its session the watch missed
            run.leftover_shm = _sweep_shm(shm_before, set(tree.seen))
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if run.timeout:
        return run
    for line in out.splitlines():
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER) :])
            run.wall_s = result.get("wall_s")
            run.digest = result.get("digest")
            run.error = result.get("error")
            run.routes = result.get("routes") or {}
            return run
    tail = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    run.error = f"no result (exit status {proc.returncode}): {tail}"[:300]
    return run


def _reap(tree: Tree) -> int:
    """Kill what is left of a child's tree after a grace of 2 s; return how many."""
    deadline = time.monotonic() + 2.0  # workers and trackers see their parent go
    while tree.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = tree.alive()
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


#: The pids in the names of /dev/shm entries: smartexec's ``smx_<owner>_w<worker>_...``,
#: loky's ``sem.loky-<pid>-...``, joblib's ``joblib_memmapping_folder_<pid>_...``.
_OWNER_PID = re.compile(r"(?:^smx_|_w|loky-|joblib_memmapping_folder_)(\d+)")


def _sweep_shm(before: set[str], pids: set[int]) -> list[str]:
    """Remove /dev/shm entries that appeared during the run and name one of its pids."""
    left = []
    for name in set(_listdir(SHM)) - before:
        numbers = {int(n) for n in _OWNER_PID.findall(name)}
        if not numbers & pids:
            continue  # another process's (the machine is shared)
        path = os.path.join(SHM, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        left.append(name)
    return sorted(left)


# -- the competing busy loop --------------------------------------------------------


#: The competing busy loop; it also stops by itself if this process dies (SIGKILL).
_BUSY = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def competing(enabled: bool) -> Iterator[None]:
    """Run a CPU-bound busy loop in another process while the block runs."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", _BUSY], start_new_session=True)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- reporting -----------------------------------------------------------------------


def _median(runs: list[Run]) -> float | None:
    times = [r.wall_s for r in runs if r.wall_s is not None]
    return statistics.median(times) if times else None


def cell(runs: list[Run], serial_digest: str | None) -> tuple[float | None, str]:
    """A contender's median for a row (None when it failed) and its text."""
    if not runs:
        return None, "-"
    if any(r.timeout for r in runs):
        return None, "timeout"
    if any(r.error for r in runs):
        return None, "fails"
    if serial_digest is not None and any(r.digest != serial_digest for r in runs):
        return None, "wrong"
    median = _median(runs)
    assert median is not None
    return median, seconds(median)


def seconds(t: float) -> str:
    return f"{t:.3f}" if t >= 0.1 else f"{t:.4f}"


def route_text(run: Run) -> str:
    """``fork`` or ``inline 776 > loky 4224``: the backends that ran items, in order."""
    items = run.routes.get("items")
    if not items:
        return "?" if run.wall_s is None else f"? ({run.routes.get('error', 'no routes')})"
    if len(items) == 1:
        return next(iter(items))
    return " > ".join(f"{name} {count}" for name, count in items.items())


def route_key(run: Run) -> str:
    """What must agree between runs: the backends, in order (not the item counts)."""
    items = run.routes.get("items") or {}
    return " > ".join(items) or "?"


def prediction_note(workload: cw.Workload, runs: list[Run]) -> str | None:
    """How far smartexec's own prediction (explain()'s figures) was from the run.

    The settling decision predicts the seconds for the items left on the
    route the map ended on; scaled to the whole input (``x total / left``),
    it is set against the run's measured wall time (median over the runs
    that predicted). Issue 14 item 8: within 1.5x.
    """
    pairs, rests = [], []
    for r in runs:
        predicted = r.routes.get("predicted") if r.routes else None
        n = r.routes.get("items", {}) if r.routes else {}
        total = sum(n.values()) if n else 0
        if not predicted or r.wall_s is None or not predicted["left"] or not total:
            continue
        if predicted["seconds"] <= 0:
            continue  # under the reason's 1 ms resolution ("0.000 s"): nothing to compare
        # The prediction runs to the map's end: the items not sent, and those in flight.
        covered = predicted["left"] + predicted.get("in_flight", 0)
        pairs.append((predicted["seconds"] * total / covered, r.wall_s, predicted))
        if predicted.get("took"):
            rests.append(_off_by(predicted["seconds"], predicted["took"]))
    if not pairs:
        return None
    pairs.sort(key=lambda p: p[1])
    projected, measured, predicted = pairs[len(pairs) // 2]
    rest = ""
    if predicted.get("took"):
        rest = (
            f"; they then took {seconds(predicted['took'])} s: off by "
            f"{_off_by(predicted['seconds'], predicted['took']):.2f}x (median over the runs "
            f"{sorted(rests)[len(rests) // 2]:.2f}x)"
        )
    return (
        f"{workload.name}: explain() predicted {seconds(predicted['seconds'])} s for the"
        f"{' next' if predicted.get('next') else ''} {predicted['left']} items"
        f"{'' if predicted.get('next') else ' left'}"
        f"{' and ' + str(predicted['in_flight']) + ' in flight' if predicted.get('in_flight') else ''}"
        f" on {predicted['route']}{rest}. Whole map ~"
        f"{seconds(projected)} s; the run took {seconds(measured)} s: off by "
        f"{_off_by(projected, measured):.2f}x"
    )


def _off_by(a: float, b: float) -> float:
    """How many times the larger of two durations is the smaller (>= 1)."""
    return max(a, b) / max(min(a, b), 1e-9)


def table(
    results: list[Run],
    rows: list[cw.Workload],
    plans: dict[str, list[str]],
    n_rounds: int,
    params: cw.Params,
) -> str:
    """The results table, then smartexec's routes and any failure or leftover."""
    head = ["workload", *COLUMNS, "best", "smx/best", "smx/serial", "smx-serial"]
    lines = []
    notes = []
    for workload in rows:
        mine = [r for r in results if r.workload == workload.name]
        by = {c: [r for r in mine if r.contender == c] for c in plans[workload.name]}
        serial_runs = by.get("serial", [])
        serial_digest = serial_runs[0].digest if serial_runs else None
        values: dict[str, float | None] = {}
        texts: dict[str, str] = {}
        for name, runs in by.items():
            values[name], texts[name] = cell(runs, serial_digest)
        # the process pool: the better chunksize
        pool = [(values[c], c) for c in ("process-1", "process-n") if c in values]
        ok = [(v, c) for v, c in pool if v is not None]
        if ok:
            v, c = min(ok)
            values["process"] = v
            cs = "1" if c == "process-1" else "n"
            texts["process"] = seconds(v) + (
                "" if workload.kind.startswith("submit") else f" cs{cs}"
            )
        elif pool:
            values["process"], texts["process"] = None, texts[pool[0][1]]
        others = {
            c: v
            for c, v in values.items()
            if v is not None and c not in ("smartexec", "process-1", "process-n")
        }
        best = min(others, key=lambda c: others[c]) if others else None
        smx = values.get("smartexec")
        serial = values.get("serial")
        row = [workload.name, *(texts.get(c, "-") for c in COLUMNS)]
        row.append(best or "-")
        row.append(f"{smx / others[best]:.2f}x" if smx and best else "-")
        row.append(f"{smx / serial:.2f}x" if smx and serial else "-")
        row.append(f"{(smx - serial) * 1e3:+.0f} ms" if smx is not None and serial else "-")
        lines.append(row)
        hand = values.get("hand-fork")
        if smx and hand:
            notes.append(
                f"{workload.name}: smartexec {seconds(smx)} s, the hand-written fork pool "
                f"{seconds(hand)} s: {smx / hand:.2f}x"
            )
        accuracy = prediction_note(workload, by.get("smartexec", []))
        if accuracy:
            notes.append(accuracy)
        threads = values.get("threads")
        if workload.kind.startswith("submit") and smx and threads:
            n = workload.items(params)
            notes.append(
                f"{workload.name}: per call, threads {threads / n * 1e6:.1f} us, smartexec "
                f"{smx / n * 1e6:.1f} us: {smx / threads:.2f}x ThreadPoolExecutor"
            )
        for runs in by.values():
            for r in runs:
                if r.error:
                    notes.append(
                        f"{workload.name} / {r.contender} (round {r.round + 1}): {r.error}"
                    )
                if r.timeout:
                    notes.append(f"{workload.name} / {r.contender}: timed out, not run again")
                if r.leftover_processes or r.leftover_shm:
                    notes.append(
                        f"{workload.name} / {r.contender} (round {r.round + 1}) left "
                        f"{r.leftover_processes} processes and /dev/shm {r.leftover_shm} "
                        f"(removed)"
                    )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in lines]
    out.append("")
    out.append(f"seconds: median of {n_rounds} fresh-process runs (executor creation to the end")
    out.append("of its with block); process: the better of chunksize 1 and len/(4 x workers);")
    out.append("best: the fastest contender other than smartexec, the serial loop included.")
    smart = [r for r in results if r.contender == "smartexec"]
    if smart:
        out.append("")
        out.append("smartexec routes (backends that ran items, per round):")
    for workload in rows:
        runs = [r for r in smart if r.workload == workload.name]
        if runs:
            out.append(f"  {workload.name:13} " + " | ".join(route_text(r) for r in runs))
    if notes:
        out.append("")
        out.append("notes:")
        out += [f"  {n}" for n in notes]
    return "\n".join(out)


def stability_report(results: list[Run], rows: list[cw.Workload]) -> str:
    out = ["smartexec stability (each run a fresh process):"]
    agreed = 0
    later_agreed = 0  # runs after the first: each started from the same stored profile
    ended_agreed = 0  # the backend each run ended on (a first-ever run may start elsewhere)
    for workload in rows:
        runs = [r for r in results if r.workload == workload.name]
        keys = [route_key(r) for r in runs]
        counts = {k: keys.count(k) for k in dict.fromkeys(keys)}
        agreed += len(counts) == 1 and "?" not in counts
        later = set(keys[1:])
        later_agreed += len(later) <= 1 and "?" not in later
        ends = {k.split(" > ")[-1] for k in keys}
        ended_agreed += len(ends) == 1 and "?" not in ends
        verdict = (
            f"all {len(runs)} agree"
            if len(counts) == 1
            else "DIFFER: " + ", ".join(f"{n} x {k}" for k, n in counts.items())
        )
        out.append(f"  {workload.name:13} {verdict}")
        for r in runs:
            wall = "fails" if r.wall_s is None else f"{r.wall_s:.3f} s"
            out.append(f"    run {r.round + 1}: {wall:>9}  {route_text(r)}")
            decisions = r.routes.get("decisions")
            if decisions:
                out.append(f"           decisions: {', '.join(decisions)}")
    out.append(f"the same route in every run on {agreed} of {len(rows)} workloads")
    out.append(
        f"the same route in every run after the first on {later_agreed} of {len(rows)} "
        f"workloads (with profiles kept, each of those starts from the first run's)"
    )
    out.append(
        f"the same backend at the end of every run on {ended_agreed} of {len(rows)} "
        f"workloads (a first-ever run measures, later ones start from its profile)"
    )
    return "\n".join(out)


def machine(args: argparse.Namespace, params: cw.Params, have: set[str]) -> str:
    version = _header.version
    commit = _header.commit(HERE)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"machine: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
        f"{platform.machine()}, load average {load}",
        f"python {platform.python_version()} ({sys.executable}), numpy {version('numpy')}, "
        f"smartexec {version('smartexec')} @ {commit}, joblib {version('joblib')}, "
        f"mpire {version('mpire')}",
        f"python_loop: {params.loop_per_s / 1e6:.1f} M iterations/s; sha256 of 4 MiB: "
        f"{1e3 / params.sha_per_s:.2f} ms (--calibration "
        f"{params.loop_per_s:.4g},{params.sha_per_s:.4g} repeats these sizes)",
        f"scale {params.scale}{' (quick)' if params.quick else ''}, "
        + (f"stability {args.stability}" if args.stability else f"rounds {args.rounds}")
        + ", "
        f"timeout {args.timeout:g} s, competing busy loop: {'yes' if args.compete else 'no'}, "
        f"SMARTEXEC_CACHE={os.environ.get('SMARTEXEC_CACHE', '(unset)')}",
    ]
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------


def warm_bytecode() -> None:
    """Compile smartexec and the contenders' packages once, before any timing."""
    import compileall
    import importlib.util

    for name in ("smartexec", "loky", "cloudpickle", "joblib", "mpire", "threadpoolctl", "tqdm"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                compileall.compile_dir(folder, quiet=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh runs per cell (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the item counts")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: scale 0.1, big data 10x smaller"
    )
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument(
        "--stability",
        type=int,
        nargs="?",
        const=5,
        default=0,
        metavar="N",
        help="run smartexec alone, N fresh runs per workload (default 5), and compare routes",
    )
    parser.add_argument(
        "--compete", action="store_true", help="a CPU-bound busy loop runs beside the benchmark"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds before a run is killed"
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="set SMARTEXEC_CACHE=0 in the runs (no profile from an earlier run)",
    )
    parser.add_argument(
        "--contenders",
        default="",
        help="comma-separated contenders to run (default all): " + ", ".join(ALL_CONTENDERS),
    )
    parser.add_argument(
        "--calibration",
        metavar="LOOP,SHA",
        help="python_loop iterations/s and sha256 blocks/s to size the work with, instead of "
        "measuring them (the header prints this run's: two runs then do the same work)",
    )
    parser.add_argument("--json", help="also write every run's raw result to this file")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in cw.BY_NAME]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(cw.BY_NAME)}")
    rows = [cw.BY_NAME[n] for n in names] if names else list(cw.WORKLOADS)
    picked = {c for c in args.contenders.split(",") if c}
    if picked - set(ALL_CONTENDERS):
        parser.error(
            f"unknown contender(s) {sorted(picked - set(ALL_CONTENDERS))}; "
            f"choose from {', '.join(ALL_CONTENDERS)}"
        )
    scale = args.scale * (0.1 if args.quick else 1.0)

    calibration = None
    if args.calibration:
        try:
            loop_rate, sha_rate = (float(x) for x in args.calibration.split(","))
        except ValueError:
            parser.error(f"--calibration takes two numbers, LOOP,SHA; not {args.calibration!r}")
        if loop_rate <= 0 or sha_rate <= 0:
            parser.error("--calibration figures must be positive")
        calibration = (loop_rate, sha_rate)

    have = {lib for lib in ("joblib", "mpire") if importlib.util.find_spec(lib) is not None}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    # As on a user's machine, compiled modules are cached: without it every
    # fresh process compiles each module it imports, inside the timed block
    # for anything imported lazily (a backend, a contender's worker code).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    warm_bytecode()
    if args.no_cache:
        env["SMARTEXEC_CACHE"] = "0"
    signal.signal(signal.SIGTERM, _sigterm)

    results: list[Run] = []
    header = "(not measured yet)"
    try:
        # Sized before the competitor starts: the same work with and without it.
        loop_per_s, sha_per_s = calibration or cw.calibrate()
        params = cw.Params(scale, args.quick, loop_per_s, sha_per_s)
        header = machine(args, params, have)
        with competing(args.compete):
            print(header, flush=True)
            missing = sorted({"joblib", "mpire"} - have)
            if missing:
                print(f"(not installed, not run: {', '.join(missing)})", flush=True)
            print(flush=True)
            cpus = os.cpu_count() or 1
            sizes = {w.name: w.items(params) for w in rows}
            if args.stability:
                plans = {w.name: ["smartexec"] for w in rows}
                n_rounds = args.stability
            else:
                plans = {w.name: contenders(w, sizes[w.name], cpus, have) for w in rows}
                if picked:
                    plans = {name: [c for c in plan if c in picked] for name, plan in plans.items()}
                n_rounds = args.rounds
            dropped: set[tuple[str, str]] = set()
            for r in range(n_rounds):
                for workload in rows:
                    plan = plans[workload.name]
                    order = plan[r % len(plan) :] + plan[: r % len(plan)]
                    done = []
                    for contender in order:
                        if (workload.name, contender) in dropped:
                            continue
                        spec = {
                            "workload": workload.name,
                            "contender": contender,
                            "round": r,
                            "params": asdict(params),
                        }
                        run = run_child(spec, args.timeout, env)
                        results.append(run)
                        if run.timeout:
                            dropped.add((workload.name, contender))
                        done.append(
                            f"{contender} "
                            + (
                                "timeout"
                                if run.timeout
                                else "fails"
                                if run.wall_s is None
                                else seconds(run.wall_s)
                            )
                        )
                    print(
                        f"round {r + 1}/{n_rounds} {workload.name}: {', '.join(done)}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"machine": header, "argv": sys.argv[1:], "runs": [asdict(r) for r in results]},
                    f,
                    indent=1,
                )
    print()
    if args.stability:
        print(stability_report(results, rows))
    else:
        print(table(results, rows, plans, n_rounds, params))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: the runs so far are lost (--json keeps them)", file=sys.stderr)
        sys.exit(130)
