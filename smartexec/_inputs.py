"""A map's input: read in bounded pieces, snapshotted, sized, its sending cost sampled.

Also the iterators that hand results over without keeping them alive
(:func:`drain`, :func:`then_raise`).
"""

from __future__ import annotations

import array
import collections
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from ._wire import BIG_BUFFER_BYTES, SHM_WRITE_S_PER_BYTE, estimate_send_s, send_parts
from .tuning import Estimate

T = TypeVar("T")

__all__ = [
    "common_length",
    "dear_to_send",
    "drain",
    "measure_pickling",
    "read_up_to",
    "snapshot_inputs",
    "then_raise",
]


def read_up_to(items: Iterator[T], n: int) -> tuple[list[T], Exception | None]:
    """Read up to ``n`` items at C speed; an input error comes back with what came before it.

    Returns:
        ``(items read, None)``, fewer than ``n`` at the end of the input; or
        ``(items read before the error, the error)`` when reading raised an
        ``Exception`` (anything else propagates).
    """
    taken: list[T] = []
    try:
        taken.extend(itertools.islice(items, n))  # extend keeps what it appended
    except Exception as exc:
        return taken, exc
    return taken, None


def _copy(iterable: Any) -> Any:
    """A same-size copy of a built-in mutable container; anything else as it is."""
    kind = type(iterable)
    if kind is list or kind is collections.deque or kind is set or kind is dict:
        return list(iterable)  # one reference per item (a dict or set: its keys)
    if kind is bytearray:
        return bytes(iterable)  # one byte per item, as the original
    if kind is array.array:
        return array.array(iterable.typecode, iterable)  # its own item size
    return iterable


def snapshot_inputs(iterables: tuple[Iterable[Any], ...]) -> tuple[Iterable[Any], ...]:
    """Copies of the inputs that are built-in mutable containers; the rest as given.

    ``concurrent.futures.Executor.map`` reads its whole input when called
    (without ``buffersize``), so a list cleared, grown or changed after
    ``map()`` returns does not change its results. smartexec reads its
    input lazily (endless inputs stream), so it copies a ``list``, ``dict``,
    ``set``, ``deque``, ``bytearray`` or ``array.array`` (exact types) when
    ``map()`` is called, never the items themselves: a list of references
    (~1 ms per million items) for the first four, a copy of the same size
    for the last two (a ``bytearray`` of 100 MB read as a list of ints took
    880 MB). Without it, clearing the list truncated the results, and an
    item replaced after the call ran instead of the one checked then. Other
    iterables (generators, ranges, tuples, numpy arrays, user sequences) are
    read as they come; so is every input of a map given ``buffersize``, as
    Python 3.14 reads it then (the caller does not call this).
    """
    return tuple(_copy(iterable) for iterable in iterables)


def common_length(iterables: tuple[Iterable[Any], ...]) -> int | None:
    """The number of items ``zip(*iterables)`` yields, when all have a length."""
    lengths = []
    for iterable in iterables:
        try:
            lengths.append(len(iterable))  # type: ignore[arg-type]
        except Exception:  # no length, or one too big for an index (range(10**20))
            return None
    return min(lengths) if lengths else 0


#: Arguments and results pickled to measure the parent's per-item pickling cost.
PICKLE_SAMPLE = 64

#: measure_pickling stops sampling once this many seconds were spent: enough
#: to time a copy, and no more (64 items of 4 MiB bytes took 60 ms in one go).
PICKLE_SAMPLE_S = 0.005


def dear_to_send(iterables: tuple[Iterable[Any], ...]) -> bool:
    """Whether a map's items carry big arguments of their own (each item sends its own copy).

    Looks at the first item of inputs that are lists or tuples (others
    cannot be looked at without reading them): True when one of its
    arguments pickles to :data:`~smartexec._wire.BIG_BUFFER_BYTES` or
    more and is not the very object the second item holds there (the same
    array in every call goes to each worker once, see
    :class:`~smartexec._object_cache.ObjectCache`). Sizing counts a numpy
    array's bytes without copying them; an argument that cannot be pickled
    answers False (sending it will raise the clear error).

    Args:
        iterables: ``map``'s iterables, as given (one per argument).

    Returns:
        True when the items are dear to send, as above; never raises.
    """
    from .inspection import payload_size

    firsts: list[Any] = []
    seconds: list[Any] = []
    for iterable in iterables:
        if not isinstance(iterable, (list, tuple)) or not iterable:
            return False
        firsts.append(iterable[0])
        seconds.append(iterable[1] if len(iterable) > 1 else None)
    for first, second in zip(firsts, seconds):
        if first is second:
            continue
        size = payload_size(first, cap_bytes=BIG_BUFFER_BYTES)
        if size.error is None and (size.capped or size.nbytes >= BIG_BUFFER_BYTES):
            return True
    return False


def measure_pickling(estimate: Estimate, args: list[Any], results: list[Any]) -> None:
    """Time sending a sample of arguments and results; store the per-item cost.

    When pickling the first item shows that the whole sample pickles within
    :data:`PICKLE_SAMPLE_S`, the others are pickled in one go, as a chunk is
    sent, and priced alone: the first only paces the sample, as a
    process's first pickling pays for set-up that later ones do not (300-380
    us of CPU for one ~3 KB JSON document in a fresh process, against ~2 us
    an item after; priced with it, 13-16 documents read 44-67 us an item to
    send, and the map moved from fork to a loop 1.5x slower). One pickler's
    set-up (a few microseconds) is shared by the chunk's items,
    as in a chunk, instead of being charged to each (small items read ~20x
    too dear, and maps of 5 us items that a process pool wins stayed
    inline), and a big argument that every item holds counts once, as a
    chunk sends it once. The price of such shared buffers is stored apart,
    as ``estimate.send_per_chunk_s`` (the same 20 MiB array in 5,000 calls
    was priced 7 ms an item, and such maps ran as a loop that a process
    pool's big chunks beat by 1.24x). Otherwise item by item, until
    :data:`PICKLE_SAMPLE_S` seconds were spent. Big buffers are not pickled
    but counted at the cost of putting them in shared memory, as
    :mod:`smartexec.transport` will (so a sample of 16 MB arrays costs
    microseconds to measure, not a 16 MB pickle each).
    """
    seconds = 0.0
    items = 0
    pairs = list(zip(args, results))
    n = len(pairs)
    try:
        if n > 1:
            first: dict[int, tuple[int, Any]] = {}
            pickling_s, big = send_parts(pairs[0], first)
            # As many items as pickle within the budget, at the first one's pace.
            n = min(n, int(PICKLE_SAMPLE_S / max(pickling_s, 1e-9)))
            if n > 1:
                # The others in one go, as a chunk sends them. A big buffer
                # of the first item that they hold too (the same array in
                # every call) is sent once per chunk: priced apart, once.
                others: dict[int, tuple[int, Any]] = {}
                rest_s, rest_big = send_parts(pairs[1:n], others)
                shared = sum(nbytes for key, (nbytes, _) in first.items() if key in others)
                del first, others
                estimate.send_per_chunk_s = shared * SHM_WRITE_S_PER_BYTE
                estimate.pickle_parent_s = (
                    2 * rest_s + (rest_big - shared) * SHM_WRITE_S_PER_BYTE
                ) / (n - 1)
                return
        for item in pairs:
            seconds += estimate_send_s(item)
            items += 1
            if seconds >= PICKLE_SAMPLE_S:
                break
    except Exception:
        return  # sending will raise a clear error later
    if items:
        estimate.pickle_parent_s = seconds / items
        estimate.send_per_chunk_s = 0.0


def drain(results: list[Any]) -> Iterator[Any]:
    """Iterate ``results`` in order, dropping each one as it is handed out.

    A list iterator would keep every result alive until the end (CPython's
    test_free_reference checks that a result dies once the caller drops it).
    Popping from the reversed list through ``starmap`` does it at C speed.
    """
    results.reverse()
    return itertools.starmap(results.pop, itertools.repeat((), len(results)))


def then_raise(results: list[Any], error: BaseException) -> Iterator[Any]:
    """Yield ``results``, then raise ``error`` (an item's, at its position)."""
    yield from drain(results)
    raise error
