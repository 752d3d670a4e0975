"""Blocking calls from asyncio code, through smartexec (issue 15).

The trap: an async service that calls a CPU-bound function directly stops
its event loop for as long as the call takes; ``asyncio.to_thread`` runs it
on asyncio's default executor, a ``ThreadPoolExecutor``, where pure-Python
work still takes turns on the GIL. A ``SmartExecutor`` cannot be that
default executor: ``loop.set_default_executor`` refuses anything but a
``ThreadPoolExecutor`` (a ``TypeError`` since Python 3.11).

What to do instead: ``await ex.run_async(fn, *args, **kwargs)``. Each call
goes through ``ex.submit``, so it is routed as a submit is (this pure-Python
function goes to worker processes, ``hashlib.sha256`` would stay on
threads), and the loop keeps serving: the script counts the ticks of a
10 ms heartbeat that ran while the calls did. A request that takes too long
is cancelled with ``asyncio.wait_for``; calls not yet started never run.

Run:
    python examples/asyncio_calls.py           # 200 requests
    python examples/asyncio_calls.py --small   # 40 requests

Set SMARTEXEC_EXAMPLES_SMALL=1 to get --small without the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import time

from smartexec import SmartExecutor


def collatz_steps(limit: int) -> int:
    """Total Collatz steps of 1..limit: a few milliseconds of pure Python."""
    total = 0
    for n in range(1, limit + 1):
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            total += 1
    return total


async def heartbeat(stop: asyncio.Event) -> int:
    """Tick every 10 ms until ``stop`` is set; return the ticks (the loop's liveness)."""
    ticks = 0
    while not stop.is_set():
        await asyncio.sleep(0.01)
        ticks += 1
    return ticks


async def serve(ex: SmartExecutor, requests: list[int]) -> tuple[list[int], int, float]:
    stop = asyncio.Event()
    beat = asyncio.create_task(heartbeat(stop))
    start = time.perf_counter()
    answers = await asyncio.gather(*(ex.run_async(collatz_steps, limit=n) for n in requests))
    elapsed = time.perf_counter() - start
    stop.set()
    return answers, await beat, elapsed


async def too_slow(ex: SmartExecutor) -> str:
    try:
        await asyncio.wait_for(ex.run_async(time.sleep, 1), timeout=0.1)
    except asyncio.TimeoutError:
        return "timed out after 0.1 s (the sleep had started, so it ran on; a call no worker had taken would never have run)"
    return "finished?"


async def default_executor_refuses() -> str:
    loop = asyncio.get_running_loop()
    try:
        with SmartExecutor() as ex:
            loop.set_default_executor(ex)
    except TypeError as exc:
        return f"TypeError: {exc}"
    return "accepted (Python 3.10 only warns; 3.11+ raises TypeError)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a run of a few seconds")
    args = parser.parse_args()
    small = args.small or os.environ.get("SMARTEXEC_EXAMPLES_SMALL") == "1"
    requests = [2_000 + 37 * (i % 50) for i in range(40 if small else 200)]

    print(f"{len(requests)} requests, each collatz_steps(limit=~3,000), awaited from asyncio")
    print("set_default_executor(SmartExecutor()):", asyncio.run(default_executor_refuses()))

    start = time.perf_counter()
    serial = [collatz_steps(n) for n in requests]
    serial_s = time.perf_counter() - start
    print(f"  serial loop (blocks the event loop): {serial_s:6.2f} s")

    with concurrent.futures.ThreadPoolExecutor() as pool:

        async def on_threads() -> tuple[list[int], int, float]:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            beat = asyncio.create_task(heartbeat(stop))
            t0 = time.perf_counter()
            got = await asyncio.gather(
                *(loop.run_in_executor(pool, collatz_steps, n) for n in requests)
            )
            took = time.perf_counter() - t0
            stop.set()
            return got, await beat, took

        threaded, ticks, took = asyncio.run(on_threads())
    print(f"  run_in_executor(ThreadPoolExecutor): {took:6.2f} s, heartbeat ticked {ticks}x")

    with SmartExecutor() as ex:
        print(f"  routing: {ex.explain(collatz_steps)}".replace("\n", "\n    "))
        answers, ticks, took = asyncio.run(serve(ex, requests))
        print(f"  await ex.run_async(...):             {took:6.2f} s, heartbeat ticked {ticks}x")
        print("  a request over its deadline:", asyncio.run(too_slow(ex)))
    assert answers == serial == threaded, "results differ from the serial loop"
    print("results equal the serial loop")


if __name__ == "__main__":
    main()
