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
Nothing here raises into a user's map. The store keeps at most
:data:`MAX_ENTRIES` files (the oldest go first).

A load reads one small file the first time a callable is seen, then answers
from this process's memory. Thread-safe and fork-safe (a forked child gets a
fresh lock).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import re
import sys
import sysconfig
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._system import current_platform
from .gil import GilProfile
from .inspection import attribute, format_seconds

__all__ = [
    "StoredProfile",
    "profile_key",
    "load",
    "save",
    "flush",
    "clear",
    "cache_dir",
    "entry_count",
    "earlier_run_reason",
    "FORMAT_VERSION",
    "MAX_AGE_S",
    "MAX_ENTRIES",
    "CACHE_ENV",
    "CACHE_DIR_ENV",
]

LOGGER = logging.getLogger(__name__)

#: The version of the files' layout; a file of another version is ignored.
FORMAT_VERSION = 1

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
_NAME = re.compile(r"^[0-9a-f]{64}\.json$")
_TMP_PREFIX = ".tmp-"
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


def _const_digest(value: Any) -> bytes:
    """A digest of one code constant, stable across interpreters of one Python."""
    h = hashlib.sha256()
    if isinstance(value, types.CodeType):
        h.update(b"code:" + _code_digest(value))
    elif isinstance(value, tuple):
        h.update(b"tuple:%d:" % len(value))
        for item in value:
            h.update(_const_digest(item))
    elif isinstance(value, frozenset):
        # Iteration order of a set of strings follows the per-process hash seed.
        h.update(b"frozenset:")
        for digest in sorted(_const_digest(item) for item in value):
            h.update(digest)
    else:
        h.update(f"{type(value).__qualname__}:{value!r}".encode("utf-8", "backslashreplace"))
    return h.digest()


def _code_digest(code: types.CodeType) -> bytes:
    """A digest of what a code object does: bytecode, constants (nested code too), names."""
    h = hashlib.sha256()
    h.update(code.co_code)  # deoptimised bytes: the same before and after the code ran
    h.update(b"\0names:" + "\0".join(code.co_names).encode("utf-8", "backslashreplace"))
    for const in code.co_consts:
        h.update(_const_digest(const))
    return h.digest()


#: Code digests by ``id()`` of their code object, with a weak reference that
#: proves the id was not reused (code objects live as long as their functions).
_digests: dict[int, tuple[weakref.ref[types.CodeType], str]] = {}


def _cached_code_digest(code: types.CodeType) -> str:
    known = _digests.get(id(code))
    if known is not None and known[0]() is code:
        return known[1]
    digest = _code_digest(code).hex()[:32]
    if len(_digests) >= _VIEW_SIZE:
        _digests.clear()
    _digests[id(code)] = (weakref.ref(code), digest)  # dict calls are atomic: no lock
    return digest


def _function_part(fn: types.FunctionType) -> str:
    # Not the file name: a notebook's cells compile to a file named after the
    # kernel's pid (/tmp/ipykernel_<pid>/...), new at every start.
    return f"function {fn.__module__}:{fn.__qualname__} code={_cached_code_digest(fn.__code__)}"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _what(fn: Any, depth: int = 0) -> str | None:
    """The part of the key that names the callable itself, or None."""
    if depth > 8:  # a chain of wrappers or partials that long is no stable thing
        return None
    if isinstance(fn, types.FunctionType):
        part = _function_part(fn)
        # A decorator's wrapper has one code for every function it wraps:
        # the wrapped function's code tells them apart (functools.wraps).
        wrapped = fn.__dict__.get("__wrapped__")
        if wrapped is None:
            return part
        inner = _what(wrapped, depth + 1)
        return None if inner is None else f"{part} wrapping {inner}"
    if isinstance(fn, types.MethodType):
        owner = fn.__self__
        inner = _what(fn.__func__, depth + 1)
        if inner is None:
            return None
        cls = owner if isinstance(owner, type) else type(owner)
        return f"method of {_class_name(cls)}: {inner}"
    if isinstance(fn, functools.partial):
        inner = _what(fn.func, depth + 1)
        if inner is None:
            return None
        args = ",".join(_class_name(type(a)) for a in fn.args)
        kwargs = ",".join(f"{k}={_class_name(type(v))}" for k, v in sorted(fn.keywords.items()))
        return f"partial({args};{kwargs}) of {inner}"
    if isinstance(fn, types.BuiltinFunctionType):
        owner = fn.__self__
        if owner is None or isinstance(owner, types.ModuleType):
            module = fn.__module__ or getattr(owner, "__name__", None)
            return None if module is None else f"builtin {module}:{fn.__qualname__}"
        cls = owner if isinstance(owner, type) else type(owner)
        return f"builtin method of {_class_name(cls)}: {fn.__name__}"
    if isinstance(
        fn,
        (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType),
    ):
        return f"descriptor of {_class_name(fn.__objclass__)}: {fn.__name__}"
    if isinstance(fn, types.MethodWrapperType):
        return f"method wrapper of {_class_name(type(fn.__self__))}: {fn.__name__}"
    if isinstance(fn, type):
        parts = [f"class {_class_name(fn)}"]
        for name in ("__new__", "__init__"):
            method = fn.__dict__.get(name)
            if isinstance(method, staticmethod):
                method = method.__func__
            if isinstance(method, types.FunctionType):
                parts.append(f"{name}: {_function_part(method)}")
        return " ".join(parts)
    cls = type(fn)
    call = next((c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__), None)
    if isinstance(call, types.FunctionType):
        return f"instance of {_class_name(cls)}: {_function_part(call)}"
    # A C-level callable object: stable only when it is a named thing (a
    # numpy ufunc, a Cython function), not one built from arguments
    # (operator.itemgetter(1)).
    label: Any = attribute(fn, "__qualname__") or attribute(fn, "__name__")
    home: Any = attribute(fn, "__module__") or cls.__module__
    if not isinstance(label, str) or not isinstance(home, str):
        return None
    return f"named {_class_name(cls)}: {home}:{label}"


@functools.lru_cache(maxsize=1)
def _python() -> str:
    # sys.abiflags names a free-threaded build ("t") where it exists (POSIX);
    # sysconfig costs ~3 ms to load its build data, on the first map's path.
    flags = getattr(sys, "abiflags", None)
    if flags is None:
        flags = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    threaded = "t" if "t" in flags else ""
    gil = "" if current_platform().gil_enabled else " gil=off"
    major, minor = sys.version_info[:2]
    return f"{sys.implementation.name}-{major}.{minor}{threaded}{gil}"


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    return f"{platform.machine()} cpus={current_platform().cpu_count} node={platform.node()}"


def profile_key(fn: Callable[..., Any]) -> str | None:
    """Return what identifies ``fn`` as "the same callable" in a later run.

    A readable string: the callable's kind, module and qualified name, a
    hash of its code (for a bound method its function's code and its class;
    for a ``functools.partial`` its function's key and the types of its bound
    arguments; for a callable object its class's ``__call__``; a builtin by
    module and name), then the Python and the machine. Lambdas and closures
    are told apart by their code's hash.

    Args:
        fn: any callable.

    Returns:
        The key, or None when ``fn`` has no key stable across runs (a C-level
        callable object made from arguments, such as ``operator.itemgetter(1)``).
    """
    try:
        what = _what(fn)
    except Exception:  # an odd object's attributes: no key, never an error
        return None
    if what is None:
        return None
    return f"v{FORMAT_VERSION} | {what} | {_python()} | {_machine()}"


# -- the store -------------------------------------------------------------------


def cache_dir() -> Path | None:
    """Return the directory profiles are kept in, or None when the store is off.

    Returns:
        ``$SMARTEXEC_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/smartexec``,
        else ``~/.cache/smartexec`` (it may not exist yet); None when
        ``SMARTEXEC_CACHE`` is ``0``, ``false``, ``no`` or ``off``, or no home
        directory is known.
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
    if (switch or "").strip().lower() in _OFF:
        directory = None
    elif explicit:
        directory = Path(explicit).expanduser()
    elif xdg and os.path.isabs(xdg):
        directory = Path(xdg) / "smartexec"
    else:
        try:
            directory = Path.home() / ".cache" / "smartexec"
        except (RuntimeError, KeyError, OSError):
            directory = None
    return directory, str(directory)


def _file_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest() + ".json"


_lock = threading.Lock()
_view: dict[tuple[str, str], StoredProfile | None] = {}
_unwritable: set[str] = set()
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
    answer from memory. Never raises.

    Args:
        fn: the callable.

    Returns:
        The saved :class:`StoredProfile`; None when the store is off, ``fn``
        has no stable key, nothing was saved for it, or the file is corrupt,
        of another format version, unreadable or older than :data:`MAX_AGE_S`.
    """
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
        try:
            text = (directory / _file_name(key)).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError):
            profile = None
        else:
            profile = _parse(text, key)
        _remember(view_key, profile)
    return profile if _fresh(profile, now) else None


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


def _prune(directory: Path, keep: str) -> None:
    """Remove stale temporary files, expired entries, and the oldest beyond MAX_ENTRIES."""
    now = time.time()
    entries: list[tuple[float, str]] = []
    with os.scandir(directory) as it:
        for entry in it:
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if entry.name.startswith(_TMP_PREFIX):
                if now - mtime > _TMP_STALE_S:
                    _unlink(entry.path)
            elif _NAME.match(entry.name) and entry.name != keep:
                if now - mtime > MAX_AGE_S:
                    _unlink(entry.path)
                else:
                    entries.append((mtime, entry.path))
    excess = len(entries) + 1 - MAX_ENTRIES
    if excess > 0:
        entries.sort()
        for _, path in entries[:excess]:
            _unlink(path)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def save(fn: Callable[..., Any], profile: StoredProfile) -> None:
    """Keep ``profile`` as ``fn``'s, for later runs (and later loads in this one).

    Never raises: when the store is off or ``fn`` has no stable key it does
    nothing. Later loads in this process get ``profile`` at once; the file
    is written by :func:`flush` (the map's end, an executor's shutdown,
    interpreter exit), not here: a save comes from a running map.

    Args:
        fn: the callable.
        profile: what its map measured.
    """
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
    if _parse(text, key) is None:  # what a load would refuse is not kept
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
    """Write the profiles saved by this process since the last flush; never raises.

    Called when a map that measured its callable ends, when an executor
    shuts down, and at interpreter exit (see :func:`save`); a store
    turned off since the saves (``SMARTEXEC_CACHE=0``) gets nothing. A
    save that adds a file beyond :data:`MAX_ENTRIES` removes the oldest;
    a directory that cannot be written turns saving off for this process
    (one debug-level log line).
    """
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
            _write(directory, where, name, text)


def _write(directory: Path, where: str, name: str, text: str) -> None:
    target = directory / name
    tmp: str | None = None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        is_new = not target.exists()
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        with _lock:
            first = where not in _unwritable
            _unwritable.add(where)
        if first:
            LOGGER.debug("smartexec: not saving profiles in %s: %s", where, exc)
        return
    finally:
        if tmp is not None:
            _unlink(tmp)
    if is_new:
        try:
            _prune(directory, name)
        except OSError:  # the profile is saved; pruning is tried again on the next new one
            pass


def _files(directory: Path) -> list[str]:
    try:
        with os.scandir(directory) as it:
            return [e.path for e in it if _NAME.match(e.name) or e.name.startswith(_TMP_PREFIX)]
    except OSError:
        return []


def entry_count() -> int:
    """Return how many profiles the store holds (0 when it is off or empty)."""
    directory = cache_dir()
    if directory is None:
        return 0
    return sum(1 for path in _files(directory) if _NAME.match(os.path.basename(path)))


def clear() -> int:
    """Remove every saved profile (and forget this process's view of them).

    Only the store's own files are removed: other files in the directory stay.

    Returns:
        The number of profile files removed (0 when the store is off).
    """
    with _lock:
        _view.clear()
        _unwritable.clear()
        _pending.clear()
    directory = cache_dir()
    if directory is None:
        return 0
    removed = 0
    for path in _files(directory):
        if _unlink(path) and _NAME.match(os.path.basename(path)):
            removed += 1
    return removed


def earlier_run_reason(profile: StoredProfile) -> str:
    """One sentence for a decision that starts from ``profile``."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(profile.saved_at))
    gil = "" if profile.gil is None else f", GIL use: {profile.gil.kind}"
    unit = "item" if profile.source == "map" else "call"
    send = f", {format_seconds(profile.send_s)} per {unit} to send" if profile.send_s > 0 else ""
    where = "earlier in this process" if profile.from_this_process else "in an earlier run"
    if profile.source == "submits":
        # Measured in process workers; the backend stored is where they moved.
        return (
            f"measured by {profile.items} completed submits {where} ({when}): "
            f"{format_seconds(profile.per_item_s)} per call in process workers{send}{gil} "
            f"-> its submits moved to {profile.backend}; a map re-checks it on its first chunks"
        )
    head = f"measured {where} ({when}, {profile.items} items)"
    return (
        f"{head}: {format_seconds(profile.per_item_s)} per {unit} on {profile.backend}"
        f"{send}{gil}; a map re-checks it on its first chunks"
    )
