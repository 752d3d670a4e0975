"""The fork backend: worker processes forked from the caller, with trampolines.

Data flow (one *pool* = one generation of workers, forked from one snapshot)::

    submit_chunk ──pickle──> queue ──dispatcher thread──> worker i (own pipe)
         │                                  ▲                    │
         └── SharedRef(token) for shared    └──── ChunkResult ───┘
             callables: a few bytes              (or its death: sentinel)

* Each worker has its own duplex pipe and runs one chunk at a time, so the
  dispatcher always knows which chunk a worker holds: a worker that dies fails
  only that chunk (:class:`~smartexec.errors.WorkerCrashedError`) and is
  replaced; the pool stays usable.
* A callable the policy marks *shared* is never pickled: the parent puts it in
  :mod:`smartexec.trampoline`'s table for the duration of each fork, the worker
  inherits it by copy-on-write, and tasks carry a :class:`SharedRef`.
* Workers see a shared callable's object as it was when ``map()`` or
  ``submit()`` was called, never an older copy. A ``map`` runs on a pool
  forked after it was called: the first chunk of each map of a shared
  callable starts a new pool (forking a process costs about a millisecond
  per 100 MB of mapped memory; hashing 100 MB, 40-80 ms), and its later
  chunks use that snapshot. A ``submit`` reuses the current pool when a
  SHA-1 digest of the object's pickled state (numpy buffers hashed in place,
  :func:`smartexec._fingerprint.digest`) equals the one taken when that pool
  forked; otherwise it starts a new pool too, as it does once that
  callable's digest took longer than the last pool took to start, while
  the current pool runs no call (:func:`smartexec.tuning.digest_pays`). The old pool finishes the
  chunks already running on it, then stops, and the new one takes over
  those queued; while both run, up to twice ``max_workers`` processes exist.
* A pickled callable (``helpers.scale``) runs in a worker on that worker's
  copy of its modules. A pool serves its ``map`` or ``submit`` only while
  the module-level values it reads by name are those the pool recorded as
  it forked (:mod:`smartexec._module_reads`: the same objects, and a digest
  of mutable ones); otherwise a new pool forks, as for a shared callable.
  A new pool records what the callables run lately read, so maps of a few
  callables alternating on one executor share it.
* ``submit_chunk`` returns at once: it queues the chunk's task, then pickles
  it in the submitting thread when it is plain data, or on the backend's
  sender thread (:mod:`smartexec._sender`), in order. A payload that cannot
  be pickled fails the chunk's future (naming the part that failed); the
  dispatcher starts tasks in queue order once they are pickled.
* A pool starts with one worker and forks more, up to ``max_workers``, when
  chunks wait behind busy workers (see :data:`GROW_WORK_S`).
* Workers ignore SIGINT (the parent decides what Ctrl-C stops) and exit on
  their own within :data:`PARENT_CHECK_S` seconds if the parent dies.
"""

from ._backend import ForkBackend
from ._parts import _may_fork_directly, _Poller  # noqa: F401 - for tests
from ._pool import _ForkPool  # noqa: F401 - for tests

__all__ = ["ForkBackend"]
