"""The evidence a map's first chunks give, and the move it may make (pure: no workers)."""

from __future__ import annotations

import pytest

from smartexec._rerouting import (
    IDLE_SETTLE_S,
    MAX_SAMPLES,
    SWITCH_GAIN,
    Evidence,
    reroute,
)
from smartexec.gil import GilProfile
from smartexec.tuning import predict_s

HOLDS = GilProfile("holds", 2, 0.02, 0.99, 0.9, 40)
RELEASES = GilProfile("releases", 2, 0.02, 0.99, 0.02, 40)
WAITS = GilProfile("waits", 2, 0.02, 0.01, 0.0, 40)
SHORT = GilProfile("holds", 1, 0.0005, 1.0, 1.0, 1)


def evidence(*watches: GilProfile, per_item_s: float = 0.01, workers: int = 2) -> Evidence:
    found = Evidence(workers)
    for watch in watches:
        found.add(1, per_item_s, per_item_s * watch.cpu_share, watch)
    return found


def test_two_agreeing_watches_settle_the_kind():
    assert evidence(WAITS, WAITS).kind == "waits"
    assert evidence(WAITS, WAITS).ready()
    assert evidence(HOLDS, HOLDS).kind == "holds"


def test_one_watch_is_enough_only_when_long():
    found = evidence(GilProfile("holds", 1, 0.005, 0.99, 0.9, 10))
    assert found.kind is None and not found.ready()
    assert evidence(GilProfile("holds", 1, 0.05, 0.99, 0.9, 100), workers=1).ready()


def test_a_watch_too_short_to_see_the_gil_is_not_counted():
    found = evidence(SHORT, SHORT, SHORT)
    assert found.watches == [] and found.kind is None


def test_one_disturbed_watch_is_outvoted_not_averaged():
    found = evidence(RELEASES, HOLDS)
    assert found.kind is None and not found.ready()  # 1 of 2: wait for a third
    found.add(1, 0.01, 0.01, RELEASES)
    assert found.kind == "releases" and found.ready()


def test_many_chunks_end_the_wait_even_without_agreement():
    found = Evidence(2)
    for _ in range(MAX_SAMPLES):
        found.add(10, 0.001, 0.001, None)
    assert found.ready() and found.kind is None


def test_without_watches_only_a_clear_wait_counts():
    waiting = Evidence(2)
    busy = Evidence(2)
    for _ in range(3):
        waiting.add(1, 0.01, 0.0001, None)
        busy.add(1, 0.01, 0.004, None)  # 40 % of a CPU: a busy machine, not a wait
    assert waiting.kind == "waits" and busy.kind is None


def test_a_stalled_chunk_moves_the_median_by_one_rank_only():
    found = Evidence(2)
    for seconds in (0.001, 0.001, 0.124, 0.001, 0.001):
        found.add(1, seconds, seconds, None)
    assert found.per_item_s == pytest.approx(0.001)


def test_predictions():
    common = {"per_item_s": 0.01, "send_s": 0.0, "rest": 100, "cpus": 2}
    assert predict_s("inline", kind="holds", workers=1, **common) == pytest.approx(1.0)
    assert predict_s("thread", kind="holds", workers=6, **common) == pytest.approx(1.5)  # turns
    # in waves: 100 waiting items on 6 threads take 17 items' time, not 100/6
    assert predict_s("thread", kind="waits", workers=6, **common) == pytest.approx(0.17)
    assert predict_s("thread", kind="releases", workers=6, **common) == pytest.approx(0.5)
    assert predict_s("fork", kind="holds", workers=2, **common) == pytest.approx(0.5, rel=1e-3)
    # the parent's sending bounds a process route ...
    sending = dict(common, send_s=0.02)
    assert predict_s("fork", kind="holds", workers=2, **dict(sending, cpus=8)) == pytest.approx(
        2.0002
    )
    # ... and where the workers use every CPU, both ends' sending takes CPU
    # from them: the items' CPU plus twice the sending, over the CPUs
    assert predict_s("fork", kind="releases", workers=2, **sending) == pytest.approx(
        (1.0 + 2 * 2.0002) / 2
    )
    # waiting items use no CPU: only the sending counts there
    assert predict_s("fork", kind="waits", workers=2, **dict(sending, per_item_s=0.05)) == (
        pytest.approx(2.5)
    )
    # an item that keeps both cores busy leaves room for one at a time
    assert predict_s("thread", kind="releases", workers=6, cores=2.0, **common) == 1.0


def test_a_rest_takes_no_less_than_one_item_on_any_pool():
    # 7 sleeps of 10 ms left on a pool grown to 100 threads: one item's
    # time (explain() predicted 0.7 ms: the sum over the width)
    few = {"per_item_s": 0.01, "send_s": 0.0, "rest": 7, "cpus": 2}
    assert predict_s("thread", kind="waits", workers=100, **few) == pytest.approx(0.01)
    assert predict_s("thread", kind="releases", workers=6, **few) == pytest.approx(0.04)
    assert predict_s("fork", kind="holds", workers=2, **few) == pytest.approx(0.04, rel=1e-3)
    assert predict_s("thread", kind="waits", workers=100, **dict(few, rest=0)) == 0.0


def test_waiting_work_moves_from_processes_to_threads():
    move = reroute(
        evidence(WAITS, WAITS),
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0)},
        send_s=1e-5,
        rest=90,
        cpus=2,
    )
    assert move.target == "thread"
    assert "moves to thread" in move.reason and "90 items not sent yet" in move.reason


def test_items_in_flight_on_processes_count_with_the_rest_on_every_route():
    # 20 items of 10 ms on fork's two workers not back yet, 90 not sent.
    routes = {"fork": (2, 0.0), "thread": (6, 0.0)}
    args = {"current": "fork", "candidates": routes, "send_s": 1e-5, "rest": 90, "cpus": 2}
    alone = reroute(evidence(HOLDS, HOLDS), **args)
    flying = reroute(evidence(HOLDS, HOLDS), in_flight=20, **args)
    # On fork the rest runs after them: 10 waves of 10 ms more.
    assert flying.predicted["fork"] == pytest.approx(alone.predicted["fork"] + 0.1, rel=0.01)
    assert "90 items not sent yet and the 20 in flight on fork" in flying.reason
    # A move takes back those no worker began: they go with the rest.
    waits = reroute(evidence(WAITS, WAITS), in_flight=20, **args)
    assert waits.predicted["thread"] == pytest.approx(0.19)  # 110 items, 6 at a time
    assert waits.target == "thread"


def test_items_in_flight_weigh_against_a_move_that_would_take_them_along():
    # A breaker's case: 300 items queued on fork, 100 not sent, 3 ms items
    # that hold the GIL, 8 CPUs. Priced beside fork's queue, threads read
    # 0.45 s against fork's 0.60 s and the map moved; on threads the ~400
    # items taken along take 1.8 s.
    found = Evidence(2)
    for _ in range(8):
        found.add(2, 0.006, 0.006, GilProfile("holds", 3, 0.009, 1.0, 1.0, 18))
    routes = {"fork": (2, 0.0), "thread": (8, 0.0), "inline": (1, 0.0)}
    verdict = reroute(
        found, current="fork", candidates=routes, send_s=2e-5, rest=100, cpus=8, in_flight=300
    )
    assert verdict.target is None, verdict.reason
    assert verdict.predicted["thread"] == pytest.approx(400 * 0.003 * 1.5, rel=0.01)
    # On threads, chunks in flight run side by side already: not counted.
    on_threads = reroute(
        evidence(RELEASES, RELEASES),
        current="thread",
        candidates={"thread": (6, 0.0), "inline": (1, 0.0)},
        send_s=0.0,
        rest=90,
        cpus=2,
        in_flight=30,
    )
    assert "in flight" not in on_threads.reason


def test_gil_holding_work_stays_on_processes():
    stay = reroute(
        evidence(HOLDS, HOLDS),
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0)},
        send_s=1e-5,
        rest=200,
        cpus=2,
    )
    assert stay.target is None and "stays on fork" in stay.reason


def test_no_move_on_disagreeing_watches_whatever_the_prediction():
    stay = reroute(
        evidence(WAITS, HOLDS),
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0)},
        send_s=1e-5,
        rest=1000,
        cpus=2,
    )
    assert stay.target is None and "its GIL use is not settled yet" in stay.reason


def test_cheap_items_settle_without_a_gil_kind_and_may_move_to_a_loop():
    found = Evidence(2)
    for _ in range(2):
        found.add(100, 100 * 2e-7, 100 * 2e-7, None)  # 0.2 us items: too short to watch
    assert found.kind is None and found.ready()
    move = reroute(
        found,
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0), "inline": (1, 0.0)},
        send_s=1e-6,  # pickling costs 5x the work
        rest=200_000,
        cpus=2,
    )
    assert move.target == "inline", move.reason


def test_cheap_items_priced_by_cold_workers_are_taken_again_with_more_chunks():
    # CI (py310, loaded machine): 7 one-item chunks and a 252-item one, each
    # a fresh worker's first calls, priced 0.1 us items at 3.2 us, near the
    # cost of sending them: the map stayed on fork for 200,000 items.
    found = Evidence(2)
    for _ in range(7):
        found.add(1, 2e-5, 2e-5, None)
    found.add(252, 252 * 3.2e-6, 252 * 3.2e-6, None)
    candidates = {"fork": (2, 0.0), "thread": (6, 0.0), "inline": (1, 0.0)}
    early = reroute(
        found, current="fork", candidates=candidates, send_s=0.5e-6, rest=199_000, cpus=2
    )
    assert found.ready() and early.target is None and found.recheck_stay()
    while len(found.per_item) < MAX_SAMPLES:  # warm workers, bigger chunks
        found.add(2835, 2835 * 1e-7, 2835 * 1e-7, None)
    assert not found.recheck_stay()
    later = reroute(
        found, current="fork", candidates=candidates, send_s=0.5e-6, rest=170_000, cpus=2
    )
    assert later.target == "inline", later.reason


def test_a_stay_is_taken_again_until_enough_chunks_are_in():
    found = evidence(HOLDS, HOLDS, per_item_s=0.01)
    assert found.ready() and found.recheck_stay()
    while len(found.per_item) < MAX_SAMPLES:
        found.add(4, 0.04, 0.04, None)
    assert not found.recheck_stay()


def test_the_first_calls_warm_up_weighs_little_once_more_chunks_are_in():
    # sha256 of a block each worker builds at its first call: each worker's
    # first (one-item) chunk read ~20 ms an item, later ones 2.35 ms.
    found = Evidence(2)
    found.add(1, 0.022, 0.022, None)
    found.add(1, 0.021, 0.021, None)
    early = found.per_item_s
    while len(found.per_item) < MAX_SAMPLES:
        found.add(6, 6 * 0.00235, 6 * 0.00235, None)
    assert early > 0.02 and found.per_item_s < 1.3 * 0.00235


def test_a_near_tie_stays():
    # threads predicted faster, but by less than SWITCH_GAIN
    found = evidence(RELEASES, RELEASES, per_item_s=0.01)
    stay = reroute(
        found,
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0)},
        # both ends' sending over the 2 CPUs: fork = 1000 x (0.01 + 2 x send) / 2
        send_s=0.01 / 2 * (SWITCH_GAIN - 1.1) - 2e-6,
        rest=1000,
        cpus=2,
    )
    assert stay.target is None and "gain only" in stay.reason


def test_an_exact_tie_is_not_called_the_fastest():
    tie = reroute(
        evidence(RELEASES, RELEASES, per_item_s=0.0025),
        current="fork",
        # 2 fork workers on 4 CPUs: the sending has CPUs of its own
        candidates={"fork": (2, 0.0), "thread": (2, 0.0)},
        send_s=1e-6,
        rest=160,
        cpus=4,
    )
    assert tie.target is None and tie.predicted["fork"] == tie.predicted["thread"]
    assert "no route is predicted faster" in tie.reason and "is fastest" not in tie.reason


def test_a_switch_must_save_some_milliseconds():
    stay = reroute(
        evidence(WAITS, WAITS, per_item_s=1e-4),
        current="fork",
        candidates={"fork": (2, 0.0), "thread": (6, 0.0)},
        send_s=0.0,
        rest=10,
        cpus=2,
    )
    assert stay.target is None
    # the gain is large; the saving is what is too small, and the line says so
    assert "thread would save only" in stay.reason and "must save 5 ms" in stay.reason


def test_start_up_counts_against_a_move_to_processes():
    found = evidence(HOLDS, HOLDS, per_item_s=0.001)
    near = dict(current="thread", send_s=1e-5, rest=300, cpus=2)
    assert reroute(found, candidates={"thread": (6, 0.0), "loky": (2, 0.5)}, **near).target is None
    assert reroute(found, candidates={"thread": (6, 0.0), "fork": (2, 0.008)}, **near).target == (
        "fork"
    )


def test_an_unknown_length_counts_only_what_was_seen():
    found = evidence(HOLDS, HOLDS, per_item_s=0.001)
    move = reroute(
        found,
        current="thread",
        candidates={"thread": (6, 0.0), "fork": (2, 0.008)},
        send_s=1e-5,
        rest=None,
        cpus=2,
    )
    assert move.target is None  # 2 items seen: no move pays for itself on 2 items
    # and explain() says what it predicted for: not "items not sent yet"
    assert "the next 2 items (the input's length is unknown" in move.reason
    assert "not sent yet" not in move.reason


def test_the_remembered_profile_is_the_agreed_kind():
    found = evidence(RELEASES, RELEASES, HOLDS)
    profile = found.profile()
    assert profile is not None and profile.kind == "releases" and profile.items == 4
    assert evidence(RELEASES, HOLDS).profile() is None


@pytest.mark.parametrize(
    ("cores", "gil_share", "kind"),
    [
        (0.05, 0.0, "waits"),
        (1.0, 0.9, "holds"),
        (1.9, 0.05, "releases"),
        (1.9, 0.9, "releases"),  # over one core: not GIL-bound, whatever the watch read
        (0.8, 0.05, None),  # busy, but no watch saw the GIL held: undecided
    ],
)
def test_on_threads_the_process_cpu_tells_waiting_from_taking_turns(cores, gil_share, kind):
    # Six threads taking turns on the GIL each read ~1/6 CPU, as if waiting:
    # the process's CPU (one core busy) says otherwise.
    found = Evidence(6)
    for _ in range(3):
        watch = GilProfile("waits", 1, 0.01, 0.16, gil_share, 20)
        found.add(1, 0.01, 0.0016, watch)
    found.on_threads = True
    assert found.kind is None  # not yet measured long enough
    found.process_cores = cores
    assert found.kind == kind
    assert found.ready() == (kind is not None)


def test_on_threads_items_that_barely_use_a_cpu_wait_whatever_the_watches_saw():
    # Sleeping items on a cold pool: the threads' start and the caller hold
    # the GIL while the watches run, and the pool threads' clocks count the
    # start too (0.8 cores). The items' own CPU, summed over the six
    # threads, is far under the one core that items taking turns keep busy.
    found = Evidence(6)
    for _ in range(3):
        watch = GilProfile("holds", 1, 0.01, 0.005, 0.7, 20)
        found.add(1, 0.01, 0.00005, watch)
    found.on_threads = True
    found.process_cores = 0.8
    assert found.kind == "waits"


def test_on_threads_a_starved_pool_of_computing_items_is_not_read_as_waiting():
    # 0.5 us items in chunks of 3,700: the caller cannot feed six threads, so
    # the pool's clocks read 0.1 cores; each chunk computed all its wall time.
    found = Evidence(6)
    for _ in range(3):
        found.add(3700, 0.002, 0.002, None)
    found.on_threads = True
    found.process_cores = 0.1
    assert found.kind is None
    assert found.ready()  # cheap items settle without a kind


@pytest.mark.parametrize(
    ("used", "wanted", "kind"),
    [
        (0.9, 4.5, "releases"),  # six threads short of CPUs: runnable, not taking turns
        (0.9, 1.05, "holds"),  # one runnable at a time: taking turns on the GIL
        (0.3, 1.5, "holds"),  # ... and their timed waits for the GIL queued for a CPU
        (0.1, 0.1, None),  # the pool waited for chunks: says nothing of the GIL
        (0.1, 0.12, "waits"),
    ],
)
def test_on_threads_the_cores_the_threads_wanted_survive_a_busy_machine(used, wanted, kind):
    # A machine short of CPUs gives GIL-releasing threads one core between
    # them, as if they took turns; their time queued for a CPU says otherwise.
    found = Evidence(6)
    share = 0.01 if kind == "waits" else 0.9 if kind is None else 0.15
    for _ in range(3):
        found.add(1, 0.01, 0.01 * share, None)
    found.on_threads = True
    found.process_cores = used
    found.wanted_cores = wanted
    assert found.kind == kind


@pytest.mark.parametrize(
    ("busy", "wanted", "kind"),
    [
        # 64 numpy items under load, the pool fed 3-4 chunks at a time: each
        # busy thread runnable, though the six threads wanted 3.1 cores.
        (3.6, 3.1, "releases"),
        (5.9, 1.4, "holds"),  # six busy threads taking turns: about one core
        (2.0, 1.05, "holds"),
        (2.0, 1.9, "releases"),
        (1.6, 1.5, None),  # two taking turns under load, or releasing: alike
        (1.7, 1.7, None),
        (1.2, 1.1, None),  # one thread alone is runnable either way: cannot tell
        (None, 3.1, "holds"),  # not read: every worker counts as busy
    ],
)
def test_on_threads_the_cores_wanted_are_judged_against_the_threads_that_had_chunks(
    busy, wanted, kind
):
    found = Evidence(6)
    for _ in range(3):
        found.add(1, 0.01, 0.0015, None)
    found.on_threads = True
    found.process_cores = 1.0
    found.wanted_cores = wanted
    found.busy_threads = busy
    assert found.kind == kind
    if busy is not None:
        assert f"by {busy:.1f} busy threads" in found.describe()


@pytest.mark.parametrize(
    ("idle", "error", "wall", "spare", "kind"),
    [
        # Six einsum threads on a busy 2-core machine (CI, Python 3.13): they
        # got 1.1 cores and wanted 2.8 of 5.9 busy, under (1 + 5.9) / 2. With
        # no core idle that says nothing: threads taking turns under load
        # wanted 1.4-3.4, threads releasing the GIL 2.3-4.1.
        # (Spare: the 1.1 cores used plus those idle, beyond one.)
        # (Error: two ticks of 10 ms over the wall seconds.)
        (0.0, 0.07, 0.3, False, None),
        (0.9, 0.07, 0.3, True, "holds"),  # a core sat idle: they waited for each other
        (0.4, 0.4, 0.05, None, None),  # 50 ms of 10 ms ticks: not known yet ...
        (0.5, 0.08, IDLE_SETTLE_S, True, "holds"),  # ... known
        (0.35, 0.08, IDLE_SETTLE_S, False, None),  # ... settled as read, after IDLE_SETTLE_S
        (None, 0.0, 0.0, True, "holds"),  # not read (no /proc/stat): as before
    ],
)
def test_on_threads_the_cores_wanted_decide_only_while_the_machine_has_cores_to_spare(
    idle, error, wall, spare, kind
):
    found = Evidence(6)
    for _ in range(MAX_SAMPLES):
        found.add(1, 0.01, 0.002, None)
    found.on_threads = True
    found.process_cores = 1.1
    found.wanted_cores = 2.8
    found.busy_threads = 5.9
    found.idle_cores, found.idle_wall_s = idle, wall
    assert found.idle_error == pytest.approx(error, abs=0.005)
    assert found.spare_cores() is spare
    assert found.kind == kind
    # Not known yet: taken again at later results, though MAX_SAMPLES are in.
    assert found.recheck_stay() is (spare is None)
    if spare is None:  # ... unless the kind does not wait on it
        found.wanted_cores = 1.2
        assert found.kind == "holds" and not found.recheck_stay()
    if idle is not None:
        assert f"{idle:.1f} +- {error:.1f} of the machine's cores sat idle" in found.describe()


@pytest.mark.parametrize(
    ("wanted", "busy", "kind"),
    [
        (1.4, 5.9, "holds"),  # about one core between six: taking turns, on any machine
        (1.4, 2.0, "holds"),  # under halfway for two threads
        (3.4, 3.6, None),  # six taking turns under load wanted this much: not "releases"
        (2.3, 3.1, None),  # six running einsum under load wanted this little: not "holds"
    ],
)
def test_on_a_machine_with_no_core_to_spare_only_few_cores_wanted_decide(wanted, busy, kind):
    found = Evidence(6)
    for _ in range(3):
        found.add(1, 0.01, 0.002, None)
    found.on_threads = True
    found.process_cores, found.wanted_cores, found.busy_threads = 0.9, wanted, busy
    found.idle_cores, found.idle_wall_s = 0.0, 0.3
    assert found.kind == kind


def test_on_threads_a_pool_using_many_cores_releases_the_gil_whatever_the_machine_has_idle():
    found = Evidence(6)
    for _ in range(MAX_SAMPLES):
        found.add(1, 0.01, 0.004, None)
    found.on_threads = True
    found.process_cores, found.wanted_cores, found.busy_threads = 1.6, 4.5, 5.5
    found.idle_cores, found.idle_wall_s = 0.0, 0.04  # give or take 0.5 cores
    assert found.kind == "releases"
    assert not found.recheck_stay()  # the idle figure, unsure yet, decides nothing here


def test_replies_whose_cpu_was_not_read_still_bring_the_verdict():
    # On threads a measuring map reads the CPU clock of a third of its
    # chunks: the others still count toward MAX_SAMPLES, or a map whose GIL
    # use stays undecided would never settle.
    from smartexec._rerouting import MAX_SAMPLES

    found = Evidence(6)
    found.add(1, 0.01, -1.0, None)
    assert not found.ready()  # no figure at all yet
    found.add(1, 0.01, 0.009, None)
    for _ in range(MAX_SAMPLES - 3):
        found.add(1, 0.01, -1.0, None)
    assert not found.ready() and found.recheck_stay()
    found.add(1, 0.01, -1.0, None)
    assert found.ready() and found.items == 1
    assert not found.recheck_stay()


def test_the_chunks_own_send_time_counts_when_dearer_than_the_estimate():
    found = Evidence(2)
    assert found.send_s(0.005) == 0.005  # nothing sent yet: the estimate
    for seconds in (0.2, 0.05, 0.03, 0.04, 0.035):  # each worker's first, then warm ones
        found.add_send(1, seconds)
    assert found.send_s(0.005) == pytest.approx(0.035)  # the warm sends' low median
    assert found.send_s(0.1) == 0.1  # never below the estimate (results come back too)


def test_a_workers_receive_of_big_requests_counts_as_this_ends_send():
    # 2 MiB bytes pickle into nothing in ~40 us; a worker took ~3 ms an item
    # to read them from its pipe and unpickle them, and fork was predicted
    # at a tie with threads that ran 1.33x faster.
    found = Evidence(2)
    found.add(1, 0.015, 0.015, None)  # a small request: not timed
    assert found.send_s(8e-5) == 8e-5
    for receive_s in (0.003, 0.0028, 0.009):  # one stalled
        found.add(1, 0.015, 0.015, None, receive_s=receive_s)
    assert found.send_s(8e-5) == pytest.approx(0.003)  # the low median
    found.add(4, 0.06, 0.06, None, receive_s=0.004)  # per item: 1 ms
    assert found.send_s(8e-5) == pytest.approx(0.0028)
    assert found.send_s(0.01) == 0.01  # never below the estimate


def test_a_dearer_send_moves_a_tie_to_threads():
    # The same figures, priced with the estimate and with the receive.
    evidence = Evidence(2)
    for _ in range(4):
        evidence.add(1, 0.015, 0.015, RELEASES, receive_s=0.003)
    routes = {"fork": (2, 0.0), "thread": (6, 0.0)}
    tie = reroute(evidence, current="fork", candidates=routes, send_s=8e-5, rest=56, cpus=2)
    assert tie.target is None, tie.reason
    moved = reroute(
        evidence, current="fork", candidates=routes, send_s=evidence.send_s(8e-5), rest=56, cpus=2
    )
    assert moved.target == "thread", moved.reason


def test_the_first_send_to_each_worker_is_left_out():
    # It pays for the pool's start and the worker's first reads: a probe's
    # two chunks of 64 JSON documents took 11-14 ms and 1.0-1.2 ms, later
    # chunks of 1,000 0.2-0.6 ms, and priced from the first two the rest of
    # the map moved to a loop 1.6x slower than fork.
    found = Evidence(2)
    found.add_send(64, 0.012)  # the fork pool started in this send
    found.add_send(64, 0.0011)  # the second worker's first
    # Nothing warm yet: the cold sends bound it from above (the low median).
    assert found.send_s(7e-6) == pytest.approx(0.0011 / 64)
    found.add_send(1000, 0.0004)
    found.add_send(1000, 0.0003)
    assert found.send_s(1e-7) == pytest.approx(0.0003 / 1000)


def test_the_per_item_figure_cuts_one_stall_and_prices_a_heavy_tail_near_its_mean():
    stalled = Evidence(2)
    for _ in range(11):
        stalled.add(4, 0.004, 0.004, None)  # 1 ms per item
    stalled.add(4, 0.4, 0.004, None)  # one chunk stalled 100x
    assert stalled.per_item_s == pytest.approx(0.001)
    # Durations 1, 1, 1, 1, 2, 2, 3, 4, 6, 9 ms (median 2, mean 3): the
    # middle 80 % average 2.5 ms.
    # (Waiting items: their figure is their wall time, which a stall inflates.)
    tail = Evidence(2)
    for ms in (1, 1, 1, 1, 2, 2, 3, 4, 6, 9):
        tail.add(1, ms / 1000, 0.0, None)
    assert tail.per_item_s == pytest.approx(0.0025)
    few = Evidence(2)
    for ms in (1, 2, 9):  # under ten chunks: the weighted median
        few.add(1, ms / 1000, 0.0, None)
    assert few.per_item_s == pytest.approx(0.002)


def test_computing_chunks_are_priced_at_their_mean_less_outliers():
    # CPU seconds, which a stall does not enter: the mean, so heavy-tailed
    # items are priced at what the whole map will take (a median read 1.9x
    # short), from the first few chunks on ...
    tail = Evidence(2)
    for ms in (1, 2, 9):
        tail.add(1, ms / 1000, ms / 1000, None)
    assert tail.per_item_s == pytest.approx(0.004)
    # ... less a chunk over ten times the median (a first call's big import).
    first_import = Evidence(2)
    for ms in (124, 1, 1, 1, 1):
        first_import.add(1, ms / 1000, ms / 1000, None)
    assert first_import.per_item_s == pytest.approx(0.001)
    # More such chunks than workers are slow items, not first calls: all count.
    slow_items = Evidence(2)
    for ms in [10] * 11 + [200] * 5:
        slow_items.add(1, ms / 1000, ms / 1000, None)
    assert slow_items.per_item_s == pytest.approx((11 * 10 + 5 * 200) / 16 / 1000)


def test_a_workers_first_call_is_left_out_of_its_chunk_and_counted_as_a_warm_up():
    # A fresh fork worker's first np.mean: 270 us; the chunk's other 63: 2.4 us.
    chunk_s = 270e-6 + 63 * 2.4e-6
    found = Evidence(2)
    for _ in range(2):
        found.add(64, chunk_s, chunk_s, None, first=(270e-6, 270e-6))
    assert found.per_item_s == pytest.approx(2.4e-6)
    assert found.warm_ups == pytest.approx([267.6e-6] * 2)
    assert found.warm_up_s == pytest.approx(267.6e-6)
    # A chunk with no first call (a later one) counts whole.
    found.add(64, chunk_s, chunk_s, None)
    assert len(found.warm_ups) == 2 and found.per_item[-1] == pytest.approx(chunk_s / 64)


def test_a_first_call_a_few_times_the_others_is_a_warm_up():
    # A fresh fork worker's first seeded 2 MiB noise array and sort: 18 ms,
    # its chunk's other call 6.5 ms; kept in, the chunks read 12 ms an item
    # and predicted fork at 1.6x what it took.
    found = Evidence(2)
    for _ in range(2):
        found.add(2, 0.018 + 0.0065, 0.018 + 0.0065, None, first=(0.018, 0.018))
    assert found.per_item_s == pytest.approx(0.0065)
    assert found.warm_ups == pytest.approx([0.0115] * 2)


def test_a_first_call_no_dearer_than_the_others_is_no_warm_up():
    found = Evidence(2)
    found.add(4, 0.003, 0.003, None, first=(0.0005, 0.0005))  # quicker than the other three
    assert found.per_item_s == pytest.approx(0.0025 / 3) and found.warm_ups == [0.0]
    assert found.warm_up_s == 0.0
    # Waiting chunks are priced on their wall time, and so is their first call.
    waits = Evidence(2)
    waits.add(10, 0.1 + 9 * 0.001, 0.0, None, first=(0.1, 0.0))
    assert waits.per_item_s == pytest.approx(0.001) and waits.warm_ups == pytest.approx([0.099])


def test_a_workers_first_call_alone_in_its_chunk_is_judged_by_the_chunks_after_it():
    # The first two of 2 MiB seeded noise arrays, one per fresh fork worker:
    # 18 and 15 ms against 3 ms after. Decided on them, the map read 10 ms
    # an item and stayed on fork, 1.3x slower than threads.
    found = Evidence(2)
    found.add(1, 0.018, 0.018, None, first=(0.018, 0.018))
    found.add(1, 0.015, 0.015, None, first=(0.015, 0.015))
    assert found.per_item == [] and not found.ready()  # nothing steady to judge them by
    assert found.per_item_s == pytest.approx(0.0165)  # until then, all there is
    found.add(1, 0.003, 0.003, None)
    assert found.warm_ups == pytest.approx([0.015, 0.012]) and found.lone_firsts == []
    found.add(1, 0.0031, 0.0031, None)
    assert found.per_item_s == pytest.approx(0.00305)
    # A first call like the later ones leaves no warm-up; the chunks are the figure.
    alike = Evidence(2)
    alike.add(1, 0.004, 0.004, None, first=(0.004, 0.004))
    alike.add(2, 0.010, 0.010, None)
    assert alike.warm_ups == [0.0] and alike.per_item == [0.005]


def test_first_calls_past_one_per_worker_count_as_their_chunks():
    # max_tasks_per_child=1: every chunk runs in a fresh worker, its one call
    # a first call. Held apart, none was ever steady: the map never decided.
    replaced = Evidence(2)
    for _ in range(4):
        replaced.add(1, 0.02, 0.02, None, first=(0.02, 0.02))
    assert replaced.per_item == [0.02] * 2 and replaced.per_item_s == pytest.approx(0.02)
    assert len(replaced.warm_ups) == 2 and replaced.lone_firsts == []
    while not replaced.ready():  # unwatched: a verdict after MAX_SAMPLES chunks
        replaced.add(1, 0.02, 0.02, None, first=(0.02, 0.02))
    assert len(replaced.per_item) == MAX_SAMPLES
    # ... and in longer chunks, each worker's first call pays its warm-up again.
    longer = Evidence(2)
    for _ in range(3):
        longer.add(4, 0.05, 0.05, None, first=(0.02, 0.02))
    assert longer.per_item == [0.01, 0.01, 0.0125] and len(longer.warm_ups) == 2


def test_a_worker_reports_its_first_call_of_a_callable_in_a_chunk_of_one():
    from smartexec import _remote

    key = _remote._watch_key(abs)
    _remote._watched.pop(key, None)  # as in a fresh worker
    _remote._last_call_s.pop(key, None)
    first = _remote.run_chunk(abs, [((-1,), {})], remote=True)
    assert first.first == (first.compute_s, first.cpu_s)
    assert _remote.run_chunk(abs, [((-2,), {})], remote=True).first is None
    _remote.forget_watches()  # as after a fork: a fresh worker's first call again
    assert _remote.run_chunk(abs, [((-3,), {})], remote=True).first is not None


def test_a_route_not_running_yet_pays_the_warm_up_once():
    found = Evidence(2)
    for _ in range(2):
        found.add(64, 0.02 + 63 * 1e-4, 0.02 + 63 * 1e-4, None, first=(0.02, 0.02))
    verdict = reroute(
        found,
        current="fork",
        candidates={"fork": (2, 0.0), "inline": (1, 0.0)},
        send_s=0.0,
        rest=1000,
        cpus=2,
    )
    assert verdict.predicted["inline"] == pytest.approx(1000 * 1e-4 + found.warm_up_s)
    running = predict_s(
        "fork", kind=None, per_item_s=1e-4, send_s=0.0, rest=1000, cpus=2, workers=2
    )
    assert verdict.predicted["fork"] == pytest.approx(running)


def test_a_cost_paid_once_per_chunk_is_told_from_one_paid_per_item():
    # The same 20 MiB array in every call: proven once per chunk, so a chunk of
    # 63 items costs the caller about what a chunk of one does.
    repeated = Evidence(2)
    for n, seconds in [(1, 0.007)] * 7 + [(63, 0.009)] * 2:
        repeated.add_send(n, seconds)
    per_chunk, per_item = repeated.per_chunk_send(0.007)
    assert per_chunk == pytest.approx(0.007 - per_item)
    assert per_item == pytest.approx(0.002 / 62)
    # Distinct big arguments: each item pays its own send, chunk or not.
    distinct = Evidence(2)
    for n, seconds in [(1, 0.007)] * 7 + [(63, 0.44)] * 2:
        distinct.add_send(n, seconds)
    assert distinct.per_chunk_send(0.007) is None
    # Sends pickled off the caller's thread cost it the same microseconds
    # whatever they carry: they do not pass for a per-chunk cost.
    queued = Evidence(2)
    for n, seconds in [(1, 2e-5)] * 7 + [(63, 2e-5)] * 2:
        queued.add_send(n, seconds)
    assert queued.per_chunk_send(0.007) is None
    # Chunks of one size alone tell nothing.
    alone = Evidence(2)
    for _ in range(5):
        alone.add_send(1, 0.007)
    assert alone.per_chunk_send(0.007) is None


def test_threads_that_release_the_gil_are_priced_at_their_cpu_not_their_wait_for_a_core():
    # Six threads sharing two cores: each chunk's wall time is 3x its CPU
    # time. Priced at the wall, explain() predicted 4.6x the run.
    found = Evidence(6)
    found.on_threads = True
    for _ in range(8):
        found.add(1, 0.003, 0.001, None)
    found.process_cores, found.wanted_cores = 2.0, 6.0
    assert found.kind == "releases"
    verdict = reroute(
        found, current="thread", candidates={"thread": (6, 0.0)}, send_s=0.0, rest=60, cpus=2
    )
    assert verdict.predicted["thread"] == pytest.approx(60 * 0.001 / 2)


def test_explain_names_how_the_time_per_item_was_taken():
    computing = Evidence(2)
    computing.add(1, 0.002, 0.002, None)
    assert "chunks, mean 2.0 ms per item" in computing.describe()
    waiting = Evidence(2)
    waiting.add(1, 0.002, 0.0, None)
    assert "chunks, median 2.0 ms per item" in waiting.describe()


def test_explain_says_one_watch_in_the_singular():
    found = Evidence(2)
    found.add(1, 0.1, 0.1, GilProfile("holds", 1, 0.1, 1.0, 0.9, 400))
    found.add(1, 0.1, 0.1, None)
    assert found.kind == "holds"
    assert "1 GIL watch says: holds" in found.describe(), found.describe()


def test_a_later_look_at_dear_items_refreshes_the_figures_and_keeps_the_route():
    found = evidence(WAITS, WAITS, per_item_s=0.01)
    args = dict(current="fork", candidates={"fork": (2, 0.0), "thread": (6, 0.0)})
    first = reroute(found, send_s=1e-5, rest=90, cpus=2, **args)
    later = reroute(found, send_s=1e-5, rest=90, cpus=2, may_move=False, **args)
    assert first.target == "thread"
    assert later.target is None and later.predicted == first.predicted
    assert "decided on its first chunks" in later.reason


def test_figures_taken_on_the_gil_use_measured_before_while_these_chunks_agree_on_none():
    found = Evidence(2)
    found.on_threads = True
    found.add(1, 0.006, 0.002, None)  # 6 threads on 2 cores: wall 3x the CPU
    found.add(1, 0.006, 0.002, None)
    assert found.kind is None
    args = dict(current="thread", candidates={"thread": (6, 0.0), "inline": (1, 0.0)})
    unknown = reroute(found, send_s=0.0, rest=60, cpus=2, **args)
    known = reroute(found, send_s=0.0, rest=60, cpus=2, prior="releases", **args)
    assert unknown.predicted["thread"] > unknown.predicted["inline"]  # priced as holding it
    assert known.predicted["thread"] == pytest.approx(60 * 0.002 / 2)
    assert "measured before: releases" in known.reason
    assert known.target is None  # no move on a kind these chunks did not agree on


def test_threads_taking_turns_on_the_gil_are_priced_on_their_cpu_time():
    # 5 threads taking turns: each chunk's wall time holds its wait for the
    # GIL (sha256 of small files read 434 us an item, 36 us in a loop).
    found = Evidence(5)
    found.on_threads = True
    for _ in range(3):
        found.add(10, 10 * 400e-6, 10 * 40e-6, None)
    args = dict(current="thread", candidates={"thread": (5, 0.0), "inline": (1, 0.0)})
    verdict = reroute(found, send_s=0.0, rest=1000, cpus=2, prior="holds", **args)
    assert verdict.predicted["inline"] == pytest.approx(1000 * 40e-6)
    assert verdict.predicted["thread"] == pytest.approx(1000 * 40e-6 * 1.5)


def test_on_threads_a_stay_is_looked_at_again_until_the_pools_clocks_were_read():
    # The GIL kind of items on threads comes from the pool's clocks, read
    # THREADS_MIN_WALL_S apart: 16 chunks of 1 ms numpy items came back
    # sooner, and the last look priced them as holding the GIL (3x off) and
    # stored no kind, run after run.
    evidence = Evidence(6, on_threads=True)
    for _ in range(MAX_SAMPLES):
        evidence.add(1, 0.003, 0.001, None)
    assert evidence.ready() and evidence.kind is None
    assert evidence.recheck_stay()  # the clocks have not been read yet
    evidence.process_cores = 1.8
    assert not evidence.recheck_stay()
    in_a_process = Evidence(2)
    for _ in range(MAX_SAMPLES):
        in_a_process.add(1, 0.003, 0.003, None)
    assert not in_a_process.recheck_stay()


def test_the_inline_verdict_is_the_one_cost_models_answer():
    """allow_inline's verdict prices a loop and the route with predict_s, nothing else."""
    from smartexec.tuning import inline_verdict

    figures = dict(per_item_s=20e-6, send_s=5e-6, cpus=2, workers=2, overhead_s=150e-6)
    verdict = inline_verdict(remaining=10_000, route="fork", startup_s=0.008, **figures)
    assert verdict.serial_s == pytest.approx(predict_s("inline", kind=None, rest=10_000, **figures))
    assert verdict.parallel_s == pytest.approx(
        predict_s("fork", kind=None, rest=10_000, startup_s=0.008, **figures)
    )
    # Sending costs more per item than the work: a loop wins.
    assert verdict.inline
    dear = dict(figures, per_item_s=2e-3)
    assert not inline_verdict(remaining=10_000, route="fork", startup_s=0.008, **dear).inline
