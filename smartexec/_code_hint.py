"""What a Python function's own code says about its cost and GIL use, read without running it.

Two readings of the bytecode, for callables not measured yet:

* :func:`code_hint`: straight-line code (no loop, no branch) that calls a
  function known to release the GIL (``time.sleep``, hashlib, zlib,
  ``urllib.request.urlopen``, numpy), and no Python helper of its own,
  most likely spends its time in that call: ``def fetch(i): time.sleep(0.01)``, ``def total(a): return
  np.einsum("i,i->", a, a)``. The policy starts such a callable's first map
  on threads, where its first chunks measure the GIL and move the rest to
  processes if they find it held (:mod:`smartexec.policy`). A measurement
  always wins over the hint.
* :func:`arithmetic_only`: code that only does arithmetic on its arguments
  (``def square(x): return x * x``) costs well under a microsecond an item
  on small numbers (:func:`small_numbers`) and can neither crash nor act on
  the process: a first map of it starts in a loop in the calling thread.

Only names the code loads as globals or from its closure's cells (and
attributes of modules reached through them) are resolved, by dictionary
lookups: nothing is imported, called, or looked up through ``__getattr__``.
A jump on the main path (a loop, or a branch: ``if retry: time.sleep(1)``
beside the real work; not the code a ``with`` block or an ``except`` clause
runs on an error, which follows the return; there, only a call that waits
whatever its arguments gives a hint), nested code (a comprehension before
Python 3.12, an inner function), a generator or coroutine, or code over :data:`MAX_CODE_BYTES`
give no hint: their time may go anywhere.

These readings say where the time goes, never whether threads are safe:
that is :mod:`smartexec.effects`' one job (a ``global`` statement, a seeded
global generator, ``os._exit``, ``ctypes``: the policy keeps such code off
threads whatever its hint, :func:`smartexec.policy.permits`).
"""

from __future__ import annotations

import builtins
import dis
import inspect
import types
from typing import Any

__all__ = [
    "code_hint",
    "operator_hint",
    "arithmetic_only",
    "small_numbers",
    "ARITHMETIC_ONLY",
    "MAX_CODE_BYTES",
]

#: Longer code is not read (a function that long does more than one call).
MAX_CODE_BYTES = 2048

_NOT_FOUND = object()

_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs) | frozenset(getattr(dis, "hasjump", ()))

#: Instructions that set up an exception handler (Python 3.10): the main
#: path goes on past them; the handler's code follows the function's return.
_HANDLER_SETUPS = frozenset({"SETUP_WITH", "SETUP_FINALLY", "SETUP_ASYNC_WITH"})

#: After the first return of straight-line code, only exception handlers
#: follow (a ``with`` block's exit on an error, an ``except`` clause); the
#: code an unconditional forward jump passes over is one too.
_RETURNS = frozenset({"RETURN_VALUE", "RETURN_CONST"})

_NOT_PLAIN = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
    | inspect.CO_ITERABLE_COROUTINE
)

_NUMPY = "numpy computes on arrays without the GIL"

#: Types of numpy's callables that the numpy hint covers (not, e.g.,
#: ``np.vectorize``, whose calls run a Python function).
_NUMPY_CALLABLES = frozenset({"ufunc", "_ArrayFunctionDispatcher"})


def _release_hint(obj: Any) -> str | None:
    """Why calling ``obj`` releases the GIL, or None (a dictionary lookup, never a call)."""
    from .inspection import _gil_hint as gil_hint
    from .inspection import attribute

    if isinstance(obj, (type, types.ModuleType)) or not callable(obj):
        return None
    hint = gil_hint(obj)
    if hint is not None:
        return hint
    module = attribute(obj, "__module__")
    if not isinstance(module, str) or not (module == "numpy" or module.startswith("numpy.")):
        return None
    kind = type(obj)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)) or (
        kind.__name__ in _NUMPY_CALLABLES and kind.__module__.startswith("numpy")
    ):
        return _NUMPY
    return None


def code_hint(fn: Any) -> str | None:
    """Why ``fn``'s code suggests it runs without the GIL, or None.

    Args:
        fn: any object; only a Python function (``types.FunctionType``) can
            give a hint.

    Returns:
        e.g. ``"its code calls time.sleep, with no loop or branch (time.sleep
        waits without the GIL)"``, or None: not a plain Python function; a
        loop, a branch or nested code in it; a call of Python code of its
        own (a function, a class with an ``__init__``, a method of an object
        of its globals); no call of a known GIL-releasing function; or code
        over :data:`MAX_CODE_BYTES`. Never raises.
    """
    from .inspection import _waits_when_called as waits_when_called

    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or not isinstance(code, types.CodeType):
        return None
    if len(code.co_code) > MAX_CODE_BYTES or code.co_flags & _NOT_PLAIN:
        return None
    if any(isinstance(const, types.CodeType) for const in code.co_consts):
        return None
    namespace = fn.__globals__
    builtins_ns = namespace.get("__builtins__", builtins)
    if isinstance(builtins_ns, types.ModuleType):
        builtins_ns = vars(builtins_ns)
    if not isinstance(builtins_ns, dict):
        builtins_ns = vars(builtins)
    cells: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    found: str | None = None
    current: Any = _NOT_FOUND
    dotted = ""
    try:
        instructions = list(dis.get_instructions(code))
    except Exception:  # noqa: BLE001 - odd code objects give no hint
        return None
    # A with block or a try (the exception table; a handler's set-up on 3.10):
    # only a call that waits whatever its arguments gives a hint there. A
    # block that opens a file to hash it spends its time in Python for small
    # files: 7,733 standard-library files (36 us an item) started on threads
    # by the hashlib hint were measured holding the GIL, and the detour to
    # processes took the map from 0.19 s to 0.3 s.
    guarded = bool(getattr(code, "co_exceptiontable", b"")) or any(
        ins.opname in _HANDLER_SETUPS for ins in instructions
    )
    resume_at = -1  # an unconditional jump's target: the code before it runs only on an error
    for ins in instructions:
        if ins.offset < resume_at:
            continue
        if ins.opname in _RETURNS:
            break  # the rest runs only on an error: a with block's exit, an except
        if ins.opname in _HANDLER_SETUPS:
            continue  # not a branch: the main path goes on
        if ins.opname == "JUMP_FORWARD" and isinstance(ins.argval, int):
            # Over a handler (no conditional jump came before it): the main
            # path goes on at its target.
            resume_at = ins.argval
            continue
        if ins.opcode in _JUMPS or ins.opname == "FOR_ITER":
            # A loop (its time may go anywhere), or a branch: the call may be
            # the rare path (a retry's back-off sleep beside the real work).
            return None
        if ins.opname == "LOAD_GLOBAL" and isinstance(ins.argval, str):
            dotted = ins.argval
            current = namespace.get(dotted, builtins_ns.get(dotted, _NOT_FOUND))
        elif ins.opname == "LOAD_DEREF" and ins.argval in cells:
            dotted = ins.argval
            current = cells[dotted]
        elif (
            ins.opname in ("LOAD_ATTR", "LOAD_METHOD")
            and isinstance(current, types.ModuleType)
            and isinstance(ins.argval, str)
        ):
            dotted = f"{dotted}.{ins.argval}"
            current = vars(current).get(ins.argval, _NOT_FOUND)
            if current is _NOT_FOUND:
                return None  # not loaded yet (numpy loads np.random lazily): unknown
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and current is not _NOT_FOUND:
            return None  # a method of an object of its globals: Python code, maybe
        else:
            current = _NOT_FOUND
            continue
        if current is _NOT_FOUND:
            return None  # a global not defined yet: it could be anything
        hint = _release_hint(current)
        if hint is None and not _plain_c(current):
            # Python code of its own (a helper of the user's), or a wrapper
            # that may call some (a partial, an lru_cache, np.vectorize):
            # its time may go anywhere (``python_loop(n) + np.sort(a)[0]``
            # holds the GIL half the time).
            return None
        if found is None and hint is not None and (not guarded or waits_when_called(current)):
            found = f"its code calls {dotted}, with no loop or branch ({hint})"
    return found


def _plain_c(obj: Any) -> bool:
    """Whether ``obj`` is a module, plain data, or a C callable that runs no Python code of the user's.

    A builtin function, or a class whose construction runs no Python
    ``__init__`` / ``__new__`` (``float``, ``bytes``): yes. A Python
    function, a bound method, a class of the user's, any other callable
    object (``functools.partial``, an ``lru_cache`` wrapper, a Cython
    function, ``np.vectorize``): no.
    """
    if isinstance(obj, types.ModuleType) or not callable(obj):
        return True
    if isinstance(obj, types.BuiltinFunctionType):
        return True
    if isinstance(obj, type):
        try:
            return not any(
                isinstance(
                    inspect.getattr_static(obj, name, None), (types.FunctionType, staticmethod)
                )
                for name in ("__init__", "__new__")
            )
        except Exception:  # noqa: BLE001 - an odd metaclass: assume the worst
            return False
    return False


#: Instructions of code that only moves values between locals and constants
#: and does arithmetic and comparisons on them (Python 3.10 to 3.14 names).
_ARITHMETIC_ONLY = frozenset(
    {
        "RESUME",
        "NOP",
        "CACHE",
        "NOT_TAKEN",
        "POP_TOP",
        "COPY",
        "SWAP",
        "ROT_TWO",
        "ROT_THREE",
        "DUP_TOP",
        "LOAD_FAST",
        "LOAD_FAST_CHECK",
        "LOAD_FAST_AND_CLEAR",
        "LOAD_FAST_LOAD_FAST",
        "LOAD_FAST_BORROW",
        "LOAD_FAST_BORROW_LOAD_FAST_BORROW",
        "LOAD_CONST",
        "LOAD_SMALL_INT",
        "STORE_FAST",
        "STORE_FAST_LOAD_FAST",
        "STORE_FAST_STORE_FAST",
        "BINARY_OP",
        "COMPARE_OP",
        "UNARY_NEGATIVE",
        "UNARY_POSITIVE",
        "UNARY_NOT",
        "UNARY_INVERT",
        "TO_BOOL",
        "BUILD_TUPLE",
        "RETURN_VALUE",
        "RETURN_CONST",
        # Python 3.10's arithmetic, one opcode per operator
        "BINARY_ADD",
        "BINARY_SUBTRACT",
        "BINARY_MULTIPLY",
        "BINARY_TRUE_DIVIDE",
        "BINARY_FLOOR_DIVIDE",
        "BINARY_MODULO",
        "BINARY_AND",
        "BINARY_OR",
        "BINARY_XOR",
        "BINARY_RSHIFT",
        "INPLACE_ADD",
        "INPLACE_SUBTRACT",
        "INPLACE_MULTIPLY",
        "INPLACE_TRUE_DIVIDE",
        "INPLACE_FLOOR_DIVIDE",
        "INPLACE_MODULO",
        "INPLACE_AND",
        "INPLACE_OR",
        "INPLACE_XOR",
        "INPLACE_RSHIFT",
    }
)

#: The operators arithmetic-only code may use (Python 3.11+ ``BINARY_OP``):
#: not ``**`` or ``<<`` (``2 ** n`` builds an n-bit number), nor ``[]``
#: (3.14's item access, which may run the user's ``__getitem__``).
_ARITHMETIC_OPERATORS = frozenset(
    {"+", "-", "*", "/", "//", "%", "&", "|", "^", ">>"}
    | {"+=", "-=", "*=", "/=", "//=", "%=", "&=", "|=", "^=", ">>="}
)
_MULTIPLY = frozenset({"*", "*=", "BINARY_MULTIPLY", "INPLACE_MULTIPLY"})

#: At most this many instructions, of which this many multiplications: on
#: numbers under 2**63, ``x * x`` four times over stays under 1,024 bits,
#: where 23 squarings in a row took 1.6 s for one item.
MAX_ARITHMETIC_INSTRUCTIONS = 64
MAX_MULTIPLICATIONS = 4

#: The exact types (not subclasses, whose operators may be the user's) of
#: the numbers arithmetic-only code may run on here.
NUMBER_TYPES = frozenset({int, float, complex, bool})

#: Why such code is cheap, for ``explain()``.
ARITHMETIC_ONLY = (
    "its code only does arithmetic on its arguments (no call, no loop, no attribute or "
    "item access), and they are small numbers: well under a microsecond an item, far "
    "less than sending one to a worker costs"
)


def arithmetic_only(fn: Any) -> bool:
    """Whether ``fn`` is a Python function whose code only does arithmetic on its locals.

    No call, no loop or branch, no attribute, item or global access, no
    ``**`` or ``<<``: on small numbers each call costs well under a
    microsecond, and nothing in it can crash or act on the process (an
    operand of the user's own type could run its own ``__mul__``: the caller
    checks the arguments are numbers, :func:`small_numbers`).

    Args:
        fn: any object.

    Returns:
        True or False; never raises.
    """
    if not isinstance(fn, types.FunctionType):  # first: others may run their own __getattr__
        return False
    code = fn.__code__
    if len(code.co_code) > MAX_CODE_BYTES or code.co_flags & _NOT_PLAIN or code.co_freevars:
        return False
    if fn.__defaults__ or fn.__kwdefaults__:
        return False  # a default may be an object of the user's, with its own __mul__
    try:
        instructions = list(dis.get_instructions(code))
    except Exception:  # noqa: BLE001 - odd code objects: not known to be cheap
        return False
    if len(instructions) > MAX_ARITHMETIC_INSTRUCTIONS:
        return False
    multiplications = 0
    for ins in instructions:
        if ins.opname not in _ARITHMETIC_ONLY:
            return False
        if ins.opname == "BINARY_OP" and ins.argrepr not in _ARITHMETIC_OPERATORS:
            return False
        if ins.argrepr in _MULTIPLY or ins.opname in _MULTIPLY:
            multiplications += 1
        if ins.opname in ("LOAD_CONST", "RETURN_CONST", "LOAD_SMALL_INT"):
            value = ins.argval
            if value is not None and not _small_number(value):
                return False  # b"\0" * n: a string, not a number
    return multiplications <= MAX_MULTIPLICATIONS


def _small_number(value: Any) -> bool:
    """Whether ``value`` is a number of :data:`NUMBER_TYPES`, an ``int`` under 2**63 in size."""
    kind = type(value)
    if kind is int:
        return bool(-(2**63) <= value < 2**63)
    return kind in NUMBER_TYPES


def small_numbers(iterables: tuple[Any, ...]) -> bool:
    """Whether every iterable holds numbers only, the first of them small (read, not consumed).

    Only lists, tuples and ranges are looked at. Every item must be a
    ``bool``, ``int``, ``float`` or ``complex`` (exactly those types: a
    subclass's operators may be the user's code, which must not run here),
    checked at C speed (~17 ns an item); the first must be small (an
    ``int`` under 2**63 in size). False for anything else, or an empty input.
    """
    if not iterables:
        return False
    for iterable in iterables:
        if not isinstance(iterable, (list, tuple, range)) or len(iterable) == 0:
            return False
        if not _small_number(iterable[0]):
            return False
        if not isinstance(iterable, range) and not NUMBER_TYPES.issuperset(map(type, iterable)):
            return False
    return True


#: ``operator`` functions whose result may be far bigger than their
#: arguments (``2 ** n``, ``1 << n``): the work is not one pass over them.
_OPERATOR_GROWING = frozenset({"pow", "ipow", "lshift", "ilshift", "call"})


def operator_hint(fn: Any) -> str | None:
    """Why an ``operator`` function is served better by threads, or None.

    ``operator.add`` and its kin do one operation, one pass over their
    arguments: pickling those arguments to a worker process, and the result
    back, costs about as much as the operation itself, and a process round
    trip (~150 us) far more than one on small numbers (20,000
    ``submit(operator.add, i, i)`` went to fork workers until their first
    calls were measured). Not for ``pow`` and ``lshift``, whose result can
    be far bigger than their arguments, nor ``call``, which runs any callable.

    Args:
        fn: any object.

    Returns:
        The reason, or None for anything but such a builtin. Never raises.
    """
    if not isinstance(fn, types.BuiltinFunctionType):
        return None
    from .inspection import attribute

    module, name = attribute(fn, "__module__"), attribute(fn, "__name__")
    if module not in ("_operator", "operator") or not isinstance(name, str):
        return None
    if name in _OPERATOR_GROWING:
        return None
    return (
        f"operator.{name} does one operation, one pass over its arguments: sending them "
        f"to a process costs about as much as the operation, and a process round trip "
        f"far more on small values"
    )
