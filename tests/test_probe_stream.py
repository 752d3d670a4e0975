"""A stream's probe (two small chunks before the full window) never ends a map early.

A map of items measured too cheap to send starts on threads with a probe
(issue 14); when its figures do not move it, the full window follows. The
readers take an empty window for the end of the map, so the stream must
never leave one while input remains, in input order or as completed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from smartexec._chunk_stream import ChunkStream
from smartexec._mapping import stream_values
from smartexec._remote import run_chunk
from smartexec._rerouting import CHEAP_ITEMS
from smartexec._routed_map import RoutedMap
from smartexec.tuning import Estimate

pytestmark = pytest.mark.timeout(30)


def square(x: int) -> int:
    return x * x


def on_two_workers(send, n, estimate, overhead_s=150e-6, **options) -> ChunkStream:
    """A stream of ``square`` over ``range(n)`` for two workers (fork's chunk cost by default)."""
    return ChunkStream(
        send=send,
        calls=(((x,), {}) for x in range(n)),
        remaining=n,
        n_workers=2,
        overhead_s=overhead_s,
        estimate=estimate,
        fixed_chunksize=None,
        end_time=None,
        on_chunk_error=lambda exc, calls: exc,
        **options,
    )


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("buffersize", [1, 3, 14])
def test_every_item_comes_after_the_probe(ordered, buffersize):
    n = 3000
    estimate = Estimate()
    estimate.seed(0.5e-6, 1000, 0.0)  # measured cheap before: the probe applies
    with ThreadPoolExecutor(2) as pool:
        stream = on_two_workers(
            lambda calls, budget_s: pool.submit(run_chunk, square, calls, False, budget_s),
            n,
            estimate,
            overhead_s=20e-6,  # threads' chunk cost
            buffersize=buffersize,
            probe=(2, 64),
        )
        got = list(stream_values([], stream, ordered=ordered))
    assert sorted(got) == [x * x for x in range(n)]
    if ordered:
        assert got == [x * x for x in range(n)]
    assert stream.sizes[:2] == [64, 64] if buffersize >= 2 else stream.sizes[0] == 64
    assert sum(stream.sizes) == n


@pytest.mark.parametrize(("length", "n", "left"), [(300, 300, 0), (200, 300, None)])
def test_a_sized_input_read_to_its_end_has_nothing_left(length, n, left):
    # A list read to its end had an unknown length (None) left, and the last
    # look at a map priced "the next N items" where none was left to send.
    estimate = Estimate()
    with ThreadPoolExecutor(2) as pool:
        stream = ChunkStream(
            send=lambda calls, budget_s: pool.submit(run_chunk, square, calls, False, budget_s),
            calls=(((x,), {}) for x in range(n)),
            remaining=length,  # its __len__ (a wrong one in the second case)
            n_workers=2,
            overhead_s=20e-6,
            estimate=estimate,
            fixed_chunksize=None,
            end_time=None,
            on_chunk_error=lambda exc, calls: exc,
            buffersize=4,
        )
        got = list(stream_values([], stream, ordered=True))
    assert got == [x * x for x in range(n)]
    assert stream.input_read and stream.remaining == left


def test_what_a_shutdown_sends_unwaited_goes_with_no_time_budget():
    # shutdown(wait=False) sends the rest of a map, and nobody may read it
    # again to send the rest of a chunk stopped at its budget: no budget.
    from concurrent.futures import Future

    budgets: list[float | None] = []

    def send(calls, budget_s):
        budgets.append(budget_s)
        done: Future = Future()
        done.set_result(run_chunk(square, calls, False, None))
        return done

    estimate = Estimate()
    estimate.seed(1e-3, 100, 0.0)
    stream = on_two_workers(send, 500, estimate, buffersize=2)
    window = len(budgets)
    assert window == 2 and all(b is not None for b in budgets)  # read as it goes: budgets
    stream.send_rest(budgets=False)
    assert stream.input_read and len(budgets) > window
    assert all(b is None for b in budgets[window:])
    assert list(stream_values([], stream, ordered=True)) == [x * x for x in range(500)]


def test_a_probe_taken_again_sends_one_item_per_worker_then_waits():
    from concurrent.futures import Future

    pending: list[tuple[Future, list]] = []
    sizes: list[int] = []
    at_once = [False]  # from some point on, chunks finish as they are sent

    def send(calls, budget_s):
        sizes.append(len(calls))
        future: Future = Future()
        if at_once[0]:
            future.set_result(run_chunk(square, calls, False, None))
        else:
            pending.append((future, calls))
        return future

    def finish_all():
        for future, calls in pending:
            if not future.done():
                future.set_result(run_chunk(square, calls, False, None))

    stream = on_two_workers(
        send, 100, Estimate(), buffersize=6, measuring=lambda: True, probe=(2, 1)
    )
    assert sizes == [1, 1]  # the probe: one item per worker
    chunks = stream.chunks()
    finish_all()
    assert next(chunks) == [(True, 0)]
    stream.probe_again()  # no verdict yet: another round, not the window
    assert next(chunks) == [(True, 1)]
    assert sizes == [1, 1, 1, 1]
    at_once[0] = True
    finish_all()
    rest = [v for chunk in chunks for _, v in chunk]  # the probe over: the full window
    assert rest == [x * x for x in range(2, 100)]
    assert max(sizes) > 1


@pytest.mark.parametrize("shares_memory", [True, False], ids=["threads", "processes"])
@pytest.mark.parametrize(("per_item_s", "probes"), [(4e-6, True), (1e-3, False), (None, False)])
def test_items_measured_too_cheap_to_send_are_probed_on_any_route(
    shares_memory, per_item_s, probes
):
    # A stored profile's 4 us an item sized the first chunks of a fork map at
    # 3,000-4,000 items: 20,000 of 30,000 were sent before it moved to a loop.
    estimate = Estimate()
    if per_item_s is not None:
        estimate.seed(per_item_s, 1000, 0.0)
    backend = SimpleNamespace(max_workers=2, shares_memory=shares_memory)
    routed = SimpleNamespace(backend=backend, estimate=estimate, dear=False)
    assert RoutedMap.probe(routed) == ((2, CHEAP_ITEMS) if probes else None)
