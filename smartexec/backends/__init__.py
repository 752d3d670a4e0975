"""Backends: one module per way of running chunks.

``inline``, ``thread``, ``fork``, ``loky`` and ``dask`` ship with smartexec;
others plug in through the ``smartexec.backends`` entry-point group or
:func:`smartexec.register_backend`. All implement :class:`Backend`.

What a backend (built-in or plugin) needs is public here: the base class,
the shape of a chunk (:data:`Call`) and of its result (:class:`ChunkResult`),
:func:`run_chunk` to run a chunk where the workers are, and
:func:`dumps_reply` / :func:`loads_reply` to carry a chunk's result across a
process boundary with each exception's traceback: the one reply format of
every process backend. See docs/backends.md.
"""

from .._remote import Call, ChunkResult, run_chunk
from ..transport import dumps_reply, loads_reply
from ._base import Backend

__all__ = ["Backend", "Call", "ChunkResult", "run_chunk", "dumps_reply", "loads_reply"]
