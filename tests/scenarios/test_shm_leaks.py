"""Issue 5: no shared-memory segment outlives its use, however the run ends.

Every test here also runs under conftest's ``no_leaks`` fixture, which fails
a test that leaves any new /dev/shm entry of ours behind. The child
interpreter tests check the child's own segments (``smx_<child pid>_*``)
after it has exited, and that the stdlib resource tracker had nothing to
warn about.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from smartexec import SmartExecutor, WorkerCrashedError, _shm
from smartexec.errors import WorkerProtocolError

from .._children import run_python

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
BACKENDS = ["fork", "loky"]


def total(a):
    return float(a.sum())


def slow_total(a, seconds=0.2):
    time.sleep(seconds)
    return float(a.sum())


def die_holding_a_result(a, i, owner):
    """Make a result segment for ``owner``, as a reply would, then die before sending it.

    ``owner`` is the executor's pid (a fork worker's parent is its pool's zygote).
    """
    if i == 3:
        _shm.create(memoryview(np.ones(MiB)), owner=owner)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    return float(a.sum()) + i


def segments_of(pid: int) -> list[str]:
    prefix = f"{_shm.PREFIX}{pid}_"
    return sorted(n for n in os.listdir(_shm.SHM_DIR) if n.startswith(prefix))


def wait_until_gone(pid: int, within: float = 10.0) -> list[str]:
    deadline = time.monotonic() + within
    left = segments_of(pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = segments_of(pid)
    return left


@pytest.mark.parametrize("backend", BACKENDS)
def test_normal_shutdown_unlinks_everything(backend):
    arrays = [np.full(2 * MiB // 8, i, dtype=np.float64) for i in range(8)]
    model_weights = np.ones(4 * MiB // 8)

    def score(i):  # a closure over a big array: cached on loky
        return float(model_weights[i])

    with SmartExecutor(2, backend=backend) as ex:
        list(ex.map(total, arrays, chunksize=1))
        list(ex.map(total, [arrays[0]] * 6, chunksize=2))  # cached while it is repeated
        list(ex.map(score, range(10)))
        assert segments_of(os.getpid())  # cached copies live until shutdown
    assert segments_of(os.getpid()) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sigkilled_worker_leaves_no_segment(backend):
    a = np.ones(2 * MiB // 8)
    with SmartExecutor(2, backend=backend) as ex:
        futures = [ex.submit(die_holding_a_result, a, i, os.getpid()) for i in range(8)]
        errors = [f.exception(timeout=60) for f in futures]
        assert errors[3] is not None
        if backend == "fork":
            assert isinstance(errors[3], WorkerCrashedError)
            assert [e is None for e in errors].count(True) == 7
        # the result segment the dead worker made is gone already
        assert not [n for n in segments_of(os.getpid()) if "_w" in n]
        assert ex.submit(total, a).result(timeout=60) == a.size  # still usable
    assert segments_of(os.getpid()) == []


def test_a_reply_whose_segment_vanished_fails_only_its_chunk(monkeypatch):
    from smartexec import transport

    real = transport.loads_reply

    def lose_segments(data):
        for name, _ in transport._split(data)[1]:
            _shm.unlink(name)
        return real(data)

    monkeypatch.setattr(transport, "loads_reply", lose_segments)
    with SmartExecutor(2, backend="fork") as ex:
        error = ex.submit(np.ones, 2 * MiB // 8).exception(timeout=60)
        # What ProcessPoolExecutor reports for a reply it cannot unpickle.
        assert isinstance(error, WorkerProtocolError) and "could not be unpickled" in str(error)
        monkeypatch.setattr(transport, "loads_reply", real)
        assert ex.submit(total, np.ones(10)).result(timeout=60) == 10.0


CHILD = """
import os, signal, sys, threading, time
import numpy as np
from smartexec import SmartExecutor
from tests.scenarios.test_shm_leaks import slow_total

print(os.getpid(), flush=True)
arrays = [np.full(2 * 1024 * 1024 // 8, i, dtype=np.float64) for i in range(40)]
weights = np.ones(4 * 1024 * 1024 // 8)

def score(i):
    return float(weights[i])

ex = SmartExecutor(2, backend={backend!r})
ex.submit(score, 1).result()  # a cached closure (loky) or a shared one (fork)
{ending}
"""

ENDINGS = {
    # Ctrl-C while a map with big arguments is in flight
    "keyboard_interrupt": """
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
for value in ex.map(slow_total, arrays, chunksize=1):
    pass
""",
    # the script ends with chunks in flight and the executor never shut down
    "no_shutdown": """
futures = [ex.submit(slow_total, a, 0.05) for a in arrays[:10]]
it = ex.map(slow_total, arrays, chunksize=1)
next(it)
""",
    # sys.exit from the middle of a map
    "sys_exit": """
for i, value in enumerate(ex.map(slow_total, arrays, chunksize=1)):
    if i == 2:
        sys.exit(3)
""",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_no_segment_survives_the_parent(backend, ending):
    result = run_python(CHILD.format(backend=backend, ending=ENDINGS[ending]), timeout=90)
    pid = int(result.stdout.split()[0])
    if ending == "keyboard_interrupt":
        assert "KeyboardInterrupt" in result.stderr
    else:
        assert result.returncode == (3 if ending == "sys_exit" else 0), result.stderr
    assert wait_until_gone(pid) == [], result.stderr
    assert "leaked shared_memory" not in result.stderr, result.stderr
    assert "resource_tracker" not in result.stderr, result.stderr


def test_a_killed_parent_is_cleaned_up_by_the_resource_tracker():
    """SIGKILL leaves no exit hook to run: the stdlib tracker unlinks the parent's segments."""
    result = run_python(
        CHILD.format(
            backend="fork",
            ending="""
futures = [ex.submit(slow_total, a, 1.0) for a in arrays[:4]]
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
""",
        ),
        timeout=90,
    )
    assert result.returncode == -signal.SIGKILL
    pid = int(result.stdout.split()[0])
    # fork workers notice their parent is gone within a second or so (their
    # sleeping tasks finish first); the tracker then sees the last writer go
    assert wait_until_gone(pid, within=20) == []
