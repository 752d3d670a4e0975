"""Module-level objects that resist inspection (see test_stale_data): none may fail a map."""

from __future__ import annotations


class LazySettings:
    """A lazy proxy, as Django's settings: asking its class configures it, and fails here."""

    _wrapped = None

    @property
    def __class__(self):
        raise RuntimeError("settings are not configured")


class Unsized(dict):
    def __len__(self):
        raise RuntimeError("no length")


settings = LazySettings()
UNSIZED = Unsized(a=1)
CHAIN = None
for _i in range(5000):
    CHAIN = (_i, CHAIN)


def unrelated(x):
    return x * 2


def reads_them(x):
    return x + UNSIZED["a"] + (0 if CHAIN is None else 0) + (0 if settings is None else 0)
