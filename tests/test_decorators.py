"""@parallel_map on module-level and nested functions."""

from __future__ import annotations

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
