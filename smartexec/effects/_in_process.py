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
  ``seen.add``, ``counts.__setitem__``, ``buf.write``, also bound by hand
  as ``partial(list.append, results)``, and the methods of the standard
  library's containers such as ``Counter.update``): the worker changes its
  copy, and the caller's list stays empty;
* methods of a random number generator (``random.Random``, numpy's
  ``Generator`` and ``RandomState``): every worker draws the same numbers
  from its own copy of the state.

:func:`process_local_reason` names such a callable; the policy then runs it
on threads, in this process (``smartexec.policy``). Methods of the user's
own classes are not judged here: whether they change their object is not
visible without running them, and sharing a big object with fork workers is
what smartexec is for (their docs say workers see it as it was).
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import queue
import random
import re
import sys
import threading
import types
from typing import Any

from .._display import with_article as _a

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


#: Unbound methods of built-in types (``list.append``), bound by hand in a partial.
_UNBOUND = (types.MethodDescriptorType, types.WrapperDescriptorType)

#: Mutable containers whose standard-library subclasses (``Counter``,
#: ``OrderedDict``, ``defaultdict``) have Python-level methods that change them.
_CONTAINERS = (list, dict, set, bytearray, collections.deque)
_STDLIB = frozenset(sys.stdlib_module_names)


def process_local_reason(fn: Any) -> str | None:
    """Why ``fn`` must run in this process, or None when a worker process may run it.

    Args:
        fn: any callable; a ``functools.partial`` is judged by its function.

    Returns:
        A sentence for ``explain()`` when ``fn`` is a method (of any kind)
        of an object that threads of this process share (a queue, a lock,
        an event, a future, a thread, an asyncio event loop) or of a random
        number generator; a built-in method, or slot wrapper, bound to a
        mutable built-in object (a list, dict, set, deque, file...), by
        Python or by a ``partial`` of the unbound method; or a method of a
        standard-library container (``Counter.update``); else None. Never
        raises (an object whose ``__getattr__`` raises is not named).
    """
    try:
        return _reason(fn)
    except Exception:
        return None


def _reason(fn: Any) -> str | None:
    if isinstance(fn, functools.partial):
        inner, args = fn.func, fn.args
        if args and isinstance(inner, _UNBOUND) and isinstance(args[0], inner.__objclass__):
            # partial(list.append, results): the method, bound by hand.
            return _owner_reason(args[0], builtin=True)
        if args and isinstance(inner, types.FunctionType) and _is_method_of(inner, args[0]):
            return _owner_reason(args[0], builtin=False)  # partial(Counter.update, counts)
        return _reason(inner)
    owner = getattr(fn, "__self__", None)
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return None
    builtin = isinstance(fn, (types.BuiltinMethodType, types.MethodWrapperType))
    return _owner_reason(owner, builtin)


def _owner_reason(owner: Any, builtin: bool) -> str | None:
    """Why a method of ``owner`` (a built-in one when ``builtin``) must run here, or None."""
    if isinstance(owner, _thread_shared()):
        return (
            f"its object ({_a(owner)}) passes data or signals between this process's "
            "threads: in a worker process the call would act on a copy (what it puts "
            "would never arrive here, what it waits for would never come)"
        )
    if isinstance(owner, _random_generators()):
        return (
            f"its object ({_a(owner)}) is a random number generator of this process: "
            "each worker process would draw from its own copy of the same state (the "
            "same numbers in every worker), and this one would never advance"
        )
    stdlib_container = isinstance(owner, _CONTAINERS) and (
        type(owner).__module__.partition(".")[0] in _STDLIB
    )
    if (builtin and not isinstance(owner, _IMMUTABLE)) or stdlib_container:
        return (
            f"it is a method of {_a(owner)} of this process: a worker process would "
            "use a copy, so what it changes would be lost here (and what it reads "
            "could be out of date)"
        )
    return None


def _is_method_of(func: types.FunctionType, obj: Any) -> bool:
    """Whether ``func`` is a function defined on ``obj``'s class (or a base), by name."""
    name = func.__name__
    return any(vars(klass).get(name) is func for klass in type(obj).__mro__)


def _thread_shared() -> tuple[type, ...]:
    """:data:`_THREAD_SHARED`, and asyncio's event loops once asyncio is imported."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return _THREAD_SHARED
    return (*_THREAD_SHARED, asyncio.AbstractEventLoop)


def _random_generators() -> tuple[type, ...]:
    """``random.Random`` (and ``SystemRandom``), and numpy's generators once ``numpy.random`` is imported.

    Not before: no object of this process can be one of its generators, and
    importing it (numpy loads it lazily) cost a bound method's first map ~10 ms.
    """
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        return (random.Random,)
    return (random.Random, np_random.Generator, np_random.RandomState, np_random.BitGenerator)
