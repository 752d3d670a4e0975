"""The dask backend on real clusters of 2 worker processes.

Most tests share one module-scoped LocalCluster that the tests start (so the
executors under test *connect* to it); the tests of an executor that owns its
cluster start their own. Skipped when dask is not installed.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import itertools
import logging
import os
import time

import pytest

distributed = pytest.importorskip(
    "distributed", reason="the dask backend needs smartexec[dask]: pip install 'smartexec[dask]'"
)
import dask  # noqa: E402

from smartexec import SmartExecutor  # noqa: E402
from smartexec.backends import dask as dask_backend  # noqa: E402
from smartexec.errors import RemoteTraceback  # noqa: E402

from ._counting import Blob, Model, lookup, unpickled  # noqa: E402
from .test_conformance import BackendConformance, fail_on_three, square  # noqa: E402

pytestmark = pytest.mark.timeout(60)

CLUSTER_OPTIONS = {
    "n_workers": 2,
    "threads_per_worker": 1,
    "processes": True,
    "memory_limit": "1GiB",
    "dashboard_address": None,
    "silence_logs": logging.ERROR,
}

#: What docs/distributed.md asks of a scheduler that smartexec broadcasts to.
NO_REDUCE_REPLICAS = {"distributed.scheduler.active-memory-manager.policies": []}


def _alive(pids) -> set[int]:
    return {pid for pid in pids if os.path.exists(f"/proc/{pid}")}


def _wait_until_gone(pids, deadline_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + deadline_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster the tests own; executors under test only connect to it."""
    with dask.config.set(NO_REDUCE_REPLICAS):
        local = distributed.LocalCluster(**CLUSTER_OPTIONS)
    client = distributed.Client(local, set_as_default=False)
    pids = set(client.run(os.getpid).values())
    yield local, client
    client.close()
    local.close()
    assert not _wait_until_gone(pids), "the test cluster's workers outlived it"


@pytest.fixture
def address(cluster):
    return cluster[0].scheduler_address


@pytest.fixture
def client(cluster):
    """The tests' own client: to look at the cluster from outside the executor."""
    return cluster[1]


@pytest.fixture
def ex(address):
    executor = SmartExecutor(2, backend="dask", address=address)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


class TestDaskConformance(BackendConformance):
    backend = "dask"

    @pytest.fixture
    def backend_options(self, address):
        return {"address": address}


# -- results ------------------------------------------------------------------


@pytest.mark.parametrize("chunksize", [None, 1, 7])
def test_map_equals_a_serial_loop(ex, chunksize):
    items = list(range(100))
    assert list(ex.map(square, items, chunksize=chunksize)) == [square(i) for i in items]


def test_submit_equals_a_serial_loop(ex):
    futures = [ex.submit(divmod, i, 7) for i in range(30)]
    assert all(isinstance(f, cf.Future) for f in futures)
    assert [f.result(timeout=30) for f in futures] == [divmod(i, 7) for i in range(30)]


def test_map_streams_an_endless_generator(ex):
    results = ex.map(square, itertools.count())
    assert [next(results) for _ in range(50)] == [square(i) for i in range(50)]
    results.close()


# -- big objects travel once per worker ------------------------------------------------


def test_big_bound_object_reaches_each_worker_once(ex, client):
    model = Model(100 << 20)
    items = list(range(40))

    assert list(ex.map(model.score, items)) == [model.score(i) for i in items]
    assert list(ex.map(model.score, items, chunksize=3)) == [model.score(i) for i in items]
    assert ex.submit(model.score, 5).result(timeout=30) == model.score(5)

    # One transfer (one unpickling) per worker, for 2 maps over 40 items and a submit.
    assert sorted(client.run(unpickled, model.token).values()) == [1, 1]
    notes = "\n".join(ex.explain(model.score).reasons)
    assert "already on every worker" in notes

    # Held weakly: once the object dies, the cluster lets go of its copy.
    scattered = ex._backends["dask"]._callables  # noqa: SLF001 - the one way to see the key
    [kept] = [k for k in scattered.values() if k.future is not None]
    key = kept.future.key
    del model, kept, scattered
    gc.collect()
    deadline = time.monotonic() + 20
    while key in client.who_has() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert key not in client.who_has()


def test_without_scattering_the_object_travels_with_every_chunk(ex, client, monkeypatch):
    # The control for the test above: the counter does count transfers.
    monkeypatch.setattr(dask_backend, "SCATTER_BYTES", 1 << 40)
    model = Model(1 << 20)
    assert list(ex.map(model.score, range(12), chunksize=2)) == [model.score(i) for i in range(12)]
    assert sum(client.run(unpickled, model.token).values()) == 6


def test_repeated_big_argument_is_sent_about_once_per_worker(ex, client):
    blob = Blob(16 << 20)
    items = list(range(20))
    results = ex.map(lookup, itertools.repeat(blob), items, chunksize=2)
    assert list(results) == [lookup(blob, i) for i in items]
    # First sighting: to one worker, for that chunk only (Dask may copy it to
    # the other); from the second on: broadcast once. Not once per chunk (10).
    counts = client.run(unpickled, blob.token)
    assert sum(counts.values()) <= 2 + len(counts)


def test_one_off_big_arguments_are_not_pinned_on_the_cluster(ex, client, recwarn):
    before = set(client.who_has())
    blobs = [Blob(12 << 20) for _ in range(4)]
    assert list(ex.map(lookup, blobs, range(4))) == [lookup(b, i) for i, b in enumerate(blobs)]
    # Scattered, never inlined in a task: Dask's "large graph" warning stays quiet.
    assert not [w for w in recwarn if "large graph" in str(w.message)]
    deadline = time.monotonic() + 20
    while set(client.who_has()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(client.who_has()) - before  # while the blobs themselves live on
    assert all(sum(client.run(unpickled, b.token).values()) >= 1 for b in blobs)


def test_refresh_sends_the_new_state(ex):
    model = Model(8 << 20)
    before = ex.submit(model.score, 1).result(timeout=30)
    model.values += 1000
    assert ex.submit(model.score, 1).result(timeout=30) == before  # workers keep the copy
    assert ex.refresh(model.score)
    assert ex.submit(model.score, 1).result(timeout=30) == before + 1000


# -- errors -------------------------------------------------------------------


def test_exception_reaches_the_caller_with_the_worker_traceback(ex):
    error = ex.submit(fail_on_three, 3).exception(timeout=30)
    assert isinstance(error, ValueError) and str(error) == "bad item 3"
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "in fail_on_three" in error.__cause__.tb
    assert 'raise ValueError(f"bad item {x}")' in error.__cause__.tb

    results = ex.map(fail_on_three, range(6), chunksize=6)
    assert [next(results) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3") as info:
        next(results)
    assert "in fail_on_three" in str(info.value.__cause__)


def test_bad_options_name_the_problem(address):
    with pytest.raises(
        TypeError, match=r"'thread' got unexpected option\(s\) address=.*no options"
    ):
        SmartExecutor(backend="thread", address=address)
    with pytest.raises(TypeError, match='address= is an option of backend="dask"'):
        SmartExecutor(address=address)
    with pytest.raises(TypeError, match="did you mean address="):
        SmartExecutor(backend="dask", adress=address)
    with pytest.raises(TypeError, match="address must be a scheduler address"):
        SmartExecutor(backend="dask", address=8786)
    with pytest.raises(ValueError, match="cluster_options apply only to the LocalCluster"):
        SmartExecutor(backend="dask", address=address, cluster_options={"n_workers": 1})


@pytest.mark.timeout(30)
def test_unreachable_scheduler_fails_the_constructor():
    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler") as info:
        SmartExecutor(backend="dask", address="tcp://127.0.0.1:1", connect_timeout_s=1)
    assert "dask scheduler" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


# -- which cluster, and who closes it -----------------------------------------------


def test_explain_names_the_cluster_and_why(ex, address):
    reasons = ex.explain(square).reasons
    assert reasons[0] == "backend='dask' was given"
    assert any(address in r and "2 workers" in r and "did not start" in r for r in reasons)


def test_the_policy_never_picks_dask():
    # Installed and registered, but only ever used when named.
    def closure(x):
        return x + len(items)

    items = [1]
    model = Model(8 << 20)
    with SmartExecutor(2) as ex:
        for fn in (square, closure, lambda x: x, model.score, print):
            assert ex.explain(fn).backend != "dask"


@pytest.mark.parametrize("as_object", [False, True], ids=["address", "cluster object"])
def test_shutdown_leaves_a_cluster_it_did_not_start_running(address, client, cluster, as_object):
    target = cluster[0] if as_object else address
    with SmartExecutor(2, backend="dask", address=target) as ex:
        assert ex.submit(square, 4).result(timeout=30) == 16
        assert "did not start" in "\n".join(ex.explain(square).reasons)
    assert cluster[0].status.name == "running"
    assert len(client.nthreads()) == 2
    assert client.submit(square, 5).result(timeout=30) == 25


@pytest.mark.timeout(90)
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")  # the module's cluster has it
def test_shutdown_closes_the_cluster_it_started():
    options = {k: v for k, v in CLUSTER_OPTIONS.items() if k != "n_workers"}
    ex = SmartExecutor(2, backend="dask", cluster_options=options)
    try:
        reasons = "\n".join(ex.explain(square).reasons)
        assert "2 workers" in reasons and "a LocalCluster this executor started" in reasons
        assert list(ex.map(square, range(10))) == [square(i) for i in range(10)]
        backend = ex._backends["dask"]  # noqa: SLF001
        address = backend.address
        pids = set(backend._client.run(os.getpid).values())  # noqa: SLF001
        # Broadcast copies must survive between maps: the scheduler it starts
        # has no ReduceReplicas policy.
        policies = backend._client.run_on_scheduler(  # noqa: SLF001
            lambda dask_scheduler: [
                type(p).__name__ for p in dask_scheduler.extensions["amm"].policies
            ]
        )
        assert "ReduceReplicas" not in policies
    finally:
        ex.shutdown(wait=True)
    assert not _alive(pids), "shutdown(wait=True) returned before the workers were gone"
    with pytest.raises(OSError):
        distributed.Client(address, timeout=1, set_as_default=False)
