"""Issue 32: shared memory under the process's limits, each in a child interpreter.

A process that is not dumpable, a low ``ulimit -n``, an address-space limit:
each child sets its own limits, so this test process keeps its own.
"""

from __future__ import annotations

import re

import pytest

from .._children import run_python

pytestmark = pytest.mark.timeout(180)


NOT_DUMPABLE = """
import ctypes, os, sys
import numpy as np
from smartexec import SmartExecutor, _shm

libc = ctypes.CDLL(None, use_errno=True)


class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class Data(ctypes.Structure):
    _fields_ = [(field, ctypes.c_uint32) for field in ("effective", "permitted", "inheritable")]


def drop_cap_sys_ptrace():
    # Root keeps CAP_SYS_PTRACE, which opens any /proc/<pid>/fd whatever the
    # dumpable flag: drop it, from this process and from what it will exec.
    CAP_SYS_PTRACE, PR_CAPBSET_DROP = 19, 24
    libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0)
    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) == 0:
        data[0].effective &= ~(1 << CAP_SYS_PTRACE)
        data[0].permitted &= ~(1 << CAP_SYS_PTRACE)
        libc.capset(ctypes.byref(header), data)


def peers_hidden():
    # What the report saw: a forked child's /proc/<pid>/fd cannot be opened.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # until the parent closes its end
        os._exit(0)
    try:
        os.close(os.open(f"/proc/{{pid}}/fd/{{r}}", os.O_RDONLY))
        return False
    except PermissionError:
        return True
    finally:
        os.close(w)
        os.waitpid(pid, 0)
        os.close(r)


assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0, as a daemon that drops privileges
if os.geteuid() == 0:
    drop_cap_sys_ptrace()
if not peers_hidden():
    print("visible")
    sys.exit(0)
with SmartExecutor(2, backend={backend!r}) as ex:
    results = list(ex.map(np.ones, [300_000] * 4))  # 2.4 MB results
    arrays = [np.full(300_000, i, dtype=np.float64) for i in range(4)]
    sums = list(ex.map(np.sum, arrays))  # 2.4 MB arguments
print("results", sorted({{float(r.sum()) for r in results}}), [float(s) for s in sums])
"""


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_process_that_is_not_dumpable_sends_big_arguments_and_results(backend):
    """Issue 32: every buffer above the threshold failed with "Permission denied".

    Reproduced for real: the child calls ``prctl(PR_SET_DUMPABLE, 0)`` and,
    as root, drops ``CAP_SYS_PTRACE`` (with which root opens any process's
    descriptors), then checks that a forked child's ``/proc/<pid>/fd`` is
    hidden before it maps. Its fork workers inherit the flag.
    ``ProcessPoolExecutor`` works there: so must we.
    """
    result = run_python(NOT_DUMPABLE.format(backend=backend), timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.strip() == "visible":
        pytest.skip("cannot hide /proc/<pid>/fd here (CAP_SYS_PTRACE cannot be dropped)")
    assert "results [300000.0] [0.0, 300000.0, 600000.0, 900000.0]" in result.stdout, (
        result.stdout + result.stderr
    )


KEPT_RESULTS = """
import os, resource
import numpy as np
from smartexec import SmartExecutor
from tests.scenarios.test_shm_limits import one_mib

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
with SmartExecutor(2, backend="fork") as ex:
    kept = list(ex.map(one_mib, range(100)))
    first = len(os.listdir("/proc/self/fd"))
    kept += list(ex.map(one_mib, range(100, 400)))
    last = len(os.listdir("/proc/self/fd"))
assert all(a.nbytes == 1 << 20 and a[0] == a[-1] == i for i, a in enumerate(kept))
print("kept", len(kept), "descriptors", first, last)
"""


def one_mib(i):
    """An array of exactly 1 MiB (the shared-memory threshold), all ``i``."""
    import numpy as np

    return np.full((1 << 20) // 8, i, dtype=np.float64)


def test_kept_results_hold_no_descriptor_each():
    """Issue 32: before Python 3.13 each kept result of 1 MiB or more held an open file.

    1,100 kept results failed with EMFILE under the usual limit of 1024;
    here 400 under a limit of 256, and the count of open files does not
    grow from 100 kept results to 400.
    """
    result = run_python(KEPT_RESULTS, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"kept 400 descriptors (\d+) (\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    first, last = int(found.group(1)), int(found.group(2))
    assert last <= first, result.stdout


OUT_OF_FILES = """
import os, resource, time
import numpy as np
from smartexec import SmartExecutor

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
with SmartExecutor(2, backend="fork") as ex:
    list(ex.map(time.sleep, [0.2] * 4))  # both workers up: the pool needs no new file
    assert ex.submit(np.ones, 1 << 17).result().sum() == 1 << 17
    fillers = []
    try:
        while True:  # this process uses up its open files, as a leaky program would
            fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        error = ex.submit(np.ones, 1 << 17).exception(timeout=60)
    finally:
        for fd in fillers:
            os.close(fd)
    print(type(error).__name__, error)
    print("then", ex.submit(np.ones, 1 << 17).result().sum())
"""

OUT_OF_ADDRESS_SPACE = """
import resource, time
import numpy as np
from smartexec import SmartExecutor

with SmartExecutor(2, backend="fork") as ex:
    list(ex.map(time.sleep, [0.2] * 4))  # both workers up, forked without the limit
    assert ex.submit(np.ones, 1 << 17).result().sum() == 1 << 17
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), hard))  # ulimit -v
    try:
        error = ex.submit(np.ones, 32 << 20).exception(timeout=60)  # a 256 MiB result
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print(type(error).__name__, error)
    print("then", ex.submit(np.ones, 1 << 17).result().sum())
"""


@pytest.mark.parametrize(
    "child, names",
    [
        (OUT_OF_FILES, ["RLIMIT_NOFILE soft limit is 256", "ulimit -n 4096"]),
        (OUT_OF_ADDRESS_SPACE, ["out of memory", "RLIMIT_AS"]),
    ],
    ids=["descriptors", "address-space"],
)
def test_running_out_while_mapping_a_result_names_the_resource(child, names):
    """Issue 32: EMFILE or ENOMEM while mapping a numpy result said "return plain data"."""
    result = run_python(child, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    message = result.stdout
    assert message.startswith("WorkerProtocolError"), message + result.stderr
    assert all(name in message for name in names), message
    assert "plain data" not in message, message
    assert "then 131072.0" in message, message  # only that call failed


UNDER_ULIMIT = """
import resource, re
import numpy as np
from smartexec import SmartExecutor

resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    with SmartExecutor({workers}, backend="fork") as ex:
        print("ok", sum(float(a.sum()) for a in ex.map(np.ones, [300_000] * 8)))
except ValueError as refused:
    print("refused", refused)
    advised = re.search(r"max_workers to at most (\\d+)", str(refused))
    if advised:
        with SmartExecutor(int(advised.group(1)), backend="fork") as ex:
            print("advice ok", sum(float(a.sum()) for a in ex.map(np.ones, [300_000] * 8)))
"""


def test_two_fork_workers_run_under_ulimit_64():
    """Issue 32: under ``ulimit -n 64`` a pool of two was refused; ProcessPoolExecutor(2) runs."""
    result = run_python(UNDER_ULIMIT.format(limit=64, workers=2), timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok 2400000.0" in result.stdout, result.stdout + result.stderr


def test_a_refusal_for_open_files_names_the_limit_and_advice_that_works():
    """Issue 32: the refusal advised ``max_workers=1``, which was refused too."""
    result = run_python(UNDER_ULIMIT.format(limit=32, workers=64), timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refused" in result.stdout and "RLIMIT_NOFILE" in result.stdout, result.stdout
    assert "32" in result.stdout.split("refused", 1)[1], result.stdout
    assert "advice ok 2400000.0" in result.stdout, result.stdout + result.stderr
