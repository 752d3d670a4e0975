"""smartexec.effects: methods the lookups cannot resolve, functions passed as values, library state.

The model (``effects/_reader.py``, ``FunctionReader.method_call``): a method
whose object is not known is read as the user's own methods of that name,
with the object as ``self``; failing those, it must be one that only reads
on every type that has it (``sum``, ``split``, ``get``), or it may change
its object. A standard-library object's method is judged by its type's
table; an installed package's is trusted. Each shape here is right on worker
processes and wrong on threads, or safe and must stay so. No process starts.
"""

from __future__ import annotations

import asyncio
import collections
import csv
import dataclasses
import functools
import hashlib
import io
import logging
import resource
import tempfile
import threading
import time
import warnings

import numpy as np
import pytest

from smartexec.effects import effects_of


def routes(fn) -> tuple[bool, bool]:
    e = effects_of(fn)
    return e.allows("thread"), e.allows("inline")


# -- methods of objects the lookups do not resolve -------------------------------------


class Accumulator:
    def __init__(self) -> None:
        self.total = np.zeros(8)

    def run(self, i: int) -> float:
        self.total[:] = i
        time.sleep(0)
        return float(self.total.sum())


_POOL = [Accumulator()]
_BY_KIND = {"acc": Accumulator()}


def method_of_a_list_element(i):
    return _POOL[0].run(i)


def method_of_a_dict_value(i):
    return _BY_KIND["acc"].run(i)


class Scaled(Accumulator):
    def run(self, i: int) -> float:
        return super().run(i) * 2


_SCALED = Scaled()


def draws_from_its_argument(rng, n):
    return float(rng.standard_normal(n).sum())


_LOG = logging.getLogger("smartexec.tests.effects_methods")


def adds_a_handler(i):
    handler = logging.StreamHandler(io.StringIO())
    _LOG.addHandler(handler)
    try:
        _LOG.info("item %d", i)
    finally:
        _LOG.removeHandler(handler)
    return i


def sets_a_library_level(i):
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    return hashlib.sha256(bytes(i)).hexdigest()


@pytest.mark.parametrize(
    "fn",
    [method_of_a_list_element, method_of_a_dict_value, _SCALED.run, draws_from_its_argument],
)
def test_an_unresolved_method_is_read_by_its_name_or_is_a_write(fn):
    assert not routes(fn)[0], effects_of(fn)


def test_super_reaches_the_base_class_method():
    found = effects_of(_SCALED.run)
    # Named Accumulator.run() from Python 3.11 (co_qualname), run() before.
    assert any("writes the object it is bound to" in str(e) for e in found.found), found
    line = Accumulator.run.__code__.co_firstlineno + 1  # self.total[:] = i, in the base class
    assert any(e.where.endswith(f":{line}") for e in found.found), found


@pytest.mark.parametrize("fn", [adds_a_handler, sets_a_library_level])
def test_a_loggers_configuration_is_process_state(fn):
    assert routes(fn) == (False, False), effects_of(fn)


# -- functions passed as values ---------------------------------------------------------

_ROW = np.empty(16)


def _row_energy(r):
    np.multiply(r, r, out=_ROW)
    return float(_ROW.sum())


def maps_a_helper(i):
    return sum(map(_row_energy, np.ones((4, 16)) * i))


def reduces_in_place(parts):
    total = functools.reduce(lambda acc, p: np.add(acc, p, out=acc), parts)
    return float(total.sum())


def sorts_by_a_pure_key(items):
    return sorted(items, key=lambda x: -x)


@pytest.mark.parametrize("fn", [maps_a_helper, reduces_in_place])
def test_a_passed_function_is_read_with_the_other_arguments(fn):
    assert not routes(fn)[0], effects_of(fn)


# -- library state and views ------------------------------------------------------------


def catches_warnings(i):
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(str(i), stacklevel=2)
    return len(caught)


def raises_a_limit(i):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return i


def sets_the_csv_limit(i):
    csv.field_size_limit(1_000_000)
    return i


def sets_tempdir(i):
    tempfile.tempdir = "/tmp"
    return i


def uses_the_threads_event_loop(i):
    return asyncio.get_event_loop() is not None


def splits_and_centres(a):
    for part in np.split(a, 2):
        part -= part.mean()
    return float(a.sum())


def clips_into_itself(a):
    np.clip(a, 0.0, 1.0, a)
    return float(a.sum())


def no_copy_array(a):
    x = np.array(a, copy=False)
    x /= 2
    return float(x.sum())


def overrides_in_a_chainmap(params):
    cfg = collections.ChainMap(params, {"rounds": 5})
    cfg["seen"] = True
    return len(cfg)


@pytest.mark.parametrize(
    "fn",
    [catches_warnings, raises_a_limit, sets_the_csv_limit, sets_tempdir],
)
def test_library_settings_are_process_state(fn):
    assert routes(fn) == (False, False), effects_of(fn)


def test_the_threads_own_state_keeps_it_off_threads_and_the_calling_thread():
    # In the calling thread it would use the caller's own (a worker process's is its own).
    assert routes(uses_the_threads_event_loop) == (False, False)


@pytest.mark.parametrize(
    "fn", [splits_and_centres, clips_into_itself, no_copy_array, overrides_in_a_chainmap]
)
def test_views_and_positional_outs_write_the_argument(fn):
    assert routes(fn) == (False, False), effects_of(fn)


# -- safe shapes stay on threads -------------------------------------------------------

_TLS = threading.local()


def per_thread_scratch(i):
    buf = getattr(_TLS, "buf", None)
    if buf is None:
        buf = _TLS.buf = np.empty(16)
    np.multiply(np.arange(16.0), i, out=buf)
    return float(buf.sum())


def logs_and_reads(i):
    _LOG.info("item %d", i)
    return i


def reads_its_arguments(a, text, table):
    return float(a.mean() + a.std()), text.split(",")[0].upper(), table.get("k")


def seeded_local_generator(i):
    rng = np.random.default_rng(i)
    return float(rng.standard_normal(4).sum())


def hashes_in_a_fresh_object(data):
    h = hashlib.sha256()
    h.update(data)
    return h.hexdigest()


@pytest.mark.parametrize(
    "fn",
    [
        per_thread_scratch,
        logs_and_reads,
        reads_its_arguments,
        seeded_local_generator,
        hashes_in_a_fresh_object,
        sorts_by_a_pure_key,
    ],
)
def test_safe_shapes_stay_allowed_on_threads(fn):
    assert routes(fn) == (True, True), effects_of(fn)


# -- straight-line rebinding: a new value from there on --------------------------------


def centres_a_new_array(x):
    x = x - x.mean()
    x /= x.std()
    return x


def copies_then_writes(x):
    x = x.copy()
    x -= x.mean()
    np.abs(x, out=x)
    return float(x.sum())


def writes_then_rebinds(x):
    x[0] = 0.0
    x = x.copy()
    return x


def rebinds_in_one_branch_only(x, fresh):
    if fresh:
        x = x.copy()
    x -= 1.0
    return x


_CACHE: dict[int, float] = {}


def cache_with_an_early_return(k):
    if k in _CACHE:
        return _CACHE[k]
    value = float(np.sqrt(k))
    _CACHE[k] = value
    return value


def views_a_shared_buffer(i):
    view = memoryview(_BA_SHARED)
    view[0] = i % 256
    return _BA_SHARED[0]


_BA_SHARED = bytearray(8)


@pytest.mark.parametrize(
    "fn", [centres_a_new_array, copies_then_writes, cache_with_an_early_return]
)
def test_a_name_rebound_in_straight_line_code_holds_the_new_value(fn):
    assert routes(fn) == (True, True), effects_of(fn)


@pytest.mark.parametrize("fn", [writes_then_rebinds, rebinds_in_one_branch_only])
def test_what_it_held_before_or_in_another_branch_is_still_written(fn):
    assert routes(fn) == (False, False), effects_of(fn)


def test_a_view_made_by_a_class_call_is_its_buffer():
    assert not routes(views_a_shared_buffer)[0]


# -- operators, constructed objects, class attributes, wrappers (a second break-it pass) --


class Lookup:
    def __init__(self, n: int) -> None:
        self.base = np.arange(float(n))
        self.work = np.empty(n)

    def __getitem__(self, k: int) -> float:
        np.multiply(self.base, k, out=self.work)
        return float(self.work.sum())

    def __mul__(self, k: int) -> float:
        return self[k]


_LOOKUP = Lookup(8)


def indexes_a_shared_object(i):
    return _LOOKUP[i]


def multiplies_a_shared_object(i):
    return _LOOKUP * i


class Rows:
    def __init__(self) -> None:
        self.data, self.pos = [1, 2, 3], 0

    def __iter__(self):
        self.pos = 0
        return self

    def __next__(self):
        if self.pos >= len(self.data):
            raise StopIteration
        self.pos += 1
        return self.data[self.pos - 1]


_ROWS = Rows()


def iterates_a_shared_object(k):
    return sum(r * k for r in _ROWS)


class Scaler:
    def __init__(self, buf):
        self.buf = buf

    def run(self, i):
        np.multiply(np.arange(8.0), i, out=self.buf)
        return float(self.buf.sum())


_SCRATCH8 = np.empty(8)


def wraps_a_module_buffer(i):
    return Scaler(_SCRATCH8).run(i)


class Acc:
    items: list[int] = []  # noqa: RUF012 - the shape under test: a class attribute shared by all

    def add(self, x):
        self.items.append(x)
        return len(self.items)


def appends_to_a_class_attribute(i):
    return Acc().add(i)


def adds_into_a_copied_dicts_value(rec, k):
    out = dict(rec)
    out["v"] += k
    return float(out["v"].sum())


def reduces_with_iadd(rows):
    import operator

    return functools.reduce(operator.iadd, rows)


def centres_a_list_of_its_arguments(a, b):
    for arr in [a, b]:
        arr -= arr.mean()
    return float(a.sum())


@functools.singledispatch
def _score(x):
    return 0.0


@_score.register
def _(x: int) -> float:
    np.multiply(np.arange(8.0), x, out=_SCRATCH8)
    return float(_SCRATCH8.sum())


def dispatches(i):
    return _score(i)


import contextlib  # noqa: E402 - beside the shape that uses it


@contextlib.contextmanager
def _workspace():
    yield _SCRATCH8


def writes_what_a_contextmanager_gives(i):
    with _workspace() as buf:
        np.multiply(np.arange(8.0), i, out=buf)
        return float(buf.sum())


_SETTINGS = threading.local()
_SETTINGS.scale = 3


def reads_a_thread_local_set_here(i):
    return i * _SETTINGS.scale


@pytest.mark.parametrize(
    "fn",
    [
        indexes_a_shared_object,
        multiplies_a_shared_object,
        iterates_a_shared_object,
        wraps_a_module_buffer,
        appends_to_a_class_attribute,
        adds_into_a_copied_dicts_value,
        reduces_with_iadd,
        centres_a_list_of_its_arguments,
        dispatches,
        writes_what_a_contextmanager_gives,
        reads_a_thread_local_set_here,
    ],
)
def test_operators_constructed_objects_and_wrappers_are_read(fn):
    assert not routes(fn)[0], effects_of(fn)


# -- and what stays allowed ---------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: float
    y: float

    def norm(self) -> float:
        return float(np.hypot(self.x, self.y))


def builds_a_dataclass(i):
    return Point(i, i + 1).norm()


def calls_a_nested_function(x):
    def sq(v):
        return v * v

    cube = lambda v: v * sq(v)  # noqa: E731 - the shape under test
    return sq(x) + cube(x)


@pytest.mark.parametrize("fn", [builds_a_dataclass, calls_a_nested_function])
def test_dataclasses_and_nested_functions_stay_allowed(fn):
    assert routes(fn) == (True, True), effects_of(fn)


# -- the caller's settings: a call that changes them stays off threads and the caller ----

import contextvars  # noqa: E402 - beside the shapes that use it
import decimal  # noqa: E402

_RUN: contextvars.ContextVar[str] = contextvars.ContextVar("_RUN", default="")


def sets_the_decimal_precision(digits):
    decimal.getcontext().prec = digits
    return str(decimal.Decimal(1) / decimal.Decimal(7))


def sets_a_context_variable(i):
    _RUN.set(str(i))
    return _RUN.get()


def reads_a_context_variable(i):
    return f"{_RUN.get()}/{i}"


def uses_a_local_decimal_context(digits):
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        return str(decimal.Decimal(1) / decimal.Decimal(7))


@pytest.mark.parametrize("fn", [sets_the_decimal_precision, sets_a_context_variable])
def test_changing_the_callers_settings_is_process_state(fn):
    assert routes(fn) == (False, False), effects_of(fn)


@pytest.mark.parametrize("fn", [reads_a_context_variable, uses_a_local_decimal_context])
def test_reading_them_or_a_local_context_stays_allowed(fn):
    assert routes(fn) == (True, True), effects_of(fn)


def test_a_loop_in_the_caller_runs_a_clean_callable_itself():
    from smartexec._context import InContext, in_caller

    assert in_caller(reads_a_context_variable, effects_of(reads_a_context_variable)) is (
        reads_a_context_variable
    )
    assert isinstance(
        in_caller(sets_a_context_variable, effects_of(sets_a_context_variable)), InContext
    )
    assert isinstance(in_caller(reads_a_context_variable, None), InContext)
