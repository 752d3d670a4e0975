"""One cold run of benchmarks/bench_cold.py: a fresh process, one workload, one contender.

``python benchmarks/_cold_child.py '<json spec>'`` builds the workload (before
the timer), then times the contender from creating its executor (or pool) to
the end of its ``with`` block, and prints one line on stdout::

    BENCH_COLD_RESULT {"wall_s": ..., "digest": ..., "routes": ...}

or ``{"error": "..."}`` when the contender cannot run the workload (a closure
in ``ProcessPoolExecutor``: a pickling error). ``digest`` fingerprints the
results (the parent checks every contender got the serial loop's). For
smartexec, ``routes`` holds where the items ran (``stats()``: backend ->
items, in the order ``decisions()`` first names them) and ``decisions``
each logged decision's backend (with its first chunksize, for a map's entry).

This file runs as ``__main__``: :func:`main_loop` and the closure made by
:func:`make_closure` are the benchmark's ``__main__`` function and closure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from typing import Any

MARKER = "BENCH_COLD_RESULT "


def main_loop(n: int) -> int:
    """``_cold_workloads.python_loop``, defined in ``__main__`` (not importable)."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def make_closure(n: int) -> Any:
    def work(i: int) -> int:
        total = 0
        for j in range(n + i):
            total += j * j
        return total

    return work


def _norm(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if hasattr(value, "tobytes"):  # a numpy array: all of it, not repr's summary
        return hashlib.sha1(value.tobytes()).hexdigest()
    return value


def digest(results: list[Any]) -> str:
    return hashlib.sha1(repr([_norm(r) for r in results]).encode()).hexdigest()[:12]


def _run_map(
    contender: str, fn: Any, lists: tuple[list[Any], ...], cpus: int, generator: bool = False
) -> Any:
    """Run and time one map; return (seconds, results, executor or None).

    ``generator``: every contender gets generators over ``lists`` (no
    length); the process pools' hand-picked chunksize still knows ``n``.
    """
    n = len(lists[0])
    iterables: tuple[Any, ...] = (
        tuple((x for x in items) for items in lists) if generator else lists
    )
    if contender == "serial":
        start = time.perf_counter()
        results = [fn(*args) for args in zip(*iterables)]
        return time.perf_counter() - start, results, None
    if contender in ("threads", "threads-64"):
        from concurrent.futures import ThreadPoolExecutor

        width = 64 if contender == "threads-64" else None  # a hand-sized pool for waiting work
        start = time.perf_counter()
        with ThreadPoolExecutor(width) as ex:
            results = list(ex.map(fn, *iterables))
        return time.perf_counter() - start, results, None
    if contender.startswith("process-"):
        from concurrent.futures import ProcessPoolExecutor

        chunksize = 1 if contender == "process-1" else max(1, n // (4 * cpus))
        start = time.perf_counter()
        with ProcessPoolExecutor() as ex:
            results = list(ex.map(fn, *iterables, chunksize=chunksize))
        return time.perf_counter() - start, results, None
    if contender in ("joblib", "joblib-threads"):
        from joblib import Parallel, delayed

        prefer = "threads" if contender == "joblib-threads" else None
        call = delayed(fn)
        start = time.perf_counter()
        results = Parallel(n_jobs=-1, prefer=prefer)(call(*args) for args in zip(*iterables))
        return time.perf_counter() - start, results, None
    if contender == "mpire":
        from mpire import WorkerPool

        # mpire unpacks a tuple item into arguments: one iterable goes as it is.
        items = iterables[0] if len(iterables) == 1 else list(zip(*iterables))
        start = time.perf_counter()
        with WorkerPool(n_jobs=cpus, start_method="fork") as pool:
            results = pool.map(fn, items)
        return time.perf_counter() - start, results, None
    if contender == "hand-fork":
        import multiprocessing

        import _cold_workloads as cw

        (items,) = iterables
        cw.HAND_TARGET = fn  # before the fork: the workers inherit it
        start = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(cpus) as pool:
            results = pool.map(cw.hand_call, items)  # chunksize len / (4 x workers)
        return time.perf_counter() - start, results, None
    if contender == "smartexec":
        from smartexec import SmartExecutor

        _time_notes()
        start = time.perf_counter()
        with SmartExecutor() as ex:
            results = list(ex.map(fn, *iterables))
            _NOTED["results in"] = time.perf_counter()
        return time.perf_counter() - start, results, ex
    raise ValueError(f"unknown contender {contender!r}")


def _run_submit(
    contender: str, fn: Any, iterables: tuple[list[Any], ...], completed: bool = False
) -> Any:
    """Run and time a submit loop; return (seconds, results, executor or None).

    ``completed``: collect the futures with ``as_completed`` (results then
    sorted, to compare with the serial loop's).
    """
    if contender == "serial":
        start = time.perf_counter()
        results = [fn(*args) for args in zip(*iterables)]
        return time.perf_counter() - start, results, None
    if contender in ("threads", "threads-64"):
        from concurrent.futures import ThreadPoolExecutor

        def make() -> Any:
            return ThreadPoolExecutor(64 if contender == "threads-64" else None)

    elif contender == "process-1":
        from concurrent.futures import ProcessPoolExecutor as make
    elif contender == "smartexec":
        from smartexec import SmartExecutor as make
    else:
        raise ValueError(f"{contender!r} does not run submit loops")
    from concurrent.futures import as_completed

    start = time.perf_counter()
    with make() as ex:
        futures = [ex.submit(fn, *args) for args in zip(*iterables)]
        if completed:
            results = sorted(f.result() for f in as_completed(futures))
        else:
            results = [f.result() for f in futures]
    return time.perf_counter() - start, results, ex if contender == "smartexec" else None


#: perf_counter() when smartexec logged each reason, and "results in": when
#: the map's last result came (before the executor's shutdown).
_NOTED: dict[str, float] = {}


def _time_notes() -> None:
    """Timestamp each reason smartexec logs for a map (a benchmark's own probe).

    explain()'s prediction is for the items not sent when the map logged
    it: set against the time they then took (from that moment to the last
    result), it is checked on what it predicts; scaled to the whole map it
    also charges it for the pool's start and the first chunks before it.
    """
    from smartexec import _router

    real = _router.Router.note

    def note(
        self: Any, decision: Any, estimate: Any, backend: str, reasons: Any, *a: Any, **k: Any
    ) -> Any:
        now = time.perf_counter()
        for reason in reasons:
            _NOTED[reason] = now
        return real(self, decision, estimate, backend, reasons, *a, **k)

    _router.Router.note = note  # type: ignore[method-assign]


_PREDICTED = re.compile(
    r"predicted for the (next )?(\d+) items (?:left|not sent yet|\(the input's [^)]*\))"
    r"(?: and the (\d+) in flight on \w+)?: (.*?) -> "
)


def _prediction(decisions: Any) -> dict[str, Any] | None:
    """What the map's settling decision predicted for the route it ended on.

    ``{"left": items left then, "route": ..., "seconds": predicted for them}``,
    from the reason ``explain()`` shows ("predicted for the N items not sent
    yet: fork 0.47 s, thread 0.16 s -> the rest moves to thread"; "items
    left" in older wording); None when the map settled on no prediction.
    """
    for decision in reversed(decisions):
        for reason in decision.reasons:
            found = _PREDICTED.search(reason)
            if found is None:
                continue
            figures = dict(
                (route, float(value))
                for route, value in re.findall(r"(\w+) ([\d.]+) s", found.group(4))
            )
            route = decision.backend
            if "moves to inline" in reason:
                route = "inline"
            if route in figures:
                out = {"left": int(found.group(2)), "route": route, "seconds": figures[route]}
                out["in_flight"] = int(found.group(3) or 0)
                out["next"] = bool(found.group(1))
                # "the next N items" of an input of unknown length: the time
                # to its end is no measure of that prediction.
                if not found.group(1) and reason in _NOTED and "results in" in _NOTED:
                    out["took"] = _NOTED["results in"] - _NOTED[reason]
                return out
    return None


def routes(ex: Any) -> dict[str, Any]:
    """Where smartexec ran the items, from ``stats()`` and ``decisions()``."""
    out: dict[str, Any] = {}
    try:
        decisions = ex.decisions()
        out["decisions"] = [
            d.backend if d.chunksize is None else f"{d.backend}(cs {d.chunksize})"
            for d in decisions
        ]
        predicted = _prediction(decisions)
        if predicted is not None:
            out["predicted"] = predicted
        items = {name: s.items for name, s in ex.stats().backends.items() if s.items}
        order = [d.backend for d in decisions if d.backend in items]
        order += [name for name in items if name not in order]
        out["items"] = {name: items[name] for name in dict.fromkeys(order)}
    except Exception as exc:  # the API moves under issue 14: report, do not fail
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    import _cold_workloads as cw

    workload = cw.BY_NAME[spec["workload"]]
    params = cw.Params(**spec["params"])
    job = workload.build(params, {"loop": main_loop, "closure": make_closure})
    cpus = os.cpu_count() or 1
    contender = spec["contender"]
    try:
        if workload.kind.startswith("submit"):
            completed = workload.kind == "submit-completed"
            seconds, results, ex = _run_submit(contender, job.fn, job.iterables, completed)
        else:
            seconds, results, ex = _run_map(contender, job.fn, job.iterables, cpus, job.generator)
    except Exception as exc:
        out: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    else:
        out = {"wall_s": seconds, "digest": digest(list(results)), "n": len(results)}
        if ex is not None:
            out["routes"] = routes(ex)
    finally:
        if job.close is not None:
            job.close()
    print(MARKER + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
