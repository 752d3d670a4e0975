"""Reading a function whose source is not found, from its bytecode: what it rebinds, and that it writes."""

from __future__ import annotations

import types
from collections.abc import Iterator
from dis import get_instructions

from ._refs import Ref, Root, root_ref
from ._scope import Budget
from ._tables import MUTATING_METHODS, place

__all__ = ["read_bytecode"]

#: Instructions that write into an object (which one, bytecode cannot say).
OBJECT_WRITES = frozenset(
    {"STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR", "STORE_SLICE"}
)


def codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in its constants."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from codes(const)


def read_bytecode(budget: Budget, fn: types.FunctionType) -> Ref:
    """Read ``fn`` by its bytecode into ``budget``: any write into an object is unread.

    Returns:
        What its result may refer to: something shared, as nothing says otherwise.
    """
    for sub in codes(fn.__code__):
        for ins in get_instructions(sub):
            positions = getattr(ins, "positions", None)
            line = positions.lineno if positions is not None else None
            where = place(sub, line or sub.co_firstlineno)
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                budget.add("shared", f"rebinds module-level `{ins.argval}`", where)
            elif ins.opname == "STORE_DEREF" and ins.argval in sub.co_freevars:
                budget.add("shared", f"rebinds closure variable `{ins.argval}`", where)
            elif ins.opname in OBJECT_WRITES or (
                ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval in MUTATING_METHODS
            ):
                budget.add(
                    "unread", f"{fn.__qualname__} writes into an object; no source to say which", ""
                )
        if any(isinstance(c, tuple) and "out" in c for c in sub.co_consts):
            budget.add("unread", f"{fn.__qualname__} passes an `out=`; no source to say where", "")
    return root_ref(Root("shared", f"what {fn.__qualname__} returns"))
