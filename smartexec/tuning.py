"""Chunksize: how many items go to a worker in one submission.

A process worker pays a fixed cost per chunk (pickling, two pipe trips, a
wake-up): about 200-300 us on the 2-core machine this was written on. Bigger
chunks amortise it; too few chunks leave workers idle at the end of a map.
Until per-item latency is measured (a later seam), the chunksize is derived
from the item count alone, as ``multiprocessing.Pool.map`` does: about four
chunks per worker.
"""

from __future__ import annotations

__all__ = ["CHUNKS_PER_WORKER", "default_chunksize"]

#: Chunks per worker for a map of known length: enough to balance uneven items
#: across workers at the end of the map, few enough to amortise dispatch.
#: Source: multiprocessing.Pool.map's heuristic (CPython Lib/multiprocessing/pool.py).
CHUNKS_PER_WORKER = 4


def default_chunksize(
    n_items: int, n_workers: int, *, in_process: bool = False, synchronous: bool = False
) -> int:
    """Return the chunksize for a map of ``n_items`` over ``n_workers``.

    Args:
        n_items: number of items in the map (int, >= 0).
        n_workers: number of workers that will run chunks (int, >= 1).
        in_process: True for thread and inline backends, where a chunk costs
            no pickling; items then go one per chunk so that results stream
            as soon as each item finishes, as with ``ThreadPoolExecutor.map``.
        synchronous: True for the inline backend, which runs every chunk
            before ``map`` returns: one chunk holds every item, so the map
            costs what a plain loop costs.

    Returns:
        An int >= 1.
    """
    if synchronous:
        return max(1, n_items)
    if in_process or n_items <= 0:
        return 1
    chunks = max(1, n_workers) * CHUNKS_PER_WORKER
    return max(1, -(-n_items // chunks))
