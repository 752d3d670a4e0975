"""smartexec.gil: the classification table, the sampler, the per-callable memory."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from smartexec import gil
from smartexec.gil import CPU_SHARE_WAITS, GIL_SHARE_HOLDS, GilSampler, classify

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("cpu", "held", "kind"),
    [
        (0.0, 0.0, "waits"),
        (CPU_SHARE_WAITS - 0.01, 0.9, "waits"),  # mostly off the CPU: threads overlap it
        (1.0, 0.0, "releases"),
        (1.0, GIL_SHARE_HOLDS - 0.01, "releases"),
        (1.0, GIL_SHARE_HOLDS, "holds"),
        (CPU_SHARE_WAITS, 1.0, "holds"),
    ],
)
def test_classify(cpu, held, kind):
    assert classify(cpu, held) == kind


def _watch(work, seconds=0.06):
    sampler = GilSampler()
    sampler.start()
    items = 0
    while sampler.elapsed_s() < seconds:
        work()
        items += 1
    sampler.items = items
    return sampler.stop()


def _spin():
    total = 0
    for i in range(20_000):
        total += i
    return total


def test_sampler_sees_a_python_loop_hold_the_gil():
    profile = _watch(_spin)
    assert profile.kind == "holds", profile
    assert profile.samples > 0 and profile.items > 0


def test_sampler_sees_a_sleep_wait():
    profile = _watch(lambda: time.sleep(0.005))
    assert profile.kind == "waits", profile


def test_sampler_sees_zlib_release_the_gil():
    import zlib

    data = bytes(range(256)) * (1 << 13)
    profile = _watch(lambda: zlib.compress(data))
    assert profile.kind == "releases", profile


def test_stop_is_idempotent_and_joins_the_thread():
    sampler = GilSampler()
    sampler.start()
    first = sampler.stop()
    assert sampler.stop() is first
    assert not [t for t in threading.enumerate() if t.name == "smartexec-gil"]


class Model:
    def predict(self, x):
        return x


def test_measurements_are_kept_weakly_and_can_be_forgotten():
    profile = gil.GilProfile("waits", 1, 0.05, 0.0, 0.0, 10)
    model = Model()
    gil.remember(model.predict, profile)
    assert gil.recall(model.predict) is profile  # a new bound method, same object
    assert gil.recall(Model().predict) is None
    gil.forget(model.predict)
    assert gil.recall(model.predict) is None

    gil.remember(model.predict, profile)
    del model
    gc.collect()
    assert not [k for k in gil._measured if k[0] == "m"]


def test_a_callable_without_weak_references_is_not_kept():
    profile = gil.GilProfile("waits", 1, 0.05, 0.0, 0.0, 10)
    items = []
    gil.remember(items.append, profile)  # a list's method: cannot be held weakly
    assert gil.recall(items.append) is None


def test_str_states_the_figures_and_the_meaning():
    text = str(gil.GilProfile("holds", 4, 0.056, 0.99, 0.87, 11))
    assert text.startswith("measured over 4 items (56 ms)")
    assert "holding the GIL 87%" in text and "threads would take turns" in text
