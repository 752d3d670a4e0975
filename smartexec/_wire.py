"""The wire format: a pickle stream with big buffers out of band in shared memory.

Wire format: the pickle stream, then, only when segments or cache entries are
involved, a small pickled header, its length (8 bytes) and a 4-byte marker.
A pickle stream always ends with the STOP opcode ``b"."``, so the marker
cannot be mistaken for one.

See :mod:`smartexec.transport` for how buffers travel and who unlinks them.
"""

from __future__ import annotations

import errno
import io
import pickle
import struct
import time
import warnings
from collections.abc import Hashable
from typing import Any

from . import _shm
from ._remote import PROTOCOL, _Pickler

__all__ = ["BIG_BUFFER_BYTES", "SHM_WRITE_S_PER_BYTE", "estimate_send_s", "send_parts"]


#: Buffers of this many bytes or more travel through shared memory, and
#: objects pickling to more are sent once per worker. Below it, a pipe copy
#: costs less than making, mapping and unlinking a segment (about 30-60 us).
#: Source: joblib's default ``max_nbytes="1M"`` for its memmaps, and
#: benchmarks/bench_payloads.py (2-core machine, 2026-12).
BIG_BUFFER_BYTES = 1 << 20

#: Seconds per byte to put a buffer into a segment (os.write into tmpfs,
#: pages allocated as it goes), for the inline verdict's cost model.
#: Source: benchmarks/bench_payloads.py, 16 MiB arrays (2-core machine, 2026-12).
SHM_WRITE_S_PER_BYTE = 1 / 3.0e9

_MAGIC = b"SMX\x05"

_LENGTH = struct.Struct("<Q")

_TAIL = _LENGTH.size + len(_MAGIC)

#: Argument types never worth caching: small and cheap to pickle.
_ATOMIC = frozenset({int, float, complex, bool, type(None), range, slice})

_full_warned = False


def _warn_full(exc: OSError) -> None:
    global _full_warned
    if not _full_warned:
        _full_warned = True
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            advice = (
                f"This process may open {_open_files_limit()} files (ulimit -n): raise it, "
                f"e.g. ulimit -n 4096, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)"
            )
        else:
            advice = (
                f"If {_shm.SHM_DIR} is small (Docker gives 64 MiB), enlarge it, e.g. "
                f"docker run --shm-size=2g"
            )
        warnings.warn(
            f"smartexec could not put a big buffer in shared memory ({exc}); sending it "
            f"through the pipe instead. {advice}",
            ResourceWarning,
            stacklevel=4,
        )


def _open_files_limit() -> str:
    """This process's soft ``RLIMIT_NOFILE``, as text ("?" where unknown)."""
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return "?"


class _Encoder:
    """The pickler's ``buffer_callback``: big buffers go to new segments.

    Args:
        owner: as for :func:`smartexec._shm.create`.
        threshold: buffers of this many bytes or more go out of band.
        named_ok: False keeps big buffers in band where only a named segment
            could hold them (a fork worker's replies, see :func:`smartexec.transport.serve_request`).
    """

    __slots__ = ("owner", "threshold", "segments", "named_ok")

    def __init__(
        self, owner: int | None, threshold: int = BIG_BUFFER_BYTES, *, named_ok: bool = True
    ):
        self.owner = owner
        self.threshold = threshold
        self.named_ok = named_ok
        self.segments: list[tuple[str, int]] = []

    def offer(self, buffer: pickle.PickleBuffer) -> bool:
        """Return False (out of band) for a buffer put in a segment, else True."""
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        if raw.nbytes < self.threshold or not _shm.available():
            return True
        if not self.named_ok and not _shm.anonymous():
            return True
        try:
            name = _shm.create(raw, owner=self.owner, named=self.named_ok)
        except OSError as exc:
            _warn_full(exc)
            return True
        self.segments.append((name, raw.nbytes))
        return False

    def abort(self) -> None:
        for name, _ in self.segments:
            _shm.unlink(name)
        self.segments = []


def _encode(obj: Any, encoder: _Encoder, prune: Any = None, named: bool = False) -> bytes:
    """Pickle ``obj``, big buffers through ``encoder``; then the header, if any.

    The header lists the segments, ``prune`` (a request's cache entries still
    alive) and ``named`` (the sender uses named segments only, and so must
    its workers: :func:`smartexec._shm.use_named`).
    """
    out = io.BytesIO()
    try:
        _Pickler(out, protocol=PROTOCOL, buffer_callback=encoder.offer).dump(obj)
    except BaseException:
        encoder.abort()
        raise
    if encoder.segments or prune is not None or named:
        header = pickle.dumps((encoder.segments, prune, named), protocol=PROTOCOL)
        out.write(header)
        out.write(_LENGTH.pack(len(header)))
        out.write(_MAGIC)
    return out.getvalue()


def _is_argument(ident: Hashable) -> bool:
    """Whether a cache key names an argument (``("a", id)``), not a callable.

    A callable's key is :func:`~smartexec._identity.identity_key`'s: a tuple
    for a bound method, a bare int for anything else.
    """
    return type(ident) is tuple and ident[0] == "a"


def _split(data: bytes) -> tuple[memoryview, list[tuple[str, int]], Any, bool]:
    """``(pickle stream, segments, prune, named)`` of what :func:`_encode` made."""
    view = memoryview(data)
    if len(view) <= _TAIL or view[-len(_MAGIC) :] != _MAGIC:
        return view, [], None, False
    (length,) = _LENGTH.unpack(view[-_TAIL : -len(_MAGIC)])
    end = len(view) - _TAIL - length
    segments, prune, named = pickle.loads(view[end:-_TAIL])
    return view[:end], segments, prune, named


def _discard(name: str, nbytes: int) -> None:
    try:
        _shm.discard(name, nbytes)
    except OSError:
        pass


class _Discard:
    def write(self, data: Any) -> int:
        return memoryview(data).nbytes


def _dump_without_copy(value: Any) -> None:
    """Pickle ``value`` into nothing, big buffers out of band: raises if it cannot."""
    _Pickler(_Discard(), protocol=PROTOCOL, buffer_callback=lambda _: False).dump(value)


def estimate_send_s(obj: Any) -> float:
    """Seconds the parent spends on ``obj`` in a round trip to a worker.

    Pickles ``obj`` into nothing with big buffers out of band (not copied),
    counts the stream twice (pickled on one side, unpickled on the other)
    and big buffers once, at :data:`SHM_WRITE_S_PER_BYTE`: they are written
    into shared memory once and mapped, not copied, on the other side. A
    buffer that ``obj`` holds twice (the same array in every call of a
    chunk) counts once, as pickle's memo and the send-once cache send it.

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    pickling_s, big = send_parts(obj)
    return 2 * pickling_s + big * SHM_WRITE_S_PER_BYTE


def send_parts(obj: Any, buffers: dict[int, tuple[int, Any]] | None = None) -> tuple[float, int]:
    """``(seconds to pickle obj, bytes of its big buffers)``: what :func:`estimate_send_s` prices.

    The seconds are those just spent pickling it into nothing (big buffers
    out of band, not copied): what measuring it costs. The wall clock, not
    this thread's CPU: an object whose ``__reduce__`` waits (for I/O, a
    lock) makes every send wait, and only this figure shows it (a 20 ms
    wait per argument, timed by the CPU clock, kept a map on fork 6x slower
    than a loop). A buffer ``obj`` holds twice counts once (pickle's memo).

    Args:
        obj: what to price.
        buffers: when given, filled with ``id(exporter) -> (bytes,
            exporter)`` of each big buffer: the array or bytes object that
            exports it, held so that its id stays its own (a Fortran-ordered
            array exports through a temporary transpose, whose id the next
            one would reuse).

    Raises:
        Exception: whatever pickling ``obj`` raises.
    """
    big = 0

    def offer(buffer: pickle.PickleBuffer) -> bool:
        nonlocal big
        try:
            raw = buffer.raw()
        except BufferError:
            return True
        nbytes = raw.nbytes
        if nbytes >= BIG_BUFFER_BYTES and _shm.available():
            big += nbytes
            if buffers is not None:
                buffers[id(raw.obj)] = (nbytes, raw.obj)
            return False
        return True

    start = time.perf_counter()
    _Pickler(_Discard(), protocol=PROTOCOL, buffer_callback=offer).dump(obj)
    return time.perf_counter() - start, big
