"""The cold benchmark's workloads (benchmarks/bench_cold.py; issue 14, item 9).

The work functions live here, in an importable module, so that process
contenders pickle them by reference. Two rows use functions that must not be
importable: ``cpu-main`` (a function of the child's ``__main__``) and
``closure`` (a closure made there); the child script (``_cold_child.py``)
hands them in through ``main``.

Every ``build_*`` takes the run's :class:`Params` and returns a :class:`Job`:
the callable and the argument lists a contender maps it over (made before
the timer starts). Sizes are chosen so a serial loop takes about 0.2-1.5 s on
a 2-core machine at ``scale=1`` (the ``tiny``, ``submit`` and cheap-method
rows are smaller jobs by design); ``scale`` multiplies the number of items,
never the work per item.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# -- work functions (importable: pickled by reference) ---------------------------


def python_loop(n: int) -> int:
    """Pure-Python loop of ``n`` iterations: holds the GIL throughout."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def sleep_10ms(i: int) -> int:
    time.sleep(0.01)
    return i


def square(x: int) -> int:
    return x * x


#: sha256 input: 4 MiB of fixed bytes, a module global (made on first use in
#: each process, so spawned workers make their own identical copy).
_BLOCK: bytes | None = None
BLOCK_BYTES = 4 << 20


def _block() -> bytes:
    global _BLOCK
    if _BLOCK is None:
        _BLOCK = np.random.default_rng(14).bytes(BLOCK_BYTES)
    return _BLOCK


def sha256_block(i: int) -> str:
    """sha256 of the 4 MiB module global, salted with ``i`` (hashlib releases the GIL)."""
    digest = hashlib.sha256(i.to_bytes(8, "little"))
    digest.update(_block())
    return digest.hexdigest()


def sum_squares(a: np.ndarray) -> float:
    return float(np.einsum("i,i->", a, a))


def loop_with_array(a: np.ndarray, n: int) -> float:
    """``python_loop(n)`` plus one read of ``a`` (the array is only carried)."""
    return python_loop(n) + float(a[n % len(a)])


class BigObject:
    """An object holding a big array, with a cheap and a heavy method."""

    def __init__(self, nbytes: int, heavy_n: int):
        self.data = np.arange(nbytes // 8, dtype=np.float64)
        self.heavy_n = heavy_n

    def cheap(self, i: int) -> float:
        """About 1 us: one read of the array."""
        return float(self.data[(i * 4099) % len(self.data)])

    def heavy(self, i: int) -> float:
        """About 5 ms of pure-Python work, then one read of the array."""
        return python_loop(self.heavy_n + i) + self.cheap(i)


class BigIndex:
    """A big pure-Python object: a dict of ``n`` int -> str entries (~150 bytes each)."""

    def __init__(self, n: int, lookups: int):
        self.table = {i: str(i) * 3 for i in range(n)}
        self.lookups = lookups

    def score(self, q: int) -> int:
        """``lookups`` dict reads from a query-dependent start: pure Python."""
        table, start = self.table, (q * 7919) % len(self.table)
        return sum(len(table.get(k, "")) for k in range(start, start + self.lookups))


#: A long series for :func:`window_mean` (made on first use in each process).
_SERIES: np.ndarray | None = None


def window_mean(start: int) -> float:
    """``np.mean`` of 64 values of a module-level series: a few microseconds of numpy."""
    global _SERIES
    if _SERIES is None:
        _SERIES = np.random.default_rng(34).standard_normal(1 << 20)
    return float(_SERIES[start % ((1 << 20) - 64) :][:64].mean())


def noise(i: int) -> np.ndarray:
    """A 2 MiB array of normal noise seeded by ``i``: a big result."""
    return np.random.default_rng(i).standard_normal(1 << 18)


def order_total(doc: str) -> float:
    """Parse a JSON order (~3 KB of text) and total its lines."""
    order = json.loads(doc)
    return round(sum(line["price"] * line["qty"] for line in order["lines"]), 2)


def fetch(url: str) -> int:
    """GET ``url`` from the loopback server; the body's length."""
    with urllib.request.urlopen(url, timeout=30) as response:
        return len(response.read())


#: The loopback HTTP server: answers every GET after 10 ms, from a thread each.
_SERVER = """
import http.server, sys, time
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.01)
        body = b"x" * 1024
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # a listen backlog as servers set it (the stdlib's is 5)
server = Server(("127.0.0.1", 0), Slow)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


#: The hand-written fork pool's target: set before the fork, read by
#: :func:`hand_call` in the workers (the manual fix for a big bound object).
HAND_TARGET: Callable[..., Any] | None = None


def hand_call(item: Any) -> Any:
    """Module-level wrapper: call :data:`HAND_TARGET` (inherited through fork)."""
    assert HAND_TARGET is not None
    return HAND_TARGET(item)


# -- workloads --------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """What sizes a run's workloads.

    Attributes:
        scale: multiplies every item count (at least 2 items remain).
        quick: a smoke run: the big objects and arrays are 10 times smaller too.
        loop_per_s: :func:`python_loop` iterations per second on this machine,
            measured once by the parent so every contender gets the same work.
    """

    scale: float
    quick: bool
    loop_per_s: float
    sha_per_s: float

    def count(self, base: int) -> int:
        return max(2, round(base * self.scale))

    def loop(self, seconds: float) -> int:
        return max(1, round(self.loop_per_s * seconds))

    def sha_count(self) -> int:
        """sha256 calls for about 0.5 s serial (before ``scale``)."""
        return min(2000, max(8, round(0.5 * self.sha_per_s)))

    def nbytes(self, base: int) -> int:
        return base // 10 if self.quick else base


@dataclass
class Job:
    """One workload, built: ``fn`` mapped over ``zip(*iterables)``."""

    fn: Callable[..., Any]
    iterables: tuple[list[Any], ...]
    keep: list[Any] = field(default_factory=list)  # what must stay alive while it runs
    generator: bool = False  # contenders get generators (no length) instead of lists
    close: Callable[[], None] | None = None  # run after the timing (stops a server)

    @property
    def n_items(self) -> int:
        return len(self.iterables[0])


@dataclass(frozen=True)
class Workload:
    """A row of the benchmark.

    Attributes:
        name: the row's name (``--only`` takes these).
        what: one line saying what it runs.
        build: ``(params, main) -> Job``; ``main`` maps ``"loop"`` and
            ``"closure"`` to the child's ``__main__`` function and closure factory.
        items: ``params -> `` how many items the built job has (without building it).
        kind: ``"map"``, ``"submit"`` (a ``submit`` loop, results in order) or
            ``"submit-completed"`` (collected with ``as_completed``).
        bound: a big bound object: the hand-written fork pool runs it too.
    """

    name: str
    what: str
    build: Callable[[Params, dict[str, Any]], Job]
    items: Callable[[Params], int]
    kind: str = "map"
    bound: bool = False


def _sleep(p: Params, main: dict[str, Any]) -> Job:
    return Job(sleep_10ms, (list(range(p.count(100))),))


def _loop_items(p: Params, seconds: float, base: int) -> list[int]:
    n = p.loop(seconds)
    return [n + i for i in range(p.count(base))]


def _cpu_module(p: Params, main: dict[str, Any]) -> Job:
    return Job(python_loop, (_loop_items(p, 0.010, 200),))


def _cpu_main(p: Params, main: dict[str, Any]) -> Job:
    return Job(main["loop"], (_loop_items(p, 0.010, 200),))


def _sha256(p: Params, main: dict[str, Any]) -> Job:
    _block()  # made before the timer in the caller (workers make theirs on first use)
    return Job(sha256_block, (list(range(p.count(p.sha_count()))),))


def _numpy_arrays(p: Params, main: dict[str, Any]) -> Job:
    length = p.nbytes(16 << 20) // 8
    arrays = [np.full(length, 1.0 + (i % 97) * 1e-3) for i in range(p.count(64))]
    return Job(sum_squares, (arrays,))


def _big_cheap(p: Params, main: dict[str, Any]) -> Job:
    obj = BigObject(p.nbytes(200 << 20), 0)
    return Job(obj.cheap, (list(range(p.count(1000))),), keep=[obj])


def _big_heavy(p: Params, main: dict[str, Any]) -> Job:
    obj = BigObject(p.nbytes(200 << 20), p.loop(0.005))
    return Job(obj.heavy, (list(range(p.count(200))),), keep=[obj])


def _tiny(p: Params, main: dict[str, Any]) -> Job:
    return Job(square, (list(range(p.count(200_000))),))


def _heavy_tail(p: Params, main: dict[str, Any]) -> Job:
    sigma = 1.0
    mean_s = 0.002
    mu = math.log(mean_s) - sigma**2 / 2
    durations = np.random.default_rng(0).lognormal(mu, sigma, p.count(500))
    return Job(python_loop, ([p.loop(float(d)) for d in durations],))


def _repeated_arg(p: Params, main: dict[str, Any]) -> Job:
    array = np.arange(p.nbytes(20 << 20) // 8, dtype=np.float64)
    n = p.count(5000)
    durations = np.random.default_rng(1).uniform(0.0, 0.0004, n)
    return Job(loop_with_array, ([array] * n, [p.loop(float(d)) for d in durations]))


def _closure(p: Params, main: dict[str, Any]) -> Job:
    return Job(main["closure"](p.loop(0.0015)), (list(range(p.count(300))),))


def _submit(p: Params, main: dict[str, Any]) -> Job:
    n = p.count(20_000)
    return Job(operator.add, (list(range(n)), [1] * n))


def _many_waits(p: Params, main: dict[str, Any]) -> Job:
    return Job(sleep_10ms, (list(range(p.count(400))),))


def _big_dict(p: Params, main: dict[str, Any]) -> Job:
    obj = BigIndex(1_500_000 if not p.quick else 150_000, 2000)
    return Job(obj.score, (list(range(p.count(3000))),), keep=[obj])


def _small_numpy(p: Params, main: dict[str, Any]) -> Job:
    window_mean(0)  # the series is made before the timer (workers make theirs)
    return Job(window_mean, (list(range(0, p.count(30_000) * 31, 31)),))


def _big_results(p: Params, main: dict[str, Any]) -> Job:
    return Job(noise, (list(range(p.count(100))),))


def _json_docs(p: Params, main: dict[str, Any]) -> Job:
    rng = np.random.default_rng(7)
    docs = []
    for i in range(p.count(20_000)):
        lines = [
            {"sku": f"item-{int(k)}", "price": float(k) / 7, "qty": int(k % 5) + 1}
            for k in rng.integers(0, 10_000, 40)
        ]
        docs.append(json.dumps({"order": i, "customer": f"c{i % 977}", "lines": lines}))
    return Job(order_total, (docs,))


def _generator(p: Params, main: dict[str, Any]) -> Job:
    return Job(python_loop, (_loop_items(p, 0.002, 500),), generator=True)


def _http(p: Params, main: dict[str, Any]) -> Job:
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    urls = [f"http://127.0.0.1:{port}/{i}" for i in range(p.count(300))]

    def close() -> None:
        server.terminate()
        server.wait(10)

    return Job(fetch, (urls,), close=close)


def _fixed(base: int) -> Callable[[Params], int]:
    return lambda p: p.count(base)


WORKLOADS: tuple[Workload, ...] = (
    Workload("sleep", "time.sleep(0.01) x 100", _sleep, _fixed(100)),
    Workload(
        "many-waits",
        "time.sleep(0.01) x 400: waiting work at high concurrency",
        _many_waits,
        _fixed(400),
    ),
    Workload(
        "submit-waits",
        "400 submit(time.sleep(0.01)), collected with as_completed",
        _many_waits,
        _fixed(400),
        kind="submit-completed",
    ),
    Workload(
        "http",
        "300 GETs of a loopback HTTP server that answers in 10 ms",
        _http,
        _fixed(300),
    ),
    Workload(
        "cpu-module", "pure-Python ~10 ms/item x 200, a module function", _cpu_module, _fixed(200)
    ),
    Workload("cpu-main", "the same, a function defined in __main__", _cpu_main, _fixed(200)),
    Workload(
        "sha256",
        "hashlib.sha256 of a 4 MiB module global (~0.5 s serial)",
        _sha256,
        lambda p: p.count(p.sha_count()),
    ),
    Workload(
        "numpy-arrays",
        "einsum sum of squares of 64 distinct 16 MiB arrays",
        _numpy_arrays,
        _fixed(64),
    ),
    Workload(
        "big-cheap",
        "1 us method of an object holding 200 MiB x 1000",
        _big_cheap,
        _fixed(1000),
        bound=True,
    ),
    Workload(
        "big-heavy",
        "~5 ms pure-Python method of that object x 200",
        _big_heavy,
        _fixed(200),
        bound=True,
    ),
    Workload(
        "big-dict",
        "pure-Python method of an object holding a dict of 1.5 M entries x 3000",
        _big_dict,
        _fixed(3000),
        bound=True,
    ),
    Workload("tiny", "trivial module function x 200,000", _tiny, _fixed(200_000)),
    Workload(
        "small-numpy",
        "np.mean of a 64-value window of a module-level series x 30,000",
        _small_numpy,
        _fixed(30_000),
    ),
    Workload(
        "big-results",
        "a 2 MiB array of seeded noise returned per item x 100",
        _big_results,
        _fixed(100),
    ),
    Workload(
        "json-docs",
        "json.loads and a total of 20,000 ~3 KB order documents given as arguments",
        _json_docs,
        _fixed(20_000),
    ),
    Workload(
        "generator",
        "pure-Python ~2 ms/item x 500, the input a generator of unknown length",
        _generator,
        _fixed(500),
    ),
    Workload(
        "heavy-tail",
        "pure Python, lognormal durations (mean 2 ms) x 500",
        _heavy_tail,
        _fixed(500),
    ),
    Workload(
        "repeated-arg",
        "the same 20 MiB array to every call, 0-0.4 ms pure Python x 5000",
        _repeated_arg,
        _fixed(5000),
    ),
    Workload("closure", "a closure of ~1.5 ms pure Python x 300", _closure, _fixed(300)),
    Workload(
        "submit",
        "20,000 submit(operator.add, i, 1), then the results",
        _submit,
        _fixed(20_000),
        kind="submit",
    ),
)

BY_NAME = {w.name: w for w in WORKLOADS}


def calibrate() -> tuple[float, float]:
    """Measure :func:`python_loop` iterations per second and sha256 blocks per second.

    Returns:
        ``(loop_per_s, sha_per_s)``, from the best of 7 and of 5 timings.
    """
    n = 500_000
    best = math.inf
    for _ in range(7):
        start = time.perf_counter()
        python_loop(n)
        best = min(best, time.perf_counter() - start)
    loop_per_s = n / best
    _block()
    best = math.inf
    for i in range(5):
        start = time.perf_counter()
        sha256_block(i)
        best = min(best, time.perf_counter() - start)
    return loop_per_s, 1.0 / best
