"""Memory-mapped numpy arrays cross to workers by reference to their file.

A ``numpy.memmap`` is a view of a file. Pickled by value, it would reach a
worker as a private copy: a task that writes into the ``mode="r+"`` memmap it
was given would write into that copy and leave the file unchanged, and a
read-only memmap of many gigabytes would be copied for nothing. joblib passes
memmaps by reference, and out-of-core code relies on it. So the transport's
pickler (:class:`smartexec._remote._Pickler`) reduces a memmap whose data is
its file's mapping to ``(file name, mode, dtype, shape, strides, position)``,
and the receiver maps the same bytes of the same file:

* ``mode="r+"`` or ``"w+"``: mapped ``"r+"`` (``"w+"`` would truncate the
  file): writes land in the file, seen by the caller's own memmap at once
  (both map the same page cache).
* ``mode="r"``, or an array marked read-only: mapped ``"r"``, nothing copied.
* ``mode="c"`` (copy-on-write): the caller's private changes are not in the
  file, so the array goes by value, as a copy.
* A view with a negative stride, or one whose data is not the file mapping
  (the result of ``mm + 1``), goes by value.

The same holds for results: a memmap a task returns arrives in the parent as
a memmap of the same file, which must still exist when the reply is read. The
file is named by its path: replacing the file between sending and reading
(rename, delete) maps whatever file then has that name.
"""

from __future__ import annotations

import mmap
import sys
from typing import Any

__all__ = ["reduce"]


def reduce(obj: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """Return a reduction of ``obj`` that maps its file again, or None to pickle it by value.

    Args:
        obj: any object (only ``numpy.memmap`` instances are reduced).

    Returns:
        ``(rebuild, args)`` for pickle's ``reducer_override``, or None.
    """
    np = sys.modules.get("numpy")
    if np is None or not isinstance(obj, np.memmap):
        return None
    mapping = getattr(obj, "_mmap", None)
    filename = getattr(obj, "filename", None)
    mode = getattr(obj, "mode", None)
    if mapping is None or filename is None or mode not in ("r", "r+", "w+"):
        return None
    if obj.dtype.hasobject or obj.size == 0 or any(s < 0 for s in obj.strides):
        return None
    try:
        start = np.frombuffer(mapping, dtype=np.uint8).__array_interface__["data"][0]
    except (ValueError, TypeError, BufferError):  # the mapping was closed
        return None
    data = obj.__array_interface__["data"][0]
    span = sum((n - 1) * s for n, s in zip(obj.shape, obj.strides)) + obj.itemsize
    if data < start or data + span > start + len(mapping):
        return None  # not the file's mapping
    if span % obj.itemsize:
        return None
    # numpy maps the file from the allocation boundary at or below its offset.
    mapped_from = obj.offset - obj.offset % mmap.ALLOCATIONGRANULARITY
    position = mapped_from + (data - start)
    read_only = mode == "r" or not obj.flags.writeable
    return _rebuild, (
        filename,
        "r" if read_only else "r+",
        obj.dtype,
        obj.shape,
        obj.strides,
        position,
        span,
    )


def _rebuild(
    filename: str,
    mode: str,
    dtype: Any,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    position: int,
    span: int,
) -> Any:
    """Map ``span`` bytes of ``filename`` from ``position`` as the array that was sent."""
    import numpy as np

    opened: Any = np.memmap  # mode is a str here, not the stubs' literal
    flat = opened(
        filename, dtype=dtype, mode=mode, offset=position, shape=(span // dtype.itemsize,)
    )
    contiguous = flat[: int(np.prod(shape))]
    for order in ("C", "F"):
        view = contiguous.reshape(shape, order=order)
        if view.strides == tuple(strides):
            return view
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides, subok=True)
