"""Callables whose whole effect is on an object of this process.

A worker process runs a bound method on a copy of its object (pickled, or
copied by ``fork``). For most objects that is the point: a big read-only
index reaches fork workers by copy-on-write. For two kinds it is a silent
wrong result, or a hang, where a ``ThreadPoolExecutor`` works:

* methods of objects that pass data or signals between this process's
  threads (``queue.Queue.get``, ``threading.Event.wait``, a lock's
  ``acquire``, ``Future.set_result``): in a worker, ``q.put(x)`` fills a
  copy that nobody reads, and ``event.wait()`` waits for ever for a
  ``set()`` made here;
* methods of a built-in mutable object (``results.append``,
  ``seen.add``, ``counts.__setitem__``, ``rng.random``, ``buf.write``): the
  worker changes its copy, and the caller's list stays empty (or every
  worker draws the same random numbers).

:func:`process_local_reason` names such a callable; the policy then runs it
on threads, in this process (``smartexec.policy``). Methods of the user's
own classes are not judged here: whether they change their object is not
visible without running them, and sharing a big object with fork workers is
what smartexec is for (their docs say workers see it as it was).
"""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import re
import threading
import types
from typing import Any

__all__ = ["process_local_reason"]

#: Types whose instances synchronise or pass data between threads of one
#: process. ``multiprocessing``'s own primitives are not here: a forked
#: worker shares them with its parent.
_THREAD_SHARED: tuple[type, ...] = (
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Semaphore,  # BoundedSemaphore too
    threading.Event,
    threading.Barrier,
    threading.Thread,
    queue.Queue,  # LifoQueue and PriorityQueue too
    queue.SimpleQueue,
    concurrent.futures.Future,
)

#: Built-in types whose methods cannot change the object: a copy in a worker
#: answers as the original would.
_IMMUTABLE: tuple[type, ...] = (
    str,
    bytes,
    int,
    float,
    complex,
    tuple,
    frozenset,
    range,
    slice,
    type(None),
    re.Pattern,
    re.Match,
)


def _a(obj: Any) -> str:
    name = type(obj).__qualname__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def process_local_reason(fn: Any) -> str | None:
    """Why ``fn`` must run in this process, or None when a worker process may run it.

    Args:
        fn: any callable; a ``functools.partial`` is judged by its function.

    Returns:
        A sentence for ``explain()`` when ``fn`` is a method (of any kind)
        of an object that threads of this process share (a queue, a lock,
        an event, a future, a thread), or a built-in method, or slot
        wrapper, bound to a mutable built-in object (a list, dict, set,
        deque, file, random generator...); else None. Never raises (an
        object whose ``__getattr__`` raises is not named).
    """
    try:
        return _reason(fn)
    except Exception:
        return None


def _reason(fn: Any) -> str | None:
    if isinstance(fn, functools.partial):
        return _reason(fn.func)
    owner = getattr(fn, "__self__", None)
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return None
    if isinstance(owner, _THREAD_SHARED):
        return (
            f"its object ({_a(owner)}) passes data or signals between this process's "
            "threads: in a worker process the call would act on a copy (what it puts "
            "would never arrive here, what it waits for would never come)"
        )
    builtin = isinstance(fn, (types.BuiltinMethodType, types.MethodWrapperType))
    if builtin and not isinstance(owner, _IMMUTABLE):
        return (
            f"it is a built-in method of {_a(owner)} of this process, which it may "
            "change: a worker process would change a copy, and the change would be "
            "lost here"
        )
    return None
