"""How a :class:`~smartexec.policy.Decision` and an :class:`~smartexec.stats.ExecutorStats` show.

Left bare as a notebook cell's last line (or typed at the REPL) a dataclass
shows its generated ``repr``: every field, nested records included (an
``explain()`` 512 characters on one line, a ``stats()`` 11,552). These
functions give those classes:

* a one-line ``repr`` that names what matters and says ``print()`` shows the
  rest (the plain REPL, logs, containers of them);
* ``_repr_pretty_``: IPython's text, the same as ``str()`` (multi-line);
* ``_repr_html_``: Jupyter's rich display, a list of reasons or a table per
  backend, every text escaped.

Duck-typed on the records' attributes: this module imports neither
``policy`` nor ``stats``, which import it.
"""

from __future__ import annotations

from typing import Any


def with_article(obj: Any) -> str:
    """``obj``'s type name after "a" or "an", for messages: ``"a list"``, ``"an Event"``, ``"an ndarray"``."""
    name = type(obj).__qualname__
    vowel = name[:1].lower() in "aeiou" or name == "ndarray"
    return f"{'an' if vowel else 'a'} {name}"


__all__ = [
    "decision_html",
    "decision_repr",
    "pretty",
    "stats_html",
    "stats_repr",
    "backend_repr",
]


def _escape(text: str) -> str:
    """``html.escape``, imported only when a notebook asks for HTML (the html package, ~2 ms)."""
    import html

    return html.escape(text)


#: The longest first reason a one-line repr shows, in characters.
REPR_REASON_CHARS = 100


def _cut(text: str, limit: int = REPR_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut_keeping_outcome(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its outcome (``... -> the rest moves to thread``).

    A measured decision's reason ends with what was done (after its last
    ``" -> "``); the figures before it are what a short line can drop.
    """
    if len(text) <= limit:
        return text
    head, arrow, outcome = text.rpartition(" -> ")
    keep = limit - len(outcome) - len(" ... -> ")
    if arrow and ": " in head and len(outcome) <= limit // 2 and keep >= 40:
        return f"{head[:keep].rstrip()} ... -> {outcome}"
    return _cut(text, limit)


def _head(decision: Any) -> str:
    """``name -> backend (chunksize N)``: ``str(decision)``'s first line."""
    return str(decision).splitlines()[0]


def decision_repr(decision: Any) -> str:
    """``<Decision sha256 -> thread: first reason (+2 more; print() shows all)>``."""
    reasons = decision.reasons
    if not reasons:
        return f"<Decision {_head(decision)}>"
    more = len(reasons) - 1
    tail = f" (+{more} more; print() shows all)" if more else ""
    return f"<Decision {_head(decision)}: {_cut(reasons[0])}{tail}>"


def decision_html(decision: Any) -> str:
    """The head in bold, then the reasons as a list."""
    items = "".join(f"<li>{_escape(reason)}</li>" for reason in decision.reasons)
    body = f"<ul>{items}</ul>" if items else ""
    return f"<div><b>{_escape(_head(decision))}</b>{body}</div>"


def backend_repr(stats: Any) -> str:
    """``<BackendStats fork: 2000 items in 28 chunks on 2 workers, busy 60%>``."""
    busy = stats.busy
    return (
        f"<BackendStats {stats.backend}: {stats.items} items in {stats.chunks} chunks on "
        f"{stats.workers} worker{'s' if stats.workers != 1 else ''}"
        + (f", busy {busy:.0%}" if busy is not None else "")
        + ">"
    )


def stats_repr(stats: Any) -> str:
    """``<ExecutorStats fork: 2000 items, busy 60%; 1 warning; 3 decisions; print() ...>``."""
    parts = [
        f"{s.backend}: {s.items} items" + (f", busy {s.busy:.0%}" if s.busy is not None else "")
        for s in stats.backends.values()
    ] or ["no work run yet"]
    warnings = len(stats.warnings)
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    count = len(stats.decisions)
    parts.append(f"{count} decision{'s' if count != 1 else ''}")
    return f"<ExecutorStats {'; '.join(parts)}; print() shows the details>"


_COLUMNS = "backend workers items chunks failed working waiting dispatching active busy".split()


def stats_html(stats: Any) -> str:
    """A table with a row per backend, the warnings, then the decisions' one-line summaries."""
    if not stats.backends:
        table = "<p>no work run yet</p>"
    else:
        head = "".join(f"<th>{name}</th>" for name in _COLUMNS)
        rows = []
        for s in stats.backends.values():
            cells = (
                s.backend,
                s.workers,
                s.items,
                s.chunks,
                s.failed_chunks,
                f"{s.working_s:.3f} s",
                f"{s.waiting_s:.3f} s",
                f"{s.dispatching_s:.3f} s",
                f"{s.active_s:.3f} s",
                "" if s.busy is None else f"{s.busy:.0%}",
            )
            rows.append("<tr>" + "".join(f"<td>{_escape(str(c))}</td>" for c in cells) + "</tr>")
        table = f"<table><tr>{head}</tr>{''.join(rows)}</table>"
    parts = [table]
    if stats.warnings:
        items = "".join(f"<li>{_escape(w)}</li>" for w in stats.warnings)
        parts.append(f"<p><b>warnings</b></p><ul>{items}</ul>")
    lines = decision_lines(stats.decisions)
    if lines:
        items = "".join(f"<li>{_escape(line)}</li>" for line in lines)
        parts.append(
            "<p><b>decisions</b> (latest last; <code>ex.decisions()</code> has every "
            f"reason)</p><ul>{items}</ul>"
        )
    return "<div>" + "".join(parts) + "</div>"


def decision_lines(decisions: tuple[Any, ...], last: int = 10) -> list[str]:
    """The ``last`` distinct one-line summaries of ``decisions``, latest last."""
    shown: list[str] = []
    for decision in decisions:
        reasons = getattr(decision, "reasons", ())
        line = f"{_head(decision)}: {reasons[0]}" if reasons else _head(decision)
        line = _cut_keeping_outcome(line, 160)
        if line in shown:
            shown.remove(line)
        shown.append(line)
    return shown[-last:]


def pretty(record: Any, printer: Any, cycle: bool) -> None:
    """IPython's ``_repr_pretty_``: the record's ``str()``, lines and all."""
    printer.text(str(record) if not cycle else f"<{type(record).__name__} ...>")
