"""How often smartexec gives a wrong result where ProcessPoolExecutor is right (issue 32).

The shapes of ``tests/scenarios/_never_wrong_workloads.py`` keep a value in
state that calls share inside one process (a scratch numpy buffer, dict,
bytearray or ``global``, ``os.environ``, the working directory, the global
random generators, the argument array), each beside a sleep, a hash or a
numpy call so that it looks like work for threads; two thread-safe controls
(``const_read``, ``pure_hash``) sit beside them. In worker processes every
call is right and the caller's state is untouched; on threads, or in the
caller's process, they are not.

Each cell (shape x API: ``map``, ``map(ordered=False)``, many ``submit``,
``joblib.Parallel(n_jobs=2)`` under the ``"smartexec"`` backend) runs
``--runs`` times, each run in a fresh interpreter with a default
``SmartExecutor()``. Runs come in pairs: the first with an empty profile
store (a new ``SMARTEXEC_CACHE_DIR``), the second with the store the first
left (``submit`` and joblib keep no profile of their own, so each run of
theirs also maps the function once after its checked run). A run is wrong
when any result differs from the item computed alone in a fresh state, when
it raises, or when it changes the caller's ``os.environ``, working directory,
random generators or argument array. A run that times out or prints no
outcome is counted apart ("no outcome").

The table gives, per shape, API and store, the wrong runs out of the runs,
the backends smartexec's decisions named, and one example of the wrongness;
then the total "wrong results: X of Y runs". The exit status is 0 whatever
the counts: it is a report.

Run: ``python benchmarks/bench_wrong_results.py [--runs 20] [--only environ,chdir]
[--apis map,submit] [--timeout 60] [--json out.json]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import _header  # noqa: E402

from tests.scenarios import _never_wrong_workloads as nw  # noqa: E402

STORES = ("empty", "kept")


@dataclass
class Run:
    """One fresh interpreter's run of one cell."""

    shape: str
    api: str
    store: str
    index: int
    outcome: dict[str, Any] | None = None
    failure: str | None = None  # no outcome: timeout, crash
    wall_s: float = 0.0
    kept_profiles: int = 0  # files in the store before the run

    @property
    def wrong(self) -> bool:
        return self.outcome is not None and bool(self.outcome.get("is_wrong"))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_child(
    shape: str, api: str, store_dir: str, timeout_s: float
) -> tuple[dict | None, str | None]:
    """Run one cell in a fresh interpreter with ``store_dir`` as its store.

    Returns:
        The cell's outcome (the first JSON line), or None and why not.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["SMARTEXEC_CACHE_DIR"] = store_dir
    env.pop("SMARTEXEC_CACHE", None)
    argv = [sys.executable, "-m", "tests.scenarios._never_wrong_workloads", shape]
    argv += nw.earlier_run_apis(api)
    # Files, not pipes: a leftover worker holding a pipe would keep us waiting.
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen(
            argv, stdout=out_f, stderr=err_f, text=True, cwd=ROOT, env=env, start_new_session=True
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # on Ctrl-C too: the child and its workers go
            _kill_group(proc.pid)
            proc.wait()
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if timed_out:
        return None, f"timed out after {timeout_s:g} s"
    for line in out.splitlines():
        if line.startswith(nw.MARKER):
            return json.loads(line[len(nw.MARKER) :]), None
    tail = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return None, f"no outcome (exit status {proc.returncode}): {tail}"[:300]


def _profile_files(store_dir: str) -> int:
    try:
        return sum(name.endswith(".json") for name in os.listdir(store_dir))
    except OSError:
        return 0


def run_cell(shape: str, api: str, runs: int, timeout_s: float, work: str) -> list[Run]:
    """``runs`` fresh runs of a cell: pairs of an empty store, then the store it left."""
    done: list[Run] = []
    store_dir = ""
    for i in range(runs):
        store = STORES[i % 2]
        if store == "empty":
            store_dir = tempfile.mkdtemp(prefix=f"store-{shape}-{api}-", dir=work)
        run = Run(shape, api, store, i, kept_profiles=_profile_files(store_dir))
        start = time.perf_counter()
        run.outcome, run.failure = run_child(shape, api, store_dir, timeout_s)
        run.wall_s = time.perf_counter() - start
        done.append(run)
    return done


@dataclass
class Row:
    shape: str
    api: str
    store: str
    runs: list[Run] = field(default_factory=list)

    def cells(self) -> list[str]:
        n = len(self.runs)
        wrong = sum(r.wrong for r in self.runs)
        failed = sum(r.outcome is None for r in self.runs)
        backends = collections.Counter(
            " > ".join(r.outcome.get("backends") or ["?"]) for r in self.runs if r.outcome
        )
        seen = ", ".join(f"{b}" if c == n else f"{b} x{c}" for b, c in backends.most_common(3))
        example = next((_wrongness(r.outcome) for r in self.runs if r.wrong and r.outcome), "")
        control = " (control)" if nw.BY_NAME[self.shape].safe else ""
        return [
            self.shape + control,
            self.api,
            self.store,
            f"{wrong} of {n}",
            str(failed) if failed else "",
            seen or "-",
            example,
        ]


def _wrongness(outcome: dict[str, Any]) -> str:
    """A short account of one wrong run: how many results, what of the caller changed."""
    parts = []
    if outcome.get("wrong"):
        parts.append(f"{outcome['wrong']}/{outcome['items']} results")
    for change in outcome.get("caller") or []:
        parts.append(change.split(" (")[0].split(" to ")[0])
    if outcome.get("error"):
        parts.append(f"raised {outcome['error'][:60]}")
    return "; ".join(parts)


def table(rows: list[Row]) -> str:
    head = ["shape", "API", "store", "wrong runs", "no outcome", "backends", "e.g."]
    lines = [row.cells() for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head).rstrip(), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line).rstrip() for line in lines]
    runs = [r for row in rows for r in row.runs]
    wrong = sum(r.wrong for r in runs)
    failed = sum(r.outcome is None for r in runs)
    out.append("")
    out.append(f"wrong results: {wrong} of {len(runs)} runs")
    controls = [r for r in runs if nw.BY_NAME[r.shape].safe]
    if controls:
        out.append(
            f"  of which controls (thread-safe work): {sum(r.wrong for r in controls)} of "
            f"{len(controls)} runs"
        )
    if failed:
        out.append(f"no outcome (timed out or crashed, not counted as wrong): {failed} runs")
        for r in runs:
            if r.failure:
                out.append(f"  {r.shape}/{r.api}/{r.store} run {r.index + 1}: {r.failure}")
    kept = [r for r in runs if r.store == "kept"]
    unprimed = sum(r.kept_profiles == 0 for r in kept)
    if unprimed:
        out.append(f"note: {unprimed} of {len(kept)} 'kept' runs found no profile in the store")
    return "\n".join(out)


def machine(args: argparse.Namespace) -> str:
    version = _header.version
    commit = _header.commit(HERE)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            f"machine: {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), "
            f"{platform.machine()}, load average {load}",
            f"python {platform.python_version()} ({sys.executable}), numpy {version('numpy')}, "
            f"smartexec {version('smartexec')} @ {commit}, joblib {version('joblib')}",
            f"{args.runs} fresh-interpreter runs per cell ({(args.runs + 1) // 2} with an empty "
            f"store, {args.runs // 2} with the store the run before left), "
            f"{nw.N_ITEMS} items a map, timeout {args.timeout:g} s",
        ]
    )


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="fresh runs per cell (default 20)")
    parser.add_argument("--only", default="", help="comma-separated shape names")
    parser.add_argument("--apis", default="", help=f"comma-separated APIs ({', '.join(nw.APIS)})")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a run is killed"
    )
    parser.add_argument("--json", help="also write every run's outcome to this file")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    shapes = [s for s in args.only.split(",") if s] or [s.name for s in nw.SHAPES]
    unknown = [s for s in shapes if s not in nw.BY_NAME]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {', '.join(nw.BY_NAME)}")
    apis = [a for a in args.apis.split(",") if a] or list(nw.APIS)
    if set(apis) - set(nw.APIS):
        parser.error(f"unknown API(s) {sorted(set(apis) - set(nw.APIS))}; choose from {nw.APIS}")
    signal.signal(signal.SIGTERM, _sigterm)

    print(machine(args), flush=True)
    print(flush=True)
    rows: list[Row] = []
    work = tempfile.mkdtemp(prefix="bench-wrong-results-")
    try:
        for shape in shapes:
            for api in apis:
                runs = run_cell(shape, api, args.runs, args.timeout, work)
                for store in STORES:
                    mine = [r for r in runs if r.store == store]
                    if mine:
                        rows.append(Row(shape, api, store, mine))
                wrong = sum(r.wrong for r in runs)
                seconds = sum(r.wall_s for r in runs)
                print(
                    f"{shape}/{api}: {wrong} of {len(runs)} runs wrong ({seconds:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    except KeyboardInterrupt:
        print("\ninterrupted: the table covers the cells finished", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"argv": sys.argv[1:], "runs": [asdict(r) for row in rows for r in row.runs]},
                    f,
                    indent=1,
                )
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
