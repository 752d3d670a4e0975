"""Issue 32: shared memory under the process's limits, each in a child interpreter.

A process that is not dumpable, a low ``ulimit -n``, an address-space limit:
each child sets its own limits, so this test process keeps its own.
"""

from __future__ import annotations

import re

import pytest

from .._children import run_python

pytestmark = pytest.mark.timeout(180)


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
