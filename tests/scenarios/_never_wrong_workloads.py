"""Issue 32, "Never a wrong answer": functions right in processes, wrong when calls share state.

Each shape is a module-level function (so that it pickles by reference)
that keeps a value in state its calls share inside one process: a scratch
buffer, dictionary or ``global``, ``os.environ``, the working directory,
the ``random`` modules' global generators, or the argument array itself.
Each also calls numpy, hashlib or ``time.sleep``, so that it looks like work
that releases the GIL and belongs on threads. In a ``ProcessPoolExecutor``
every call runs alone in its worker and is right, and the caller's own state
is untouched; on threads the calls interleave and read each other's values,
and in the caller's process they change the caller's state.

Two controls (``const_read``, ``pure_hash``) are thread-safe: they must
stay right wherever they run.

:func:`run_cell` runs one shape through one API of a fresh default
``SmartExecutor()`` and returns what went wrong; ``tests/scenarios/
test_never_wrong.py`` asserts on it and ``benchmarks/bench_wrong_results.py``
counts it over fresh interpreters. ``python -m
tests.scenarios._never_wrong_workloads SHAPE API [API...]`` runs cells and
prints each outcome as one JSON line (what the test's and the benchmark's child
interpreters run; the repository root must be on ``sys.path``).
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Items per map: enough for routing to measure and settle on threads.
N_ITEMS = 48
#: Seconds each call sleeps between writing its state and reading it back.
PAUSE_S = 0.0015
#: Elements of the scratch buffers (small: a map's items pickle quickly).
N_SCRATCH = 4096
#: Columns of the in-place array's rows (big enough that numpy drops the GIL).
N_COLUMNS = 32768

#: The environment variable the ``environ`` shape sets.
ENV_VAR = "SMARTEXEC_NEVER_WRONG_ITEM"

#: The APIs a cell runs a shape through.
APIS = ("map", "map_unordered", "submit", "joblib")

#: What :func:`run_cell` prints before its JSON outcome, for a parent to find.
MARKER = "NEVER-WRONG-OUTCOME "


# -- the shapes: right in a worker process, wrong when calls share state ---------------

_BUF = np.zeros(N_SCRATCH)


def scratch_array(x: np.ndarray) -> float:
    """Copy the item into a module-level scratch buffer, wait, sum the buffer."""
    _BUF[:] = x
    time.sleep(PAUSE_S)
    return float(_BUF.sum())


_SCRATCH: dict[int, int] = {}


def scratch_dict(i: int) -> tuple[int, str]:
    """Fill a module-level dict for the item, hash, read the dict back."""
    for k in range(8):
        _SCRATCH[k] = i * k
    digest = hashlib.sha256(str(i).encode() * 1024).hexdigest()
    time.sleep(PAUSE_S)
    return sum(_SCRATCH.values()), digest


_BYTES = bytearray(64 * 1024)


def scratch_bytes(i: int) -> str:
    """Write the item into a module-level bytearray, wait, hash the bytearray."""
    _BYTES[:] = bytes([i % 256]) * len(_BYTES)
    time.sleep(PAUSE_S)
    return hashlib.sha256(_BYTES).hexdigest()


def environ(i: int) -> str:
    """Set an environment variable to the item, wait, read it back."""
    os.environ[ENV_VAR] = str(i)
    time.sleep(PAUSE_S)
    return os.environ[ENV_VAR]


def chdir(folder: str) -> str:
    """Change into the item's folder, wait, return the working directory."""
    os.chdir(folder)
    time.sleep(PAUSE_S)
    return os.getcwd()


def random_seed(i: int) -> float:
    """Seed ``random``'s global generator with the item, wait, draw."""
    random.seed(i)
    time.sleep(PAUSE_S)
    return random.random()


def np_random_seed(i: int) -> float:
    """Seed numpy's global generator with the item, wait, draw."""
    np.random.seed(i)
    time.sleep(PAUSE_S)
    return float(np.random.rand())


_LAST = 0


def global_counter(i: int) -> int:
    """Keep the item in a ``global``, wait, return twice the global."""
    global _LAST
    _LAST = i
    time.sleep(PAUSE_S)
    return _LAST * 2


def inplace(row: np.ndarray) -> float:
    """``log1p`` of the argument row, written into the row itself; its sum."""
    np.log1p(row, out=row)
    return float(row.sum())


class _Accumulator:
    """A worker object whose method keeps the item in ``self`` (reached by subscript: unresolved)."""

    def __init__(self) -> None:
        self.total = np.zeros(N_SCRATCH)

    def run(self, i: int) -> float:
        self.total[:] = i
        time.sleep(PAUSE_S)
        return float(self.total.sum())


_POOL = [_Accumulator()]


def method_by_name(i: int) -> float:
    """Call a method of an object kept in a module-level list: its writes to ``self`` are shared."""
    return _POOL[0].run(i)


_TEMPLATE = np.zeros(N_SCRATCH)


def shifts_its_argument(base: np.ndarray) -> float:
    """Add 1 to the argument in place (every item is the same template array), wait, sum it."""
    base += 1.0
    time.sleep(PAUSE_S)
    return float(base.sum())


RUN_ID: contextvars.ContextVar[str] = contextvars.ContextVar("RUN_ID", default="unset")
RUN_ID.set("run-32")  # set once by the program, as a worker process inherits it


def run_label(i: int) -> str:
    """Read a context variable the program set at start-up, wait, label the item with it."""
    time.sleep(PAUSE_S)
    return f"{RUN_ID.get()}/{i}"


# -- controls: thread-safe, right anywhere ----------------------------------------------

_CONST = np.linspace(0.0, 1.0, 1 << 18)


def const_read(i: int) -> float:
    """Read a module-level constant array and compute on a new one."""
    return float(np.multiply(_CONST, i).sum())


def pure_hash(data: bytes) -> str:
    """sha256 of the argument alone."""
    return hashlib.sha256(data).hexdigest()


# -- items and reference answers --------------------------------------------------------


def _values(root: str) -> list[int]:
    return list(range(N_ITEMS))


def _arrays(root: str) -> list[np.ndarray]:
    return [np.full(N_SCRATCH, float(i)) for i in range(N_ITEMS)]


def _folders(root: str) -> list[str]:
    """One folder per item under ``root``, made here; their resolved paths."""
    folders = []
    for i in range(N_ITEMS):
        path = os.path.join(root, f"item-{i:03d}")
        os.makedirs(path, exist_ok=True)
        folders.append(os.path.realpath(path))
    return folders


def _rows(root: str) -> np.ndarray:
    """The array the caller keeps; each API maps over its rows (views)."""
    return np.random.RandomState(32).rand(N_ITEMS, N_COLUMNS)


def _blobs(root: str) -> list[bytes]:
    return [bytes([i]) * (64 * 1024) for i in range(N_ITEMS)]


def _templates(root: str) -> list[np.ndarray]:
    """The same array for every item: one object in a chunk's pickle."""
    return [_TEMPLATE] * N_ITEMS


def _ref_scratch_dict(i: int) -> tuple[int, str]:
    return sum(i * k for k in range(8)), hashlib.sha256(str(i).encode() * 1024).hexdigest()


def _ref_scratch_bytes(i: int) -> str:
    return hashlib.sha256(bytes([i % 256]) * len(_BYTES)).hexdigest()


@dataclass(frozen=True)
class Shape:
    """One function, the items a map gives it, and what each item alone returns.

    Attributes:
        name: the shape's name in test ids and the benchmark's table.
        fn: the module-level function mapped.
        items: makes the items (given a scratch folder of the run's).
        reference: one item's result computed alone, in a fresh state
            (for ``inplace``, on a copy of the row).
        safe: a control: thread-safe work that must stay right.
        passes: maps run over the same items (``inplace``: a second pass
            must give the first's results).
    """

    name: str
    fn: Callable[[Any], Any]
    items: Callable[[str], Any]
    reference: Callable[[Any], Any]
    safe: bool = False
    passes: int = 1


SHAPES: tuple[Shape, ...] = (
    Shape("scratch_array", scratch_array, _arrays, lambda x: float(x.sum())),
    Shape("scratch_dict", scratch_dict, _values, _ref_scratch_dict),
    Shape("scratch_bytes", scratch_bytes, _values, _ref_scratch_bytes),
    Shape("environ", environ, _values, str),
    Shape("chdir", chdir, _folders, lambda folder: folder),
    Shape("random_seed", random_seed, _values, lambda i: random.Random(i).random()),
    Shape(
        "np_random_seed",
        np_random_seed,
        _values,
        lambda i: float(np.random.RandomState(i).rand()),
    ),
    Shape("global_counter", global_counter, _values, lambda i: i * 2),
    Shape("inplace", inplace, _rows, lambda row: inplace(row.copy()), passes=2),
    Shape("method_by_name", method_by_name, _values, lambda i: float(i * N_SCRATCH)),
    Shape("shifts_its_argument", shifts_its_argument, _templates, lambda t: float(N_SCRATCH)),
    Shape("run_label", run_label, _values, lambda i: f"run-32/{i}"),
    Shape("const_read", const_read, _values, lambda i: float(np.multiply(_CONST, i).sum()), True),
    Shape("pure_hash", pure_hash, _blobs, lambda b: hashlib.sha256(b).hexdigest(), True),
)

BY_NAME = {shape.name: shape for shape in SHAPES}


def sample_arg(shape: Shape, root: str) -> Any:
    """One item of ``shape``'s (for ``explain``)."""
    return shape.items(root)[1]


# -- the caller's state -------------------------------------------------------------------


@dataclass
class CallerState:
    """What a map in worker processes leaves as it was in the calling process."""

    environ: dict[str, str]
    cwd: str
    random_state: Any
    np_random_state: Any

    @classmethod
    def now(cls) -> CallerState:
        return cls(dict(os.environ), os.getcwd(), random.getstate(), np.random.get_state())

    def changed(self) -> list[str]:
        """What differs now, in words ([] when nothing)."""
        found = []
        if dict(os.environ) != self.environ:
            keys = {
                k for k in {*os.environ, *self.environ} if os.environ.get(k) != self.environ.get(k)
            }
            found.append(f"os.environ changed ({', '.join(sorted(keys))})")
        if os.getcwd() != self.cwd:
            found.append(f"cwd changed to {os.getcwd()}")
        if random.getstate() != self.random_state:
            found.append("random's global state changed")
        now = np.random.get_state()
        if not all(
            np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
            for a, b in zip(now, self.np_random_state)
        ):
            found.append("np.random's global state changed")
        return found

    def restore(self) -> None:
        """Put the caller's state back (a wrong run must not spoil the next)."""
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
        random.setstate(self.random_state)
        np.random.set_state(self.np_random_state)


# -- one cell --------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run of a shape through an API gave.

    Attributes:
        wrong: items whose result differs from the reference (for
            ``map_unordered``, results missing from the reference's multiset),
            summed over the passes.
        items: results compared (items x passes).
        caller: the caller's state that changed (``environ``, cwd, the
            random generators, the argument array).
        error: the exception the run raised, if any (a wrong run too).
        backends: the backends smartexec's decisions named, in order.
        examples: a few wrong results, as ``item: got != expected``.
        seconds: the run's wall time.
    """

    shape: str
    api: str
    wrong: int = 0
    items: int = 0
    caller: list[str] = field(default_factory=list)
    error: str | None = None
    backends: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def is_wrong(self) -> bool:
        return bool(self.wrong or self.caller or self.error)

    def describe(self) -> str:
        """One line for a failure message or a report."""
        parts = []
        if self.wrong:
            parts.append(f"{self.wrong} of {self.items} results wrong")
        if self.caller:
            parts.append("; ".join(self.caller))
        if self.error:
            parts.append(f"raised {self.error}")
        if not parts:
            parts.append("right")
        text = f"{self.shape}/{self.api}: {', '.join(parts)}"
        if self.backends:
            text += f" [backends: {' > '.join(self.backends)}]"
        if self.examples:
            text += f" e.g. {'; '.join(self.examples)}"
        return text


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _note_backends(decisions: Iterable[Any], names: list[str]) -> None:
    """Add the backends ``decisions`` name to ``names``, in order, a repeat only once."""
    for decision in decisions:
        name = getattr(decision, "backend", None)
        if name is not None and (not names or names[-1] != name):
            names.append(str(name))


def _run_api(api: str, fn: Callable[[Any], Any], items: Any, backends: list[str]) -> list[Any]:
    """``fn`` over ``items`` through ``api``, on a fresh default ``SmartExecutor()``."""
    from smartexec import SmartExecutor

    if api == "joblib":
        import joblib

        import smartexec.joblib  # noqa: F401  (registers the backend)

        with joblib.parallel_config(backend="smartexec"):
            parallel = joblib.Parallel(n_jobs=2)
            results = parallel(joblib.delayed(fn)(x) for x in items)
        backend = getattr(parallel, "_backend", None)
        if backend is not None and hasattr(backend, "decisions"):
            _note_backends(backend.decisions(), backends)
        return list(results)
    with SmartExecutor() as ex:
        if api == "map":
            results = list(ex.map(fn, items))
        elif api == "map_unordered":
            results = list(ex.map(fn, items, ordered=False))
        elif api == "submit":
            futures = [ex.submit(fn, x) for x in items]
            results = [f.result() for f in futures]
        else:
            raise ValueError(f"unknown API {api!r}; choose from {', '.join(APIS)}")
        _note_backends(ex.decisions(), backends)
    return results


def _compare(api: str, got: list[Any], expected: list[Any], outcome: Outcome) -> None:
    outcome.items += len(expected)
    if api == "map_unordered":
        missing = collections.Counter(map(repr, expected)) - collections.Counter(map(repr, got))
        outcome.wrong += sum(missing.values()) + max(0, len(expected) - len(got))
        extra = collections.Counter(map(repr, got)) - collections.Counter(map(repr, expected))
        for text in list(extra)[:3]:
            outcome.examples.append(f"unexpected {text[:40]}")
        return
    if len(got) != len(expected):
        outcome.wrong += abs(len(expected) - len(got))
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            outcome.wrong += 1
            if len(outcome.examples) < 3:
                outcome.examples.append(f"item {i}: {_short(g)} != {_short(e)}")


def _import_libraries() -> None:
    """Import what a run imports, so that the caller's state is taken after their imports.

    threadpoolctl's import sets ``KMP_DUPLICATE_LIB_OK`` in ``os.environ``:
    a library's, not the mapped function's, change.
    """
    import importlib

    for name in ("smartexec", "threadpoolctl", "joblib", "smartexec.joblib"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def run_cell(shape_name: str, api: str, root: str | None = None) -> Outcome:
    """Run one shape through one API and compare every result with the reference.

    Args:
        shape_name: a name of :data:`SHAPES`.
        api: one of :data:`APIS`.
        root: a folder for the items' files (``chdir``'s folders); a
            temporary one when None.

    Returns:
        The :class:`Outcome`. The caller's state is put back afterwards,
        whatever the run changed.
    """
    shape = BY_NAME[shape_name]
    outcome = Outcome(shape_name, api)
    _import_libraries()
    with tempfile.TemporaryDirectory(prefix="never-wrong-", dir=root) as scratch:
        items = shape.items(scratch)
        # The reference: each item alone, in a fresh state, on a copy.
        expected = [shape.reference(np.copy(x) if isinstance(x, np.ndarray) else x) for x in items]
        kept = np.copy(items) if isinstance(items, np.ndarray) else None
        before = CallerState.now()
        start = time.perf_counter()
        try:
            for _ in range(shape.passes):
                got = _run_api(api, shape.fn, items, outcome.backends)
                _compare(api, got, expected, outcome)
        except Exception as exc:  # a wrong run too: reported, not raised
            outcome.error = f"{type(exc).__qualname__}: {exc}"[:300]
        finally:
            outcome.seconds = time.perf_counter() - start
            outcome.caller = before.changed()
            before.restore()
        if kept is not None and not np.array_equal(kept, items):
            rows = int((kept != items).any(axis=1).sum())
            outcome.caller.append(f"the argument array changed ({rows} of {len(items)} rows)")
    return outcome


def earlier_run_apis(api: str) -> tuple[str, ...]:
    """What an "earlier run" of a cell runs, to leave a profile in the store for the next.

    A map keeps its function's profile. ``submit`` and the joblib backend
    keep none of their own (today), so their earlier run maps the function
    too, after its own run: the store then holds what a program that mapped
    the function before would have left.
    """
    return (api,) if api.startswith("map") else (api, "map")


def main(argv: list[str]) -> int:
    """``SHAPE API [API...]``: run the cells in turn, print :data:`MARKER` and each outcome.

    One JSON line per API, in order; the first is the cell's own run.
    """
    shape, *apis = argv
    for api in apis:
        outcome = run_cell(shape, api)
        payload = dict(vars(outcome), is_wrong=outcome.is_wrong)
        print(MARKER + json.dumps(payload), flush=True)
    return 0


if __name__ == "__main__":
    # Run as the package's module, not as __main__: the functions then pickle
    # by reference to it, as they do from the tests.
    from tests.scenarios._never_wrong_workloads import main as _main

    sys.exit(_main(sys.argv[1:]))
