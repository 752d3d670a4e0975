"""The cold benchmark's harness (benchmarks/bench_cold.py): one child run, and its clean-up.

No timing is asserted: these check that a run reports its result and routes,
and that what a run leaves behind (processes, /dev/shm entries) is found,
reported and removed, even when the run is killed on its timeout.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

import _cold_child  # noqa: E402
import _cold_workloads as cw  # noqa: E402
import bench_cold  # noqa: E402

#: A child that leaves a /dev/shm segment and two processes behind (one in
#: its own session, which a process-group kill misses), then reports or hangs.
LEAKY = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    open(f"/dev/shm/smx_{os.getpid()}_benchtest", "w").close()
    code = "import os, time; os.setsid(); open(f'/dev/shm/sem.loky-{os.getpid()}-t', 'w').close(); time.sleep(60)"
    subprocess.Popen([sys.executable, "-c", code])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.5)
    if json.loads(sys.argv[1])["contender"] == "hang":
        time.sleep(60)
    print("BENCH_COLD_RESULT " + json.dumps({"wall_s": 0.5, "digest": "d"}))
    """
)


@pytest.fixture
def leaky(tmp_path, monkeypatch):
    path = tmp_path / "leaky_child.py"
    path.write_text(LEAKY)
    monkeypatch.setattr(bench_cold, "CHILD", str(path))


def _spec(contender: str, workload: str = "sleep") -> dict:
    params = cw.Params(scale=0.05, quick=True, loop_per_s=1e7, sha_per_s=200.0)
    return {
        "workload": workload,
        "contender": contender,
        "round": 0,
        "params": dataclasses.asdict(params),
    }


def _gone(names: list[str]) -> bool:
    return not any(os.path.exists(os.path.join("/dev/shm", n)) for n in names)


@pytest.mark.timeout(60)
def test_leftovers_are_reported_and_removed(leaky):
    run = bench_cold.run_child(_spec("ok"), 30.0, dict(os.environ))
    assert run.wall_s == 0.5 and not run.timeout and run.error is None
    assert run.leftover_processes == 2
    assert len(run.leftover_shm) == 2
    assert any(n.startswith("smx_") for n in run.leftover_shm)
    assert any(n.startswith("sem.loky-") for n in run.leftover_shm)
    assert _gone(run.leftover_shm)


@pytest.mark.timeout(60)
def test_a_run_over_its_timeout_is_killed_with_its_workers(leaky):
    run = bench_cold.run_child(_spec("hang"), 2.0, dict(os.environ))
    assert run.timeout and run.wall_s is None
    assert len(run.leftover_shm) == 2 and _gone(run.leftover_shm)
    # the grandchild in the child's session went with the group kill, the one
    # in its own session by pid
    assert run.leftover_processes >= 1


@pytest.mark.timeout(120)
def test_a_real_child_reports_its_time_digest_and_smartexec_routes():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bench_cold.HERE, env.get("PYTHONPATH")) if p)
    serial = bench_cold.run_child(_spec("serial"), 60.0, env)
    smart = bench_cold.run_child(_spec("smartexec"), 60.0, env)
    assert serial.error is None and smart.error is None
    assert serial.wall_s is not None and smart.wall_s is not None
    assert smart.digest == serial.digest  # the same results
    assert sum(smart.routes["items"].values()) == 5  # sleep x 100, scale 0.05
    assert bench_cold.route_key(smart) != "?"
    assert not smart.leftover_processes and not smart.leftover_shm


@pytest.mark.timeout(60)
def test_the_settling_prediction_is_read_from_explains_own_words():
    # The benchmark checks explain()'s prediction against the run (issue 14,
    # item 8) by reading the settling decision's text: a change of wording
    # must not silently leave it with nothing to check.
    from smartexec import SmartExecutor

    # Enough chunks (16) that the map decides even if its GIL watches do not agree.
    n = 400
    with SmartExecutor(max_workers=2) as ex:
        assert list(ex.map(cw.python_loop, [20_000] * n)) == [cw.python_loop(20_000)] * n
        decisions = ex.decisions()
    predicted = _cold_child._prediction(decisions)
    text = "\n".join(map(str, decisions))
    assert predicted is not None, text
    assert predicted["route"] in ("fork", "thread", "inline", "loky"), predicted
    assert 0 < predicted["left"] < n and predicted["seconds"] > 0, predicted


def test_a_prediction_to_the_maps_end_is_read_with_its_items_in_flight():
    from smartexec._decision import Decision

    reason = (
        "measured in the workers: 40 items in 4 chunks, mean 1.0 ms per item; predicted "
        "for the 60 items not sent yet and the 12 in flight on fork: fork 0.040 s, "
        "thread 0.030 s -> the rest moves to thread (1.3x)"
    )
    predicted = _cold_child._prediction([Decision("thread", (reason,))])
    assert predicted is not None
    assert (predicted["left"], predicted["in_flight"], predicted["seconds"]) == (60, 12, 0.03)


@pytest.mark.timeout(120)
def test_a_contender_that_cannot_pickle_a_closure_fails_and_is_not_best():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bench_cold.HERE, env.get("PYTHONPATH")) if p)
    runs = [bench_cold.run_child(_spec(c, "closure"), 60.0, env) for c in ("serial", "process-1")]
    assert runs[0].error is None
    # "Can't pickle local object" (3.13: "Can't get local object")
    error = (runs[1].error or "").lower()
    assert "pickle" in error or "local object" in error, runs[1].error
    params = cw.Params(**_spec("serial")["params"])
    plans = {"closure": ["serial", "process-1"]}
    text = bench_cold.table(runs, [cw.BY_NAME["closure"]], plans, 1, params)
    row = next(line for line in text.splitlines() if line.startswith("closure"))
    assert "fails" in row and row.split()[-4] == "serial"  # the best contender


def test_contenders_per_row():
    big, sleep, submit = (cw.BY_NAME[n] for n in ("big-cheap", "sleep", "submit"))
    everything = bench_cold.contenders(big, 1000, 2, {"joblib", "mpire"})
    assert everything == list(bench_cold.ALL_CONTENDERS)
    # mpire not installed: not run; hand-fork only for a big bound object;
    # process-n only when len / (4 x workers) is more than 1
    assert bench_cold.contenders(sleep, 8, 2, {"joblib"}) == [
        "serial",
        "threads",
        "threads-64",
        "process-1",
        "joblib",
        "joblib-threads",
        "smartexec",
    ]
    assert bench_cold.contenders(submit, 20_000, 2, {"joblib", "mpire"}) == [
        "serial",
        "threads",
        "threads-64",
        "process-1",
        "smartexec",
    ]
    waits = cw.BY_NAME["submit-waits"]
    assert bench_cold.contenders(waits, 400, 2, set()) == bench_cold.contenders(
        submit, 20_000, 2, set()
    )


def test_stability_report_says_when_routes_differ():
    def run(i: int, items: dict) -> bench_cold.Run:
        return bench_cold.Run("repeated-arg", "smartexec", i, wall_s=1.0, routes={"items": items})

    runs = [
        run(0, {"inline": 5000}),
        run(1, {"inline": 776, "loky": 4224}),
        run(2, {"inline": 5000}),
    ]
    text = bench_cold.stability_report(runs, [cw.BY_NAME["repeated-arg"]])
    assert "DIFFER: 2 x inline, 1 x inline > loky" in text
    assert "inline 776 > loky 4224" in text
    assert "the same route in every run on 0 of 1 workloads" in text
    assert "every run after the first on 0 of 1 workloads" in text
    agreeing_later = [
        run(0, {"fork": 9, "thread": 91}),
        run(1, {"thread": 100}),
        run(2, {"thread": 100}),
    ]
    text = bench_cold.stability_report(agreeing_later, [cw.BY_NAME["repeated-arg"]])
    assert "the same route in every run on 0 of 1 workloads" in text
    assert "every run after the first on 1 of 1 workloads" in text
