"""Weak handles to callables: they never keep the user's object alive, and die quietly."""

from __future__ import annotations

import gc
import weakref

import pytest

from smartexec._identity import WeakCallable, WeakRecords, identity_key

from ._children import run_python

pytestmark = pytest.mark.timeout(60)


class Model:
    def predict(self, x):
        return x + 1


def test_a_bound_method_is_rebuilt_while_its_object_lives_and_reported_dead_once():
    model = Model()
    deaths = []
    handle = WeakCallable(model.predict, lambda: deaths.append(1))
    assert handle.weak
    assert handle.get()(1) == 2
    assert handle.matches(model.predict) and identity_key(handle.get()) == identity_key(
        model.predict
    )
    assert not handle.matches(Model().predict)  # another object's method
    del model
    gc.collect()
    assert handle.get() is None and not handle.matches(Model().predict)
    assert deaths == [1]


def test_a_method_whose_function_dies_first_is_reported_dead_once():
    class Local:
        pass

    def method(self):
        return 7

    obj = Local()
    deaths = []
    handle = WeakCallable(method.__get__(obj), lambda: deaths.append(1))
    assert handle.get()() == 7
    del method
    gc.collect()
    assert handle.get() is None
    del obj
    gc.collect()
    assert deaths == [1]  # the object's death later calls nothing again


def test_a_method_of_an_object_without_weak_references_is_held_strongly():
    class Slotted:
        __slots__ = ()

        def f(self):
            return 3

    handle = WeakCallable(Slotted().f)
    assert not handle.weak and handle.get()() == 3


def test_a_script_that_mapped_a_big_objects_method_exits_without_a_traceback():
    # weakref.WeakMethod's callbacks printed "Exception ignored in:
    # <function WeakMethod.__new__.<locals>._cb ...>" at the exit of every
    # such script (a new user's first try).
    result = run_python(
        """
import numpy as np
from smartexec import SmartExecutor

class Big:
    def __init__(self):
        self.a = np.zeros(2_000_000)

    def f(self, i):
        return i + 1

b = Big()
with SmartExecutor(2) as ex:
    print(list(ex.map(b.f, range(5))), ex.submit(b.f, 1).result())
""",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[1, 2, 3, 4, 5] 2"
    assert "Exception ignored" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


class _Rec:
    handle = None


def test_weak_records_keep_a_record_while_its_callable_lives_and_never_keep_it_alive():
    records = WeakRecords()

    def fn():
        return 1

    first = _Rec()
    assert records.keep(fn, first) and records.find(fn) is first
    ref = weakref.ref(fn)
    del fn
    gc.collect()
    assert ref() is None and not records  # it went with its callable

    class Holder:
        def method(self):
            return 2

    a, b = Holder(), Holder()
    records.keep(a.method, _Rec())
    assert records.find(b.method) is None  # another object's method: not its record
    assert not records.keep([].append, _Rec()) and len(records) == 1  # held strongly: not kept
