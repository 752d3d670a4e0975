"""The maps an executor's shutdown finishes: :class:`OpenMaps`.

``map`` reads its input lazily, but the stdlib's ``map`` submits every item
when called, so its results stay readable after ``shutdown()``. An executor
keeps here every map still open: at ``shutdown`` (and when it is dropped
unshut) a map over an input of known length sends the rest of its input, and
every map's chunks already sent finish whole.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import types
import warnings
import weakref
from collections.abc import Sequence

from ._chunk_stream import ChunkStream
from ._threads import is_ours
from .backends._base import Backend

__all__ = ["OpenMaps", "completes_futures", "finish"]


class OpenMaps:
    """The open maps of one executor, for its shutdown. Its methods run under the executor's lock."""

    def __init__(self) -> None:
        #: Maps shutdown(wait=True) finishes, by id(): the stream, and
        #: whether the rest of its input is sent too.
        self._unsent: dict[int, tuple[ChunkStream, bool]] = {}
        #: Of those, the maps over an input of unknown length given no
        #: ``buffersize``, by id(): what their shutdown leaves unread is
        #: warned of (see :func:`finish`).
        self._unknown_length: dict[int, str] = {}
        #: Those whose rest is sent if the executor is dropped unshut (see
        #: :meth:`release_when_dropped`): held weakly, so that no map keeps it alive.
        self._rest_if_dropped: weakref.WeakSet[ChunkStream] = weakref.WeakSet()

    def __bool__(self) -> bool:
        return bool(self._unsent)

    def add(self, stream: ChunkStream, send_rest: bool, unknown_length: str | None = None) -> None:
        """Count ``stream`` among the maps :meth:`finish` finishes.

        Every map's chunks already sent finish whole, re-sent parts
        included (:meth:`ChunkStream.finish`). With ``send_rest`` (a map over
        inputs of known length without ``buffersize``) the rest of its input
        is sent first: the stdlib's reads such an input whole when called,
        so its every item runs, read or not. One read lazily to its end at
        shutdown would never end on an endless input, which the stdlib's
        ``map`` could not take either; with ``buffersize``, 3.14's reads
        lazily too, and its shutdown finishes only the tasks already sent.
        ``unknown_length``: the callable's name, for a map over such an
        input given no ``buffersize``; what it leaves unread at shutdown is
        warned of (:meth:`take`).
        """
        unsent, unknown = self._unsent, self._unknown_length
        # A copy first: a collected map's finaliser (any allocation may run
        # one) pops from the dict, which iterating it would not survive.
        for key, (held, _) in unsent.copy().items():
            if held.settled:  # nothing left to send or to send again
                unsent.pop(key, None)
                unknown.pop(key, None)
        key = id(stream)
        unsent[key] = (stream, send_rest)
        if send_rest:
            self._rest_if_dropped.add(stream)
        if unknown_length is not None:
            unknown[key] = unknown_length

        def finished() -> None:  # holds the dict, not the stream nor the executor
            unsent.pop(key, None)
            unknown.pop(key, None)

        stream.on_cancel = finished

    def take(self) -> list[tuple[ChunkStream, bool]]:
        """The open maps, each with whether its rest is sent; none are kept after.

        Warns (``RuntimeWarning``) of each map over an input of unknown
        length, given no ``buffersize``, that was not read to its end: its
        unread items will not run, where the stdlib's ``map``, which reads
        a finite input whole when called, runs them all.
        """
        unsent = self._unsent.copy()  # see add()
        unread = [
            self._unknown_length[key]
            for key, (stream, _) in unsent.items()
            if key in self._unknown_length and stream.started and not stream.input_read
        ]
        self._unsent.clear()
        self._unknown_length.clear()
        for name in unread:
            warnings.warn(
                f"a map of {name} over an input of unknown length (a generator, a file) "
                f"was not read to its end before shutdown: the items it did not read will not "
                f"run (the stdlib's map reads a finite input whole when called). Read the map's "
                f"results before the executor shuts down, pass a list, or pass buffersize=N to "
                f"say that a lazy map is meant",
                RuntimeWarning,
                stacklevel=_callers_level(),
            )
        return list(unsent.values())

    def release_when_dropped(self, owner: object, backends: dict[str, Backend]) -> None:
        """When ``owner`` dies unshut, let ``backends`` go as ``shutdown(wait=False)`` does.

        As the stdlib executors do (the callback holds no reference to the
        owner). Not at interpreter exit (weakref.finalize's default): a fork
        pool shut down without waiting runs its whole queue out then, and an
        executor still referenced at exit has its pools stopped instead
        (fork's exit hook): a forgotten shutdown() held the exit for as long
        as its queued calls ran, depending on which exit hook ran first.
        """
        finalizer = weakref.finalize(owner, _release, backends, self._rest_if_dropped)
        finalizer.atexit = False


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside smartexec and the standard library.

    A shutdown comes from the user's ``with`` block (through two
    ``__exit__`` methods, or a ``contextlib.ExitStack``'s) or from a call of
    ``shutdown()``: the first frame outside smartexec and the standard
    library is the user's.
    """
    ours = (os.path.dirname(__file__), sysconfig.get_paths()["stdlib"])
    level, frame = 1, sys._getframe(1)
    found: types.FrameType | None = frame
    while found is not None and found.f_code.co_filename.startswith(ours):
        level, found = level + 1, found.f_back
    return level


def finish(
    unsent: list[tuple[ChunkStream, bool]],
    backends: Sequence[Backend],
    *,
    wait: bool,
    cancel_futures: bool,
) -> None:
    """Finish the maps :meth:`OpenMaps.take` gave, as ``shutdown(wait, cancel_futures)`` does.

    A map still reading its first window (its input is the user's code,
    which may wait for this very thread) is not waited for: as with the
    stdlib, whose ``map`` submits as it reads, what it sends after the
    backends shut down fails with ``RuntimeError``.

    Raises:
        BaseException: a Ctrl-C while waiting, after stopping those maps'
            chunks and the backends.
    """
    unsent = [(stream, send_rest) for stream, send_rest in unsent if stream.started]
    streams = [stream for stream, _ in unsent]
    try:
        if not cancel_futures:
            # As the stdlib's map submits every item when called, every
            # item runs, the results readable after the shutdown, waited
            # for or not.
            for stream, send_rest in unsent:
                stream.on_cancel = None
                if send_rest:
                    # Not waited for, the rest goes with no time budget:
                    # the part of a chunk its worker stopped at one could
                    # be sent again only as the map is read, when the
                    # backends no longer take chunks.
                    stream.send_rest(budgets=wait)
        if wait and not cancel_futures and not completes_futures(backends):
            # The rest of a chunk stopped at its time budget, and a dead
            # worker's items, are sent again only as a map is read: here,
            # while the backends still take them.
            for stream in streams:
                stream.finish()
    except BaseException:  # Ctrl-C while waiting: stop those maps' chunks
        for stream in streams:
            stream.abort()
        for backend in backends:
            backend.shutdown(wait=False, cancel_futures=True)
        raise


def completes_futures(backends: Sequence[Backend]) -> bool:
    """Whether the calling thread is one that runs chunks or completes their futures.

    A ``shutdown(wait=True)`` there (from a call on the executor's own
    threads, or from a future's done-callback, run by a dispatcher thread or
    loky's manager thread) must not wait for chunks: their results would
    come through this very thread, and it would wait forever.
    """
    thread = threading.current_thread()
    if is_ours(thread) or type(thread).__name__ == "_ExecutorManagerThread":
        return True
    return any(backend.runs_this_thread() for backend in backends)


def _release(backends: dict[str, Backend], streams: weakref.WeakSet[ChunkStream]) -> None:
    """Shut down the backends of an executor that was dropped, as ``shutdown(wait=False)`` does.

    Its maps over inputs of known length still open (``streams``) send the
    rest of their input first (see :meth:`SmartExecutor.shutdown`): as with
    the stdlib, whose ``map`` submits every item when called, their results
    stay readable.
    """
    for stream in list(streams):
        try:
            stream.send_rest(budgets=False)
        except Exception:  # pragma: no cover - best effort during garbage collection
            pass
    for backend in list(backends.values()):
        try:
            backend.shutdown(wait=False)
        except Exception:  # pragma: no cover - best effort during garbage collection
            pass
