"""Backend discovery: built-in table, entry points, runtime registration.

Two tables, as fsspec keeps them:

* *known*: name -> ``"package.module:Class"`` path and an install hint. Filled
  from the built-ins and, once, on first lookup, from the entry-point group
  ``smartexec.backends``. Nothing is imported to fill it.
* *loaded*: name -> backend class, filled when a backend is first used.

A plugin never silently replaces a name: the first registration of a name
wins and a later different one raises unless ``replace=True`` is given.

:func:`create_backend` makes an instance, checking first that the backend can
run here and that the user's backend options fit its signature (the way
fsspec's ``filesystem(protocol, **storage_options)`` does for file systems).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .backends._base import Backend
from .errors import BackendUnavailableError, UnknownBackendError

__all__ = [
    "ENTRY_POINT_GROUP",
    "register_backend",
    "get_backend_class",
    "available_backends",
    "known_backends",
    "create_backend",
]

ENTRY_POINT_GROUP = "smartexec.backends"

#: Keyword arguments a backend may take that are ``SmartExecutor``'s own
#: (passed only when the user sets them), not backend options.
WORKER_OPTIONS = ("initializer", "initargs", "max_tasks_per_child")

#: name -> (import path, install hint, where it came from)
_BUILTIN: dict[str, tuple[str, str]] = {
    "inline": ("smartexec.backends.inline:InlineBackend", ""),
    "thread": ("smartexec.backends.thread:ThreadBackend", ""),
    "fork": ("smartexec.backends.fork:ForkBackend", ""),
    "loky": ("smartexec.backends.loky:LokyBackend", "pip install loky"),
    "dask": ("smartexec.backends.dask:DaskBackend", "pip install 'smartexec[dask]'"),
}

_lock = threading.RLock()
_known: dict[str, tuple[str | Callable[..., Backend], str, str]] = {
    name: (path, hint, "built-in") for name, (path, hint) in _BUILTIN.items()
}
_loaded: dict[str, Callable[..., Backend]] = {}
_entry_points_read = False


def _read_entry_points() -> None:
    global _entry_points_read
    with _lock:
        if _entry_points_read:
            return
        _entry_points_read = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in _known:
                continue  # first occurrence wins; built-ins first
            dist = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
            _known[ep.name] = (
                ep.value,
                f"reinstall {dist}, which declares entry point {ep.name} = {ep.value}",
                f"entry point of {dist}",
            )


def known_backends() -> Mapping[str, str]:
    """Return a read-only mapping of backend name -> where it came from."""
    _read_entry_points()
    with _lock:
        return MappingProxyType({name: source for name, (_, _, source) in _known.items()})


def register_backend(
    name: str, factory: str | Callable[..., Backend], *, replace: bool = False
) -> None:
    """Register a backend under ``name``.

    Args:
        name: short lowercase name, e.g. ``"mycluster"``.
        factory: a :class:`~smartexec.backends.Backend` subclass (or any
            callable ``(max_workers, cpu_count, **options) -> Backend``), or
            its import path as ``"package.module:Class"`` (imported on first
            use).
        replace: allow replacing a different backend already registered
            under ``name``.

    Raises:
        TypeError: ``factory`` is neither callable nor a string.
        ValueError: ``name`` is taken by a different backend and ``replace``
            is False.
    """
    if not isinstance(factory, str) and not callable(factory):
        raise TypeError(
            f"factory must be a Backend subclass or a 'module:Class' string, "
            f"got {factory!r} ({type(factory).__qualname__})"
        )
    _read_entry_points()
    with _lock:
        current = _known.get(name)
        if current is not None and current[0] != factory and not replace:
            raise ValueError(
                f"a backend named {name!r} is already registered ({current[2]}); "
                f"pass replace=True to replace it"
            )
        _known[name] = (factory, "", "register_backend()")
        _loaded.pop(name, None)


def _import(path: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def require_known(name: str) -> None:
    """Check that a backend is registered under ``name``, importing nothing.

    Raises:
        UnknownBackendError: no backend has that name (a ``ValueError``); the
            message lists the known names and the closest one.
    """
    if name not in _BUILTIN:  # built-in names come first: no need to scan plugins
        _read_entry_points()
    with _lock:
        if name in _known:
            return
        known = tuple(sorted(_known))
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownBackendError(
        f"unknown backend {name!r}: known backends are {', '.join(known)}{hint}",
        name=name,
        known=known,
    )


def get_backend_class(name: str) -> Callable[..., Backend]:
    """Return the backend factory registered under ``name``, importing it now.

    Raises:
        UnknownBackendError: no backend has that name (a ``ValueError``).
        BackendUnavailableError: its module cannot be imported (an
            ``ImportError``, chained from the original, carrying the hint).
    """
    require_known(name)
    with _lock:
        if name in _loaded:
            return _loaded[name]
        factory, hint, source = _known[name]
    if isinstance(factory, str):
        try:
            factory = _import(factory)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"backend {name!r} ({source}) cannot be imported: {exc}"
                + (f". To install it: {hint}" if hint else ""),
                backend=name,
                hint=hint,
            ) from exc
    with _lock:
        _loaded[name] = factory
    return factory


def available_backends() -> dict[str, str]:
    """Return each known backend name -> ``"available"`` or why it is not.

    Mirrors fsspec's ``available_protocols``, with the reason attached, e.g.
    ``"backend 'dask' (built-in) cannot be imported: No module named
    'distributed'. To install it: pip install 'smartexec[dask]'"``. Imports
    every known backend's module (plugins included) to find out.
    """
    report = {}
    for name in sorted(known_backends()):
        try:
            factory = get_backend_class(name)
        except ImportError as exc:
            report[name] = str(exc)
            continue
        reason_of = getattr(factory, "unavailable_reason", None)
        reason = reason_of() if reason_of is not None else None
        report[name] = "available" if reason is None else reason
    return report


def _accepted_options(factory: Any) -> tuple[str, ...] | None:
    """The keyword options ``factory`` takes after ``(max_workers, cpu_count)``.

    None when any name is accepted (``**kwargs``) or the signature cannot be read.
    """
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters[2:] if p.kind in named)


def create_backend(
    name: str, max_workers: int | None, cpu_count: int, options: Mapping[str, Any]
) -> Backend:
    """Create the backend registered under ``name`` with the user's options.

    Args:
        name: a registered backend name.
        max_workers: workers (int >= 1), or None for the backend's default.
        cpu_count: CPUs this process may use.
        options: backend options (keyword arguments for the factory), e.g.
            ``{"address": "tcp://10.0.0.5:8786"}`` for ``"dask"``, and the
            worker options the user set on ``SmartExecutor`` that the backend
            takes (:data:`WORKER_OPTIONS`: ``initializer``, ``initargs``,
            ``max_tasks_per_child``; see :class:`~smartexec.backends.Backend`).

    Returns:
        The new backend; the caller owns it and must shut it down.

    Raises:
        UnknownBackendError: no backend has that name (a ``ValueError``).
        BackendUnavailableError: it cannot be imported, or its
            ``unavailable_reason()`` says it cannot run here (an
            ``ImportError``).
        TypeError: an option's name is not one the backend takes (the
            message lists those it takes), or a value has the wrong type.
        ValueError: an option's value is not acceptable.
        OSError: the backend could not start or reach its workers (e.g. a
            Dask scheduler that does not answer).
    """
    factory = get_backend_class(name)
    reason_of = getattr(factory, "unavailable_reason", None)
    reason = reason_of() if reason_of is not None else None
    if reason is not None:
        raise BackendUnavailableError(f"backend {name!r} cannot run here: {reason}", backend=name)
    if options:
        accepted = _accepted_options(factory)
        unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
        if unknown:
            # Worker options are SmartExecutor's arguments: not listed as options.
            accepted = tuple(o for o in accepted or () if o not in WORKER_OPTIONS)
            takes = (
                "it takes " + ", ".join(f"{o}=" for o in accepted)
                if accepted
                else "it takes no options"
            )
            close = [difflib.get_close_matches(o, accepted or (), n=1) for o in unknown]
            hint = "".join(f"; did you mean {c[0]}= for {o}=?" for o, c in zip(unknown, close) if c)
            raise TypeError(
                f"backend {name!r} got unexpected option(s) "
                f"{', '.join(f'{o}=' for o in unknown)}: {takes}{hint}"
            )
    return factory(max_workers, cpu_count, **options)
