"""Measured profiles of callables, kept on disk so that a script's next run starts decided.

A typical script creates one executor, runs one big ``map`` and exits, so
everything measured about its callable (seconds per item, pickling cost, GIL
use, the route it ran on) would be lost with the process. This module keeps
those figures in a small store, one JSON file per callable, and gives them
back to a later process that maps *the same callable on the same machine*.

The same callable means the same :func:`profile_key`: module, qualified
name and a hash of the code (bytecode, constants including nested code
objects, global names), the Python (implementation, major.minor, free-
threaded or not) and the machine (architecture, usable CPUs, node name).
Edit the function's body and the key changes; copy the script to another
machine and it changes too. Nothing in the key covers the *data* a map gets:
a stored profile is a starting point, re-checked by the first chunks of the
new map, never trusted over fresh evidence.

Storage: ``$SMARTEXEC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/smartexec``,
else ``~/.cache/smartexec``; ``SMARTEXEC_CACHE=0`` (or ``false``, ``no``,
``off``) turns loading and saving off. A save is known to this process at
once and written to disk by :func:`flush`: when the map that measured it
ends, when an executor shuts down, and at interpreter exit, not while a map
runs (a write lets go of the GIL and,
under load, waits for it behind busy pool threads: two saves took 17 ms of
a 70 ms map of numpy items on threads). Files are written atomically (a
temporary file in the same directory, then :func:`os.replace`); a file that
is corrupt, of another format version, for another key or older than
:data:`MAX_AGE_S` is ignored and replaced by the next save; an unwritable
directory turns saving off for this process with one debug-level log line.
The store keeps at most :data:`MAX_ENTRIES` files (the oldest go first).

What the store trusts, and why. A stored profile changes where a user's
code runs, so the store is one that can only make things faster: it reads
nothing another user could have written, and nothing it reads or fails to
read can hang, exhaust or break a map.

- The directory must belong to this user (:func:`os.geteuid`) and not be
  writable by group or others: anyone else who can create files in it
  could plant profiles (and root would read them). Otherwise the store runs
  as if it were empty (no load, no save) and logs one warning per
  directory per process (:mod:`logging`, not :mod:`warnings`: a warning
  turned into an error by ``-W error`` would raise into the map).
  :func:`refusal` says why, and ``python -m smartexec cache`` prints it.
  The directory is opened once per operation and its files are reached
  through that descriptor, so a path swapped after the check is not used.
- A file is read only when it is a regular file (no symlink: the open
  uses ``O_NOFOLLOW``; no FIFO or device: ``O_NONBLOCK`` then ``fstat``)
  owned by this user, not writable by group or others, and of at most
  :data:`MAX_FILE_BYTES` (a profile is about 1 KiB): anything else is
  ignored as if absent.
- Every error of the store (an unusable directory, ``OSError``,
  ``ValueError``, ``MemoryError``, anything) is a debug-level log line,
  never an exception out of :func:`load`, :func:`save`, :func:`flush`,
  :func:`clear`, :func:`entry_count` or :func:`cache_dir`, so never out
  of ``map`` or ``submit``.
- It removes only files it made (when pruning and in :func:`clear`), all
  regular files of this user: a profile is one whose JSON names a key
  (of any format version) whose hash is its file name; a temporary file
  is one whose name carries the store's token (``.tmp-smartexec-``), and
  is removed only over an hour old (a live writer's stays). A save
  replaces only a regular file of this user at its own key's name. A
  user's other files in the directory, whatever their names, stay.
- Where the platform lacks those calls (``O_NOFOLLOW``, ``os.geteuid``,
  directory descriptors: not POSIX) the store is off.

A load reads one small file the first time a callable is seen, then answers
from this process's memory. Thread-safe and fork-safe (a forked child gets a
fresh lock).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._profile_key import FORMAT_VERSION, profile_key
from ._store_files import (
    _DIR_FLAGS,
    _O_CLOEXEC,
    _O_DIRECTORY,
    _O_NOFOLLOW,
    _O_NONBLOCK,
    _TMP_PREFIX,
    _WRITE_FLAGS,
    MAX_FILE_BYTES,
    _not_own_file,
    _read,
    _store_files,
    _unlink,
    _untrusted_dir,
    refusal,
)
from .gil import GilProfile
from .inspection import format_seconds

__all__ = [
    "StoredProfile",
    "profile_key",
    "load",
    "save",
    "flush",
    "clear",
    "cache_dir",
    "refusal",
    "entry_count",
    "earlier_run_reason",
    "FORMAT_VERSION",
    "MAX_AGE_S",
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "CACHE_ENV",
    "CACHE_DIR_ENV",
]

LOGGER = logging.getLogger(__name__)


#: This process's token in the profiles it saves (:attr:`StoredProfile.run`).
_RUN_ID = os.urandom(8).hex()

#: A profile saved longer ago than this (seconds: 30 days) is ignored.
MAX_AGE_S = 30 * 24 * 3600.0

#: The most profile files kept; a save that adds one beyond it removes the oldest.
MAX_ENTRIES = 1000

#: Set to "0", "false", "no" or "off" to neither load nor save profiles.
CACHE_ENV = "SMARTEXEC_CACHE"

#: The directory profiles are kept in (default: the user's cache directory).
CACHE_DIR_ENV = "SMARTEXEC_CACHE_DIR"

_OFF = frozenset({"0", "false", "no", "off"})
_KINDS = ("waits", "releases", "holds")

#: Whether this platform has what the store needs to open its files safely
#: (POSIX); without it the store is off.
_SAFE_CALLS = (
    all((_O_NOFOLLOW, _O_NONBLOCK, _O_CLOEXEC, _O_DIRECTORY))
    and hasattr(os, "geteuid")
    and {os.open, os.stat, os.unlink, os.rename} <= os.supports_dir_fd  # os.replace is rename()
    and os.scandir in os.supports_fd
)
#: A temporary file older than this (seconds) was left by a writer that died.
_TMP_STALE_S = 3600.0
#: Most entries (hits and misses) kept in this process's view of the store.
_VIEW_SIZE = 4096


@dataclass(frozen=True)
class StoredProfile:
    """What an earlier run measured about one callable.

    Attributes:
        backend: the route the callable's last map ran on (``"thread"``,
            ``"fork"``, ``"loky"``, ``"inline"`` ...).
        per_item_s: seconds of work per item, measured in the workers.
        gil: how the items used the CPU and the GIL (a
            :class:`~smartexec.gil.GilProfile`), or None when not measured.
        send_s: seconds per item the parent spent pickling arguments and
            unpickling results; 0 on threads.
        items: the number of items the figures rest on.
        saved_at: when it was saved (``time.time()``, seconds since the epoch).
        source: what measured them: ``"map"`` (a map's chunks) or
            ``"submits"`` (completed submits, see
            :mod:`smartexec._submit_learning`).
        run: which process saved it (set by :func:`save`: a token drawn once
            per process; "" when unknown): another executor of this
            process, or an earlier run.
    """

    backend: str
    per_item_s: float
    gil: GilProfile | None
    send_s: float
    items: int
    saved_at: float
    source: str = "map"
    run: str = field(default="", compare=False)

    @property
    def from_this_process(self) -> bool:
        """Whether this process saved it (another executor measured it), not an earlier run."""
        return self.run == _RUN_ID

    def last_work(self) -> str:
        """What measured it, for a sentence: "the earlier run's last map", ..."""
        what = "last map" if self.source == "map" else "submits"
        if self.from_this_process:
            return f"its {what} in another executor of this process"
        return f"the earlier run's {what}"


# -- the key ---------------------------------------------------------------------


# -- the store -------------------------------------------------------------------


def cache_dir() -> Path | None:
    """Return the directory profiles are kept in, or None when the store is off.

    The directory may not exist yet, and may be one the store refuses to
    use (:func:`refusal` says). Never raises.

    Returns:
        ``$SMARTEXEC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/smartexec``,
        else ``~/.cache/smartexec``; None when ``SMARTEXEC_CACHE`` is ``0``,
        ``false``, ``no`` or ``off``, when no home directory is known or
        ``$SMARTEXEC_CACHE_DIR`` cannot be expanded (``~nosuchuser/...``),
        or when this platform lacks the calls the store needs to open its
        files safely (``O_NOFOLLOW``, ``os.geteuid``, directory descriptors).
    """
    return _where()[0]


def _where() -> tuple[Path | None, str]:
    """:func:`cache_dir` and its ``str()``, re-read from the environment at every call."""
    env = os.environ.get
    return _resolve(env(CACHE_ENV), env(CACHE_DIR_ENV), env("XDG_CACHE_HOME"), env("HOME"))


@functools.lru_cache(maxsize=8)
def _resolve(
    switch: str | None, explicit: str | None, xdg: str | None, home: str | None
) -> tuple[Path | None, str]:
    directory: Path | None
    if not _SAFE_CALLS or (switch or "").strip().lower() in _OFF:
        directory = None
    else:
        try:
            if explicit:
                directory = Path(explicit).expanduser()
            elif xdg and os.path.isabs(xdg):
                directory = Path(xdg) / "smartexec"
            else:
                directory = Path.home() / ".cache" / "smartexec"
        except Exception as exc:  # RuntimeError, KeyError, OSError: no such home
            LOGGER.debug("smartexec: no profile store: %r", exc)
            directory = None
    return directory, str(directory)


def _file_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest() + ".json"


_lock = threading.Lock()
_view: dict[tuple[str, str], StoredProfile | None] = {}
_unwritable: set[str] = set()
#: Directories warned about (untrusted), once each per process; clear() keeps it.
_warned: set[str] = set()
#: Saves not written yet: (directory, its str()) and file name -> the file's text.
_pending: dict[tuple[Path, str, str], str] = {}
_flushing = threading.Lock()  # held by flush() throughout
#: Whether flush() is registered to run at exit (at the first save).
_at_exit = False


def _after_fork_in_child() -> None:
    global _lock, _flushing
    _lock = threading.Lock()  # another thread of the parent may have held it
    _flushing = threading.Lock()
    _pending.clear()  # the parent's to write, not a worker's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- what the store trusts ------------------------------------------------------------


def _warn_once(where: str, reason: str) -> None:
    with _lock:
        first = where not in _warned
        _warned.add(where)
    if first:
        LOGGER.warning(
            "smartexec: not using the profile store %s: %s; profiles of measured callables "
            "are neither loaded nor saved (make it yours and not writable by others, e.g. "
            "chmod go-w, or set %s to a directory of your own)",
            where,
            reason,
            CACHE_DIR_ENV,
        )


@contextlib.contextmanager
def _opened(where: str) -> Iterator[int | None]:
    """A descriptor of the directory ``where`` when the store trusts it, else None.

    None too when it does not exist; an untrusted one gets one warning per
    process (:func:`_warn_once`). Other errors (not a directory, no access)
    are raised, for the caller's note.
    """
    try:
        fd = os.open(where, _DIR_FLAGS)
    except FileNotFoundError:
        yield None
        return
    try:
        reason = _untrusted_dir(os.fstat(fd))
        if reason is not None:
            _warn_once(where, reason)
        yield fd if reason is None else None
    finally:
        os.close(fd)


def _made_by_store(data: bytes | None, name: str) -> bool:
    """Whether ``data``, read from the file ``name``, is a profile this store wrote.

    Of any format version: a JSON object whose ``key`` hashes to the file's
    name (:func:`_file_name`), which only the store's files do.
    """
    if data is None:
        return False
    try:
        content = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    key = content.get("key") if isinstance(content, dict) else None
    return isinstance(key, str) and _file_name(key) == name


def _is_own(dir_fd: int, kind: str, name: str) -> bool:
    """Whether the file ``name`` of :func:`_store_files`'s ``kind`` is one the store made.

    False when it cannot be read: a file the store cannot tell is its own stays.
    """
    if kind == "tmp":
        return True
    try:
        return _made_by_store(_read(dir_fd, name), name)
    except OSError as exc:
        LOGGER.debug("smartexec: cannot read %s in the profile store: %s", name, exc)
        return False


# -- the files' content -------------------------------------------------------------


def _number(value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"not a number: {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"out of range: {value!r}")
    return number


def _count(value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"not a count: {value!r}")
    return value


def _gil_from(data: Any) -> GilProfile | None:
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise ValueError("bad gil entry")
    return GilProfile(
        kind=data["kind"],
        items=_count(data["items"]),
        wall_s=_number(data["wall_s"]),
        cpu_share=_number(data["cpu_share"]),
        gil_share=_number(data["gil_share"]),
        samples=_count(data["samples"]),
        threads=_count(data["threads"], 1),
        cores=_number(data["cores"], positive=True),
    )


def _parse(text: str, key: str) -> StoredProfile | None:
    """The profile in a file's text, or None when it is not a valid one for ``key``."""
    try:
        data = json.loads(text)
        if (
            not isinstance(data, dict)
            or data.get("format") != FORMAT_VERSION
            or data.get("key") != key
        ):
            return None
        backend = data["backend"]
        if not isinstance(backend, str) or not backend:
            return None
        return StoredProfile(
            backend=backend,
            per_item_s=_number(data["per_item_s"]),
            gil=_gil_from(data["gil"]),
            send_s=_number(data["send_s"]),
            items=_count(data["items"], 1),
            saved_at=_number(data["saved_at"]),
            source="submits" if data.get("source") == "submits" else "map",
            run=str(data.get("run", "")),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _fresh(profile: StoredProfile | None, now: float) -> bool:
    # A date far in the future is a wrong clock or a forged file: not fresh either.
    return profile is not None and -86400.0 <= now - profile.saved_at <= MAX_AGE_S


def _remember(view_key: tuple[str, str], profile: StoredProfile | None) -> None:
    with _lock:
        if len(_view) >= _VIEW_SIZE:
            _view.clear()
        _view[view_key] = profile


def load(fn: Callable[..., Any]) -> StoredProfile | None:
    """Return the profile an earlier run saved for ``fn``, or None.

    Reads at most one small file per callable per process; later loads
    answer from memory. Never raises: an error of the store is a
    debug-level log line, and the store is then as if empty.

    Args:
        fn: the callable.

    Returns:
        The saved :class:`StoredProfile`; None when the store is off or
        refuses its directory (see the module's docstring), ``fn`` has no
        stable key, nothing was saved for it, or the file is corrupt, of
        another format version, not a regular file of this user, bigger
        than :data:`MAX_FILE_BYTES`, unreadable or older than
        :data:`MAX_AGE_S`.
    """
    try:
        return _load(fn)
    except Exception as exc:  # anything at all: the store only ever makes things faster
        LOGGER.debug("smartexec: not loading a profile: %r", exc)
        return None


def _load(fn: Callable[..., Any]) -> StoredProfile | None:
    directory, where = _where()
    if directory is None:
        return None
    key = profile_key(fn)
    if key is None:
        return None
    view_key = (where, key)
    now = time.time()
    with _lock:
        known = view_key in _view
        profile = _view.get(view_key)
    if not known:
        profile = _read_profile(where, key)
        _remember(view_key, profile)
    return profile if _fresh(profile, now) else None


def _read_profile(where: str, key: str) -> StoredProfile | None:
    """The profile of ``key`` in the directory ``where``, or None (errors are notes)."""
    try:
        with _opened(where) as dir_fd:
            data = None if dir_fd is None else _read(dir_fd, _file_name(key))
        return None if data is None else _parse(data.decode("utf-8"), key)
    except Exception as exc:
        LOGGER.debug("smartexec: not loading the profile of %s from %s: %r", key, where, exc)
        return None


def _encode(key: str, profile: StoredProfile) -> str:
    data = {
        "format": FORMAT_VERSION,
        "key": key,
        "backend": profile.backend,
        "per_item_s": profile.per_item_s,
        "gil": None if profile.gil is None else asdict(profile.gil),
        "send_s": profile.send_s,
        "items": profile.items,
        "saved_at": profile.saved_at,
        "source": profile.source,
        "run": profile.run,
    }
    return json.dumps(data, allow_nan=False, sort_keys=True)


def _prune(dir_fd: int, keep: str) -> None:
    """Remove the store's stale temporary files, expired entries, and the oldest beyond MAX_ENTRIES.

    Only files the store made (:func:`_is_own`) are removed.
    """
    now = time.time()
    entries: list[tuple[float, str]] = []
    for kind, name, st in _store_files(dir_fd):
        age = now - st.st_mtime
        if kind != "profile":
            if age > _TMP_STALE_S and _is_own(dir_fd, kind, name):
                _unlink(name, dir_fd)
        elif name != keep:
            if age <= MAX_AGE_S:
                entries.append((st.st_mtime, name))
            elif _is_own(dir_fd, kind, name):
                _unlink(name, dir_fd)
    excess = len(entries) + 1 - MAX_ENTRIES
    entries.sort()
    for _, name in entries:
        if excess <= 0:
            break
        if _is_own(dir_fd, "profile", name):
            _unlink(name, dir_fd)
        excess -= 1  # one removed, or one counted that was not the store's


def save(fn: Callable[..., Any], profile: StoredProfile) -> None:
    """Keep ``profile`` as ``fn``'s, for later runs (and later loads in this one).

    Never raises: when the store is off or ``fn`` has no stable key it does
    nothing, and an error is a debug-level log line. Later loads in this
    process get ``profile`` at once; the file is written by :func:`flush`
    (the map's end, an executor's shutdown, interpreter exit), not here: a
    save comes from a running map.

    Args:
        fn: the callable.
        profile: what its map measured.
    """
    try:
        _save(fn, profile)
    except Exception as exc:  # anything at all: the store only ever makes things faster
        LOGGER.debug("smartexec: not saving a profile: %r", exc)


def _save(fn: Callable[..., Any], profile: StoredProfile) -> None:
    directory, where = _where()
    if directory is None:
        return
    key = profile_key(fn)
    if key is None:
        return
    profile = dataclasses.replace(profile, run=_RUN_ID)
    try:
        text = _encode(key, profile)
    except (ValueError, TypeError) as exc:
        LOGGER.debug("smartexec: not saving a profile of %s: %s", key, exc)
        return
    # What a load would refuse is not kept.
    if _parse(text, key) is None or len(text.encode("utf-8")) > MAX_FILE_BYTES:
        LOGGER.debug("smartexec: not saving an invalid profile of %s: %r", key, profile)
        return
    _remember((where, key), profile)
    global _at_exit
    with _lock:
        if where not in _unwritable:
            _pending[(directory, where, _file_name(key))] = text
        register, _at_exit = not _at_exit, True
    if register:
        # At the first save, so that it runs before the exit hooks of the
        # pools started earlier (atexit runs the last registered first):
        # written after them, the files moved loky's semaphore clean-up at
        # exit, whose tracker then warned of a leak.
        atexit.register(flush)


def flush() -> None:
    """Write the profiles saved by this process since the last flush.

    Called when a map that measured its callable ends, when an executor
    shuts down, and at interpreter exit (see :func:`save`); a store
    turned off since the saves (``SMARTEXEC_CACHE=0``) gets nothing. A
    save that adds a file beyond :data:`MAX_ENTRIES` removes the oldest
    of the store's files; a directory that cannot be written turns saving
    off for this process (one debug-level log line), and one the store
    refuses (see the module's docstring) gets nothing (one warning). Never
    raises.
    """
    try:
        _flush()
    except Exception as exc:  # anything at all: the store only ever makes things faster
        LOGGER.debug("smartexec: not writing profiles: %r", exc)


def _flush() -> None:
    with _flushing:  # one flush at a time: a slower one must not write older text last
        with _lock:
            if not _pending:
                return
            pending = list(_pending.items())
            _pending.clear()
        if _where()[0] is None:
            return  # the store was turned off since (SMARTEXEC_CACHE=0): nothing is written
        for (directory, where, name), text in pending:
            with _lock:
                if where in _unwritable:
                    continue
            try:
                _write(directory, where, name, text)
            except Exception as exc:  # _write's OSErrors turn saving off; others are notes
                LOGGER.debug("smartexec: not saving %s in %s: %r", name, where, exc)


def _write(directory: Path, where: str, name: str, text: str) -> None:
    """Write one profile's file in ``directory``; an OSError turns saving there off."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _opened(where) as dir_fd:
            if dir_fd is not None:
                _write_in(dir_fd, name, text.encode("utf-8"))
                return
        with _lock:
            _unwritable.add(where)  # refused: warned once by _opened
    except OSError as exc:
        with _lock:
            first = where not in _unwritable
            _unwritable.add(where)
        if first:
            LOGGER.debug("smartexec: not saving profiles in %s: %s", where, exc)


def _write_in(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``data`` as the file ``name`` of the directory ``dir_fd``, atomically.

    Replaces only a regular file of this user (a FIFO, symlink, directory or
    another user's file at that name stays); a new file may prune the store.
    """
    try:
        why = _not_own_file(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    except FileNotFoundError:
        is_new = True
    else:
        if why is not None:
            LOGGER.debug("smartexec: not replacing %s in the profile store: %s", name, why)
            return
        is_new = False
    tmp = f"{_TMP_PREFIX}{os.urandom(8).hex()}.json"
    fd = os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(tmp, dir_fd)
        raise
    if is_new:
        try:
            _prune(dir_fd, name)
        except Exception as exc:  # the profile is saved; pruning is tried again on the next
            LOGGER.debug("smartexec: not pruning the profile store: %r", exc)


def entry_count() -> int:
    """Return how many profiles the store holds.

    Counts only files the store made (see :func:`clear`). Never raises.

    Returns:
        The number of profile files; 0 when the store is off, refuses its
        directory, is empty or cannot be read.
    """
    try:
        directory, where = _where()
        if directory is None:
            return 0
        with _opened(where) as dir_fd:
            if dir_fd is None:
                return 0
            return sum(
                1
                for kind, name, _ in _store_files(dir_fd)
                if kind == "profile" and _is_own(dir_fd, kind, name)
            )
    except Exception as exc:
        LOGGER.debug("smartexec: cannot count the stored profiles: %r", exc)
        return 0


def clear() -> int:
    """Remove every saved profile (and forget this process's view of them).

    Only the store's own files are removed: a profile whose content names
    the key its file name is the hash of, and a temporary file with the
    store's token in its name, left over an hour ago by a writer that died.
    Other files in the directory stay, whatever their names. Nothing is
    removed from a directory the store refuses (see :func:`refusal`).
    Never raises.

    Returns:
        The number of profile files removed (0 when the store is off).
    """
    with _lock:
        _view.clear()
        _unwritable.clear()
        _pending.clear()
    removed = 0
    try:
        directory, where = _where()
        if directory is None:
            return 0
        now = time.time()
        with _opened(where) as dir_fd:
            if dir_fd is None:
                return 0
            for kind, name, st in _store_files(dir_fd):
                if kind != "profile" and now - st.st_mtime <= _TMP_STALE_S:
                    continue  # a live writer's
                if _is_own(dir_fd, kind, name) and _unlink(name, dir_fd):
                    removed += kind == "profile"
    except Exception as exc:
        LOGGER.debug("smartexec: not clearing the profile store: %r", exc)
    return removed


def earlier_run_reason(profile: StoredProfile, starts_on: str | None = None) -> str:
    """One sentence for a decision that starts from ``profile``.

    ``starts_on``: the backend the decision starts on (its own reasons, such
    as reading the code, may put it on threads whatever was stored), or None.
    """
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(profile.saved_at))
    gil = "" if profile.gil is None else f", GIL use: {profile.gil.kind}"
    unit = "item" if profile.source == "map" else "call"
    send = f", {format_seconds(profile.send_s)} per {unit} to send" if profile.send_s > 0 else ""
    where = "earlier in this process" if profile.from_this_process else "in an earlier run"
    if profile.source == "submits":
        # Measured in process workers; the backend stored is where they moved.
        check = (
            "a map re-checks it on its first chunks"
            if profile.from_this_process
            else "this run's own submits must move them again"
        )
        return (
            f"measured by {profile.items} completed submits {where} ({when}): "
            f"{format_seconds(profile.per_item_s)} per call in process workers{send}{gil} "
            f"-> its submits moved to {profile.backend}; {check}"
        )
    head = f"measured {where} ({when}, {profile.items} items)"
    check = "a map re-checks it on its first chunks"
    on_processes = starts_on not in ("thread", "inline")
    if not profile.from_this_process and profile.backend in ("thread", "inline") and on_processes:
        check = (
            f"it starts on processes all the same: a move to {profile.backend} is "
            f"re-earned from this run's first chunks"
        )
    return (
        f"{head}: {format_seconds(profile.per_item_s)} per {unit} on {profile.backend}"
        f"{send}{gil}; {check}"
    )
