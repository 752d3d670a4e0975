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
thread on the same terms: it writes nothing another call or the caller
sees (a module-level object written there is the caller's own, and keeps
what the map wrote after it), no process state and none of its arguments. The
user widens that: ``backend=``, ``prefer="threads"``, or
:func:`thread_safe` on the callable.
"""

from __future__ import annotations

from ._found import MAX_DEPTH, MAX_FUNCTIONS, Effect, Effects, thread_safe
from ._in_process import process_local_reason
from ._kinds import effects_of

__all__ = [
    "Effect",
    "Effects",
    "effects_of",
    "thread_safe",
    "process_local_reason",
    "MAX_DEPTH",
    "MAX_FUNCTIONS",
]
