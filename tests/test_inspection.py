"""One small test per callable kind, and the payload sizer's tricky cases."""

from __future__ import annotations

import functools
import hashlib
import socket
import threading
import time
import tracemalloc
import zlib

import numpy as np
import pytest

from smartexec import SmartExecutor
from smartexec.inspection import (
    inspect_callable,
    locate_unpicklable,
    payload_size,
    pickles_by_reference,
)


def module_function(x):
    return x


class Holder:
    def __init__(self, nbytes=0):
        self.data = np.zeros(nbytes // 8)

    def method(self, x):
        return x

    def __call__(self, x):
        return x

    @classmethod
    def make(cls):
        return cls()


def test_importable_function():
    p = inspect_callable(module_function)
    assert (p.kind, p.by_reference, p.state_bytes) == ("function", True, 0)


def test_builtin():
    p = inspect_callable(len)
    assert (p.kind, p.by_reference) == ("builtin", True)


@pytest.mark.parametrize("fn", [time.sleep, hashlib.sha256, zlib.compress])
def test_known_gil_releasing_builtins_carry_a_hint(fn):
    assert inspect_callable(fn).gil_hint


def test_ufunc():
    p = inspect_callable(np.add)
    assert (p.kind, p.by_reference) == ("ufunc", True)
    assert p.gil_hint


def test_class():
    assert inspect_callable(Holder).kind == "class"


def test_bound_method_sizes_its_instance():
    p = inspect_callable(Holder(4 << 20).method)
    assert p.kind == "bound_method"
    assert p.by_reference  # the code pickles by reference, the instance by value
    assert p.state_bytes >= 4 << 20
    assert "Holder" in p.state_holder


def test_classmethod_has_no_state():
    p = inspect_callable(Holder.make)
    assert (p.kind, p.state_bytes) == ("bound_method", 0)


def test_builtin_method_bound_to_an_array():
    p = inspect_callable(np.zeros(1 << 18).sum)
    assert p.kind == "bound_method"
    assert p.state_bytes >= 2 << 20


def test_callable_instance():
    p = inspect_callable(Holder(2 << 20))
    assert p.kind == "callable_instance"
    assert p.state_bytes >= 2 << 20


def test_partial_counts_its_arguments():
    p = inspect_callable(functools.partial(module_function, np.zeros(1 << 18)))
    assert p.kind == "partial"
    assert p.by_reference
    assert p.state_bytes >= 2 << 20


def test_lambda():
    p = inspect_callable(lambda x: x)
    assert (p.kind, p.by_reference) == ("lambda", False)


def test_closure_names_its_cells():
    table = np.zeros(10)

    def lookup(i):
        return table[i]

    p = inspect_callable(lookup)
    assert (p.kind, p.by_reference) == ("closure", False)
    assert "'table'" in p.state_holder


def test_nested_function_without_cells():
    def nested(x):
        return x

    assert inspect_callable(nested).kind == "nested"


def test_function_replaced_by_a_decorator_is_not_importable():
    # pickle would look the name up and find the wrapper, not this function
    def original(x):
        return x

    original.__module__ = __name__
    original.__qualname__ = "module_function"  # the name resolves to another object
    assert not pickles_by_reference(original)


def test_not_callable_is_a_clear_type_error():
    with pytest.raises(TypeError, match="not callable.*submit\\(work, item\\)"):
        inspect_callable(42)


def test_numpy_buffers_are_counted_without_copying():
    array = np.ones(50_000_000 // 8)  # 50 MB
    tracemalloc.start()
    try:
        size = payload_size({"a": array, "b": [1, 2, 3]})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size.nbytes >= array.nbytes and not size.capped
    assert peak < 1_000_000, f"sizing allocated {peak} bytes"


def test_non_contiguous_arrays_are_counted_without_copying():
    array = np.ones((4000, 4000))[:, ::2]  # 64 MB view, not contiguous
    tracemalloc.start()
    try:
        size = payload_size(array, cap_bytes=1 << 40)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size.nbytes >= array.nbytes
    assert peak < 1_000_000


def test_sizing_stops_at_the_cap():
    size = payload_size(list(range(2_000_000)), cap_bytes=100_000)
    assert size.capped and 100_000 < size.nbytes < 300_000


class _Counted:
    """Counts how many of its kind a pickler visited."""

    reduced = 0

    def __reduce__(self):
        _Counted.reduced += 1
        return (_Counted, ())


class ManyObjects:
    def __init__(self, n):
        self.parts = [_Counted() for _ in range(n)]

    def count(self, i):
        return len(self.parts) + i


def test_routing_sizes_a_state_only_as_far_as_the_decision_needs():
    # Issue 34: a dict of 1.5 M entries was pickled to its end (0.84 s) to
    # learn that it is over big_state_bytes.
    obj = ManyObjects(200_000)
    _Counted.reduced = 0
    with SmartExecutor(big_state_bytes=32 << 10) as ex:
        decision = ex.explain(obj.count)
    assert decision.share and "holds >" in str(decision)  # a lower bound, honestly
    assert 0 < _Counted.reduced < 50_000  # stopped past 32 KiB (a 64 KiB frame), not at the end


def test_unpicklable_state_is_reported_not_raised():
    lock = threading.Lock()

    def holds_lock():
        return lock

    p = inspect_callable(holds_lock)
    assert p.state.error is not None and "lock" in p.state.error


def test_locate_names_the_cell_holding_a_socket():
    conn = socket.socket()
    try:

        def score(x):
            return conn.fileno() + x

        where, part, reason = locate_unpicklable(score, "score()")
        assert where == "score(), cell 'conn'"
        assert part is conn
        assert "socket" in reason
    finally:
        conn.close()


def test_locate_descends_into_attributes():
    holder = Holder()
    holder.lock = threading.Lock()
    where, part, _ = locate_unpicklable(holder.method, "m")
    assert where == "m, __self__, attribute 'lock'"
    assert part is holder.lock


def test_locate_returns_none_for_picklable_objects():
    assert locate_unpicklable([1, "a", np.zeros(3)], "x") is None


def test_a_callable_object_that_is_a_module_global_pickles_by_reference():
    # np.sort is an _ArrayFunctionDispatcher instance, importable as numpy.sort
    import pickle

    import numpy as np

    profile = inspect_callable(np.sort)
    assert profile.by_reference and profile.kind == "function", profile
    assert pickle.loads(pickle.dumps(np.sort)) is np.sort


class _DictBacked:
    """A config object whose __getattr__ raises KeyError for unknown names."""

    def __init__(self, **settings):
        self.__dict__["_settings"] = settings

    def __getattr__(self, name):
        return self.__dict__["_settings"][name]

    def __call__(self, x):
        return x * self.scale


def test_a_getattr_that_raises_keyerror_does_not_stop_routing():
    # ThreadPoolExecutor runs such a callable; looking up its __qualname__
    # (KeyError, not AttributeError) must not fail explain() or submit().
    from smartexec import SmartExecutor
    from smartexec.inspection import callable_name

    fn = _DictBacked(scale=3)
    assert callable_name(fn) == "_DictBacked instance"
    with SmartExecutor(prefer="threads") as ex:
        # Threads; on Python 3.10 fork workers reach it by copy-on-write
        # (there pickling it fails too: KeyError '__getstate__').
        assert ex.explain(fn).backend in ("thread", "fork")
        assert ex.submit(fn, 2).result(timeout=30) == 6
        assert list(ex.map(fn, [1, 2])) == [3, 6]
