"""The tables: which standard-library and numpy callables change the process or their arguments, and which code is the user's own (read) rather than installed (trusted)."""

from __future__ import annotations

import functools
import os
import random
import sys
import sysconfig
import types
from typing import Any

from ._found import Kind

# --- the tables --------------------------------------------------------------

#: Functions that change state of the whole process, by module.
PROCESS_STATE: dict[str, frozenset[str]] = {
    "posix": frozenset(
        {"chdir", "fchdir", "chroot", "putenv", "unsetenv", "umask", "nice", "setsid"}
        | {"setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid", "setgroups"}
        | {"setpgid", "setpgrp", "setpriority", "sched_setaffinity", "register_at_fork"}
        | {"_exit", "abort", "kill", "killpg", "fork", "forkpty", "closerange"}
        | {"execv", "execve"}
    ),
    "os": frozenset(
        {"execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "putenv", "unsetenv"}
        | {"chdir", "fchdir", "umask", "_exit", "kill", "abort"}
    ),
    "sys": frozenset(
        {"exit", "setrecursionlimit", "setswitchinterval", "settrace", "setprofile"}
        | {"setdlopenflags", "set_int_max_str_digits", "addaudithook", "set_asyncgen_hooks"}
    ),
    "signal": frozenset(
        {"signal", "alarm", "setitimer", "pthread_sigmask", "siginterrupt", "set_wakeup_fd"}
        | {"pause", "raise_signal", "pthread_kill"}
    ),
    "_signal": frozenset({"signal", "alarm", "setitimer", "pthread_sigmask", "raise_signal"}),
    "locale": frozenset({"setlocale"}),
    "_locale": frozenset({"setlocale"}),
    "time": frozenset({"tzset"}),
    "gc": frozenset({"disable", "enable", "set_threshold", "freeze", "unfreeze"}),
    "faulthandler": frozenset({"enable", "disable", "register", "dump_traceback_later"}),
    "warnings": frozenset({"simplefilter", "filterwarnings", "resetwarnings", "catch_warnings"}),
    "logging": frozenset({"basicConfig", "disable", "captureWarnings", "addLevelName"}),
    "resource": frozenset({"setrlimit", "prlimit"}),
    "csv": frozenset({"field_size_limit", "register_dialect", "unregister_dialect"}),
    "_csv": frozenset({"field_size_limit", "register_dialect", "unregister_dialect"}),
    "asyncio": frozenset({"set_event_loop", "set_event_loop_policy"}),
    "asyncio.events": frozenset({"set_event_loop", "set_event_loop_policy"}),
    "contextlib": frozenset({"redirect_stdout", "redirect_stderr", "chdir"}),
    "socket": frozenset({"setdefaulttimeout"}),
    "_socket": frozenset({"setdefaulttimeout"}),
    "atexit": frozenset({"register", "unregister"}),
    "threading": frozenset({"settrace", "setprofile", "stack_size"}),
    "importlib": frozenset({"reload", "invalidate_caches"}),
    "numpy": frozenset({"seterr", "seterrcall", "set_printoptions", "setbufsize"}),
    "ctypes": frozenset({"memmove", "memset"}),
    "threadpoolctl": frozenset({"threadpool_limits"}),
    "decimal": frozenset({"setcontext"}),
    "_decimal": frozenset({"setcontext"}),
}

#: Modules every function of which acts on the whole process.
PROCESS_MODULES = ("faulthandler", "signal", "_signal")
#: Modules that reach raw memory: what their calls write cannot be read.
RAW_MEMORY_MODULES = (
    "ctypes",
    "_ctypes",
    "numpy.ctypeslib",
    "numpy.lib.stride_tricks",
    "numpy.lib._stride_tricks_impl",
)


def _in_modules(module: str, modules: tuple[str, ...]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in modules)


def table_effect(obj: Any, module: str, name: str) -> tuple[Kind, str] | None:
    """What the tables say calling ``obj`` (``module.name``) does: ``(kind, what)``, or None.

    Kinds as :class:`~smartexec.effects.Effect`'s: ``"process"`` for
    :data:`PROCESS_STATE`, :data:`PROCESS_MODULES` and the legacy
    ``numpy.random`` functions; ``"unread"`` for :data:`RAW_MEMORY_MODULES`
    and the builtins that run code they build.
    """
    dotted = f"{module}.{name}" if module else name
    if name in PROCESS_STATE.get(module, ()) or numpy_global_random(obj, module):
        return "process", f"changes process state (`{dotted}`)"
    if _in_modules(module, PROCESS_MODULES):
        return "process", f"acts on the whole process (`{dotted}`)"
    if _in_modules(module, RAW_MEMORY_MODULES):
        return "unread", f"reaches raw memory (`{dotted}`)"
    if module == "builtins" and name in UNREADABLE_BUILTINS:
        return "unread", f"runs code it builds (`{dotted}`)"
    if name in THREAD_STATE.get(module, ()):
        return "shared", f"uses state of the thread it runs in (`{dotted}`)"
    return None


#: Functions whose answer depends on which thread calls them (a worker
#: process's calls all run in its main thread).
THREAD_STATE: dict[str, frozenset[str]] = {
    "asyncio": frozenset({"get_event_loop"}),
    "_asyncio": frozenset({"get_event_loop"}),
    "asyncio.events": frozenset({"get_event_loop"}),
    "threading": frozenset({"main_thread", "current_thread"}),
}


#: Functions that write into an argument, by (module, name): the argument's position.
WRITES_ARGUMENT: dict[tuple[str, str], int] = {
    **{("numpy", n): 0 for n in ("copyto", "put", "place", "putmask", "fill_diagonal")},
    ("numpy", "put_along_axis"): 0,
    **{(m, n): 0 for m in ("heapq", "_heapq") for n in ("heappush", "heappop", "heapify")},
    **{(m, n): 0 for m in ("heapq", "_heapq") for n in ("heapreplace", "heappushpop")},
    **{(m, n): 0 for m in ("bisect", "_bisect") for n in ("insort", "insort_left", "insort_right")},
    **{(m, n): 0 for m in ("operator", "_operator") for n in ("setitem", "delitem", "iadd")},
    **{(m, n): 0 for m in ("operator", "_operator") for n in ("iconcat", "isub", "imul", "ior")},
    ("builtins", "setattr"): 0,
    ("builtins", "delattr"): 0,
    ("struct", "pack_into"): 1,
    ("_struct", "pack_into"): 1,
    ("posix", "readv"): 1,
    # numpy's positional ``out`` (a keyword ``out=`` is read wherever it is)
    **{("numpy", n): 3 for n in ("clip", "take", "cumsum", "cumprod", "sum", "mean", "prod")},
    **{("numpy", n): 2 for n in ("dot", "round", "around", "argmax", "argmin", "max", "min")},
    **{("numpy", n): 2 for n in ("amax", "amin", "any", "all")},
    ("posix", "preadv"): 1,
}

#: Methods that change the object they are called on (lists, dicts, sets,
#: deques, arrays, files, hashes are read as the usual types do).
MUTATING_METHODS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update"}
    | {"setdefault", "add", "discard", "sort", "reverse", "appendleft", "extendleft"}
    | {"popleft", "rotate", "fill", "resize", "itemset", "setflags", "partition", "put"}
    | {"put_nowait", "write", "writelines", "truncate", "seek", "shuffle", "seed", "setstate"}
    | {"difference_update", "intersection_update", "symmetric_difference_update"}
    | {"__setitem__", "__delitem__", "__iadd__", "__imul__", "__ior__", "__iand__"}
)
#: Methods that write into their first argument (``f.readinto(buf)``).
METHODS_WRITING_ARGUMENT = frozenset(
    {"readinto", "readinto1", "recv_into", "recvfrom_into", "shuffle", "at"}
)
#: Methods whose result is the object itself or a view of it.
VIEW_METHODS = frozenset(
    {"view", "reshape", "ravel", "transpose", "swapaxes", "squeeze", "__enter__", "cast"}
    | {"getbuffer", "toreadonly", "__iter__"}
)
#: Methods whose result is an element of the object.
ELEMENT_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__", "popleft"})
#: Methods whose result iterates over the object's elements.
ITER_METHODS = frozenset({"values", "items", "keys", "copy", "tolist"})
#: Functions whose result is their first argument or a view of it.
PASS_THROUGH = frozenset(
    {"asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require"}
    | {"atleast_1d", "atleast_2d", "atleast_3d", "reshape", "ravel", "transpose"}
    | {"squeeze", "moveaxis", "swapaxes", "expand_dims", "broadcast_to", "frombuffer"}
    | {"memoryview", "as_strided", "ChainMap", "flip", "fliplr", "flipud", "real", "imag"}
    | {"asarray_chkfinite", "diagonal", "matrix_transpose", "permute_dims"}
)
#: Builtins whose result holds (iterates over) their arguments' elements.
HOLDING_BUILTINS = frozenset(
    {"iter", "reversed", "enumerate", "zip", "sorted", "list", "tuple", "set", "dict"}
    | {"filter", "frozenset", "copy", "chain", "islice", "nditer", "ndenumerate"}
    | {"split", "array_split", "hsplit", "vsplit", "dsplit", "unstack"}
)
#: The modules a decimal context comes from.
DECIMAL_MODULES = ("decimal", "_decimal", "_pydecimal")
#: What runs code the syntax tree does not show.
UNREADABLE_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "breakpoint"})
#: Module-level objects of the process itself.
PROCESS_OBJECTS: dict[int, str] = {
    id(os.environ): "os.environ",
    id(os.environb): "os.environb",
    id(sys.path): "sys.path",
    id(sys.modules): "sys.modules",
    id(sys.meta_path): "sys.meta_path",
}
#: Objects whose writes are not state of the callable's (streams of this process).
STREAMS = frozenset({id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)})
IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset, type(...))
CALLED_ONLY = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    functools.partial,
)


def global_generators() -> dict[int, str]:
    """The process's global random generators: their methods use process state."""
    found = {id(random._inst): "random"}
    numpy_random = sys.modules.get("numpy.random.mtrand")
    rand = getattr(numpy_random, "_rand", None)
    if rand is not None:
        found[id(rand)] = "numpy.random"
    return found


def installed_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(sorted({os.path.realpath(paths[k]) + os.sep for k in keys if k in paths}))


INSTALLED = installed_paths()


@functools.lru_cache(maxsize=4096)
def _installed(name: str) -> bool:
    """Whether the file ``name`` lies under the standard library's or the packages' paths."""
    path = os.path.realpath(name)
    return any(path.startswith(p) for p in INSTALLED)


def user_code(code: types.CodeType) -> bool:
    """Whether ``code`` is the user's own (read), not the standard library's or a package's."""
    name = code.co_filename
    if not name or name.startswith("<frozen"):
        return False
    if name.startswith("<"):
        return True  # <stdin>, <string>, a notebook cell: the user's, source permitting
    return not _installed(name)


def user_module(module: types.ModuleType) -> bool:
    """Whether ``module`` is the user's own (a file outside the installed paths)."""
    name = getattr(module, "__file__", None)
    if not isinstance(name, str):
        return module.__name__ == "__main__"  # an interactive session's
    if module.__name__.split(".")[0] in sys.stdlib_module_names:
        return False
    return not _installed(name)


def stdlib_type(cls: type) -> bool:
    """Whether ``cls`` comes from the standard library (read by name), not a package (trusted)."""
    module = getattr(cls, "__module__", None) or "builtins"
    return module.split(".")[0] in sys.stdlib_module_names


def place(code: types.CodeType, line: int) -> str:
    return f"{os.path.basename(code.co_filename)}:{line}"


def qualified(obj: Any) -> tuple[str, str]:
    try:
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__name__", None)
    except Exception:  # noqa: BLE001 - an odd object: not in the tables
        return "", ""
    if not isinstance(module, str):
        owner = getattr(obj, "__self__", None)
        module = owner.__name__ if isinstance(owner, types.ModuleType) else ""
    return module, name if isinstance(name, str) else ""


def numpy_global_random(obj: Any, module: str) -> bool:
    """A legacy ``numpy.random`` function: it uses the global generator's state."""
    if not (module == "numpy.random" or module.startswith("numpy.random.")):
        return False
    if isinstance(obj, type) or "." in str(getattr(obj, "__qualname__", "")):
        return False
    return getattr(obj, "__name__", "") not in ("default_rng",)


def is_generator(obj: Any) -> bool:
    """A random number generator object: its draws change its state."""
    if obj is None or isinstance(obj, type):
        return False
    if isinstance(obj, random.Random):
        return True
    kind = type(obj)
    return kind.__name__ in ("RandomState", "Generator") and kind.__module__.startswith(
        "numpy.random"
    )


def is_ufunc(obj: Any) -> bool:
    kind = type(obj)
    return kind.__name__ == "ufunc" and kind.__module__ == "numpy"


# --- methods that only read the object they are called on ---------------------

#: Methods of these types beyond :data:`MUTATING_METHODS` that change the object.
_ALSO_MUTATING = frozenset({"setfield", "byteswap", "dump", "tofile", "set", "put_nowait"})


def _read_only_methods() -> dict[type, frozenset[str]]:
    import collections
    import contextvars
    import datetime
    import decimal
    import fractions
    import hashlib
    import logging
    import pathlib
    import re
    import threading

    types_read = [str, bytes, bytearray, int, float, complex, tuple, list, dict, set, frozenset]
    types_read += [range, memoryview, collections.deque, datetime.date, datetime.time]
    types_read += [datetime.timedelta, pathlib.PurePath, pathlib.Path, decimal.Decimal]
    types_read += [fractions.Fraction, re.Pattern, re.Match, type(hashlib.sha256())]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        types_read += [numpy.ndarray, numpy.generic]
    found = {
        cls: frozenset(n for n in dir(cls) if not n.startswith("_"))
        - MUTATING_METHODS
        - _ALSO_MUTATING
        for cls in types_read
    }
    # Thread-safe by design, and what one call does there no other call sees.
    found[logging.Logger] = frozenset(
        {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"}
        | {"isEnabledFor", "getEffectiveLevel", "getChild", "hasHandlers"}
    )
    found[contextvars.ContextVar] = frozenset({"get", "name"})
    for lock in (threading.Lock(), threading.RLock()):
        found[type(lock)] = frozenset({"acquire", "release", "locked", "__enter__", "__exit__"})
    return found


#: The table, built at first use, again once numpy is loaded (its types join it).
_READ_ONLY: dict[type, frozenset[str]] = {}


def reads_only(name: str, cls: type | None = None) -> bool:
    """Whether method ``name`` only reads its object, on ``cls`` (by its MRO) or, None, on any known type.

    Types not in the table (a queue, a user's class) answer False: such a
    method may change its object.
    """
    numpy = sys.modules.get("numpy")
    if not _READ_ONLY or (numpy is not None and numpy.ndarray not in _READ_ONLY):
        _READ_ONLY.clear()
        _READ_ONLY.update(_read_only_methods())
        _READ_ONLY[object] = frozenset().union(*_READ_ONLY.values())
    if cls is None:
        return name in _READ_ONLY[object]
    for base in cls.__mro__:
        if base is not object and base in _READ_ONLY:
            return name in _READ_ONLY[base]
    return False
