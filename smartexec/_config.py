"""What the user asked for, as the policy reads it: :class:`Options`, and its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Options", "BIG_STATE_BYTES", "PREFER_VALUES"]

#: State bigger than this is shared with fork workers by copy-on-write rather
#: than pickled with every chunk. At 1 MiB, pickling and piping the state costs
#: about 1 ms per chunk, the same order as a process pool's own per-chunk cost
#: (docs/problems.md, problem 4).
BIG_STATE_BYTES = 1 << 20

PREFER_VALUES = ("threads", "processes")


@dataclass(frozen=True)
class Options:
    """What the user asked for.

    Attributes:
        backend: a backend name that forces the route, or None to decide.
        prefer: ``"threads"``, ``"processes"`` or None; a hint, weaker than
            ``backend`` and than state that must not be pickled.
        big_state_bytes: state above this many bytes is shared by
            copy-on-write where fork is available.
        stoppable: the user set a ``task_timeout``: process work goes to a
            backend that can stop one task (fork) rather than loky.
        start_method: the start method of the user's ``mp_context``
            (``"fork"``, ``"spawn"``, ``"forkserver"``), or None. Any but
            ``"fork"`` turns the fork route off: process work goes to loky,
            whose workers start as fresh interpreters.
        retires_workers: the user set ``max_tasks_per_child``: process work
            goes to fork, whose workers can be retired one at a time, rather
            than loky.
        initializer: the user set an ``initializer``: a callable whose code
            travels by value (``__main__``, lambda, closure) is shared with
            fork workers rather than pickled, so that it reads the globals
            the initializer set in the worker (a pickled copy brings its own).
        allow_inline: the user let process-routed callables run items in
            the calling process (``SmartExecutor(allow_inline=True)``): only
            then is an unmeasured one's GIL use measured (``measure=True``).
    """

    backend: str | None = None
    prefer: Literal["threads", "processes"] | None = None
    big_state_bytes: int = BIG_STATE_BYTES
    stoppable: bool = False
    start_method: str | None = None
    retires_workers: bool = False
    initializer: bool = False
    allow_inline: bool = False

    @property
    def routes_freely(self) -> bool:
        """No option pins where work runs: the route is the policy's own guess.

        Only then may measured figures move work (e.g. later submits to
        threads): the user chose no backend, preference, initializer, task
        timeout or worker retirement.
        """
        return (
            self.backend is None
            and self.prefer is None
            and not self.initializer
            and not self.stoppable
            and not self.retires_workers
        )
