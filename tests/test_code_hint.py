"""What a function's bytecode says about its GIL use (pure: nothing runs)."""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import hashlib
import math
import os
import signal
import sys
import time
import types
import urllib.request
import zlib
from time import sleep

import pytest

from smartexec._code_hint import MAX_CODE_BYTES, arithmetic_only, code_hint, small_numbers
from smartexec.effects import effects_of
from smartexec.inspection import inspect_callable


def waits(i):
    time.sleep(0.01)
    return i


def waits_imported_name(i):
    sleep(0.01)


def digests(data):
    return hashlib.sha256(data).hexdigest()


def compresses(data):
    return zlib.compress(data)


def fetches(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return len(response.read())


def waits_in_a_with_block(path):
    with open(path) as f:
        time.sleep(0.01)
        return f.name


def waits_then_returns(path):
    with open(path) as f:
        time.sleep(0.01)
    return f.name


def waits_after_a_try(x):
    try:
        y = abs(x)
    except TypeError:
        y = 0
    time.sleep(0.01)
    return y


def hashes_a_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def sleeps_on_error(x):
    try:
        return arithmetic(x)
    except ValueError:
        time.sleep(1)  # a back-off on the rare path


def sleeps_sometimes(x):
    if x < 0:
        time.sleep(1)  # a rare back-off beside the real work
    return arithmetic(x)


def looping(n):
    for _ in range(n):
        time.sleep(0)


def while_looping(n):
    while n:
        n -= 1
    time.sleep(0)


def comprehension(items):
    return [time.sleep(0) for _ in items]


def with_inner(i):
    def inner():
        return i

    time.sleep(0)
    return inner


def generator(i):
    time.sleep(0)
    yield i


def arithmetic(x):
    return x * x


def scalar_math(x):
    return math.sqrt(x)


def crashes(delay):
    time.sleep(delay)
    faulthandler._sigsegv()


def exits(delay):
    time.sleep(delay)
    os._exit(1)


def kills(pid, delay):
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)


def raw_memory(delay):
    time.sleep(delay)
    return ctypes.string_at(0)


def system_exit(delay):
    time.sleep(delay)
    sys.exit(3)


def unknown_global(i):
    time.sleep(0)
    return not_defined_anywhere(i)  # noqa: F821


@pytest.mark.parametrize(
    "fn, names",
    [
        (waits, "time.sleep"),
        (waits_imported_name, "sleep"),
        (digests, "hashlib.sha256"),
        (compresses, "zlib.compress"),
        (lambda i: time.sleep(i), "time.sleep"),
        (fetches, "urllib.request.urlopen"),
        (waits_in_a_with_block, "time.sleep"),
        (waits_then_returns, "time.sleep"),
        (waits_after_a_try, "time.sleep"),
    ],
)
def test_loop_free_code_that_calls_a_gil_releasing_function_gets_a_hint(fn, names):
    hint = code_hint(fn)
    assert hint is not None and hint.startswith(f"its code calls {names}, with no loop or branch")


def test_numpy_calls_give_a_hint_and_numpy_types_do_not():
    np = pytest.importorskip("numpy")

    def einsum(a):
        return np.einsum("i,i->", a, a)

    def scalar(x):
        return np.float64(x)

    assert "np.einsum" in code_hint(einsum)
    assert code_hint(scalar) is None


@pytest.mark.parametrize(
    "fn",
    [
        looping,
        while_looping,
        comprehension,
        with_inner,
        generator,
        arithmetic,
        scalar_math,
        sleeps_sometimes,
        sleeps_on_error,
        hashes_a_file,  # in a with block only a waiting call hints: small files hold the GIL
    ],
)
def test_loops_branches_nested_code_and_plain_work_give_no_hint(fn):
    assert code_hint(fn) is None


@pytest.mark.parametrize("fn", [crashes, exits, kills, raw_memory, system_exit])
def test_code_that_acts_on_the_whole_process_never_runs_on_threads(fn):
    # On a thread it would crash, end or signal this process: its effects
    # keep it off threads, whatever the hint says of its time.
    assert not effects_of(fn).allows("thread")
    assert _route(fn) != "thread"


def calls_a_helper(n):
    time.sleep(0)
    return arithmetic(n)


class Record:
    def __init__(self, x):
        self.x = x


def builds_a_record(x):
    time.sleep(0)
    return Record(x)


def converts(x):
    time.sleep(0)
    return float(x)


class Model:
    def predict(self, x):
        return x


MODEL = Model()


def calls_a_method_of_a_global(x):
    time.sleep(0)
    return MODEL.predict(x)


@pytest.mark.parametrize(
    "fn", [calls_a_helper, builds_a_record, unknown_global, calls_a_method_of_a_global]
)
def test_code_that_runs_python_of_its_own_gets_no_hint(fn):
    # A helper's time may go anywhere: python_loop(n) + np.sort(a)[0] holds
    # the GIL half the time; a global not defined yet could be anything.
    assert code_hint(fn) is None


def test_builtin_types_and_functions_beside_the_call_keep_the_hint():
    assert code_hint(converts) is not None


def test_only_plain_python_functions_are_read():
    assert code_hint(time.sleep) is None  # a builtin: inspection's own table covers it
    assert code_hint(int) is None
    assert code_hint(object()) is None


def test_long_code_is_not_read():
    body = "\n".join(f"    x{i} = x + {i}" for i in range(MAX_CODE_BYTES // 4))
    namespace = {"time": time}
    exec(f"def long(x):\n    time.sleep(0)\n{body}\n", namespace)
    assert code_hint(namespace["long"]) is None


def test_inspection_carries_the_hint_for_functions_methods_and_partials():
    import functools

    class Holder:
        def wait(self, i):
            time.sleep(i)

    assert inspect_callable(waits).code_hint is not None
    assert inspect_callable(Holder().wait).code_hint is not None
    assert inspect_callable(functools.partial(waits, 1)).code_hint is not None
    assert inspect_callable(looping).code_hint is None


def _polynomial(x, y):
    z = x * 3 + y
    return z - 1, x < y


def _power(x):
    return x**2


def _shift(x):
    return 1 << x


def _absolute(x):
    return abs(x)


def _branch(x):
    return x if x > 0 else -x


def _attribute(x):
    return x.real


def _global_constant(x):
    return math.pi * x


@pytest.mark.parametrize(
    "fn, cheap",
    [
        (arithmetic, True),
        (_polynomial, True),
        (lambda x: x + 1, True),
        (_power, False),  # 2 ** n builds an n-bit number
        (_shift, False),
        (_absolute, False),  # a call
        (_branch, False),
        (_attribute, False),
        (_global_constant, False),
        (waits, False),
        (abs, False),
    ],
)
def test_which_code_only_does_arithmetic(fn, cheap):
    assert arithmetic_only(fn) is cheap


def test_which_inputs_are_small_numbers():
    assert small_numbers(([1, 2],))
    assert small_numbers((range(10), (1.5,)))
    assert small_numbers(([True], [1j]))
    assert not small_numbers(([2**63],))
    assert not small_numbers((["a"],))
    assert not small_numbers(([1], ["a"]))
    assert not small_numbers((iter([1]),))
    assert not small_numbers(([],))
    assert not small_numbers(())

    class Number(int):
        pass

    assert not small_numbers(([Number(1)],))  # its * may be the user's own


def test_operator_functions_get_a_hint_but_pow_and_lshift_do_not():
    import operator

    from smartexec._code_hint import operator_hint

    assert operator_hint(operator.add).startswith("operator.add does one operation")
    assert operator_hint(operator.not_) is not None
    assert operator_hint(operator.pow) is None  # 2 ** n: far bigger than its arguments
    assert operator_hint(operator.lshift) is None
    assert operator_hint(pow) is None and operator_hint(abs) is None
    assert operator_hint(arithmetic) is None
    assert inspect_callable(operator.add).code_hint == operator_hint(operator.add)


# -- what an adversarial review found ------------------------------------------------


class _Hostile:
    def __rmul__(self, other):
        return ("ran", other)

    __mul__ = __rmul__


def _with_default(x, m=_Hostile()):  # noqa: B008 - the point of the test
    return x * m


def _string_times(n):
    return b"\0" * n


def _squarings(x):
    x = x * x
    x = x * x
    x = x * x
    x = x * x
    x = x * x
    return x


def test_defaults_constants_and_long_multiplications_are_not_arithmetic_only():
    assert not arithmetic_only(_with_default)  # a default may bring its own __mul__
    assert not arithmetic_only(_string_times)  # b"\0" * n builds n bytes
    assert not arithmetic_only(_squarings)  # 1.6 s for one item at 23 squarings


def test_a_user_number_anywhere_in_the_input_is_not_small_numbers():
    class Weird(int):
        pass

    assert not small_numbers(([1, 2, Weird(3)],))
    assert not small_numbers(((1.0, _Hostile()),))
    assert small_numbers(([1, 2.5, True, 3j],))


_stop_now = functools.partial(os._exit, 3)
_cached_helper = functools.lru_cache(maxsize=0)(arithmetic)


def _through_a_partial(x):
    time.sleep(0)
    _stop_now()


def _through_exec(x):
    time.sleep(x)
    exec("import os")


def _through_a_cached_helper(x):
    time.sleep(0)
    return _cached_helper(x)


def _strided(n):
    return as_strided(n, shape=(n,), strides=(8,))


try:
    from numpy.lib.stride_tricks import as_strided
except ImportError:  # pragma: no cover - numpy is a dependency
    as_strided = None


def test_a_cached_helper_gives_no_hint():
    assert code_hint(_through_a_cached_helper) is None  # its time may go anywhere


@pytest.mark.parametrize("fn", [_through_a_partial, _through_exec, _strided])
def test_wrappers_exec_and_memory_unsafe_numpy_never_run_on_threads(fn):
    # On threads, a partial of os._exit ended this process, and as_strided
    # past the end of its array crashed it.
    assert not effects_of(fn).allows("thread")
    assert _route(fn) != "thread"


def test_numpy_global_random_state_never_runs_on_threads():
    # np.random.seed(i) then np.random.rand() on six threads: 100 of 100
    # results unlike a loop's.
    np = pytest.importorskip("numpy")
    namespace = {"np": np}
    exec(
        "def seeded(i):\n    np.random.seed(i)\n    return float(np.sort(np.random.rand(10))[0])\n",
        namespace,
    )
    assert not effects_of(namespace["seeded"]).allows("thread")
    assert _route(namespace["seeded"]) != "thread"


def test_a_module_attribute_not_loaded_yet_gives_no_hint():
    fake = types.ModuleType("fake")
    namespace = {"fake": fake, "time": time}
    exec("def lazy(x):\n    time.sleep(0)\n    return fake.later(x)\n", namespace)
    assert code_hint(namespace["lazy"]) is None


def test_numpy_vectorize_gives_no_hint():
    np = pytest.importorskip("numpy")
    namespace = {"np": np, "vec": np.vectorize(arithmetic)}
    exec("def f(a):\n    return vec(a)\n", namespace)
    assert code_hint(namespace["f"]) is None


@pytest.mark.skipif(not hasattr(__import__("operator"), "call"), reason="operator.call: 3.11+")
def test_operator_call_gets_no_operator_hint():
    import operator

    from smartexec._code_hint import operator_hint

    assert operator_hint(operator.call) is None  # it runs any callable


_LAST = None


def _sets_a_global(x):
    global _LAST
    _LAST = x
    time.sleep(0)


def _fetches_and_sets_a_global(url):
    global _LAST
    with urllib.request.urlopen(url, timeout=30) as response:
        _LAST = response.read()
        return len(_LAST)


@pytest.mark.parametrize("fn", [_sets_a_global, _fetches_and_sets_a_global])
def test_a_global_statement_never_runs_on_threads(fn):
    # On threads the caller would see the writes; each worker keeps its own.
    # A with block's hint (a wait) changes nothing of that.
    assert not effects_of(fn).allows("thread")
    assert _route(fn) != "thread"


def _route(fn):
    from smartexec._system import current_platform
    from smartexec.policy import Options, decide

    return decide(inspect_callable(fn), current_platform(), Options()).backend


class _RaisingGetattr:
    """A callable whose ``__getattr__`` raises something other than AttributeError."""

    def __call__(self, x):
        return x + 1

    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")


@pytest.mark.timeout(60)
def test_a_callable_whose_getattr_raises_is_mapped_as_the_stdlib_maps_it():
    # A breaker's callable: ThreadPoolExecutor maps it, and SmartExecutor's
    # map raised its RuntimeError from reading __code__ for the code hint.
    from smartexec import SmartExecutor

    odd = _RaisingGetattr()
    assert not arithmetic_only(odd)
    with SmartExecutor() as ex:
        assert list(ex.map(odd, range(3))) == [1, 2, 3]
        assert ex.submit(odd, 5).result() == 6
