"""Proof that an object is unchanged since it was sent: exact comparison, or a digest.

Anything a process backend keeps for reuse (an object cached in its workers,
a fork pool's copy-on-write snapshot) may be reused only once it is proven
unchanged since it was sent; an ``id()`` is not a version. Two proofs:

* :func:`split` + :func:`same_bytes`: pickle the object again (pickle protocol
  5, big buffers handed over out of band, so numpy data is not copied) and
  compare the stream and each buffer byte for byte against what was sent,
  which still sits in its shared-memory segments. An exact proof; it reads
  both copies once, ~3 GB/s for buffers (numpy, uint64 words).
* :func:`digest`: the same pickling, then SHA-1 of the stream and of each
  buffer in place (~1.4 GB/s). For a copy that is not at hand (a fork
  worker's snapshot). A 160-bit digest: two different states share one with
  probability about 2**-160, far below the odds of a hardware fault. CRC-32
  is faster (~2.6 GB/s) but a 32-bit code is not a proof, and blake2b is
  slower here (~0.7 GB/s).

Both pickle the object, so they run its ``__getstate__`` (or
``__reduce__``), and both raise whatever pickling raises.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import sys
from typing import Any

from . import _shm
from ._remote import PROTOCOL, _Pickler

__all__ = ["split", "same_bytes", "digest"]

#: Bytes compared per step by :func:`same_bytes` (bounds its temporary memory).
_STEP = 1 << 26


def split(obj: Any, threshold: int) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj`` as :mod:`smartexec.transport` sends it, without copying big buffers.

    Args:
        obj: the object.
        threshold: contiguous buffers of this many bytes or more go out of
            band (when shared memory is available), as the transport's
            encoder puts them in segments.

    Returns:
        ``(stream, buffers)``: the in-band pickle stream and a view of each
        out-of-band buffer's memory, in pickling order.

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    buffers: list[memoryview] = []
    shm = _shm.available()

    def offer(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: in band, as the encoder does
            return True
        if raw.nbytes < threshold or not shm:
            return True
        buffers.append(raw)
        return False

    out = io.BytesIO()
    _Pickler(out, protocol=PROTOCOL, buffer_callback=offer).dump(obj)
    return out.getvalue(), buffers


def same_bytes(a: Any, b: Any) -> bool:
    """Return True when buffers ``a`` and ``b`` hold exactly the same bytes.

    Args:
        a, b: objects supporting the buffer protocol (contiguous).

    Returns:
        True when both have the same length and content.
    """
    x = memoryview(a).cast("B")
    y = memoryview(b).cast("B")
    try:
        if x.nbytes != y.nbytes:
            return False
        np = sys.modules.get("numpy")
        for start in range(0, x.nbytes, _STEP):
            if not _same_step(x[start : start + _STEP], y[start : start + _STEP], np):
                return False
        return True
    finally:
        x.release()
        y.release()


def _same_step(x: memoryview, y: memoryview, np: Any) -> bool:
    if np is None:
        return bytes(x) == bytes(y)
    words = x.nbytes // 8 * 8
    left = np.frombuffer(x[:words], dtype=np.uint64)
    right = np.frombuffer(y[:words], dtype=np.uint64)
    same = bool(np.array_equal(left, right))
    del left, right  # they export x and y, which must be released afterwards
    return same and bytes(x[words:]) == bytes(y[words:])


def digest(obj: Any) -> bytes:
    """Return a SHA-1 digest of ``obj``'s pickled state, buffers hashed in place.

    Equal digests prove equal states (up to a 2**-160 chance); the same
    object pickled twice gives the same digest when it has not changed.

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    stream, buffers = split(obj, 0)
    h = hashlib.sha1(usedforsecurity=False)
    h.update(len(stream).to_bytes(8, "little"))
    h.update(stream)
    for buffer in buffers:
        h.update(buffer.nbytes.to_bytes(8, "little"))
        h.update(buffer)
    return h.digest()
