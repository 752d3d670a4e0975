"""explain()'s Decision and stats()' ExecutorStats, left bare in a notebook cell or at the REPL."""

from __future__ import annotations

import pytest

from smartexec import SmartExecutor
from smartexec.policy import Decision
from smartexec.stats import BackendStats, ExecutorStats

pytestmark = pytest.mark.timeout(60)


def work(x: int) -> int:
    return sum(i * i for i in range(x))


@pytest.fixture
def ran():
    """A real decision and a real snapshot, after a map on threads."""
    with SmartExecutor(2, backend="thread") as ex:
        assert list(ex.map(work, range(300))) == [work(x) for x in range(300)]
        return ex.explain(work), ex.stats()


class Printer:
    """What IPython's pretty printer gives ``_repr_pretty_``: ``text()``."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def text(self, s: str) -> None:
        self.out.append(s)


def test_decision_repr_is_one_short_line(ran):
    decision, _ = ran
    text = repr(decision)
    assert "\n" not in text and len(text) <= 200
    assert text.startswith("<Decision work -> thread: ")
    assert decision.reasons[0][:40] in text
    assert f"+{len(decision.reasons) - 1} more; print() shows all" in text
    assert "CallableProfile" not in text  # not the dataclass' fields


def test_decision_repr_without_reasons():
    assert repr(Decision("thread", ())) == "<Decision thread>"
    long = Decision("fork", ("x" * 500,))
    assert len(repr(long)) < 130 and repr(long).endswith("...>")


def test_a_long_decision_line_keeps_its_outcome():
    from smartexec._display import decision_lines

    measured = Decision(
        "fork",
        (
            "measured in the workers: 12 items in 2 chunks, mean 2.7 ms per item; "
            + "figures " * 30
            + "-> the rest moves to thread (1.6x)",
        ),
    )
    (line,) = decision_lines((measured,))
    assert len(line) <= 160
    assert line.startswith("fork: measured in the workers: 12 items")
    assert line.endswith(" ... -> the rest moves to thread (1.6x)")
    (plain,) = decision_lines((Decision("fork", ("y" * 500,)),))
    assert len(plain) == 160 and plain.endswith("...")


def test_decision_pretty_and_html(ran):
    decision, _ = ran
    printer = Printer()
    decision._repr_pretty_(printer, False)
    assert printer.out == [str(decision)]
    page = decision._repr_html_()
    assert page.startswith("<div><b>work -&gt; thread</b><ul><li>")
    assert page.count("<li>") == len(decision.reasons)
    assert "<script" not in Decision("x", ("<script>alert(1)</script>",))._repr_html_()


def test_str_is_unchanged(ran):
    decision, stats = ran
    assert str(decision).startswith("work -> thread\n  - ")
    assert str(stats).startswith("thread: 300 items in ")


def test_stats_repr_is_one_short_line(ran):
    _, stats = ran
    text = repr(stats)
    assert "\n" not in text and len(text) <= 200
    assert text.startswith("<ExecutorStats thread: 300 items")
    assert f"{len(stats.decisions)} decision" in text
    assert text.endswith("print() shows the details>")
    assert repr(ExecutorStats({})) == (
        "<ExecutorStats no work run yet; 0 decisions; print() shows the details>"
    )
    one = stats.backends["thread"]
    assert repr(one).startswith("<BackendStats thread: 300 items in ")


def test_stats_pretty_and_html(ran):
    _, stats = ran
    printer = Printer()
    stats._repr_pretty_(printer, False)
    assert printer.out == [str(stats)]
    page = stats._repr_html_()
    assert "<th>backend</th>" in page and "<td>thread</td><td>2</td><td>300</td>" in page
    assert "<b>decisions</b>" in page
    assert ExecutorStats({})._repr_html_() == "<div><p>no work run yet</p></div>"


def test_warnings_show_in_html():
    slow = BackendStats("fork", 4, 10, 2, 0, 0.1, 0.0, 1.0, {5: 2})
    stats = ExecutorStats({"fork": slow})
    assert "1 warning;" in repr(stats)
    assert "<b>warnings</b>" in stats._repr_html_()


def test_ipython_displays_the_summaries(ran):
    formatters = pytest.importorskip("IPython.core.formatters")
    decision, stats = ran
    display = formatters.DisplayFormatter()
    for record in (decision, stats):
        data, _ = display.format(record)
        assert data["text/plain"] == str(record)
        assert data["text/html"] == record._repr_html_()
