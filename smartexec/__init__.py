"""smartexec: parallel map that picks threads, fork, loky or inline per callable.

>>> from smartexec import SmartExecutor
>>> with SmartExecutor() as ex:
...     list(ex.map(abs, [-1, -2, 3]))
[1, 2, 3]
"""

from __future__ import annotations

from typing import Any

from .effects import thread_safe
from .errors import (
    BackendUnavailableError,
    InitializerError,
    PayloadPicklingError,
    ProcessInitializerError,
    RemoteError,
    ResultPicklingError,
    TaskTimeoutError,
    ThreadInitializerError,
    UnknownBackendError,
    WorkerCrashedError,
    WorkerProtocolError,
)
from .executor import SmartExecutor
from .policy import Decision
from .registry import available_backends, register_backend
from .stats import ExecutorStats

__all__ = [
    "SmartExecutor",
    "parallel_map",
    "thread_safe",
    "Decision",
    "ExecutorStats",
    "register_backend",
    "available_backends",
    "PayloadPicklingError",
    "WorkerCrashedError",
    "InitializerError",
    "ProcessInitializerError",
    "ThreadInitializerError",
    "WorkerProtocolError",
    "ResultPicklingError",
    "TaskTimeoutError",
    "RemoteError",
    "UnknownBackendError",
    "BackendUnavailableError",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "parallel_map":
        from .decorators import parallel_map

        return parallel_map
    raise AttributeError(f"module 'smartexec' has no attribute {name!r}")
