"""The on-disk store of measured profiles (smartexec/_profiles.py) and the route it seeds.

Every test runs against its own store directory (the ``profile_store``
fixture in conftest.py), never the user's cache.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import operator
import os
import signal
import threading
import time

import pytest

from smartexec import SmartExecutor
from smartexec import _profiles as profiles
from smartexec.gil import GilProfile, forget, remember

from ._children import run_python

HOLDS = GilProfile("holds", items=40, wall_s=0.05, cpu_share=0.98, gil_share=0.9, samples=90)
RELEASES = GilProfile("releases", items=12, wall_s=0.05, cpu_share=0.97, gil_share=0.02, samples=95)


def work(x):
    return sum(i * i for i in range(x))


def other(x):
    return x + 1


class Model:
    def predict(self, x):
        return x * 2

    def __call__(self, x):
        return x * 3


def stored(gil=RELEASES, backend="thread", per_item_s=0.002, saved_at=None, items=200):
    return profiles.StoredProfile(
        backend=backend,
        per_item_s=per_item_s,
        gil=gil,
        send_s=0.0 if backend == "thread" else 2e-5,
        items=items,
        saved_at=time.time() if saved_at is None else saved_at,
    )


def new_process_view():
    """Forget what this process read from the store, as a new process would have.

    This one's saves are written first, as its exit would.
    """
    profiles.flush()
    profiles._RUN_ID = os.urandom(8).hex()  # what it saved is an earlier run's
    with profiles._lock:
        profiles._view.clear()
        profiles._unwritable.clear()


def save_now(fn, profile):
    """Save ``profile`` and write it to disk at once (as an executor's shutdown does)."""
    profiles.save(fn, profile)
    profiles.flush()


def only_file(directory):
    (path,) = [p for p in directory.iterdir() if p.suffix == ".json"]
    return path


# -- round trips ------------------------------------------------------------------


@pytest.mark.parametrize("gil", [HOLDS, RELEASES, None])
def test_save_then_load_in_a_new_process_view(profile_store, gil):
    profile = stored(gil=gil, backend="fork")
    save_now(work, profile)
    new_process_view()
    assert profiles.load(work) == profile
    assert profiles.load(other) is None
    data = json.loads(only_file(profile_store).read_text())
    assert data["format"] == profiles.FORMAT_VERSION
    assert data["key"] == profiles.profile_key(work)


def test_a_load_reads_the_file_once_per_process(profile_store):
    save_now(work, stored())
    new_process_view()
    first = profiles.load(work)
    only_file(profile_store).unlink()
    assert profiles.load(work) == first  # answered from memory
    new_process_view()
    assert profiles.load(work) is None


def test_one_file_per_callable_and_clear(profile_store):
    (profile_store / "notes.txt").write_text("the user's")
    for fn in (work, other, Model().predict, Model()):
        save_now(fn, stored())
    save_now(work, stored(per_item_s=0.5))  # replaces, adds no file
    assert profiles.entry_count() == 4
    assert profiles.clear() == 4
    assert profiles.entry_count() == 0
    assert profiles.load(work) is None
    assert (profile_store / "notes.txt").read_text() == "the user's"
    assert [p.name for p in profile_store.iterdir()] == ["notes.txt"]


def test_old_entries_are_ignored():
    save_now(work, stored(saved_at=time.time() - profiles.MAX_AGE_S - 60))
    new_process_view()
    assert profiles.load(work) is None
    save_now(work, stored(saved_at=time.time() + 10 * 86400))  # a wrong clock
    new_process_view()
    assert profiles.load(work) is None


def test_the_store_stays_bounded(profile_store, monkeypatch):
    monkeypatch.setattr(profiles, "MAX_ENTRIES", 3)
    fns = [eval(f"lambda x: x + {i}") for i in range(5)]  # five keys: the code differs
    for i, fn in enumerate(fns):
        save_now(fn, stored())
        path = profile_store / profiles._file_name(profiles.profile_key(fn))
        os.utime(path, (1e9 + i, time.time() - 1000 + i))  # oldest first
    assert profiles.entry_count() == 3
    new_process_view()
    assert [profiles.load(fn) is not None for fn in fns] == [False, False, True, True, True]


def test_invalid_profiles_are_not_saved(profile_store):
    save_now(work, stored(per_item_s=float("nan")))
    save_now(work, stored(per_item_s=-1.0))
    assert profiles.entry_count() == 0
    assert profiles.load(work) is None


# -- keys -------------------------------------------------------------------------


def test_keys_of_each_kind_of_callable():
    key = profiles.profile_key
    assert key(work) != key(other)
    assert key(work) == key(work)
    model = Model()
    assert key(model.predict) == key(Model().predict)  # the object's state is not in it
    assert "Model" in key(model.predict)
    assert key(model) != key(model.predict)
    assert key(functools.partial(work, 3)) != key(functools.partial(work, "3"))
    assert key(functools.partial(work, 3)) != key(work)
    assert key(len).startswith("v1 | builtin builtins:len |")
    assert key(str.upper) != key(str.lower)
    assert key(int) != key(float)
    first, second = (lambda x: x + 1), (lambda x: x + 2)
    assert key(first) != key(second)  # one qualname, different code
    assert key(operator.itemgetter(1)) is None  # built from arguments: no stable key
    assert key(functools.partial(operator.itemgetter(1), [1, 2])) is None


def test_a_decorated_function_is_keyed_by_the_code_it_wraps():
    def timed(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            return fn(*args)

        return wrapper

    keys = []
    for body in ("x + 1", "x + 2"):
        namespace = {"__name__": "m"}
        exec(f"def f(x):\n    return {body}\n", namespace)
        keys.append(profiles.profile_key(timed(namespace["f"])))
    assert keys[0] != keys[1]  # the same wrapper code and qualname, other wrapped code
    assert "wrapping function m:f" in keys[0]


def test_a_key_does_not_depend_on_the_file_name():
    # A notebook cell compiles to /tmp/ipykernel_<pid>/<n>.py, new at every kernel start.
    source = "def cell(x):\n    return x * 2\n"
    keys = []
    for pid in (101, 202):
        namespace = {"__name__": "__main__"}
        exec(compile(source, f"/tmp/ipykernel_{pid}/3141.py", "exec"), namespace)
        keys.append(profiles.profile_key(namespace["cell"]))
    assert keys[0] == keys[1]
    namespace = {"__name__": "__main__"}
    exec(compile(source.replace("2", "3"), "/tmp/ipykernel_101/3141.py", "exec"), namespace)
    assert profiles.profile_key(namespace["cell"]) != keys[0]


def test_a_key_does_not_change_when_the_code_has_run():
    before = profiles.profile_key(work)
    for _ in range(200):  # long enough for CPython's specialising interpreter
        work(20)
    assert profiles.profile_key(work) == before


def test_the_key_names_python_and_machine():
    import platform

    key = profiles.profile_key(work)
    assert f"cpython-{'.'.join(map(str, __import__('sys').version_info[:2]))}" in key
    assert platform.machine() in key and platform.node() in key


MODULE = """
def work(x):
    if x in {"a", "b", "c", "d", "e"}:  # a frozenset constant: its order follows the hash seed
        return 0
    return sum(i * i for i in range(x)) + OFFSET

OFFSET = 1
double = lambda x: 2 * x

class Model:
    def predict(self, x):
        return [x * k for k in (1.5, 2.5)]
"""

CHILD = """
import functools, json, sys, time
sys.path.insert(0, {where!r})
import mod
from smartexec import SmartExecutor
from smartexec import _profiles as profiles
from smartexec.gil import GilProfile

fns = {{"work": mod.work, "double": mod.double, "predict": mod.Model().predict,
        "partial": functools.partial(mod.work, 3)}}
keys = {{name: profiles.profile_key(fn) for name, fn in fns.items()}}
loaded = profiles.load(mod.work)
with SmartExecutor() as ex:
    reasons = ex.explain(mod.work).reasons
if {save}:
    gil = GilProfile("releases", 12, 0.05, 0.97, 0.02, 95)
    # written at exit (no flush here)
    profiles.save(mod.work, profiles.StoredProfile("thread", 0.004, gil, 0.0, 300, time.time() - 3600))
print(json.dumps({{"keys": keys, "loaded": loaded is not None, "reasons": reasons}}))
"""


@pytest.mark.timeout(120)
def test_keys_are_stable_across_interpreters_and_change_with_the_code(tmp_path, monkeypatch):
    (tmp_path / "mod.py").write_text(MODULE)

    def child(seed, save=False):
        monkeypatch.setenv("PYTHONHASHSEED", str(seed))
        result = run_python(CHILD.format(where=str(tmp_path), save=save), cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])

    first = child(1, save=True)
    assert not first["loaded"]
    assert not any("earlier run" in r for r in first["reasons"])
    second = child(2)
    assert second["keys"] == first["keys"]
    assert second["loaded"]  # the first run's profile starts the second run decided
    assert any(
        r.startswith("measured in an earlier run (") and "300 items): 4.0 ms per item" in r
        for r in second["reasons"]
    )

    (tmp_path / "mod.py").write_text(MODULE.replace("+ OFFSET", "- OFFSET"))
    for stale in (tmp_path / "__pycache__").glob("*"):
        stale.unlink()
    edited = child(3)
    assert edited["keys"]["work"] != first["keys"]["work"]
    assert edited["keys"]["partial"] != first["keys"]["partial"]
    assert edited["keys"]["double"] == first["keys"]["double"]
    assert edited["keys"]["predict"] == first["keys"]["predict"]
    assert not edited["loaded"]


# -- opt-out, damage, unwritable --------------------------------------------------


@pytest.mark.parametrize("off", ["0", "false", "No", "OFF"])
def test_smartexec_cache_off_disables_load_and_save(profile_store, monkeypatch, off):
    save_now(work, stored())
    monkeypatch.setenv(profiles.CACHE_ENV, off)
    assert profiles.cache_dir() is None
    assert profiles.load(work) is None
    save_now(other, stored())
    with SmartExecutor() as ex:
        assert not any("earlier run" in r for r in ex.explain(work).reasons)
    monkeypatch.setenv(profiles.CACHE_ENV, "1")
    new_process_view()
    assert profiles.load(work) is not None
    assert profiles.load(other) is None
    assert profiles.entry_count() == 1


def test_default_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(profiles.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert profiles.cache_dir() == tmp_path / "smartexec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert profiles.cache_dir() == tmp_path / ".cache" / "smartexec"


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: "{not json",
        lambda data: "\xff\xfe",
        lambda data: json.dumps([1, 2]),
        lambda data: json.dumps({**data, "format": profiles.FORMAT_VERSION + 1}),
        lambda data: json.dumps({**data, "key": data["key"] + " (another)"}),
        lambda data: json.dumps({**data, "per_item_s": -1}),
        lambda data: json.dumps({**data, "per_item_s": "fast"}),
        lambda data: json.dumps({**data, "items": True}),
        lambda data: json.dumps({**data, "backend": ""}),
        lambda data: json.dumps({**data, "gil": {**data["gil"], "kind": "maybe"}}),
        lambda data: json.dumps({**data, "gil": {"kind": "holds"}}),
        lambda data: json.dumps({k: v for k, v in data.items() if k != "send_s"}),
        lambda data: "[" * 100_000,
    ],
)
def test_a_damaged_file_is_ignored_then_replaced(profile_store, damage):
    save_now(work, stored())
    path = only_file(profile_store)
    path.write_text(damage(json.loads(path.read_text())), encoding="latin-1")
    new_process_view()
    assert profiles.load(work) is None
    with SmartExecutor() as ex:
        assert not any("earlier run" in r for r in ex.explain(work).reasons)
    fresh = stored(per_item_s=0.25)
    save_now(work, fresh)
    new_process_view()
    assert profiles.load(work) == fresh


def test_an_unreadable_file_is_ignored(profile_store):
    save_now(work, stored())
    path = only_file(profile_store)
    path.unlink()
    path.mkdir()  # reading it fails with IsADirectoryError
    new_process_view()
    assert profiles.load(work) is None


def test_an_unwritable_directory_disables_saving_quietly(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(profiles.CACHE_DIR_ENV, str(blocker / "cache"))  # cannot be made
    with caplog.at_level(logging.DEBUG, logger="smartexec._profiles"):
        save_now(work, stored())
        save_now(other, stored())
    lines = [r for r in caplog.records if r.name == "smartexec._profiles"]
    assert len(lines) == 1 and lines[0].levelno == logging.DEBUG
    assert "not saving profiles in" in lines[0].getMessage()
    assert profiles.load(work) is not None  # this process still remembers it
    new_process_view()
    assert profiles.load(work) is None
    assert profiles.entry_count() == 0 and profiles.clear() == 0
    assert not list(tmp_path.glob("**/.tmp-*"))


def test_no_temporary_file_is_left(profile_store):
    for _ in range(5):
        save_now(work, stored())
    assert [p.name for p in profile_store.iterdir()] == [
        profiles._file_name(profiles.profile_key(work))
    ]


# -- threads and fork -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_threads_save_and_load_at_once():
    fns = [eval(f"lambda x: x * {i}") for i in range(8)]
    errors = []

    def hammer(fn):
        try:
            for n in range(30):
                save_now(fn, stored(items=n + 1))
                assert profiles.load(fn) is not None
                new_process_view()
        except BaseException as exc:  # pragma: no cover - the failure is the report
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(fn,)) for fn in fns for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    new_process_view()
    assert all(profiles.load(fn).items == 30 for fn in fns)


@pytest.mark.timeout(30)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_the_store_is_locked_can_use_it():
    save_now(work, stored())
    with profiles._lock:  # as another thread of the parent might hold it
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(10)  # a deadlock ends the child, not the suite
            ok = profiles.load(work) is not None
            save_now(other, stored())
            os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    new_process_view()
    assert profiles.load(other) is not None


def test_a_fork_child_does_not_write_the_parents_unwritten_saves(profile_store):
    profiles.save(work, stored())  # known here, not written yet
    assert not list(profile_store.glob("*.json"))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(10)
        profiles.flush()  # as the child's exit would, if it ran exit handlers
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not list(profile_store.glob("*.json"))
    profiles.flush()
    assert len(list(profile_store.glob("*.json"))) == 1


# -- when a save is written -----------------------------------------------------------


def test_a_save_is_known_at_once_and_written_at_flush(profile_store):
    # A save comes from a running map: its file is written later, at the
    # executor's shutdown or at exit, not while the map's threads run.
    profile = stored()
    profiles.save(work, profile)
    assert profiles.load(work) == dataclasses.replace(profile, run=profiles._RUN_ID)
    assert not list(profile_store.glob("*.json"))
    profiles.flush()
    assert len(list(profile_store.glob("*.json"))) == 1
    profiles.flush()  # nothing left to write: nothing happens
    assert len(list(profile_store.glob("*.json"))) == 1


def test_clear_drops_saves_not_written_yet(profile_store):
    profiles.save(work, stored())
    profiles.clear()
    profiles.flush()
    assert not list(profile_store.glob("*.json"))


def test_a_flush_after_the_store_is_turned_off_writes_nothing(profile_store, monkeypatch):
    profiles.save(work, stored())
    monkeypatch.setenv(profiles.CACHE_ENV, "0")
    profiles.flush()
    monkeypatch.delenv(profiles.CACHE_ENV)
    profiles.flush()  # dropped, not kept for later
    assert not list(profile_store.glob("*.json"))


@pytest.mark.timeout(60)
def test_a_measured_maps_profile_is_written_when_its_results_end(profile_store):
    # Not at shutdown only: a fork child of multiprocessing ends by os._exit,
    # which runs no exit handler.
    from smartexec._remote import forget_watches

    forget(work)  # measured afresh, as in a new process
    forget_watches()
    ex = SmartExecutor()
    try:
        assert list(ex.map(work, [20_000] * 64)) == [work(20_000)] * 64
        log = "\n".join(map(str, ex.decisions()))
        assert "measured in the workers" in log, log
        assert len(list(profile_store.glob("*.json"))) == 1, log
    finally:
        ex.shutdown()
        forget(work)


@pytest.mark.timeout(60)
def test_an_executor_writes_its_maps_profiles_at_shutdown(profile_store):
    with SmartExecutor() as ex:
        assert list(ex.map(operator.neg, range(2000))) == [-x for x in range(2000)]
    assert len(list(profile_store.glob("*.json"))) == 1


@pytest.mark.timeout(120)
def test_a_script_that_never_shuts_down_writes_its_profiles_at_exit(profile_store, tmp_path):
    script = (
        "import operator\n"
        "from smartexec import SmartExecutor\n"
        "ex = SmartExecutor()\n"
        "assert list(ex.map(operator.neg, range(2000))) == [-x for x in range(2000)]\n"
    )
    result = run_python(script, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert len(list(profile_store.glob("*.json"))) == 1


# -- the route --------------------------------------------------------------------


def test_a_stored_profile_seeds_a_new_executor_but_never_starts_it_in_this_process():
    # Issue 32: an earlier run's "it ran on threads" does not start the next
    # run there (how an item fails must not depend on what was stored); the
    # profile is named, and its figures seed the estimate.
    with SmartExecutor() as ex:
        assert ex.explain(work).backend == "fork"  # unmeasured: it may hold the GIL
    save_now(work, stored(gil=RELEASES, backend="thread", per_item_s=0.004))
    new_process_view()
    with SmartExecutor() as ex:
        decision = ex.explain(work)
        assert decision.backend == "fork"
        assert decision.gil is None
        text = str(decision)
        assert "measured in an earlier run (" in text and "300 items" not in text
        assert "200 items): 4.0 ms per item on thread, GIL use: releases" in text
        estimate = ex._router.route(work)[1]
        assert (estimate.per_item_s, estimate.items, estimate.pickle_parent_s) == (0.004, 200, 0.0)
        assert not estimate.loop_here


def test_a_stored_loop_never_starts_a_map_in_this_process():
    save_now(work, stored(gil=HOLDS, backend="inline", per_item_s=1e-6))
    new_process_view()
    with SmartExecutor() as ex:
        assert ex.explain(work).backend == "fork"
        assert not ex._router.route(work)[1].loop_here


def test_a_stored_process_route_keeps_its_send_cost():
    save_now(work, stored(gil=HOLDS, backend="fork", per_item_s=0.01))
    new_process_view()
    with SmartExecutor() as ex:
        decision = ex.explain(work)
        assert decision.backend == "fork"
        assert "GIL use: holds" in str(decision) and "20.0 us per item to send" in str(decision)
        assert ex._router.route(work)[1].pickle_parent_s == 2e-5


def test_a_measurement_in_this_process_wins_over_the_store():
    save_now(work, stored(gil=RELEASES))
    remember(work, HOLDS)
    try:
        with SmartExecutor() as ex:
            decision = ex.explain(work)
        assert decision.backend == "fork"
        assert not any("earlier run" in r for r in decision.reasons)
    finally:
        forget(work)


@pytest.mark.timeout(120)
def test_a_stored_profile_is_rechecked_by_fresh_evidence():
    # The store says "computes without the GIL", but it is a pure-Python
    # loop: the next run starts on processes all the same, its own first
    # chunks are measured in the workers, and what they found replaces it.
    save_now(work, stored(gil=RELEASES, backend="thread", per_item_s=0.002))
    new_process_view()
    from smartexec._remote import forget_watches

    forget_watches()
    try:
        with SmartExecutor() as ex:
            assert ex.explain(work).backend == "fork"
            assert list(ex.map(work, [20_000] * 400)) == [work(20_000)] * 400
            log = "\n".join(map(str, ex.decisions()))
        assert "measured in the workers" in log, log
        assert all(
            d.backend != "thread" or "moves to thread" in d.reasons[0] for d in ex.decisions()
        )
    finally:
        forget(work)


def test_the_earlier_run_sentence_agrees_with_where_the_decision_starts():
    # A fresh user saw "it starts on processes all the same" under a
    # decision that its code had already put on threads.
    stored = profiles.StoredProfile("thread", 0.002, None, 0.0, 64, 0.0)
    assert "starts on processes all the same" in profiles.earlier_run_reason(stored, "fork")
    on_threads = profiles.earlier_run_reason(stored, "thread")
    assert "processes all the same" not in on_threads
    assert "re-checks it on its first chunks" in on_threads


def test_a_callable_whose_last_map_ended_on_processes_starts_there_without_a_faked_measurement():
    # Issue 33: the process route came from asking the table with a made-up
    # "holds" measurement; policy.alternatives() answers it, and the
    # decision quotes no GIL figure nobody measured.
    save_now(work, stored(gil=RELEASES, backend="fork", per_item_s=0.01))  # this process's
    try:
        with SmartExecutor() as ex:
            decision = ex.explain(work)
        assert decision.backend == "fork"
        text = str(decision)
        assert "its GIL figures alone would send it to threads" in text
        assert "held 100%" not in text and "off threads, where" not in text
        assert decision.gil == RELEASES
    finally:
        forget(work)


def _label(i):
    """Cheap, not arithmetic alone (a loop here is not proven safe): it starts on fork."""
    return "-".join(str(i))


@pytest.mark.timeout(60)
def test_a_map_that_ends_before_a_verdict_keeps_its_figures(profile_store):
    # 12 cheap items: under the CHEAP_ITEMS that settle without a GIL kind,
    # in chunks too short to watch the GIL. Such a map kept nothing, and its
    # next run started from nothing again.
    from smartexec import SmartExecutor

    with SmartExecutor(2) as ex:
        assert list(ex.map(_label, range(12))) == [_label(i) for i in range(12)]
        assert [d.backend for d in ex.decisions()] == ["fork", "fork"]  # no verdict
    new_process_view()  # read it back from the file
    kept = profiles.load(_label)
    assert kept is not None and kept.backend == "fork" and kept.items > 0
    assert kept.gil is None  # no GIL kind measured: the next run measures it again
