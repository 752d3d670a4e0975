"""``await ex.run_async(fn, *args, **kwargs)``: smartexec from asyncio code."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from smartexec import SmartExecutor

pytestmark = pytest.mark.timeout(120)

#: Set by a thread-route test so that a call can wait on it.
GATE = threading.Event()
STARTED = threading.Event()
RAN: list[int] = []


def square(x: int) -> int:
    return x * x


def gated(x: int) -> int:
    STARTED.set()
    GATE.wait(30)
    return x


async def started() -> None:
    """Wait (without blocking the loop) until a thread runs ``gated``."""
    for _ in range(3000):
        if STARTED.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("gated() never started")


def record(x: int) -> int:
    RAN.append(x)
    return x


def wait_for_file(path: str) -> str:
    """Block (in a worker process) until ``path`` exists, then return it."""
    Path(path + ".started").touch()
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return path


def touch(path: str) -> str:
    Path(path).touch()
    return path


class Failure(Exception):
    pass


RAISED: list[BaseException] = []


def fail(message: str) -> None:
    error = Failure(message)
    RAISED.append(error)
    raise error


def stop() -> None:
    raise StopIteration("not a coroutine's to raise")


def test_a_thousand_calls_with_kwargs():
    async def main(ex: SmartExecutor) -> list[int]:
        squares = await asyncio.gather(*(ex.run_async(square, i) for i in range(1000)))
        parsed = await ex.run_async(int, "ff", base=16)
        return [*squares, parsed]

    with SmartExecutor(4) as ex:
        results = asyncio.run(main(ex))
        # Through submit: routed and counted as submits are.
        stats = ex.stats()
        assert sum(s.items for s in stats.backends.values()) == 1001
        routes = [d for d in ex.decisions() if d.profile is not None and d.profile.name == "square"]
        assert routes[0].backend in ("fork", "loky")  # loky while foreign threads run
    assert results == [i * i for i in range(1000)] + [255]


def test_submit_learning_applies():
    async def one_by_one(ex: SmartExecutor) -> list[int]:
        # Each call completes before the next is submitted: its figures count.
        return [await ex.run_async(square, i) for i in range(20)]

    with SmartExecutor(2) as ex:
        assert asyncio.run(one_by_one(ex)) == [i * i for i in range(20)]
        routes = [d for d in ex.decisions() if d.profile is not None and d.profile.name == "square"]
    assert routes[0].backend in ("fork", "loky")
    # Calls of microseconds cost less than a process round trip: moved to threads.
    assert routes[-1].backend == "thread" and "submits" in routes[-1].reasons[0]


def test_a_thousand_calls_on_fork():
    async def main(ex: SmartExecutor) -> list[int]:
        return await asyncio.gather(*(ex.run_async(square, i) for i in range(1000)))

    with SmartExecutor(2, backend="fork") as ex:
        assert asyncio.run(main(ex)) == [i * i for i in range(1000)]


def test_cancelling_the_task_cancels_a_call_not_started_on_threads():
    GATE.clear()
    STARTED.clear()
    RAN.clear()

    async def main(ex: SmartExecutor) -> None:
        busy = asyncio.ensure_future(ex.run_async(gated, 1))
        queued = asyncio.ensure_future(ex.run_async(record, 2))
        await started()  # both submitted; the one thread waits on GATE
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        GATE.set()
        assert await busy == 1

    with SmartExecutor(1, backend="thread") as ex:
        asyncio.run(main(ex))
    assert RAN == []  # shut down with wait=True: the cancelled call never ran


def test_cancelling_the_task_cancels_a_call_not_started_on_fork(tmp_path):
    release, ran = str(tmp_path / "release"), str(tmp_path / "ran")

    async def main(ex: SmartExecutor) -> None:
        busy = asyncio.ensure_future(ex.run_async(wait_for_file, release))
        queued = asyncio.ensure_future(ex.run_async(touch, ran))
        for _ in range(3000):  # until the one worker holds the first call
            if os.path.exists(release + ".started"):
                break
            await asyncio.sleep(0.01)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        Path(release).touch()
        assert await busy == release

    with SmartExecutor(1, backend="fork") as ex:
        asyncio.run(main(ex))
    assert not os.path.exists(ran)


def test_a_timeout_cancels_the_call():
    GATE.clear()
    STARTED.clear()
    RAN.clear()

    async def main(ex: SmartExecutor) -> None:
        busy = asyncio.ensure_future(ex.run_async(gated, 1))
        await started()  # the one thread now waits on GATE
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ex.run_async(record, 2), 0.2)
        GATE.set()
        await busy

    with SmartExecutor(1, backend="thread") as ex:
        asyncio.run(main(ex))
    assert RAN == []


def test_a_started_call_runs_on():
    GATE.clear()
    STARTED.clear()

    async def main(ex: SmartExecutor) -> None:
        running = asyncio.ensure_future(ex.run_async(gated, 7))
        await started()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    with SmartExecutor(1, backend="thread") as ex:
        asyncio.run(main(ex))
        # The call was running: it goes on, and the next one waits behind it.
        follow = ex.submit(square, 3)
        assert not follow.done()
        GATE.set()
        assert follow.result(timeout=30) == 9


def test_exceptions_propagate_unchanged():
    RAISED.clear()

    async def main(ex: SmartExecutor) -> BaseException:
        with pytest.raises(Failure, match="item 3") as caught:
            await ex.run_async(fail, "item 3")
        return caught.value

    with SmartExecutor(backend="thread") as ex:
        assert asyncio.run(main(ex)) is RAISED[0]
    with SmartExecutor(1, backend="fork") as ex:
        error = asyncio.run(main(ex))
        assert type(error) is Failure and error.args == ("item 3",)


def test_stop_iteration_fails_the_task_instead_of_hanging():
    # loop.run_in_executor never completes here: asyncio futures refuse StopIteration.
    async def main(ex: SmartExecutor) -> None:
        with pytest.raises(RuntimeError) as caught:
            await asyncio.wait_for(ex.run_async(stop), 10)
        assert isinstance(caught.value.__cause__, StopIteration)

    with SmartExecutor(backend="thread") as ex:
        asyncio.run(main(ex))


def test_after_shutdown_it_raises_and_starts_nothing():
    ex = SmartExecutor()
    ex.shutdown()

    async def main() -> None:
        with pytest.raises(RuntimeError, match="shutdown"):
            await ex.run_async(square, 2)

    asyncio.run(main())


def test_outside_an_event_loop_it_submits_nothing():
    RAN.clear()
    with SmartExecutor(backend="thread") as ex:
        coro = ex.run_async(record, 1)
        with pytest.raises(RuntimeError, match="no running event loop"):
            coro.send(None)
    assert RAN == []
