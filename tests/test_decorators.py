"""@parallel_map on module-level and nested functions."""

from __future__ import annotations

import threading

import pytest

from smartexec import parallel_map

pytestmark = pytest.mark.timeout(60)


@parallel_map
def double(x):
    return 2 * x


@parallel_map(max_workers=2, chunksize=3)
def checked(x):
    if x == 5:
        raise KeyError(x)
    return x


def test_bare_decorator_on_a_module_function():
    assert double(range(10)) == [2 * x for x in range(10)]
    assert double.__wrapped__(4) == 8
    assert double.__name__ == "double"


def test_first_failing_item_raises_as_a_loop_would():
    assert checked(range(5)) == list(range(5))
    with pytest.raises(KeyError):
        checked(range(10))


def test_nested_function_with_arguments():
    base = 10

    @parallel_map(backend="thread")
    def shifted(x):
        return x + base

    assert shifted([1, 2, 3]) == [11, 12, 13]


def test_accepts_any_iterable():
    assert double(x for x in [1, 2]) == [2, 4]


@parallel_map(max_workers=2, backend="thread")
def tripled(x):
    return 3 * x


def test_exposes_its_decisions_and_the_last_calls_stats():
    assert tripled.stats().backends == {} and tripled.decisions() == ()
    assert "no work run yet" in str(tripled.stats())
    before = tripled.explain()
    assert before.backend == "thread" and before.profile.name == "tripled"
    assert "pickle to" in str(tripled.explain(7))  # an example item's size

    assert tripled(range(50)) == [3 * x for x in range(50)]
    stats = tripled.stats()
    assert sum(s.items for s in stats.backends.values()) == 50
    assert tripled.decisions() == stats.decisions
    assert [d.backend for d in tripled.decisions()][-1] == "thread"
    assert all(d.profile.name == "tripled" for d in tripled.decisions())

    assert tripled(range(5)) == [0, 3, 6, 9, 12]
    assert sum(s.items for s in tripled.stats().backends.values()) == 5  # the last call only


def test_a_failed_call_still_reports():
    before = checked.stats()
    with pytest.raises(KeyError):
        checked(range(10))
    assert checked.stats() is not before
    assert checked.decisions()
    assert sum(s.items for s in checked.stats().backends.values()) >= 1


def test_a_positional_option_is_refused_when_decorating():
    # parallel_map(4) wrapped the int 4, and the first call failed deep in map
    # with "'function' object is not iterable".
    with pytest.raises(TypeError, match=r"keyword-only, e\.g\. @parallel_map\(max_workers=4\)"):
        parallel_map(4)


@pytest.mark.parametrize(
    ("options", "error", "said"),
    [
        ({"max_workers": 0}, ValueError, "max_workers must be greater than 0"),
        ({"max_threads": 0}, ValueError, "max_threads must be greater than 0"),
        ({"max_workers": True}, TypeError, "max_workers must be an int"),
        ({"chunksize": 0}, ValueError, "chunksize must be >= 1"),
        ({"max_processes": 2.5}, TypeError, "max_processes must be an int"),
        ({"chunksize": "100"}, TypeError, "chunksize must be an int"),
        ({"prefer": "gpu"}, ValueError, "prefer must be one of"),
        ({"backend": "forkk"}, ValueError, "did you mean 'fork'"),
    ],
)
def test_bad_options_are_refused_when_decorating(options, error, said):
    with pytest.raises(error, match=said):
        parallel_map(**options)


def test_the_limits_per_kind_of_pool_reach_the_executor():
    @parallel_map(max_threads=3, max_processes=1, backend="thread")
    def ident(x):
        return threading.get_ident()

    assert len(set(ident(range(50)))) <= 3
    width = ident.stats().backends["thread"].workers
    assert width == 3


class _Scaler:
    factor = 3

    @parallel_map
    def scale(self, x):
        return x * self.factor


def test_a_decorated_method_says_how_to_map_a_method():
    # A new user's: "Thing.method() takes 1 positional argument but 2 were given".
    with pytest.raises(
        TypeError, match=r"_Scaler.scale\(\) takes the one iterable.*ex.map\(obj.method"
    ):
        _Scaler().scale(range(5))
    with pytest.raises(TypeError, match="got 0 positional arguments"):
        _Scaler.scale()
