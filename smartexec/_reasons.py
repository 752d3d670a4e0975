"""The reasons a decision gives: sentences for people, with rule ids for code.

A :class:`Reason` is a ``str`` (its sentence) that also carries the id of
the rule that gave it; code that acts on reasons (:func:`reasons_off_processes`,
:func:`measured_reasons`, the executor's notes) compares ids, never prose.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Reason",
    "rule_of",
    "GIL_UNKNOWN_RULE",
    "REACHES_PROCESSES_RULE",
    "MEASURED_RULE",
    "LAST_MAP_RULE",
    "INITIALIZER_BY_VALUE_RULE",
    "GIL_UNKNOWN",
    "GIL_NOT_MEASURED",
    "GIL_FIRST_MAP_MEASURES",
    "reasons_off_processes",
    "measured_reasons",
    "CODE_HINT_THREADS",
    "INITIALIZER_BY_VALUE",
]


class Reason(str):
    """One sentence of a :class:`Decision`'s reasons, with the id of the rule that gave it.

    ``str()`` is the sentence, so logs, ``explain()`` and ``in`` tests read
    as before; code that acts on a reason compares ``rule`` (never the
    prose, which may be reworded). Plain strings among the reasons have no
    rule (:func:`rule_of` gives None).
    """

    rule: str

    def __new__(cls, rule: str, text: str) -> Reason:
        made = super().__new__(cls, text)
        made.rule = rule
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (Reason, (self.rule, str(self)))


def rule_of(reason: str) -> str | None:
    """The rule id of ``reason`` (a :class:`Reason`), or None for a plain sentence."""
    return reason.rule if isinstance(reason, Reason) else None


#: Rule ids that code acts on (see :func:`reasons_off_processes`,
#: :func:`measured_reasons` and the executor's route notes).
GIL_UNKNOWN_RULE = "gil-unknown"
REACHES_PROCESSES_RULE = "reaches-processes"
MEASURED_RULE = "measured"
LAST_MAP_RULE = "last-map"
INITIALIZER_BY_VALUE_RULE = "initializer-by-value"

#: The reason a callable not measured yet starts on processes; the words in
#: parentheses say how it will be measured, and are dropped once it was
#: (:func:`measured_reasons`).
GIL_UNKNOWN = "it may hold the GIL, so processes run it in parallel"
GIL_NOT_MEASURED = (
    " (not measured in this run yet: its first chunks are measured in the workers, and a map "
    "may move to threads)"
)
GIL_FIRST_MAP_MEASURES = " (its first map measures this and may move it to threads)"


def reasons_off_processes(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """``reasons`` of a process decision, for the threads (or loop) its figures moved it to.

    Drops what only argued for processes: the guess that it may hold the GIL
    (:data:`GIL_UNKNOWN`, now answered by the figures) and how its code
    reaches process workers.
    """
    dropped = (GIL_UNKNOWN_RULE, REACHES_PROCESSES_RULE)
    return tuple(reason for reason in reasons if rule_of(reason) not in dropped)


def measured_reasons(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """``reasons`` (a :class:`Decision`'s) with "not measured yet" taken out.

    For the lines a map logs once its first chunks were measured: the reason
    its route was chosen stays, the promise of a measurement goes.
    """
    answered = Reason(GIL_UNKNOWN_RULE, GIL_UNKNOWN)
    return tuple(answered if rule_of(reason) == GIL_UNKNOWN_RULE else reason for reason in reasons)


#: Why a callable that its code hint sends to threads can still move.
CODE_HINT_THREADS = (
    "threads run it with no pickling; its first chunks measure its GIL use there, "
    "and the rest of a map moves to processes if they find the GIL held"
)


#: The reason (and the ``RuntimeWarning`` the executor gives) when an
#: initializer is set and a callable's code must travel by value to loky.
INITIALIZER_BY_VALUE = Reason(
    INITIALIZER_BY_VALUE_RULE,
    "an initializer is set, but this callable's code travels by value to loky workers "
    "(no fork route here): a pickled copy reads its own copy of its module's globals, "
    "not what the initializer set in the worker; define the callable and the "
    "initializer in an importable module (they are then pickled by reference)",
)
