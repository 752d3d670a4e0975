"""Issue 32, "Never a wrong answer": what is right on ProcessPoolExecutor is right on smartexec.

Each shape of ``_never_wrong_workloads`` keeps a value in state that calls
share inside one process (a scratch buffer, dict, bytearray or ``global``,
``os.environ``, the working directory, the global random generators, the
argument array) and also sleeps, hashes or calls numpy, so that it looks
like work for threads. Run by a ``ProcessPoolExecutor`` each is right and
leaves the caller as it was. The matrix runs every shape through every API
(``map``, ``map(ordered=False)``, many ``submit``, the joblib backend) of a
default ``SmartExecutor()``, once with an empty profile store and once with
the store a first run in another interpreter kept (``submit`` and joblib
keep no profile of their own: that first run also maps the function), and checks every result
against the item computed alone, and that the caller's ``os.environ``, working
directory, random generators and argument array are unchanged. Two
thread-safe controls must stay right too. No timings are asserted.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from smartexec import SmartExecutor, gil

from .. import _children
from . import _never_wrong_workloads as nw

pytestmark = pytest.mark.timeout(90)

STORES = ("empty", "kept")


@pytest.fixture(autouse=True)
def fresh_measurements():
    """No GIL measurement kept in this process from an earlier test: only the store's."""
    gil.forget()
    yield
    gil.forget()


def _first_run_in_a_child(shape: str, api: str, store) -> dict:
    """The same cell in a fresh interpreter, with the test's store: it keeps a profile there.

    ``submit`` and joblib keep no profile of their own: their first run maps
    the function too (``nw.earlier_run_apis``). Returns the cell's outcome there.
    """
    code = f"""
        import sys
        from tests.scenarios._never_wrong_workloads import main
        sys.exit(main({[shape, *nw.earlier_run_apis(api)]!r}))
    """
    assert os.environ["SMARTEXEC_CACHE_DIR"] == str(store)  # the child inherits it
    done = _children.run_python(code, timeout=60)
    assert done.returncode == 0, f"the first run failed:\n{done.stdout}\n{done.stderr}"
    lines = [line for line in done.stdout.splitlines() if line.startswith(nw.MARKER)]
    assert lines, f"the first run printed no outcome:\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[0][len(nw.MARKER) :])


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("api", nw.APIS)
@pytest.mark.parametrize("shape", [s.name for s in nw.SHAPES])
def test_results_are_those_of_each_item_alone(shape, api, store, profile_store, tmp_path):
    if store == "kept":
        first = _first_run_in_a_child(shape, api, profile_store)
        assert os.listdir(profile_store), (
            f"the first run kept no profile in the store (it ran: {first})"
        )
    outcome = nw.run_cell(shape, api, str(tmp_path))
    print(outcome.describe(), file=sys.stderr)
    assert outcome.error is None, outcome.describe()
    assert outcome.wrong == 0, outcome.describe()
    assert outcome.caller == [], outcome.describe()


@pytest.mark.parametrize("shape", [s.name for s in nw.SHAPES])
def test_explain_runs(shape, tmp_path):
    spec = nw.BY_NAME[shape]
    with SmartExecutor() as ex:
        decision = ex.explain(spec.fn, nw.sample_arg(spec, str(tmp_path)))
    assert str(decision)
