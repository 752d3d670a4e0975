"""The profile store can only make things faster (smartexec/_profiles.py, issue 32).

It trusts no file another user could have written, nothing it reads can hang
or exhaust a map, no error of its own reaches a map, and it removes only the
files it made. Every test points ``SMARTEXEC_CACHE_DIR`` at its own directory
(the ``profile_store`` fixture in conftest.py, or one made here).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time

import pytest

from smartexec import SmartExecutor
from smartexec import _profiles as profiles
from smartexec.gil import GilProfile

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or not hasattr(os, "mkfifo"), reason="POSIX only"
)

RELEASES = GilProfile("releases", items=12, wall_s=0.05, cpu_share=0.97, gil_share=0.02, samples=95)
OTHER_UID = 12345


def work(x):
    return sum(i * i for i in range(x))


def add_one(x):
    return x + 1


def stored(per_item_s=0.004):
    return profiles.StoredProfile(
        backend="thread",
        per_item_s=per_item_s,
        gil=RELEASES,
        send_s=0.0,
        items=200,
        saved_at=time.time(),
    )


def new_process_view():
    """Forget what this process read from the store, as a new process would have."""
    profiles.flush()
    profiles._RUN_ID = os.urandom(8).hex()
    with profiles._lock:
        profiles._view.clear()
        profiles._unwritable.clear()


def path_of(directory, fn):
    """Where the store keeps (or would keep) ``fn``'s profile."""
    return directory / profiles._file_name(profiles.profile_key(fn))


def plant(directory, fn=work):
    """A valid profile of ``fn`` in ``directory``, saying it computes without the GIL."""
    profiles.save(fn, stored())
    profiles.flush()
    new_process_view()
    path = path_of(directory, fn)
    assert path.is_file()
    return path


def from_earlier_run(fn=work):
    with SmartExecutor() as ex:
        return [r for r in ex.explain(fn).reasons if "earlier run" in r]


def map_add_one():
    """smartexec's public map on a module-level function: it must answer, right."""
    with SmartExecutor() as ex:
        assert list(ex.map(add_one, range(200))) == list(range(1, 201))


def warnings_of_the_store(caplog):
    return [
        r
        for r in caplog.records
        if r.name == "smartexec._profiles" and r.levelno >= logging.WARNING
    ]


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "smartexec", *args], capture_output=True, text=True, timeout=100
    )


# -- what sits at a profile's path ------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_fifo_at_a_profiles_path_is_ignored(profile_store):
    # Opening a FIFO for reading waits for a writer: map() hung for ever.
    path = path_of(profile_store, add_one)
    os.mkfifo(path)
    assert profiles.load(add_one) is None
    map_add_one()
    assert stat.S_ISFIFO(os.lstat(path).st_mode)  # not the store's: left as it is
    assert profiles.entry_count() == 0 and profiles.clear() == 0
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.mark.timeout(60)
def test_a_symlink_to_dev_zero_at_a_profiles_path_is_not_followed(profile_store):
    # Reading /dev/zero to its end raised MemoryError out of map().
    path = path_of(profile_store, add_one)
    path.symlink_to("/dev/zero")
    assert profiles.load(add_one) is None
    map_add_one()
    assert os.readlink(path) == "/dev/zero"
    assert profiles.entry_count() == 0 and profiles.clear() == 0
    assert os.readlink(path) == "/dev/zero"


def test_a_symlink_to_a_valid_profile_is_not_followed(profile_store, tmp_path):
    # A link can point anywhere, a file another user wrote included.
    path = plant(profile_store)
    elsewhere = tmp_path / "elsewhere.json"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert profiles.load(work) is None
    assert from_earlier_run() == []


def test_a_file_over_the_size_cap_is_ignored(profile_store):
    path = plant(profile_store)
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data) + " " * profiles.MAX_FILE_BYTES)  # valid JSON, too big
    assert profiles.load(work) is None
    assert from_earlier_run() == []


# -- whose files the store reads -------------------------------------------------------


@pytest.mark.parametrize("mode", [0o1777, 0o770, 0o702], ids=oct)
@pytest.mark.timeout(60)
def test_a_directory_others_can_write_is_not_used(profile_store, caplog, mode):
    # Anyone who can create files in it could plant a profile that routes our code.
    path = plant(profile_store)
    planted = path.read_bytes()
    os.chmod(profile_store, mode)
    with caplog.at_level(logging.DEBUG, logger="smartexec._profiles"):
        assert profiles.load(work) is None
        assert profiles.load(add_one) is None
        assert from_earlier_run() == []
        map_add_one()
        profiles.save(add_one, stored())
        profiles.flush()
        assert profiles.entry_count() == 0 and profiles.clear() == 0
    (warning,) = warnings_of_the_store(caplog)  # one per directory per process
    assert "writable by group or others" in warning.getMessage()
    assert str(profile_store) in warning.getMessage()
    assert sorted(p.name for p in profile_store.iterdir()) == [path.name]  # nothing saved
    assert path.read_bytes() == planted  # nor removed


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
@pytest.mark.timeout(60)
def test_a_directory_of_another_user_is_not_used(profile_store, caplog):
    # Root would read what another user planted there.
    plant(profile_store)
    os.chown(profile_store, OTHER_UID, -1)
    with caplog.at_level(logging.DEBUG, logger="smartexec._profiles"):
        assert profiles.load(work) is None
        assert from_earlier_run() == []
        map_add_one()
    (warning,) = warnings_of_the_store(caplog)
    assert f"owned by uid {OTHER_UID}" in warning.getMessage()
    assert profiles.refusal(profile_store).startswith(f"owned by uid {OTHER_UID}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
@pytest.mark.timeout(60)
def test_a_profile_file_of_another_user_is_ignored_and_left_alone(profile_store):
    path = plant(profile_store)
    os.chown(path, OTHER_UID, -1)
    planted = path.read_bytes()
    assert profiles.load(work) is None
    assert from_earlier_run() == []
    with SmartExecutor() as ex:
        assert list(ex.map(work, [50] * 100)) == [work(50)] * 100
    profiles.save(work, stored(per_item_s=0.5))
    profiles.flush()  # the slot holds a file the store did not make: not replaced
    assert path.stat().st_uid == OTHER_UID and path.read_bytes() == planted
    assert profiles.entry_count() == 0 and profiles.clear() == 0
    assert path.exists()


def test_a_profile_file_others_can_write_is_ignored(profile_store):
    path = plant(profile_store)
    os.chmod(path, 0o666)
    assert profiles.load(work) is None
    assert from_earlier_run() == []


def test_a_trusted_directory_is_used_and_not_warned_about(profile_store, caplog):
    with caplog.at_level(logging.DEBUG, logger="smartexec._profiles"):
        plant(profile_store)
        assert profiles.load(work) is not None
        assert len(from_earlier_run()) == 1
    assert warnings_of_the_store(caplog) == []
    assert profiles.refusal(profile_store) is None
    assert profiles.refusal(profile_store / "not-yet") is None  # made at the first save


# -- errors are notes ------------------------------------------------------------------


def unusable_directories(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {
        "a regular file": str(a_file),
        "under a regular file": str(a_file / "cache"),
        "an unknown user's home": "~no-such-user-of-smartexec/cache",
    }


@pytest.mark.parametrize(
    "which", ["a regular file", "under a regular file", "an unknown user's home"]
)
@pytest.mark.timeout(60)
def test_an_unusable_cache_dir_is_an_empty_store(tmp_path, monkeypatch, which):
    # "~no-such-user/..." raised RuntimeError (Path.expanduser) out of map().
    monkeypatch.setenv(profiles.CACHE_DIR_ENV, unusable_directories(tmp_path)[which])
    profiles.cache_dir()  # None or a path, never an exception
    assert profiles.load(add_one) is None
    profiles.save(add_one, stored())
    profiles.flush()
    assert profiles.entry_count() == 0 and profiles.clear() == 0
    map_add_one()
    assert (tmp_path / "a-file").read_text() == ""


@pytest.mark.timeout(60)
def test_any_error_of_the_store_is_a_note_not_an_exception(profile_store, monkeypatch, caplog):
    plant(profile_store)

    def broken(*args, **kwargs):
        raise MemoryError("as a huge or hostile file could cause")

    monkeypatch.setattr(profiles, "_parse", broken)
    with caplog.at_level(logging.DEBUG, logger="smartexec._profiles"):
        assert profiles.load(work) is None
        profiles.save(add_one, stored())
        profiles.flush()
        map_add_one()
    assert any("MemoryError" in r.getMessage() for r in caplog.records)


# -- the store removes only its own files ------------------------------------------------


def user_files(directory):
    """Files a user keeps beside the store, some named as the store names its own."""
    old = time.time() - profiles.MAX_AGE_S - 86400  # older than anything the store keeps
    files = {
        "ab" * 32 + ".json": '{"mine": "a user\'s JSON named like a profile"}',
        "cd" * 32 + ".json": "not JSON at all",
        ".tmp-foo": "a user's temporary file",
        ".tmp-abcd1234.json": '{"key": "not a profile key", "format": 1}',
        "notes.txt": "the user's",
    }
    for name, text in files.items():
        (directory / name).write_text(text)
        os.utime(directory / name, (old, old))
    return files


def the_stores_leftover(directory):
    """A temporary file of the store's, left by a writer that died long ago."""
    old = time.time() - 2 * 3600
    path = directory / ".tmp-smartexec-0123456789abcdef.json"
    path.write_text(json.dumps({"format": 1, "key": profiles.profile_key(work)}))
    os.utime(path, (old, old))
    return path


def assert_kept(directory, files):
    for name, text in files.items():
        assert (directory / name).read_text() == text, name


def test_clear_removes_only_the_stores_files(profile_store):
    files = user_files(profile_store)
    leftover = the_stores_leftover(profile_store)
    for fn in (work, add_one):
        profiles.save(fn, stored())
    profiles.flush()
    assert profiles.entry_count() == 2  # the user's look-alikes are not counted
    assert profiles.clear() == 2
    assert_kept(profile_store, files)
    assert sorted(p.name for p in profile_store.iterdir()) == sorted(files)
    assert not leftover.exists()


@pytest.mark.timeout(120)
def test_the_cli_clear_removes_only_the_stores_files(profile_store):
    files = user_files(profile_store)
    plant(profile_store)
    result = cli("cache")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{profile_store}: 1 profile of measured callables"
    result = cli("cache", "--clear")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"removed 1 profile from {profile_store}"
    assert_kept(profile_store, files)
    assert sorted(p.name for p in profile_store.iterdir()) == sorted(files)


def test_pruning_removes_only_the_stores_files(profile_store, monkeypatch):
    monkeypatch.setattr(profiles, "MAX_ENTRIES", 2)
    files = user_files(profile_store)  # expired by age, and the oldest
    fns = [eval(f"lambda x: x + {i}") for i in range(4)]  # four keys: the code differs
    for i, fn in enumerate(fns):
        profiles.save(fn, stored())
        profiles.flush()
        path = path_of(profile_store, fn)
        os.utime(path, (1e9, time.time() - 1000 + i))  # oldest first
    assert_kept(profile_store, files)
    assert profiles.entry_count() == 2
    new_process_view()
    assert [profiles.load(fn) is not None for fn in fns] == [False, False, True, True]


def test_a_live_writers_temporary_file_stays(profile_store):
    live = profile_store / ".tmp-smartexec-fedcba9876543210.json"
    live.write_text("{")  # being written now
    profiles.save(work, stored())
    profiles.flush()
    assert profiles.clear() == 1
    assert live.exists()


# -- the command line ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_cli_says_why_it_does_not_use_a_directory(profile_store, monkeypatch):
    path = plant(profile_store)
    os.chmod(profile_store, 0o777)
    result = cli("cache")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{profile_store}: not used (writable by group or others")
    result = cli("cache", "--clear")
    assert result.returncode == 1
    assert "not used" in result.stderr and "Traceback" not in result.stderr
    assert path.exists()
    monkeypatch.setenv(profiles.CACHE_DIR_ENV, "~no-such-user-of-smartexec/cache")
    result = cli("cache")
    assert result.returncode == 0, result.stderr
    assert "is no usable path" in result.stdout and "Traceback" not in result.stderr


STARTS_WHERE = """
import os
from smartexec import SmartExecutor

def pid_or_double(x):
    return os.getpid() if x < 0 else x * 2

items = {items}
with SmartExecutor(max_workers=2) as ex:
    out = list(ex.map(pid_or_double, items))
    print("ENDED", ex.decisions()[-1].backend)
    print("FIRST-HERE", out[0] == os.getpid())
"""


@pytest.mark.timeout(180)
def test_where_an_item_runs_first_does_not_depend_on_what_an_earlier_run_stored(tmp_path):
    # Issue 32: a stored "it ended in a loop here" made the next run start in
    # the caller's thread, where a crashing first item kills the program; the
    # first run (empty store) had crashed a worker instead. Now both runs
    # start in the workers, and the second re-earns the loop from its own
    # first chunks.
    from ._children import run_python

    env_line = f"import os; os.environ['SMARTEXEC_CACHE_DIR'] = {str(tmp_path)!r}\n"
    cheap = list(range(20_000))
    first = run_python(env_line + STARTS_WHERE.format(items=cheap), timeout=120)
    assert first.returncode == 0, first.stderr
    assert "ENDED inline" in first.stdout or "ENDED thread" in first.stdout, first.stdout
    assert list(tmp_path.glob("*.json")), "the first run stored its profile"
    second = run_python(env_line + STARTS_WHERE.format(items=[-1] + cheap), timeout=120)
    assert second.returncode == 0, second.stderr
    assert "FIRST-HERE False" in second.stdout, second.stdout
