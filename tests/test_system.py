"""The CPU count smartexec sizes pools by: affinity, cgroup quotas, and no loky import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from smartexec import _system


def _point_at(monkeypatch, tmp_path, v2=None, v1=None):
    """Make the cgroup files be ``v2`` (cpu.max's text) and ``v1`` ((quota, period))."""
    cpu_max, quota, period = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    if v2 is not None:
        cpu_max.write_text(v2)
    if v1 is not None:
        quota.write_text(v1[0])
        period.write_text(v1[1])
    monkeypatch.setattr(_system, "CGROUP_CPU_MAX", str(cpu_max))
    monkeypatch.setattr(_system, "CGROUP_V1_QUOTA", str(quota))
    monkeypatch.setattr(_system, "CGROUP_V1_PERIOD", str(period))


@pytest.mark.parametrize(
    ("v2", "v1", "expected"),
    [
        ("150000 100000\n", None, 2),  # 1.5 CPUs: rounded up
        ("max 100000\n", ("50000", "100000"), None),  # v2 says no quota: v1 is not read
        (None, ("300000", "100000"), 3),
        (None, ("-1", "100000"), None),
        (None, None, None),
        ("garbage\n", None, None),
    ],
)
def test_cgroup_cpu_limit_reads_v2_then_v1(monkeypatch, tmp_path, v2, v1, expected):
    _point_at(monkeypatch, tmp_path, v2, v1)
    assert _system.cgroup_cpu_limit() == expected


def test_usable_cpu_count_takes_the_least_limit(monkeypatch, tmp_path):
    _point_at(monkeypatch, tmp_path, v2="100000 100000")
    monkeypatch.delenv("LOKY_MAX_CPU_COUNT", raising=False)
    assert _system.usable_cpu_count() == 1
    _point_at(monkeypatch, tmp_path, v2="max 100000")
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert _system.usable_cpu_count() == expected
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert _system.usable_cpu_count() == 1


def test_creating_an_executor_does_not_import_loky():
    # Importing loky costs ~10 ms, on the way to a fork pool's first result.
    code = (
        "import sys\n"
        "from smartexec import SmartExecutor\n"
        "SmartExecutor().shutdown()\n"
        "print('loky' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_deferred_interrupts_hold_a_ctrl_c_until_the_block_ends():
    import os
    import signal
    import threading

    from smartexec._system import deferred_interrupts

    steps = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            with deferred_interrupts():  # nested: the outer one holds it
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("inner")
            steps.append("outer")
    assert steps == ["inner", "outer"]  # raised only once the block ended
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with deferred_interrupts():
        pass  # nothing held: nothing raised
    seen = []
    worker = threading.Thread(target=lambda: seen.append(deferred_interrupts().__enter__()))
    worker.start()
    worker.join()
    assert seen == [None] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
