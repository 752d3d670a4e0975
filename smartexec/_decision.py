"""A routing decision: where a callable runs, and why (:class:`Decision`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _display
from .gil import GilProfile
from .inspection import CallableProfile

__all__ = ["Decision"]


@dataclass(frozen=True, repr=False)
class Decision:
    """Where a callable runs, and why.

    Attributes:
        backend: the backend name, e.g. ``"fork"``.
        reasons: short human sentences, most important first.
        share: True when the callable reaches fork workers through the
            trampoline table (copy-on-write) instead of being pickled.
        chunksize: for a map's entry in ``SmartExecutor.decisions()``, the
            size of its first chunk (later chunks follow the measurements);
            None for the policy's own decision and for inline runs.
        profile: the profile the decision was made from.
        measure: True when the callable's first ``map`` measures its GIL use
            in the calling thread, which could change the route (it was
            routed to processes because it may hold the GIL, it has not been
            measured, and ``Options.allow_inline`` lets it run there).
        gil: the measurement the decision used, or None.
        rule: the id of the :data:`smartexec.policy.TABLE` row that chose it (``""`` for a
            decision made elsewhere: a move on measurements, an earlier run).
    """

    backend: str
    reasons: tuple[str, ...]
    share: bool = False
    chunksize: int | None = None
    profile: CallableProfile | None = field(default=None, compare=False)
    measure: bool = False
    gil: GilProfile | None = None
    rule: str = field(default="", compare=False)

    def __str__(self) -> str:
        head = self.backend
        if self.chunksize is not None:
            head += f" (chunksize {self.chunksize})"
        if self.profile is not None:
            head = f"{self.profile.name} -> {head}"
        return head + "".join(f"\n  - {reason}" for reason in self.reasons)

    def __repr__(self) -> str:
        return _display.decision_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text display (a notebook cell's last line): ``str()``."""
        _display.pretty(self, printer, cycle)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the route in bold, the reasons as a list."""
        return _display.decision_html(self)


def _describe(profile: CallableProfile) -> str:
    kinds = {
        "function": "an importable module-level function",
        "builtin": "an importable builtin",
        "ufunc": "a numpy ufunc",
        "class": "a class",
        "bound_method": "a bound method",
        "callable_instance": "a callable instance",
        "partial": "a functools.partial",
        "lambda": "a lambda",
        "closure": "a closure",
        "nested": "a function defined inside another function",
        "main": "a function defined in __main__",
    }
    return f"{profile.name} is {kinds.get(profile.kind, profile.kind)}"
