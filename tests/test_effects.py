"""smartexec.effects: what a callable's code may change, one small test per shape.

Each shape is right on worker processes (every call has its own copy of the
state) and wrong on threads or in a loop in the caller, or it is safe there
and must stay so. No process is started: the reading never runs the code.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import heapq
import inspect
import itertools
import os
import random
import sys
import time
import types

import numpy as np
import pytest

import smartexec
from smartexec.effects import Effects, effects_of, thread_safe

_BUF = np.zeros(16)
_TABLE: dict[int, int] = {}
_BYTES = bytearray(8)
_CONST = np.arange(16.0)
_NAMES = ("a", "b")
_LAST = 0
_RNG = random.Random(0)
_GEN = np.random.default_rng(0)


def kinds(fn) -> set[str]:
    return {e.kind for e in effects_of(fn).found}


def routes(fn) -> tuple[bool, bool]:
    e = effects_of(fn)
    return e.allows("thread"), e.allows("inline")


# --- shapes that write an object other calls see: off threads and the calling thread


def scratch_array(x):
    _BUF[:] = x
    time.sleep(0)
    return float(_BUF.sum())


def scratch_through_a_local(x):
    buf = _BUF
    view = buf[2:]
    view[:] = x
    return float(buf.sum())


def scratch_dict(x):
    _TABLE[0] = x
    return _TABLE[0]


def scratch_dict_method(x):
    _TABLE.update({0: x})
    return _TABLE[0]


def scratch_bytes(x):
    _BYTES[:4] = x.to_bytes(4, "little")
    return hashlib.sha256(_BYTES).hexdigest()


def global_counter(i):
    global _LAST
    _LAST = i
    return _LAST * 2


def _fill(buf, x):
    buf[0] = x


def through_a_helper(x):
    _fill(_BUF, x)
    return float(_BUF[0])


def seeded_module_generator(i):
    _RNG.seed(i)
    return _RNG.random()


def draws_from_module_generator(i):
    return _GEN.random() + i


def closure_over_a_list():
    seen: list[int] = []

    def add(x):
        seen.append(x)
        return len(seen)

    return add


class Model:
    def __init__(self) -> None:
        self.weights = np.ones(3)
        self.cache: dict[int, float] = {}

    def predict(self, x):
        return float(self.weights @ x)

    def remember(self, x):
        self.cache[x] = 1.0
        return x

    def through_own_method(self, x):
        return self._scale(x)

    def _scale(self, x):
        self.weights *= x
        return x


class Counter:
    calls = 0

    @classmethod
    def count(cls, x):
        cls.calls += 1
        return x


@pytest.mark.parametrize(
    "fn",
    [
        scratch_array,
        scratch_through_a_local,
        scratch_dict,
        scratch_dict_method,
        scratch_bytes,
        global_counter,
        through_a_helper,
        seeded_module_generator,
        draws_from_module_generator,
        closure_over_a_list(),
        Model().remember,
        Model().through_own_method,
        Counter.count,
        functools.partial(_fill, _BUF),
    ],
)
def test_writes_to_shared_objects_keep_it_off_threads_and_the_calling_thread(fn):
    # In the calling thread, the object written is the caller's own: it keeps
    # what the map wrote (on processes each worker writes a copy).
    assert kinds(fn) == {"shared"}, effects_of(fn)
    assert routes(fn) == (False, False)


def test_the_finding_names_the_object_and_its_line():
    (effect,) = effects_of(scratch_array).found
    assert "`_BUF`" in effect.what
    line = scratch_array.__code__.co_firstlineno + 1
    assert effect.where == f"test_effects.py:{line}"
    assert "_BUF" in effects_of(scratch_array).reason("thread")
    assert "smartexec.thread_safe" in effects_of(scratch_array).reason("thread")


# --- process state: off threads and off the calling thread


def changes_environ(i):
    os.environ["SMARTEXEC_TEST_ITEM"] = str(i)
    return os.environ["SMARTEXEC_TEST_ITEM"]


def changes_directory(path):
    os.chdir(path)
    return os.getcwd()


def seeds_random(i):
    random.seed(i)
    return random.random()


def seeds_numpy(i):
    np.random.seed(i)
    return float(np.random.rand())


def sets_umask(i):
    return os.umask(i)


@pytest.mark.parametrize(
    "fn",
    [
        changes_environ,
        changes_directory,
        seeds_random,
        seeds_numpy,
        sets_umask,
        np.random.seed,
    ],
)
def test_process_state_keeps_it_off_threads_and_the_calling_thread(fn):
    assert "process" in kinds(fn), effects_of(fn)
    assert routes(fn) == (False, False)


# --- writes into its arguments: off threads and off the calling thread


def log_in_place(row):
    np.log1p(row, out=row)
    return float(row.sum())


def add_in_place(row):
    row += 1
    return float(row.sum())


def write_each_element(rows):
    for row in rows:
        row[0] = 1
    return 0


def sorts_its_list(items):
    items.sort()
    return items[0]


def pushes_on_its_heap(heap):
    heapq.heappush(heap, 1)
    return heap[0]


def writes_through_asarray(data):
    array = np.asarray(data)
    array[0] = 0
    return array


def positional_out(row):
    np.add(row, 1, row)
    return row


def _write_first(a):
    a[0] = 0


def through_a_helper_into_its_argument(row):
    _write_first(row)
    return row


@pytest.mark.parametrize(
    "fn",
    [
        log_in_place,
        add_in_place,
        write_each_element,
        sorts_its_list,
        pushes_on_its_heap,
        writes_through_asarray,
        positional_out,
        through_a_helper_into_its_argument,
        np.copyto,
    ],
)
def test_writes_into_arguments_keep_it_off_threads_and_the_calling_thread(fn):
    assert "argument" in kinds(fn), effects_of(fn)
    assert routes(fn) == (False, False)


@pytest.mark.parametrize("fn", [random.seed, random.random, random.shuffle, [].append])
def test_methods_of_this_process_objects_belong_on_threads(fn):
    # Row 1b: a worker would act on a copy (every worker the same numbers,
    # the caller's list left empty), so these stay on threads whatever they write.
    effects = effects_of(fn)
    assert effects.in_process is not None
    assert routes(fn) == (True, True)


def test_the_argument_is_named():
    assert any("`row`" in e.what for e in effects_of(log_in_place).found)


# --- what cannot be read


def calls_what_it_is_given(fn):
    return fn(1)


def runs_code_it_builds(text):
    return eval(text)  # noqa: S307 - the shape under test


@pytest.mark.parametrize("fn", [calls_what_it_is_given, runs_code_it_builds])
def test_what_cannot_be_read_keeps_it_off_threads(fn):
    assert kinds(fn) == {"unread"}, effects_of(fn)
    assert routes(fn) == (False, False)


def hashes_by_name(blob):
    return tuple(getattr(hashlib, name)(blob).hexdigest() for name in ("md5", "sha256"))


def hashes_by_name_in_a_loop(blob):
    out = []
    for name in ["sha1", "sha512"]:
        out.append(getattr(hashlib, name)(blob).digest())
    return out


_THIS_MODULE = sys.modules[__name__]


def calls_a_module_function_by_name(x):
    return getattr(_THIS_MODULE, "_write_scratch")(x)  # noqa: B009 - the shape under test


def _write_scratch(x):
    _BUF[:] = x
    return 1


def names_a_function_it_is_given(blob, name="md5"):
    for name in ("md5", "sha1"):  # noqa: B007, PLR1704 - the shape under test
        pass
    return getattr(hashlib, name)(blob).hexdigest()


def loops_over_names_then_rebinds(blob):
    digests = []
    for name in ("md5", "sha1"):
        digests.append(name)
    name = blob.decode()
    return getattr(hashlib, name)(blob).hexdigest()


def test_a_function_named_by_a_loops_literal_strings_is_read():
    # getattr(hashlib, name) for name in a literal tuple: hashlib.md5 or
    # hashlib.sha256, each read (a new user's 6 hashes per blob were kept
    # off threads, which ran them 1.33x faster than fork).
    for fn in (hashes_by_name, hashes_by_name_in_a_loop):
        assert effects_of(fn).found == (), effects_of(fn)
        assert routes(fn) == (True, True)
    assert "_hashlib.openssl_md5" in effects_of(hashes_by_name).trusted


def rebinds_the_name_from_an_inner_function(path):
    for name in ("getcwd",):  # noqa: B007 - the shape under test
        pass

    def switch():
        nonlocal name
        name = "chdir"

    switch()
    return getattr(os, name)(path)


def rebinds_the_name_through_its_frame(path):
    for name in ("getcwd",):  # noqa: B007 - the shape under test
        pass
    sys._getframe().f_locals["name"] = "chdir"  # writes through from 3.13
    return getattr(os, name)(path)


_LOOKED_UP = "_write_scratch"


def a_comprehensions_own_name_is_not_the_functions(x):
    _ = [0 for _LOOKED_UP in ("hashes_by_name",)]  # noqa: F841 - the shape under test
    return getattr(_THIS_MODULE, _LOOKED_UP)(x)  # the module-level one


class _Scratch:
    def run(self, x):
        self.x = x
        return self.x * 2


_SCRATCH = _Scratch()
_RUN = _SCRATCH.run
_RNG = random.Random(0)


class _Router:
    def __getattribute__(self, name):
        return _write_scratch

    def good(self, x):
        return x * 2


_ROUTER = _Router()


def a_bound_method_by_name(x):
    return getattr(_SCRATCH, "run")(x)  # noqa: B009 - the shape under test


def a_bound_method_by_alias(x):
    return _RUN(x)


def a_classes_method_given_its_object(x):
    getattr(random.Random, "seed")(_RNG, x)  # noqa: B009 - the shape under test
    return getattr(random.Random, "random")(_RNG)  # noqa: B009


def an_attribute_from_getattribute(x):
    return getattr(_ROUTER, "good")(x)  # noqa: B009 - the shape under test


@pytest.mark.parametrize(
    "fn",
    [
        a_comprehensions_own_name_is_not_the_functions,
        a_bound_method_by_name,
        a_bound_method_by_alias,
        a_classes_method_given_its_object,
        an_attribute_from_getattribute,
    ],
)
def test_what_a_breaker_reached_through_getattr_stays_off_threads(fn):
    # Each wrote shared state on threads (a result unlike a serial loop's).
    assert not effects_of(fn).allows("thread"), effects_of(fn)


def test_a_function_named_by_a_name_bound_otherwise_stays_unread():
    for fn in (
        names_a_function_it_is_given,
        loops_over_names_then_rebinds,
        rebinds_the_name_from_an_inner_function,
        rebinds_the_name_through_its_frame,
    ):
        assert kinds(fn) == {"unread"}, effects_of(fn)


def test_a_function_named_by_a_literal_string_is_read_into():
    found = effects_of(calls_a_module_function_by_name)
    assert not found.allows("thread"), found
    assert "unread" not in {e.kind for e in found.found}, found


def test_a_function_without_source_is_read_from_its_bytecode():
    namespace: dict[str, object] = {"_BUF": _BUF}
    exec("def scratch(x):\n    _BUF[:] = x\n    return 1\n", namespace)  # noqa: S102
    assert not effects_of(namespace["scratch"]).allows("thread")
    exec("def pure(x):\n    return x * 2\n", namespace)  # noqa: S102
    assert effects_of(namespace["pure"]).allows("thread")


# --- thread-safe work keeps its routes


def reads_a_constant(x):
    return float(np.einsum("i,i->", _CONST, _CONST)) + x


def hashes_its_argument(data):
    digest = hashlib.sha256()
    digest.update(data)
    return digest.hexdigest()


def builds_and_writes_its_own(x):
    a = np.zeros(4)
    a[0] = x
    out = np.empty_like(a)
    np.add(a, 1, out=out)
    total = 0.0
    for v in out:
        total += v
    parts = list(_NAMES)
    parts.append("c")
    return total, parts


def sleeps(x):
    time.sleep(0)
    return x


def local_generator(i):
    rng = np.random.default_rng(i)
    return float(rng.random())


def _scaled(a, k):
    return a * k


def calls_a_pure_helper(x):
    return _scaled(np.ones(3), x)


@pytest.mark.parametrize(
    "fn",
    [
        reads_a_constant,
        hashes_its_argument,
        builds_and_writes_its_own,
        sleeps,
        local_generator,
        calls_a_pure_helper,
        Model().predict,
        lambda x: x * 2,
        np.log1p,
        np.einsum,
        hashlib.sha256,
        time.sleep,
        abs,
        random.Random(0).random,
    ],
)
def test_thread_safe_work_stays_allowed_everywhere(fn):
    assert effects_of(fn).found == (), effects_of(fn)
    assert routes(fn) == (True, True)


def test_native_calls_are_trusted_and_named():
    assert "numpy.einsum" in effects_of(reads_a_constant).trusted
    assert "trusted" in effects_of(reads_a_constant).trust_note()


# --- the opt-in


def test_thread_safe_declares_a_function_and_returns_it():
    def fill(i):
        _TABLE[1] = i
        return i

    assert not effects_of(fill).allows("thread")
    assert thread_safe(fill) is fill
    assert effects_of(fill) == Effects(declared=True)
    assert effects_of(fill).allows("thread") and effects_of(fill).allows("inline")
    assert smartexec.thread_safe is thread_safe


def test_thread_safe_on_a_bound_method_declares_every_objects_method():
    class Box:
        def put(self, x):
            self.x = x

    thread_safe(Box().put)
    assert effects_of(Box().put).declared


def test_thread_safe_refuses_what_takes_no_attributes():
    with pytest.raises(TypeError, match="prefer='threads'"):
        thread_safe(len)
    with pytest.raises(TypeError, match="callable"):
        thread_safe(3)  # type: ignore[arg-type]


def test_reading_never_raises_on_odd_objects():
    class Odd:
        def __getattr__(self, name):
            raise RuntimeError(name)

        def __call__(self, x):
            return x

    assert isinstance(effects_of(Odd()), Effects)


_exit_now = functools.partial(os._exit, 3)


@functools.cache
def _cached_writer(x):
    _TABLE[2] = x
    return x


def through_a_partial_of_exit(x):
    _exit_now()


def through_a_cached_writer(x):
    return _cached_writer(x)


def test_partials_and_cached_wrappers_are_read_through():
    assert "process" in kinds(through_a_partial_of_exit)
    assert kinds(through_a_cached_writer) == {"shared"}


_LAZY = None
_MEMO: dict[int, int] = {}


def lazy_module_cache(i):
    global _LAZY
    if _LAZY is None:
        _LAZY = bytes(64)
    return hashlib.sha256(_LAZY + bytes([i % 256])).hexdigest()


def memoized(key):
    if key not in _MEMO:
        _MEMO[key] = key * key
    return _MEMO[key]


def memoized_with_get(key):
    if _MEMO.get(key) is None:
        _MEMO[key] = key + 1
    return _MEMO[key]


@pytest.mark.parametrize("fn", [lazy_module_cache, memoized, memoized_with_get])
def test_a_cache_filled_once_is_not_a_shared_write(fn):
    # Every call that fills it stores what any other would: threads compute
    # what a serial loop does (bench_cold's sha256 row reads its 4 MiB block so).
    assert effects_of(fn).found == (), effects_of(fn)


def unguarded_after_a_check(i):
    if _MEMO:
        _MEMO[0] = i  # a scratch write behind an unrelated test
    return _MEMO.get(0)


def test_a_write_behind_another_test_is_still_a_write():
    assert kinds(unguarded_after_a_check) == {"shared"}


def test_a_write_in_a_helper_names_the_helper():
    (effect,) = effects_of(through_a_helper).found
    assert "_fill()" in effect.what and "_BUF" in effect.what


def test_explain_says_a_declared_callable_was_trusted():
    def fill(i):
        _TABLE[3] = i
        time.sleep(0)
        return i

    thread_safe(fill)
    text = str(smartexec.SmartExecutor().explain(fill))
    assert "declared with smartexec.thread_safe" in text, text


class _Tally:
    seen = 0

    def note(self, i):
        type(self).seen = i
        return type(self).seen


def updates_environ(i):
    os.environ.update(SMARTEXEC_TEST_ITEM=str(i))
    return os.environ["SMARTEXEC_TEST_ITEM"]


def redirects_stdout(i):
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        print(i)
    return i


@pytest.mark.parametrize(
    "fn, kind",
    [(_Tally().note, "shared"), (updates_environ, "process"), (redirects_stdout, "process")],
)
def test_writes_through_stdlib_methods_and_type_are_found(fn, kind):
    # Found by a last break-it pass: a stdlib method of a module-level object
    # (os.environ.update), a class attribute through type(self), and
    # contextlib's process-wide redirections.
    assert kind in kinds(fn), effects_of(fn)
    assert not effects_of(fn).allows("thread")


_CYCLE = iter([np.empty(4), np.empty(4)])
_SPACE = type("Space", (), {})()
_SPACE.buf = np.empty(4)


def next_buffer(i):
    buf = next(_CYCLE)
    np.multiply(np.ones(4), i, out=buf)
    return float(buf.sum())


def named_buffer(i, name="buf"):
    buf = getattr(_SPACE, name)
    np.multiply(np.ones(4), i, out=buf)
    return float(buf.sum())


def astype_in_place(x):
    view = x.astype(np.float64, copy=False)
    np.log1p(view, out=view)
    return float(view.sum())


@pytest.mark.parametrize("fn", [next_buffer, named_buffer, astype_in_place])
def test_next_getattr_and_astype_without_copy_alias_what_they_read(fn):
    # Found by the break-it pass: a buffer drawn from a module-level cycle,
    # reached by getattr, or an argument's astype(copy=False) view.
    assert not effects_of(fn).allows("thread"), effects_of(fn)


_LAST_CALL = None


def one_entry_memo(x):
    global _LAST_CALL
    if _LAST_CALL is None or _LAST_CALL[0] != x:
        _LAST_CALL = (x, x * 2)
    return _LAST_CALL[1]


@functools.cache
def _workspace(n):
    return np.empty(n)


def cached_workspace(i):
    buf = _workspace(4)
    np.multiply(np.ones(4), i, out=buf)
    return float(buf.sum())


@functools.cache
def cached_scratch(i):
    _BUF[:] = i
    return float(_BUF.sum())


@pytest.mark.parametrize("fn", [one_entry_memo, cached_workspace, cached_scratch])
def test_memos_that_overwrite_and_cached_objects_are_shared(fn):
    # From the break-it pass: a one-entry memo overwrites what another call
    # reads; an lru_cache returns one object to every call; an lru_cache'd
    # callable is read through to its function.
    assert not effects_of(fn).allows("thread"), effects_of(fn)


_SEEN: dict = {}


def first_seen(x):
    if x in _SEEN:  # its result says whether another call filled it
        return False
    _SEEN[x] = True
    return True


def first_seen_inverted(x):
    if x not in _SEEN:
        _SEEN[x] = True
        return True
    return False


def first_seen_by_flag(x):
    fresh = False
    if x not in _SEEN:
        _SEEN[x] = True
        fresh = True
    return fresh


@pytest.mark.parametrize("fn", [first_seen, first_seen_inverted, first_seen_by_flag])
def test_a_fill_whose_result_says_it_ran_is_a_shared_write(fn):
    # A new user's finding: each was taken for a cache fill and moved into the
    # caller's thread, where 6,416 (or 3,128) of 30,000 items came back True
    # against 3,000 from a serial loop.
    assert not effects_of(fn).allows("thread"), effects_of(fn)
    assert not effects_of(fn).allows("inline"), effects_of(fn)


class _Held:
    @functools.cache  # noqa: B019 - a decorated method, for its first line
    def method(self, x):
        return x + 1


# fmt: off
_SPREAD = [
    lambda x: (
        x + 1
    ),
    map(
        str,
        [],
    ),
]
# fmt: on
_ACROSS = functools.partial(
    sorted,
    key=lambda y: -y,  # a lambda whose statement began two lines up
)


@pytest.mark.parametrize(
    "fn",
    [_Held.method.__wrapped__, _SPREAD[0], _ACROSS.keywords["key"], smartexec.SmartExecutor.map],
    ids=["decorated-method", "lambda-over-lines", "lambda-mid-statement", "library-method"],
)
def test_a_functions_own_lines_are_read_or_else_its_whole_file(fn):
    from smartexec.effects import _source

    nodes = _source.nodes_of(fn)
    assert nodes is not None and len(nodes) == 1
    assert nodes[0].lineno in (fn.__code__.co_firstlineno, fn.__code__.co_firstlineno + 1)


def _ends_across_lines(x):
    def inner(y):
        return y

    return inner(
        x,
    )


def test_a_plain_function_is_found_without_parsing_its_whole_file(monkeypatch):
    from smartexec.effects import _source

    def no_file(*_):
        raise AssertionError("the whole file was parsed")

    monkeypatch.setattr(_source, "source_tree", no_file)
    assert _source.nodes_of(_Held.method.__wrapped__) is not None
    if sys.version_info >= (3, 11):  # end lines kept: a last statement over several lines
        assert _source.nodes_of(_ends_across_lines) is not None


def test_a_functions_lines_end_at_its_last_instruction_nested_code_included():
    from smartexec.effects import _source

    code = _ends_across_lines.__code__
    last = _source.last_line(code)
    lines = inspect.getsourcelines(_ends_across_lines)[0]
    expected = code.co_firstlineno + len(lines) - 1  # the closing parenthesis
    assert last == expected if sys.version_info >= (3, 11) else expected - 1 <= last <= expected


def appends_through_map(rows):
    list(map(rows.append, [1]))
    return len(rows)


def appends_through_a_deque(rows):
    collections.deque(map(rows.append, [1]), maxlen=0)
    return len(rows)


def appends_through_its_type(rows):
    type(rows).append(rows, 1)
    return len(rows)


def appends_to_its_own_list(rows):
    out = []
    add = out.append
    collections.deque(map(add, rows), maxlen=0)
    return out


@pytest.mark.parametrize(
    "fn", [appends_through_map, appends_through_a_deque, appends_through_its_type]
)
def test_a_changing_method_taken_as_a_value_or_through_its_type_writes_its_object(fn):
    # Found by a helper trying to break it: these wrote the caller's lists in a loop here.
    assert "argument" in kinds(fn), effects_of(fn)
    assert routes(fn) == (False, False)


def test_a_changing_method_of_a_local_taken_as_a_value_changes_nothing_shared():
    assert routes(appends_to_its_own_list) == (True, True), effects_of(appends_to_its_own_list)


_IDS = itertools.count()
_STATS = types.SimpleNamespace(calls=0)
_TABLE: dict = {}


def takes_an_id(i):
    for n in _IDS:
        return n


def zips_ids(i):
    return min(zip(_IDS, [i]))


def counts_through_object_setattr(i):
    object.__setattr__(_STATS, "calls", _STATS.calls + 1)
    return i


def fills_under_a_rebound_key(i):
    key = -1
    if key not in _TABLE:
        key = i
        _TABLE[key] = i
    return i


@pytest.mark.parametrize(
    "fn", [takes_an_id, zips_ids, counts_through_object_setattr, fills_under_a_rebound_key]
)
def test_writes_a_second_helper_found_are_writes(fn):
    # Each changed the caller's module state from a loop here (found by a
    # helper trying to break it): a module-level iterator is advanced by any
    # use, a slot wrapper's setter writes its object, and a "fill" whose key
    # is rebound under its test stores what only this call would.
    assert kinds(fn) == {"shared"}, effects_of(fn)
    assert routes(fn) == (False, False)
