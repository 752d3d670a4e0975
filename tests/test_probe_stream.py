"""A stream's probe (two small chunks before the full window) never ends a map early.

A map of items measured too cheap to send starts on threads with a probe
(issue 14); when its figures do not move it, the full window follows. The
readers take an empty window for the end of the map, so the stream must
never leave one while input remains, in input order or as completed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from smartexec._mapping import ChunkStream, stream_values
from smartexec._remote import run_chunk
from smartexec.tuning import Estimate

pytestmark = pytest.mark.timeout(30)


def square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("buffersize", [1, 3, 14])
def test_every_item_comes_after_the_probe(ordered, buffersize):
    n = 3000
    estimate = Estimate()
    estimate.seed(0.5e-6, 1000, 0.0)  # measured cheap before: the probe applies
    with ThreadPoolExecutor(2) as pool:
        stream = ChunkStream(
            send=lambda calls, budget_s: pool.submit(run_chunk, square, calls, False, budget_s),
            calls=(((x,), {}) for x in range(n)),
            remaining=n,
            n_workers=2,
            overhead_s=20e-6,
            estimate=estimate,
            fixed_chunksize=None,
            buffersize=buffersize,
            end_time=None,
            on_chunk_error=lambda exc, calls: exc,
            probe=(2, 64),
        )
        got = list(stream_values([], stream, ordered=ordered))
    assert sorted(got) == [x * x for x in range(n)]
    if ordered:
        assert got == [x * x for x in range(n)]
    assert stream.sizes[:2] == [64, 64] if buffersize >= 2 else stream.sizes[0] == 64
    assert sum(stream.sizes) == n
