"""The routing table, walked without starting a process."""

from __future__ import annotations

import pytest

from smartexec._system import Platform
from smartexec.inspection import CallableProfile, PayloadSize
from smartexec.policy import BIG_STATE_BYTES, Options, decide

LINUX = Platform(("fork", "spawn", "forkserver"), 2, True, (3, 12))
NO_FORK = Platform(("spawn",), 2, True, (3, 12))
FREE_THREADED = Platform(("fork", "spawn", "forkserver"), 2, False, (3, 13))
NO_FORK_FREE_THREADED = Platform(("spawn",), 2, False, (3, 13))

BIG = PayloadSize(BIG_STATE_BYTES + 1)
HUGE_CAPPED = PayloadSize(64 << 20, capped=True)
SMALL = PayloadSize(300)
NONE = PayloadSize(0)
LOCKED = PayloadSize(10, error="TypeError: cannot pickle '_thread.lock' object")


def profile(kind, *, by_reference=True, state=NONE, gil_hint=None, code_hint=None):
    return CallableProfile(kind, "f", by_reference, state, "its state", gil_hint, code_hint)


@pytest.mark.parametrize(
    "prof, platform, options, backend, share",
    [
        # big state: shared by copy-on-write, never pickled
        (profile("bound_method", state=BIG), LINUX, Options(), "fork", True),
        (profile("bound_method", state=HUGE_CAPPED), LINUX, Options(), "fork", True),
        (profile("callable_instance", state=BIG), LINUX, Options(), "fork", True),
        (profile("partial", state=BIG), LINUX, Options(), "fork", True),
        (profile("closure", by_reference=False, state=BIG), LINUX, Options(), "fork", True),
        (profile("lambda", by_reference=False, state=BIG), LINUX, Options(), "fork", True),
        # big state beats prefer="threads": pickling it per task is the worst case
        (profile("bound_method", state=BIG), LINUX, Options(prefer="threads"), "fork", True),
        # no fork: sent once to each loky worker and cached there
        (profile("bound_method", state=BIG), NO_FORK, Options(), "loky", True),
        (profile("partial", state=HUGE_CAPPED), NO_FORK, Options(), "loky", True),
        (profile("bound_method", state=BIG), NO_FORK, Options(prefer="processes"), "loky", True),
        # ... unless threads fit: asked for, known to release the GIL, or no GIL
        (profile("bound_method", state=BIG), NO_FORK, Options(prefer="threads"), "thread", False),
        (profile("bound_method", state=BIG, gil_hint="h"), NO_FORK, Options(), "thread", False),
        (profile("bound_method", state=BIG), NO_FORK_FREE_THREADED, Options(), "thread", False),
        # unpicklable state: fork shares it, elsewhere the pickling error names it
        (profile("closure", by_reference=False, state=LOCKED), LINUX, Options(), "fork", True),
        (profile("closure", by_reference=False, state=LOCKED), NO_FORK, Options(), "loky", False),
        # by-value code: fork workers receive it with cloudpickle; loky without fork
        (profile("lambda", by_reference=False, state=SMALL), LINUX, Options(), "fork", False),
        (profile("closure", by_reference=False, state=SMALL), LINUX, Options(), "fork", False),
        (profile("nested", by_reference=False, state=SMALL), LINUX, Options(), "fork", False),
        (profile("main", by_reference=False, state=SMALL), LINUX, Options(), "fork", False),
        (profile("lambda", by_reference=False, state=SMALL), NO_FORK, Options(), "loky", False),
        (profile("main", by_reference=False, state=SMALL), NO_FORK, Options(), "loky", False),
        # GIL-releasing callables and hints
        (profile("builtin", gil_hint="sleeps"), LINUX, Options(), "thread", False),
        (profile("ufunc", gil_hint="ufunc"), LINUX, Options(), "thread", False),
        (profile("builtin", gil_hint="sleeps"), LINUX, Options(prefer="processes"), "fork", False),
        (profile("function"), LINUX, Options(prefer="threads"), "thread", False),
        # a code hint: threads first, unless the user said processes
        (profile("function", code_hint="calls time.sleep"), LINUX, Options(), "thread", False),
        (profile("main", by_reference=False, code_hint="c"), NO_FORK, Options(), "thread", False),
        (profile("function", code_hint="c"), LINUX, Options(prefer="processes"), "fork", False),
        # ... and big state shared by copy-on-write still wins
        (profile("bound_method", state=BIG, code_hint="c"), LINUX, Options(), "fork", True),
        (profile("function"), FREE_THREADED, Options(), "thread", False),
        # importable GIL-holding work: processes
        (profile("function"), LINUX, Options(), "fork", False),
        (profile("builtin"), LINUX, Options(), "fork", False),
        (profile("bound_method", state=SMALL), LINUX, Options(), "fork", False),
        (profile("function"), NO_FORK, Options(), "loky", False),
        # forced backends win
        (profile("bound_method", state=BIG), LINUX, Options(backend="loky"), "loky", True),
        (profile("bound_method", state=SMALL), LINUX, Options(backend="loky"), "loky", False),
        (profile("closure", state=LOCKED), LINUX, Options(backend="loky"), "loky", False),
        (profile("function"), LINUX, Options(backend="inline"), "inline", False),
        (profile("bound_method", state=BIG), LINUX, Options(backend="fork"), "fork", True),
        (profile("bound_method", state=SMALL), LINUX, Options(backend="fork"), "fork", False),
        (profile("function"), LINUX, Options(backend="thread"), "thread", False),
    ],
)
def test_routing_table(prof, platform, options, backend, share):
    decision = decide(prof, platform, options)
    assert (decision.backend, decision.share) == (backend, share), str(decision)
    assert decision.reasons and all(isinstance(r, str) and r for r in decision.reasons)


def test_reasons_name_the_state_and_its_size():
    decision = decide(profile("bound_method", state=BIG), LINUX, Options())
    text = str(decision)
    assert "its state holds 1.0 MiB" in text
    assert "copy-on-write" in text


def test_reasons_say_why_fork_is_missing():
    decision = decide(profile("function"), NO_FORK, Options())
    assert "'fork' is not available" in str(decision)


def test_threshold_is_configurable():
    prof = profile("bound_method", state=SMALL)
    assert decide(prof, LINUX, Options(big_state_bytes=100)).share is True
    assert decide(prof, LINUX, Options()).share is False


def test_decide_is_pure():
    prof = profile("closure", by_reference=False, state=BIG)
    assert decide(prof, LINUX, Options()) == decide(prof, LINUX, Options())


# -- measured GIL use (smartexec.gil) -------------------------------------------

from smartexec.gil import GilProfile  # noqa: E402

WAITS = GilProfile("waits", 5, 0.05, 0.04, 0.0, 90)
RELEASES = GilProfile("releases", 9, 0.05, 1.0, 0.06, 80)
HOLDS = GilProfile("holds", 4, 0.06, 1.0, 0.87, 11)
INLINE_OK = Options(allow_inline=True)


@pytest.mark.parametrize(
    "prof, platform, options, measured, backend, measure",
    [
        # unmeasured GIL-holding candidates ask for a measurement, when
        # allowed to run items in the calling process
        (profile("function"), LINUX, INLINE_OK, None, "fork", True),
        (profile("lambda", by_reference=False), LINUX, INLINE_OK, None, "fork", True),
        (profile("function"), NO_FORK, INLINE_OK, None, "loky", True),
        (profile("function"), LINUX, Options(), None, "fork", False),
        (profile("lambda", by_reference=False), LINUX, Options(), None, "fork", False),
        (profile("function"), NO_FORK, Options(), None, "loky", False),
        # measured: waits / releases -> threads, holds -> processes
        (profile("function"), LINUX, Options(), WAITS, "thread", False),
        (profile("function"), LINUX, Options(), RELEASES, "thread", False),
        (profile("lambda", by_reference=False), LINUX, Options(), RELEASES, "thread", False),
        (profile("function"), LINUX, Options(), HOLDS, "fork", False),
        (profile("closure", by_reference=False), LINUX, Options(), HOLDS, "fork", False),
        (profile("function"), NO_FORK, Options(), HOLDS, "loky", False),
        # the user's word wins over a measurement, and asks for none
        (profile("function"), LINUX, Options(prefer="processes"), RELEASES, "fork", False),
        (profile("function"), LINUX, Options(prefer="processes"), None, "fork", False),
        (profile("function"), LINUX, Options(prefer="threads"), HOLDS, "thread", False),
        (profile("function"), LINUX, Options(backend="loky"), RELEASES, "loky", False),
        (profile("function"), LINUX, Options(backend="fork"), None, "fork", False),
        # static answers need no measurement
        (profile("builtin", gil_hint="sleeps"), LINUX, Options(), None, "thread", False),
        (profile("function"), FREE_THREADED, Options(), None, "thread", False),
        (profile("bound_method", state=BIG), LINUX, Options(), None, "fork", False),
        (profile("bound_method", state=BIG), LINUX, Options(), RELEASES, "fork", False),
    ],
)
def test_measured_gil_use_routes(prof, platform, options, measured, backend, measure):
    decision = decide(prof, platform, options, measured)
    assert decision.backend == backend, str(decision)
    assert decision.measure is measure
    if measured is not None and backend == "thread" and options == Options():
        assert decision.gil is measured
        assert str(measured) in decision.reasons


def test_an_unmeasured_decision_says_why_it_was_not_measured():
    text = str(decide(profile("function"), LINUX, Options()))
    assert "its first chunks are measured in the workers" in text
    assert "its first map measures this" in str(decide(profile("function"), LINUX, INLINE_OK))


def test_a_measured_decision_shows_its_evidence():
    text = str(decide(profile("function"), LINUX, Options(), HOLDS))
    assert "the GIL held 87%" in text and "threads would take turns" in text


def test_no_fork_reasons_say_the_state_is_sent_once():
    text = str(decide(profile("bound_method", state=BIG), NO_FORK, Options()))
    assert "'fork' is not available" in text
    assert "sent once to each worker" in text and "shared memory" in text
    assert "proven unchanged" in text  # issue 13: never a stale copy


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize(
    "prof",
    [profile("function"), profile("bound_method", state=BIG), profile("closure", state=LOCKED)],
)
def test_mp_context_without_fork_turns_the_fork_route_off(prof, method):
    decision = decide(prof, LINUX, Options(start_method=method))
    assert decision.backend == "loky", str(decision)
    assert any(f"mp_context uses start method {method!r}" in r for r in decision.reasons)
    # and a task_timeout does not bring fork back
    stopped = decide(prof, LINUX, Options(start_method=method, stoppable=True))
    assert stopped.backend == "loky", str(stopped)


def test_mp_context_fork_changes_nothing():
    for prof in (profile("function"), profile("lambda", by_reference=False, state=SMALL)):
        assert decide(prof, LINUX, Options(start_method="fork")) == decide(prof, LINUX, Options())


def test_work_moved_to_loky_by_other_threads_says_how_loky_reads_it():
    # A new user read "fork workers start in milliseconds" on a map that ran
    # on loky, and nothing about the module values loky's fresh imports read.
    for prof in (profile("function"), profile("lambda", by_reference=False, state=SMALL)):
        decision = decide(prof, LINUX, Options(), other_threads=1)
        assert decision.backend == "loky", str(decision)
        text = str(decision)
        assert "fork workers" not in text and "start in milliseconds" not in text
        assert "import your modules afresh" in decision.reasons[-1]


@pytest.mark.parametrize("threads", [0, 2])
def test_max_tasks_per_child_moves_loky_work_to_fork(threads):
    lam = profile("lambda", by_reference=False, state=SMALL)
    decision = decide(lam, LINUX, Options(retires_workers=True), other_threads=threads)
    assert decision.backend == "fork", str(decision)
    if threads:  # without threads by-value code goes to fork anyway
        assert "max_tasks_per_child" in decision.reasons[-1]
    fn = decide(profile("function"), LINUX, Options(retires_workers=True), other_threads=threads)
    assert fn.backend == "fork", str(fn)
    # threads are not processes: thread-bound work stays
    hinted = profile("builtin", gil_hint="sleeps")
    assert decide(hinted, LINUX, Options(retires_workers=True)).backend == "thread"


@pytest.mark.parametrize(
    "prof",
    [
        profile("main", by_reference=False, state=SMALL),
        profile("lambda", by_reference=False, state=SMALL),
        profile("closure", by_reference=False, state=SMALL),
    ],
)
def test_with_an_initializer_by_value_code_is_inherited_by_fork_workers(prof):
    decision = decide(prof, LINUX, Options(initializer=True))
    assert (decision.backend, decision.share) == ("fork", True), str(decision)
    assert "initializer" in decision.reasons[-1]
    forced = decide(prof, LINUX, Options(initializer=True, backend="fork"))
    assert forced.share, str(forced)
    # an importable function is pickled by reference: it finds the worker's globals
    assert not decide(profile("function"), LINUX, Options(initializer=True)).share
    # without fork, nothing to inherit from
    assert decide(prof, LINUX, Options(initializer=True, start_method="spawn")).backend == "loky"


@pytest.mark.parametrize(
    "prof, backend, share",
    [
        (profile("function"), "thread", False),  # fork -> loky (threads) -> thread (timeout)
        (profile("lambda", by_reference=False, state=SMALL), "thread", False),
        (profile("builtin", gil_hint="sleeps"), "thread", False),
        (profile("bound_method", state=BIG), "fork", True),  # a zygote forks: safe
    ],
)
def test_task_timeout_never_forks_the_users_threads(prof, backend, share):
    """Issue 13: stoppable() moved work that decide() had kept off fork back to fork."""
    decision = decide(prof, LINUX, Options(stoppable=True), other_threads=1)
    assert (decision.backend, decision.share) == (backend, share), str(decision)
    if backend == "thread" and prof.kind != "builtin":
        assert "cannot stop the call" in decision.reasons[-1]
    assert decide(prof, LINUX, Options(stoppable=True)).backend == "fork"


def test_a_measurement_wins_over_the_code_hint():
    from smartexec.gil import GilProfile

    hinted = profile("function", code_hint="its code calls time.sleep, with no loop or branch")
    first = decide(hinted, LINUX, Options())
    assert first.backend == "thread" and first.gil is None
    assert "its code calls time.sleep, with no loop or branch" in first.reasons
    held = GilProfile("holds", 2, 0.02, 0.99, 0.9, 40)
    assert decide(hinted, LINUX, Options(), held).backend == "fork"
    waits = GilProfile("waits", 2, 0.02, 0.01, 0.0, 40)
    assert decide(hinted, LINUX, Options(), waits).gil == waits


def test_reasons_that_code_acts_on_carry_rule_ids_and_read_as_their_text():
    # Issue 33: code compares rule ids, never prose; str() stays the sentence.
    from smartexec._reasons import (
        GIL_UNKNOWN,
        GIL_UNKNOWN_RULE,
        REACHES_PROCESSES_RULE,
        Reason,
        measured_reasons,
        reasons_off_processes,
        rule_of,
    )

    decision = decide(profile("function"), LINUX, Options())
    rules = [rule_of(r) for r in decision.reasons]
    assert GIL_UNKNOWN_RULE in rules and REACHES_PROCESSES_RULE in rules
    assert all(isinstance(r, str) for r in decision.reasons)
    assert reasons_off_processes(decision.reasons) == tuple(
        r for r in decision.reasons if rule_of(r) not in (GIL_UNKNOWN_RULE, REACHES_PROCESSES_RULE)
    )
    reworded = (Reason(GIL_UNKNOWN_RULE, "reworded: it may hold the GIL"),)
    assert reasons_off_processes(reworded) == ()  # by id, whatever the words
    assert measured_reasons(reworded) == (GIL_UNKNOWN,)


def _writing(kind_of_effect, **kwargs):
    import dataclasses

    from smartexec.effects import Effect, Effects

    effects = Effects(found=(Effect(kind_of_effect, "writes module-level `_BUF`", "w.py:3"),))
    return dataclasses.replace(profile("function", **kwargs), effects=effects)


@pytest.mark.parametrize("kind_of_effect", ["shared", "process", "argument", "unread"])
@pytest.mark.parametrize(
    "hint",
    [
        {"gil_hint": "time.sleep waits without the GIL"},
        {"code_hint": "its code calls time.sleep, with no loop or branch"},
    ],
)
def test_row_0_effects_keep_every_thread_row_off(kind_of_effect, hint):
    prof = _writing(kind_of_effect, **hint)
    decision = decide(prof, LINUX, Options())
    assert decision.backend == "fork"
    assert any("kept off threads" in r for r in decision.reasons), decision
    assert decide(prof, FREE_THREADED, Options()).backend == "fork"
    measured = GilProfile("releases", 10, 0.05, 1.0, 0.0, 100)
    assert decide(prof, LINUX, Options(), measured).backend == "fork"


def test_row_0_gives_way_to_the_users_word():
    from smartexec.policy import permits

    prof = _writing("shared", gil_hint="time.sleep waits without the GIL")
    assert decide(prof, LINUX, Options(prefer="threads")).backend == "thread"
    assert decide(prof, LINUX, Options(backend="thread")).backend == "thread"
    assert not permits(prof, "thread", Options())
    assert not permits(prof, "inline", Options())  # a loop here writes the caller's `_BUF`
    assert not permits(_writing("process"), "inline", Options())
    assert permits(prof, "fork", Options()) and permits(prof, "loky", Options())


def test_the_docs_routing_table_has_the_policys_rows_in_order():
    # Issue 33: one routing table; docs/routing.md's rows are the policy's
    # TABLE (plus row 0, the effects, which permits() applies to the thread rows).
    import pathlib
    import re

    from smartexec.policy import TABLE

    text = (pathlib.Path(__file__).parents[1] / "docs" / "routing.md").read_text()
    section = text.split("## The routing table", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+b?) \| [^|]+ \| ([^|]+) \|", section, re.MULTILINE)
    assert [row for row, _ in rows] == ["0"] + [rule.row for rule in TABLE]
    for (_, backend), rule in zip(rows[1:], TABLE):
        if rule.backend in ("thread", "fork", "loky"):
            assert f"`{rule.backend}`" in backend, (rule, backend)


def test_every_decision_names_the_row_that_chose_it():
    from smartexec.policy import TABLE

    ids = {rule.id for rule in TABLE}
    for prof in (profile("function"), profile("lambda", by_reference=False)):
        for options in (Options(), Options(prefer="threads"), Options(backend="loky")):
            assert decide(prof, LINUX, options).rule in ids
    assert decide(profile("function"), LINUX, Options()).rule == "importable-fork"
    assert decide(profile("function"), NO_FORK, Options()).rule == "importable-loky"


def test_alternatives_name_every_permitted_route_without_a_measurement():
    """Issue 33: where else a callable could run is the policy's answer, asked
    with no made-up GIL measurement; the process route's reason says why it
    was asked."""
    from smartexec.policy import ELSEWHERE_THREADS, alternatives

    releases = profile("function", gil_hint="h")  # the table sends it to threads
    assert decide(releases, LINUX, Options()).backend == "thread"
    found = alternatives(releases, LINUX, Options())
    assert sorted(found) == ["fork", "inline", "thread"]
    assert ELSEWHERE_THREADS in found["fork"].reasons and found["fork"].gil is None
    assert sorted(alternatives(releases, NO_FORK, Options())) == ["inline", "loky", "thread"]
    # other threads running: fork gives way to loky, as decide() says
    assert "loky" in alternatives(releases, LINUX, Options(), other_threads=1)
    assert sorted(alternatives(releases, LINUX, Options(prefer="threads"))) == ["inline", "thread"]
    assert sorted(alternatives(releases, LINUX, Options(prefer="processes"))) == ["fork"]
    # effects that keep it off threads leave only the process route
    kept_off = alternatives(_writing("shared", gil_hint="h"), LINUX, Options())
    assert "thread" not in kept_off and "fork" in kept_off
    # a route that must share a live object is never an alternative
    assert alternatives(profile("bound_method", state=BIG), LINUX, Options()).get("fork") is None
