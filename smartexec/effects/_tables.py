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
    "warnings": frozenset({"simplefilter", "filterwarnings", "resetwarnings"}),
    "logging": frozenset({"basicConfig", "disable"}),
    "contextlib": frozenset({"redirect_stdout", "redirect_stderr", "chdir"}),
    "socket": frozenset({"setdefaulttimeout"}),
    "_socket": frozenset({"setdefaulttimeout"}),
    "atexit": frozenset({"register", "unregister"}),
    "threading": frozenset({"settrace", "setprofile", "stack_size"}),
    "importlib": frozenset({"reload", "invalidate_caches"}),
    "numpy": frozenset({"seterr", "seterrcall", "set_printoptions", "setbufsize"}),
    "ctypes": frozenset({"memmove", "memset"}),
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
    return None


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
    | {"memoryview", "as_strided"}
)
#: Builtins whose result holds (iterates over) their arguments' elements.
HOLDING_BUILTINS = frozenset(
    {"iter", "reversed", "enumerate", "zip", "sorted", "list", "tuple", "set", "dict"}
    | {"filter", "frozenset", "copy", "chain"}
)
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


def user_code(code: types.CodeType) -> bool:
    """Whether ``code`` is the user's own (read), not the standard library's or a package's."""
    name = code.co_filename
    if not name or name.startswith("<frozen"):
        return False
    if name.startswith("<"):
        return True  # <stdin>, <string>, a notebook cell: the user's, source permitting
    path = os.path.realpath(name)
    return not any(path.startswith(p) for p in INSTALLED)


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
