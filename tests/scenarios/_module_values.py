"""Functions that read module-level values a test changes between maps (see test_stale_data).

Importable, so process workers reach them by reference: a forked worker reads
this module as it was when it forked.
"""

from __future__ import annotations

import functools

import numpy as np

SCALE = 1
CONFIG = {"factor": 1}
TABLE = np.ones(1 << 20)  # 8 MiB: more than a proof hashes


class Settings:
    factor = 1


def scaled(x):
    return x * SCALE


def configured(x):
    return x * CONFIG["factor"]


def tabled(x):
    return x * float(TABLE[0])


def by_class(x):
    return x * Settings.factor


def through_a_helper(x):
    return scaled(x) + 0


def negated(x):
    return -x


class Base:
    factor = 1


class Derived(Base):
    def scaled(self, x):
        return x * self.factor


DERIVED = Derived()
TABLE_OF_FUNCTIONS = {"scale": scaled}


def by_instance(x):
    return DERIVED.scaled(x)  # a module-level instance; the attribute is its base class's


def by_table(x):
    return TABLE_OF_FUNCTIONS["scale"](x)


def by_import_in_body(x):
    from tests.scenarios._module_values import SCALE as scale

    return x * scale


def by_default(x, config=CONFIG):
    return x * config["factor"]


def by_name(x):
    return x * globals()["SCALE"]


def apply(fn, x):
    return fn(x)


by_partial = functools.partial(apply, scaled)


@functools.singledispatch
def dispatched(x):
    return x * SCALE


STATE = {"factor": 1}


def by_its_own_cache(x):
    global STATE
    if STATE is None:  # a cache it would fill; the caller changes it in place
        STATE = {"factor": 1}
    return x * STATE["factor"]


def by_default_rule(x, rule=scaled):
    return rule(x)
