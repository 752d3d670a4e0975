"""What a callable may change besides its return value, read from its code: its effects.

A route may change how fast a map runs, never what it computes. On worker
processes every call starts from a copy of the caller's state and what it
writes stays in its worker; on threads all calls share one process, and in
a loop in the calling thread they share the caller's own state. A function
that is right on a ``ProcessPoolExecutor`` can therefore be wrong on the
other two routes:

* it writes an object other calls see (a module-level scratch buffer, a
  dict filled per item, a closure's cell, the object a method is bound to,
  a default argument value): on threads, calls overwrite each other;
* it changes the process (``os.chdir``, ``os.environ[...] = ...``,
  ``random.seed``, a signal handler, ``sys.setrecursionlimit``, ...): on
  threads calls overwrite each other, and on threads or in a loop the
  caller's own process is changed;
* it writes into an argument in place (``row += 1``, ``np.log1p(row,
  out=row)``, ``items.sort()``): on threads or in a loop the caller's own
  objects change, where a worker process writes into its copy.

:func:`effects_of` reads a callable's code for those writes, without running
it: the function's syntax tree (from its source), followed into the
module-level functions, methods and classes of the user's own code that it
calls, to :data:`MAX_DEPTH` levels and :data:`MAX_FUNCTIONS` functions, and
tables for the standard library and numpy (:data:`PROCESS_STATE`,
:data:`WRITES_ARGUMENT`, :data:`MUTATING_METHODS`). Code of installed
packages and native code not in the tables is trusted, as a
``ThreadPoolExecutor`` trusts it, and :class:`Effects` names what it trusted.
What it cannot see into (a call of a callable it was passed, ``exec``, a
function whose source is not found, code over the limits) is an
``"unread"`` effect, which keeps the callable off threads and the calling
thread like a write does.

:meth:`Effects.allows` answers which routes are safe: threads only when
nothing it writes can be seen by another call; a loop in the calling
thread only when it changes no process state and none of its arguments (a
module-level scratch object is safe there: items run one at a time). The
user widens that: ``backend=``, ``prefer="threads"``, or
:func:`thread_safe` on the callable.
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import inspect
import linecache
import os
import random
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = ["Effect", "Effects", "effects_of", "thread_safe", "MAX_DEPTH", "MAX_FUNCTIONS"]

F = TypeVar("F", bound=Callable[..., Any])

#: How many levels of calls into the user's own code are read.
MAX_DEPTH = 4
#: How many functions one reading may read in all; past it, the rest is "unread".
MAX_FUNCTIONS = 40

Kind = Literal["shared", "process", "argument", "unread"]

#: The routes each kind of effect keeps a callable off, and why.
_OFF: dict[str, tuple[str, ...]] = {
    "shared": ("thread",),
    "process": ("thread", "inline"),
    "argument": ("thread", "inline"),
    "unread": ("thread", "inline"),
}

_DECLARED = "__smartexec_thread_safe__"


@dataclass(frozen=True)
class Effect:
    """One thing a callable may change, and where its code does it.

    Attributes:
        kind: ``"shared"`` (an object other calls see), ``"process"`` (state
            of the whole process), ``"argument"`` (an argument, in place) or
            ``"unread"`` (code that could not be read).
        what: e.g. ``"writes module-level `_BUF`"``.
        where: ``"file.py:12"``, or ``""`` when not known.
    """

    kind: Kind
    what: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.what} ({self.where})" if self.where else self.what


@dataclass(frozen=True)
class Effects:
    """What :func:`effects_of` found a callable may change.

    Attributes:
        found: the effects, in the order the code has them (at most one per
            kind and object).
        trusted: native or installed-package callables it calls that are not
            in the tables, by name: trusted to change nothing shared.
        declared: the user declared it thread-safe (:func:`thread_safe`).
    """

    found: tuple[Effect, ...] = ()
    trusted: tuple[str, ...] = ()
    declared: bool = False

    def blocking(self, route: str) -> Effect | None:
        """The first effect that keeps the callable off ``route``, or None.

        Args:
            route: ``"thread"`` (this process's threads) or ``"inline"`` (a
                loop in the calling thread); any other route (a process
                backend) is never blocked.
        """
        if self.declared:
            return None
        return next((e for e in self.found if route in _OFF[e.kind]), None)

    def allows(self, route: str) -> bool:
        """Whether ``route`` computes what worker processes would (see :meth:`blocking`)."""
        return self.blocking(route) is None

    def reason(self, route: str) -> str | None:
        """Why the callable is kept off ``route``, with the opt-in, or None when it is not."""
        effect = self.blocking(route)
        if effect is None:
            return None
        where = "threads" if route == "thread" else "the calling thread"
        return (
            f"{effect}: kept off {where}, where calls would see each other's writes or "
            f"change the caller (smartexec.thread_safe(fn), prefer='threads' or "
            f"backend='thread' runs it there all the same)"
        )

    def trust_note(self) -> str | None:
        """Which native calls a threads route trusted, for ``explain()``, or None."""
        if not self.trusted:
            return None
        names = ", ".join(self.trusted[:4]) + (", ..." if len(self.trusted) > 4 else "")
        return f"trusted to change no shared state (native code, not read): {names}"


def thread_safe(fn: F) -> F:
    """Declare that ``fn``'s calls may share this process: threads and a loop are safe for it.

    smartexec keeps a callable off threads when its code writes an object
    other calls see, changes the process or writes into its arguments
    (:func:`effects_of`). Use this when those writes are safe all the same
    (guarded by a lock, or meant to be shared), as you would on a
    ``ThreadPoolExecutor``. Works as a decorator; returns ``fn`` itself.

    Args:
        fn: a Python function, a bound method (the declaration goes on its
            function, so every object's method is declared), a
            ``functools.partial`` (on the partial) or a callable object
            that takes attributes.

    Returns:
        ``fn``, unchanged but for the declaration.

    Raises:
        TypeError: ``fn`` is not callable, or takes no attributes (a
            built-in function): pass ``prefer="threads"`` or
            ``backend="thread"`` to the executor instead.
    """
    if not callable(fn):
        raise TypeError(f"thread_safe() takes a callable, got {type(fn).__name__}")
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    try:
        setattr(target, _DECLARED, True)
    except (AttributeError, TypeError):
        raise TypeError(
            f"thread_safe() cannot mark {fn!r}: it takes no attributes; pass "
            f"prefer='threads' or backend='thread' to the SmartExecutor instead"
        ) from None
    return fn


def _declared(fn: Any) -> bool:
    """Whether :func:`thread_safe` marked ``fn`` (lookups only: no ``__getattr__`` runs)."""
    found = [fn]
    if isinstance(fn, types.MethodType):
        found.append(fn.__func__)
    elif isinstance(fn, functools.partial):
        found.append(fn.func)
    for obj in found:
        try:
            own = object.__getattribute__(obj, "__dict__")
        except Exception:  # noqa: BLE001 - an odd object: not marked
            continue
        if isinstance(own, dict) and own.get(_DECLARED) is True:
            return True
    return False


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
    "socket": frozenset({"setdefaulttimeout"}),
    "_socket": frozenset({"setdefaulttimeout"}),
    "atexit": frozenset({"register", "unregister"}),
    "threading": frozenset({"settrace", "setprofile", "stack_size"}),
    "importlib": frozenset({"reload", "invalidate_caches"}),
    "numpy": frozenset({"seterr", "seterrcall", "set_printoptions", "setbufsize"}),
    "ctypes": frozenset({"memmove", "memset"}),
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
_VIEW_METHODS = frozenset(
    {"view", "reshape", "ravel", "transpose", "swapaxes", "squeeze", "__enter__", "cast"}
    | {"getbuffer", "toreadonly", "__iter__"}
)
#: Methods whose result is an element of the object.
_ELEMENT_METHODS = frozenset({"get", "setdefault", "pop", "__getitem__", "popleft"})
#: Methods whose result iterates over the object's elements.
_ITER_METHODS = frozenset({"values", "items", "keys", "copy", "tolist"})
#: Functions whose result is their first argument or a view of it.
_PASS_THROUGH = frozenset(
    {"asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require"}
    | {"atleast_1d", "atleast_2d", "atleast_3d", "reshape", "ravel", "transpose"}
    | {"squeeze", "moveaxis", "swapaxes", "expand_dims", "broadcast_to", "frombuffer"}
    | {"memoryview", "as_strided"}
)
#: Builtins whose result holds (iterates over) their arguments' elements.
_HOLDING_BUILTINS = frozenset(
    {"iter", "reversed", "enumerate", "zip", "sorted", "list", "tuple", "set", "dict"}
    | {"filter", "frozenset", "copy", "chain"}
)
#: What runs code the syntax tree does not show.
_UNREADABLE_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "breakpoint"})
#: Module-level objects of the process itself.
_PROCESS_OBJECTS: dict[int, str] = {
    id(os.environ): "os.environ",
    id(os.environb): "os.environb",
    id(sys.path): "sys.path",
    id(sys.modules): "sys.modules",
    id(sys.meta_path): "sys.meta_path",
}
#: Objects whose writes are not state of the callable's (streams of this process).
_STREAMS = frozenset({id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)})
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset, type(...))
_CALLED_ONLY = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    functools.partial,
)


def _global_generators() -> dict[int, str]:
    """The process's global random generators: their methods use process state."""
    found = {id(random._inst): "random"}
    numpy_random = sys.modules.get("numpy.random.mtrand")
    rand = getattr(numpy_random, "_rand", None)
    if rand is not None:
        found[id(rand)] = "numpy.random"
    return found


def _installed_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(sorted({os.path.realpath(paths[k]) + os.sep for k in keys if k in paths}))


_INSTALLED = _installed_paths()


# --- what an expression may refer to ----------------------------------------


@dataclass(frozen=True)
class _Root:
    """An object a function did not create: its argument, a shared object, or process state."""

    kind: Literal["argument", "shared", "process"]
    label: str


_Roots = frozenset  # of _Root


@dataclass(frozen=True)
class _Ref:
    """What an expression's value may be, or hold: the objects a write through it reaches.

    ``direct``: objects the value may be (a write to it writes them).
    ``inner``: objects its elements or attributes may be.
    """

    direct: frozenset[_Root] = frozenset()
    inner: frozenset[_Root] = frozenset()

    def __or__(self, other: _Ref) -> _Ref:
        return _Ref(self.direct | other.direct, self.inner | other.inner)

    def element(self) -> _Ref:
        both = self.direct | self.inner
        return _Ref(both, both)

    def holding(self) -> _Ref:
        return _Ref(frozenset(), self.direct | self.inner)


_NOTHING = _Ref()
_MISSING = object()


def _root_ref(root: _Root) -> _Ref:
    return _Ref(frozenset({root}), frozenset({root}))


def _object_ref(obj: Any, label: str) -> _Ref:
    """The reference to a module-level object or closure value ``obj`` named ``label``."""
    if id(obj) in _STREAMS or isinstance(obj, _IMMUTABLE):
        return _NOTHING
    if id(obj) in _PROCESS_OBJECTS:
        return _root_ref(_Root("process", _PROCESS_OBJECTS[id(obj)]))
    if isinstance(obj, types.ModuleType):
        return _root_ref(_Root("shared", f"module `{obj.__name__}`"))
    if isinstance(obj, type):
        if obj.__module__ == "builtins":
            return _NOTHING
        return _root_ref(_Root("shared", f"class `{obj.__qualname__}`"))
    if _is_ufunc(obj) or isinstance(obj, _CALLED_ONLY):
        return _NOTHING  # called, not written; a write to its attributes is rare
    if isinstance(obj, tuple) and all(isinstance(x, _IMMUTABLE) for x in obj):
        return _NOTHING
    return _root_ref(_Root("shared", label))


def _user_code(code: types.CodeType) -> bool:
    """Whether ``code`` is the user's own (read), not the standard library's or a package's."""
    name = code.co_filename
    if not name or name.startswith("<frozen"):
        return False
    if name.startswith("<"):
        return True  # <stdin>, <string>, a notebook cell: the user's, source permitting
    path = os.path.realpath(name)
    return not any(path.startswith(p) for p in _INSTALLED)


def _where(code: types.CodeType, line: int) -> str:
    return f"{os.path.basename(code.co_filename)}:{line}"


# --- finding a function's syntax tree ------------------------------------------

_TREES: collections.OrderedDict[tuple[str, int, int], ast.Module | None] = collections.OrderedDict()
_TREES_LOCK = threading.Lock()
_MAX_TREES = 64

_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _tree(code: types.CodeType, module_globals: dict[str, Any]) -> ast.Module | None:
    """The parsed source file of ``code``, cached while the file's lines are unchanged."""
    lines = linecache.getlines(code.co_filename, module_globals)
    if not lines:
        return None
    key = (code.co_filename, len(lines), hash(lines[-1]) ^ hash(lines[0]))
    with _TREES_LOCK:
        if key in _TREES:
            _TREES.move_to_end(key)
            return _TREES[key]
    try:
        tree: ast.Module | None = ast.parse("".join(lines))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        tree = None
    with _TREES_LOCK:
        _TREES[key] = tree
        while len(_TREES) > _MAX_TREES:
            _TREES.popitem(last=False)
    return tree


def _params(node: _FunctionNode) -> list[str]:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names


def _code_params(code: types.CodeType) -> list[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return list(code.co_varnames[:n])


def _nodes_of(fn: types.FunctionType) -> list[_FunctionNode] | None:
    """The syntax tree nodes ``fn``'s code was compiled from, or None when not found.

    A node matches on its first line, its name and its parameters; two
    lambdas on one line with the same parameters both match (both are read).
    """
    code = fn.__code__
    tree = _tree(code, fn.__globals__)
    if tree is None:
        return None
    name, first, params = code.co_name, code.co_firstlineno, _code_params(code)
    found: list[_FunctionNode] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda):
            lines = {node.lineno}
            node_name = "<lambda>"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = {node.lineno, *(d.lineno for d in node.decorator_list[:1])}
            node_name = node.name
        else:
            continue
        if first in lines and node_name == name and _params(node) == params:
            found.append(node)
    return found or None


# --- reading ----------------------------------------------------------------


class _Budget:
    def __init__(self) -> None:
        self.functions = 0
        self.found: dict[tuple[str, str], Effect] = {}
        self.trusted: dict[str, None] = {}
        self.stack: list[types.CodeType] = []

    def add(self, kind: Kind, what: str, where: str) -> None:
        self.found.setdefault((kind, what), Effect(kind, what, where))


@dataclass
class _Call:
    """What a call passes: its positional and keyword arguments' references."""

    args: list[_Ref] = field(default_factory=list)
    keywords: dict[str, _Ref] = field(default_factory=dict)
    spread: _Ref = _NOTHING  # *args / **kwargs
    #: the map's own call: each parameter not bound otherwise is the caller's argument
    mapped: bool = False


class _Scope:
    """One function's names while it is read: what each may refer to."""

    def __init__(
        self,
        reader: _Reader,
        fn: types.FunctionType,
        node: _FunctionNode,
        params: dict[str, _Ref],
        known: dict[str, Any],
        parent: _Scope | None = None,
    ):
        self.reader, self.fn, self.node, self.parent = reader, fn, node, parent
        self.code = fn.__code__
        self.env: dict[str, _Ref] = dict(params)
        self.known = known  # names whose object is known (a bound method's self)
        self.globals_declared: set[str] = set()
        self.nonlocals: set[str] = set()
        self.locals: set[str] = set(_params(node))
        self.returns = _NOTHING
        body = node.body if isinstance(node.body, list) else [node.body]
        for sub in _own_nodes(body):
            if isinstance(sub, ast.Global):
                self.globals_declared.update(sub.names)
            elif isinstance(sub, ast.Nonlocal):
                self.nonlocals.update(sub.names)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                self.locals.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.locals.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                self.locals.update((a.asname or a.name).split(".")[0] for a in sub.names)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                self.locals.add(sub.name)
        self.locals -= self.globals_declared | self.nonlocals
        self.cells: dict[str, Any] = {}
        for name, cell in zip(self.code.co_freevars, fn.__closure__ or ()):
            try:
                self.cells[name] = cell.cell_contents
            except ValueError:
                self.cells[name] = _MISSING

    # -- names and values

    def lookup(self, name: str) -> _Ref:
        if name in self.locals:
            return self.env.get(name, _NOTHING)
        if self.parent is not None and name not in self.globals_declared:
            return self.parent.lookup(name)
        if name in self.cells:
            value = self.cells[name]
            if value is _MISSING:
                return _root_ref(_Root("shared", f"closure variable `{name}`"))
            return _object_ref(value, f"closure variable `{name}`")
        value = self.global_value(name)
        if value is _MISSING:
            return _NOTHING
        return _object_ref(value, f"module-level `{name}`")

    def global_value(self, name: str) -> Any:
        if name in self.cells:
            return self.cells[name]
        namespace = self.fn.__globals__
        if name in namespace:
            return namespace[name]
        spaces = namespace.get("__builtins__", builtins)
        spaces = vars(spaces) if isinstance(spaces, types.ModuleType) else spaces
        return spaces.get(name, _MISSING) if isinstance(spaces, dict) else _MISSING

    def value(self, expr: ast.expr) -> Any:
        """The object ``expr`` names, found by dictionary lookups only, or _MISSING."""
        if isinstance(expr, ast.Name):
            if expr.id in self.known:
                return self.known[expr.id]
            if expr.id in self.locals:
                return _MISSING
            if self.parent is not None and expr.id not in self.globals_declared:
                return self.parent.value(expr)
            return self.global_value(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.value(expr.value)
            if owner is _MISSING:
                return _MISSING
            return _static_attribute(owner, expr.attr)
        return _MISSING

    def bind(self, name: str, ref: _Ref) -> None:
        if name in self.locals:
            old = self.env.get(name, _NOTHING)
            self.env[name] = old | ref
        elif self.parent is not None and name in self.nonlocals:
            self.parent.bind(name, ref)


def _static_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` found without running code (no descriptors, no ``__getattr__``).

    Module attributes, a class's attributes, an instance's own attributes,
    and the Python methods of an instance's class (bound to it); a built-in
    method of an instance is not resolved (its call is judged by its name).
    """
    if isinstance(owner, types.ModuleType):
        return vars(owner).get(name, _MISSING)
    if isinstance(owner, type):
        try:
            found = inspect.getattr_static(owner, name)
        except (AttributeError, TypeError, ValueError):
            return _MISSING
        if isinstance(found, (staticmethod, classmethod)):
            return found.__get__(None, owner)
        return found
    own = getattr(owner, "__dict__", None)
    if isinstance(own, dict) and name in own:
        return own[name]
    try:
        found = inspect.getattr_static(type(owner), name)
    except (AttributeError, TypeError, ValueError):
        return _MISSING
    if isinstance(found, types.FunctionType):
        return types.MethodType(found, owner)
    if isinstance(found, staticmethod):
        return found.__func__
    if isinstance(found, classmethod):
        return types.MethodType(found.__func__, type(owner))
    return _MISSING


def _own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """The nodes of ``body``, not descending into nested functions, lambdas or classes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))


class _Reader:
    """Reads functions for effects, into one :class:`_Budget`."""

    def __init__(self) -> None:
        self.budget = _Budget()

    def effects(self) -> tuple[tuple[Effect, ...], tuple[str, ...]]:
        return tuple(self.budget.found.values()), tuple(self.budget.trusted)

    def unread(self, what: str, where: str = "") -> None:
        self.budget.add("unread", what, where)

    def write(self, ref: _Ref, how: str, where: str) -> None:
        """Record a write through a reference: into an argument, a shared object, the process."""
        for root in sorted(ref.direct, key=lambda r: (r.kind, r.label)):
            if root.kind == "argument":
                self.budget.add("argument", f"writes into its argument {root.label}{how}", where)
            elif root.kind == "process":
                self.budget.add("process", f"changes {root.label}{how}", where)
            else:
                self.budget.add("shared", f"writes {root.label}{how}", where)

    def function(
        self,
        fn: types.FunctionType,
        call: _Call,
        known: dict[str, Any] | None = None,
        self_ref: _Ref | None = None,
    ) -> _Ref:
        """Read ``fn`` called with ``call``'s references; returns what its result may refer to."""
        code = fn.__code__
        if _declared(fn) or not _user_code(code):
            return _NOTHING
        if code in self.budget.stack:
            return _NOTHING  # recursion: read once
        if len(self.budget.stack) >= MAX_DEPTH or self.budget.functions >= MAX_FUNCTIONS:
            self.unread(f"calls {fn.__qualname__}, past what is read", "")
            return _NOTHING
        nodes = _nodes_of(fn)
        if nodes is None:
            return self.bytecode(fn)
        self.budget.functions += 1
        self.budget.stack.append(code)
        try:
            result = _NOTHING
            for node in nodes:
                params = _bind(fn, node, call, self_ref)
                scope = _Scope(self, fn, node, params, known or {})
                _FunctionReader(scope).read()
                result = result | scope.returns
            return result
        finally:
            self.budget.stack.pop()

    def bytecode(self, fn: types.FunctionType) -> _Ref:
        """Read a function whose source is not found: any write into an object is unread."""
        from dis import get_instructions

        code = fn.__code__
        for sub in _codes(code):
            for ins in get_instructions(sub):
                positions = getattr(ins, "positions", None)
                line = positions.lineno if positions is not None else None
                where = _where(sub, line or sub.co_firstlineno)
                if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                    self.budget.add("shared", f"rebinds module-level `{ins.argval}`", where)
                elif ins.opname == "STORE_DEREF" and ins.argval in sub.co_freevars:
                    self.budget.add("shared", f"rebinds closure variable `{ins.argval}`", where)
                elif ins.opname in _OBJECT_WRITES or (
                    ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in MUTATING_METHODS
                ):
                    self.unread(f"{fn.__qualname__} writes into an object; no source to say which")
        return _root_ref(_Root("shared", f"what {fn.__qualname__} returns"))


_OBJECT_WRITES = frozenset(
    {"STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR", "STORE_SLICE"}
)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _bind(
    fn: types.FunctionType, node: _FunctionNode, call: _Call, self_ref: _Ref | None
) -> dict[str, _Ref]:
    """Each parameter of ``node`` and what the call (or its default) passes it."""
    a = node.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    bound: dict[str, _Ref] = {}
    if self_ref is not None and positional:
        bound[positional[0]] = self_ref
        positional = positional[1:]
    for name, ref in zip(positional, call.args):
        bound[name] = ref
    extra = call.args[len(positional) :]
    if a.vararg is not None:
        bound[a.vararg.arg] = functools.reduce(_Ref.__or__, extra, call.spread).holding()
    for name, ref in call.keywords.items():
        if name in positional or name in (x.arg for x in a.kwonlyargs):
            bound[name] = bound.get(name, _NOTHING) | ref
    if a.kwarg is not None:
        bound[a.kwarg.arg] = call.spread.holding()
    values = fn.__defaults__ or ()
    defaults = dict(zip(positional[len(positional) - len(values) :], values))
    defaults.update(fn.__kwdefaults__ or {})
    for name in _params(node):
        if name in bound:
            continue
        ref = _root_ref(_Root("argument", f"`{name}`")) if call.mapped else call.spread
        if name in defaults:
            ref = ref | _object_ref(defaults[name], f"the default value of `{name}`")
        bound[name] = ref
    return bound


class _FunctionReader:
    """Walks one function's body: binds names to references, then records its writes and calls."""

    #: Passes over the body to let names settle (``a = b`` before ``b = arg``).
    PASSES = 3

    def __init__(self, scope: _Scope):
        self.scope = scope
        self.record = False

    def read(self) -> None:
        node = self.scope.node
        body: list[ast.AST] = list(node.body) if isinstance(node.body, list) else [node.body]
        for _ in range(self.PASSES):
            before = dict(self.scope.env)
            for stmt in body:
                self.visit(stmt)
            if before == self.scope.env:
                break
        self.record = True
        for stmt in body:
            self.visit(stmt)
        if isinstance(node, ast.Lambda):
            self.scope.returns = self.ref(node.body)

    def where(self, node: ast.AST) -> str:
        return _where(self.scope.code, getattr(node, "lineno", self.scope.code.co_firstlineno))

    # -- statements

    def visit(self, node: ast.AST) -> None:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            method(node)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            self.nested(node)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.ref(child)
            else:
                self.visit(child)

    def visit_Assign(self, node: ast.Assign) -> None:
        ref = self.ref(node.value)
        for target in node.targets:
            self.store(target, ref, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.store(node.target, self.ref(node.value), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.ref(node.value)
        target = node.target
        if isinstance(target, ast.Name):
            # In place on a mutable object (a list, an array): the object it names.
            self.write(self.scope.lookup(target.id), " in place", node)
            self.store(target, _NOTHING, node)
        else:
            self.store(target, _NOTHING, node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.store(target, _NOTHING, node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.store(node.target, self.ref(node.iter).element(), node)
        for stmt in (*node.body, *node.orelse):
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            ref = self.ref(item.context_expr)
            if item.optional_vars is not None:
                self.store(item.optional_vars, ref, node)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncWith = visit_With

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.scope.returns = self.scope.returns | self.ref(node.value)

    def visit_Global(self, node: ast.Global) -> None:
        return None

    def nested(self, node: ast.AST) -> None:
        """A nested function or class: its body is read as if it ran (its names see ours)."""
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                self.visit(stmt)
            return
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for default in (*node.args.defaults, *(d for d in node.args.kw_defaults if d)):
            self.ref(default)
        if self.record:
            inner = _Scope(self.scope.reader, self.scope.fn, node, {}, {}, parent=self.scope)
            inner.cells = {}
            _FunctionReader(inner).read()
        if not isinstance(node, ast.Lambda):
            self.scope.bind(node.name, _NOTHING)

    # -- stores and writes

    def store(self, target: ast.expr, ref: _Ref, node: ast.AST) -> None:
        scope = self.scope
        if isinstance(target, ast.Name):
            if target.id in scope.globals_declared:
                if self.record:
                    scope.reader.budget.add(
                        "shared", f"rebinds module-level `{target.id}`", self.where(node)
                    )
            elif target.id in scope.nonlocals and scope.parent is None:
                if self.record:
                    scope.reader.budget.add(
                        "shared", f"rebinds closure variable `{target.id}`", self.where(node)
                    )
            else:
                scope.bind(target.id, ref)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.store(elt, ref.element(), node)
        elif isinstance(target, ast.Starred):
            self.store(target.value, ref.holding(), node)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            if isinstance(target, ast.Subscript):
                self.ref(target.slice)
            owner = self.ref(target.value)
            self.write(owner, "", node)

    def write(self, ref: _Ref, how: str, node: ast.AST) -> None:
        if self.record:
            self.scope.reader.write(ref, how, self.where(node))

    # -- expressions

    def ref(self, expr: ast.expr) -> _Ref:
        """What ``expr``'s value may refer to; records the writes and calls in it."""
        scope = self.scope
        if isinstance(expr, ast.Name):
            return scope.lookup(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = scope.value(expr.value)
            if isinstance(owner, types.ModuleType):
                value = _static_attribute(owner, expr.attr)
                if value is not _MISSING:
                    return _object_ref(value, f"module-level `{_dotted(expr)}`")
            return self.ref(expr.value).element()
        if isinstance(expr, ast.Subscript):
            self.ref(expr.slice)
            return self.ref(expr.value).element()
        if isinstance(expr, ast.Starred):
            return self.ref(expr.value)
        if isinstance(expr, ast.NamedExpr):
            ref = self.ref(expr.value)
            self.store(expr.target, ref, expr)
            return ref
        if isinstance(expr, ast.Call):
            return self.call(expr)
        if isinstance(expr, (ast.IfExp, ast.BoolOp)):
            parts = [expr.body, expr.orelse] if isinstance(expr, ast.IfExp) else expr.values
            if isinstance(expr, ast.IfExp):
                self.ref(expr.test)
            return functools.reduce(_Ref.__or__, (self.ref(p) for p in parts), _NOTHING)
        if isinstance(expr, ast.Tuple):
            refs = [self.ref(e) for e in expr.elts]
            return functools.reduce(_Ref.__or__, refs, _NOTHING).holding()
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in expr.generators:
                self.store(gen.target, self.ref(gen.iter).element(), expr)
                for cond in gen.ifs:
                    self.ref(cond)
            parts = [expr.key, expr.value] if isinstance(expr, ast.DictComp) else [expr.elt]
            refs = [self.ref(p) for p in parts]
            return functools.reduce(_Ref.__or__, refs, _NOTHING).holding()
        if isinstance(expr, ast.Lambda):
            self.nested(expr)
            return _NOTHING
        for child in ast.iter_child_nodes(expr):
            if isinstance(child, ast.expr):
                self.ref(child)
            elif isinstance(child, ast.AST):
                self.visit(child)
        return _NOTHING

    def call(self, node: ast.Call) -> _Ref:
        call = _Call()
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                call.spread = call.spread | self.ref(arg.value).element()
            else:
                call.args.append(self.ref(arg))
        for kw in node.keywords:
            if kw.arg is None:
                call.spread = call.spread | self.ref(kw.value).element()
            else:
                call.keywords[kw.arg] = self.ref(kw.value)
        if "out" in call.keywords:
            self.write(call.keywords["out"].element() | call.keywords["out"], " (out=)", node)
        callee = self.scope.value(node.func)
        if callee is not _MISSING:
            return self.known_call(callee, call, node)
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = self.ref(func.value)
            if _is_generator(self.scope.value(func.value)):
                self.write(receiver, f" (draws from it: `{_dotted(func)}`)", node)
            return self.method_call(func.attr, receiver, call, node)
        target = self.ref(func)
        if self.record:
            what = _dotted(func) or "a callable it computes"
            if target.direct or isinstance(func, ast.Name):
                self.scope.reader.unread(
                    f"calls `{what}`, which it cannot see into", self.where(node)
                )
            else:
                self.scope.reader.unread(
                    f"calls {what}, which it cannot see into", self.where(node)
                )
        return _NOTHING

    def method_call(self, name: str, receiver: _Ref, call: _Call, node: ast.Call) -> _Ref:
        if name in MUTATING_METHODS:
            self.write(receiver, f" (.{name}())", node)
        if name in METHODS_WRITING_ARGUMENT and call.args:
            self.write(call.args[0], f" (.{name}())", node)
        if name in _VIEW_METHODS:
            return receiver
        if name in _ELEMENT_METHODS:
            return receiver.element()
        if name in _ITER_METHODS:
            return receiver.holding()
        return _NOTHING

    def known_call(self, callee: Any, call: _Call, node: ast.Call) -> _Ref:
        """A call of an object found by lookups: the tables, or its code read in turn."""
        reader = self.scope.reader
        if not self.record:
            return _result_ref(callee, call)
        where = self.where(node)
        name = _dotted(node.func)
        if _declared(callee):
            return _result_ref(callee, call)
        owner = getattr(callee, "__self__", None)
        generators = _global_generators()
        if owner is not None and id(owner) in generators and not isinstance(owner, type):
            reader.budget.add(
                "process",
                f"uses the process's global {generators[id(owner)]} generator (`{name}`)",
                where,
            )
        elif _is_generator(owner) and isinstance(node.func, ast.Attribute):
            self.write(self.ref(node.func.value), f" (draws from it: `{name}`)", node)
        module, fname = _qualified(callee)
        if fname in PROCESS_STATE.get(module, ()) or _numpy_global_random(callee, module):
            reader.budget.add("process", f"changes process state (`{name}`)", where)
        if fname in _UNREADABLE_BUILTINS and module == "builtins":
            reader.unread(f"runs code it builds (`{name}`)", where)
        position = WRITES_ARGUMENT.get((module, fname))
        if position is not None and position < len(call.args):
            self.write(call.args[position], f" (`{name}`)", node)
        if isinstance(callee, types.MethodType) and isinstance(callee.__func__, types.FunctionType):
            self_ref = (
                self.ref(node.func.value) if isinstance(node.func, ast.Attribute) else _NOTHING
            )
            return reader.function(
                callee.__func__, call, {_first(callee.__func__): owner}, self_ref
            )
        if isinstance(callee, types.FunctionType):
            return reader.function(callee, call)
        if isinstance(callee, type):
            init = inspect.getattr_static(callee, "__init__", None)
            if isinstance(init, types.FunctionType):
                reader.function(init, call, None, _NOTHING)
            return _NOTHING
        if isinstance(callee, functools.partial):
            return _NOTHING
        if _is_ufunc(callee):
            nin = int(getattr(callee, "nin", 1))
            for out in call.args[nin:]:
                self.write(out, f" (`{name}` out)", node)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            # A built-in method bound at module level (`_add = _SEEN.add`).
            if id(owner) in generators or _is_ufunc(owner):
                return _NOTHING
            receiver = _object_ref(owner, f"the object `{name}` is bound to")
            return self.method_call(getattr(callee, "__name__", ""), receiver, call, node)
        if isinstance(callee, (types.MethodDescriptorType, types.WrapperDescriptorType)):
            if getattr(callee, "__name__", "") in MUTATING_METHODS and call.args:
                self.write(call.args[0], f" (`{name}`)", node)
            return _NOTHING
        if (
            callable(callee)
            and not isinstance(callee, types.BuiltinFunctionType)
            and not _is_ufunc(callee)
        ):
            call_method = inspect.getattr_static(type(callee), "__call__", None)
            if isinstance(call_method, types.FunctionType) and _user_code(call_method.__code__):
                receiver = _object_ref(callee, f"module-level `{name}`")
                return reader.function(call_method, call, {_first(call_method): callee}, receiver)
        if fname and module not in ("builtins",):
            reader.budget.trusted.setdefault(f"{module}.{fname}" if module else fname, None)
        return _result_ref(callee, call)


def _first(fn: types.FunctionType) -> str:
    code = fn.__code__
    return code.co_varnames[0] if code.co_argcount else ""


def _qualified(obj: Any) -> tuple[str, str]:
    try:
        module = getattr(obj, "__module__", None)
        name = getattr(obj, "__name__", None)
    except Exception:  # noqa: BLE001 - an odd object: not in the tables
        return "", ""
    if not isinstance(module, str):
        owner = getattr(obj, "__self__", None)
        module = owner.__name__ if isinstance(owner, types.ModuleType) else ""
    return module, name if isinstance(name, str) else ""


def _numpy_global_random(obj: Any, module: str) -> bool:
    """A legacy ``numpy.random`` function: it uses the global generator's state."""
    if not (module == "numpy.random" or module.startswith("numpy.random.")):
        return False
    if isinstance(obj, type) or "." in str(getattr(obj, "__qualname__", "")):
        return False
    return getattr(obj, "__name__", "") not in ("default_rng",)


def _is_generator(obj: Any) -> bool:
    """A random number generator object: its draws change its state."""
    if obj is None or isinstance(obj, type):
        return False
    if isinstance(obj, random.Random):
        return True
    kind = type(obj)
    return kind.__name__ in ("RandomState", "Generator") and kind.__module__.startswith(
        "numpy.random"
    )


def _is_ufunc(obj: Any) -> bool:
    kind = type(obj)
    return kind.__name__ == "ufunc" and kind.__module__ == "numpy"


def _result_ref(callee: Any, call: _Call) -> _Ref:
    """What the result of a known callable refers to: its first argument, for views and iterators."""
    name = getattr(callee, "__name__", "")
    if name in _PASS_THROUGH and call.args:
        return call.args[0]
    if name in _HOLDING_BUILTINS:
        return functools.reduce(_Ref.__or__, call.args, call.spread).holding()
    if name == "globals" and getattr(callee, "__module__", "") == "builtins":
        return _root_ref(_Root("shared", "its module's globals"))
    return _NOTHING


def _dotted(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr}" if base else expr.attr
    return ""


# --- the entry point ----------------------------------------------------------


def effects_of(fn: Callable[..., Any]) -> Effects:
    """What ``fn`` may change besides its return value, read from its code without running it.

    Args:
        fn: any callable: a function, lambda or closure, a bound method (its
            object is shared by every call), a ``functools.partial`` (its
            bound arguments are shared), a callable object, a class, a
            built-in.

    Returns:
        An :class:`Effects`; ``Effects(declared=True)`` for a callable
        declared with :func:`thread_safe`. Never raises: code that cannot be
        read is an ``"unread"`` effect.
    """
    if _declared(fn):
        return Effects(declared=True)
    reader = _Reader()
    try:
        _read_callable(reader, fn, _mapped_call(), 0)
    except RecursionError:
        reader.unread("code nested too deep to read")
    except Exception as exc:  # noqa: BLE001 - reading is advice: an odd object is unread
        reader.unread(f"its code could not be read ({type(exc).__name__})")
    found, trusted = reader.effects()
    return Effects(found, trusted)


def _read_callable(reader: _Reader, fn: Any, call: _Call, depth: int) -> None:
    """Read any kind of callable, as called with ``call``'s (the map's) arguments."""
    if depth > 3:
        reader.unread(f"{type(fn).__name__} wraps too many layers to read")
        return
    if isinstance(fn, functools.partial):
        bound = [_object_ref(a, "an argument bound in the partial") for a in fn.args]
        keywords = {
            k: _object_ref(v, f"the partial's keyword `{k}`") for k, v in fn.keywords.items()
        }
        inner = _Call(bound, keywords, _argument_ref(), mapped=True)
        _read_callable(reader, fn.func, inner, depth + 1)
        return
    if isinstance(fn, types.MethodType):
        _read_method(reader, fn, call)
        return
    if isinstance(fn, types.FunctionType):
        reader.function(fn, call)
        return
    if isinstance(fn, type):
        init = inspect.getattr_static(fn, "__init__", None)
        if isinstance(init, types.FunctionType):
            reader.function(init, call, None, _NOTHING)
        return
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)) or _is_ufunc(fn):
        receiver = _NOTHING
        if owner is not None and not isinstance(owner, types.ModuleType):
            receiver = _object_ref(owner, f"the object it is bound to (a {type(owner).__name__})")
        _read_builtin(reader, fn, owner, receiver)
        return
    call_method = inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(call_method, types.FunctionType):
        receiver = _object_ref(fn, f"the callable object (a {type(fn).__name__})")
        reader.function(call_method, call, {_first(call_method): fn}, receiver)
        return
    _read_builtin(reader, fn, owner, _NOTHING)


def _read_method(reader: _Reader, fn: types.MethodType, call: _Call) -> None:
    """A bound method: its object is shared by every call."""
    owner = fn.__self__
    if isinstance(owner, type):
        receiver = _object_ref(owner, f"class `{owner.__qualname__}`")
    else:
        receiver = _object_ref(owner, f"the object it is bound to (a {type(owner).__name__})")
    generators = _global_generators()
    name = getattr(fn, "__name__", "")
    if id(owner) in generators:
        what = f"uses the process's global {generators[id(owner)]} generator (`{name}`)"
        reader.budget.add("process", what, "")
    elif _is_generator(owner):
        reader.write(receiver, f" (draws from it: `{name}`)", "")
    if name in METHODS_WRITING_ARGUMENT and _is_generator(owner):
        reader.write(_argument_ref(), f" (`{name}`)", "")
    if isinstance(fn.__func__, types.FunctionType):
        reader.function(fn.__func__, call, {_first(fn.__func__): owner}, receiver)
    else:
        _read_builtin(reader, fn.__func__, owner, receiver)


def _argument_ref() -> _Ref:
    return _root_ref(_Root("argument", "(an item of the map)"))


def _mapped_call() -> _Call:
    """A call as ``map`` makes it: every argument is the caller's."""
    return _Call(spread=_argument_ref(), mapped=True)


def _read_builtin(reader: _Reader, fn: Any, owner: Any, receiver: _Ref) -> None:
    """A native callable: the tables, else trusted."""
    module, name = _qualified(fn)
    generators = _global_generators()
    if owner is not None and id(owner) in generators:
        reader.budget.add(
            "process", f"uses the process's global {generators[id(owner)]} generator (`{name}`)", ""
        )
        return
    if name in PROCESS_STATE.get(module, ()) or _numpy_global_random(fn, module):
        reader.budget.add("process", f"changes process state (`{module}.{name}`)", "")
    if (module, name) in WRITES_ARGUMENT or name in METHODS_WRITING_ARGUMENT and owner is not None:
        reader.write(_argument_ref(), f" (`{name}`)", "")
    if name in MUTATING_METHODS and owner is not None and not isinstance(owner, types.ModuleType):
        reader.write(receiver, f" (.{name}())", "")
    elif name:
        reader.budget.trusted.setdefault(f"{module}.{name}" if module else name, None)
