"""Which threads of this process are the user's running threads, and which a fork may ignore.

Forking copies every lock that another thread holds at that instant, held,
into the child; so smartexec does not fork this process while the user's
threads run (see :func:`smartexec.policy.decide`). Many threads are not the
user's, though: joblib's and loky's executor manager and queue feeder (they
stay after a ``Parallel`` run), tqdm's monitor, and the 8-10 threads of a
Jupyter kernel (IOPub, heartbeat, control, shell channel, history saving,
parent poller, output pipe watchers). Counted as the user's, they sent every
function to loky.

:func:`census` leaves a thread out only when both hold:

* it is *known*: its class, or the function it runs, is one of those of a
  library listed in :data:`_KINDS` (matched by module and qualified name,
  never by the thread's name, which anyone can choose); and
* it is *idle*, read from its stack (``sys._current_frames()``): its
  innermost frame is a wait (``threading``'s ``wait``/``join``, a
  ``selectors`` select, or one of the blocking calls its library is known to
  make: an ``os.read`` of a pipe, ``time.sleep``, ``zmq.proxy``), and every
  frame on its stack is its library's or the standard library's (no user
  callback runs there).

A thread waiting there holds no lock but its own objects' (which the child
never uses: a forked worker forgets loky's reusable executor, see
:func:`forget_inherited_pools`). Anything else counts as a running user
thread: an unknown thread, a known one that is busy (IPython's history
thread writing to its database), a ``ThreadPoolExecutor``'s workers (idle
or not: the pool is the user's, and its copy in a child believes idle
workers exist that are not there, so a ``submit`` there would wait for
ever). The check and the fork are not one atomic step: a known thread may
wake in the microseconds between them, the same window any ``fork`` of a
process with threads has; :func:`census` can first wait a little
(``settle_s``) for a busy known thread to go back to its wait.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IgnoredThread",
    "ThreadCensus",
    "census",
    "forget_inherited_pools",
    "fork_warning_checked",
    "foreign_thread_ids",
    "native_threads_run",
    "is_ours",
    "mark_ours",
    "own_thread",
    "running_user_code",
    "user_code_ends",
    "user_code_starts",
]

#: Idents of smartexec's own threads running the user's code now (a thread
#: backend's chunk or call, its initializer, a GIL watch's helper), each with
#: how many such runs it is in: they count as the user's running threads,
#: whatever their name (a lock that code holds would be copied, held, into a
#: forked worker: a fork for one map while another ran on threads hung).
_USER_CODE: dict[int, int] = {}
# A forked child has none of those threads (an ident may come back as another).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_USER_CODE.clear)


#: smartexec's own threads, known by object: a thread's name is no proof
#: (anyone may name a thread "smartexec-..."). Pool threads add themselves as
#: they start (:func:`mark_ours`); the others are made by :func:`own_thread`.
_OURS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def own_thread(target: Any, name: str, *, daemon: bool = True) -> threading.Thread:
    """A new thread of smartexec's (not started) running ``target()``, named ``name``."""
    thread = threading.Thread(target=target, name=name, daemon=daemon)
    _OURS.add(thread)
    return thread


def mark_ours() -> None:
    """Count the calling thread as smartexec's own (a pool's thread, from its initializer)."""
    _OURS.add(threading.current_thread())


def is_ours(thread: threading.Thread | None = None) -> bool:
    """Whether ``thread`` (default: the calling thread) is one of smartexec's own."""
    return (threading.current_thread() if thread is None else thread) in _OURS


def user_code_starts() -> int:
    """Mark the calling smartexec thread as running the user's code; returns its ident.

    Plain calls, not a context manager: a thread-backend submit pays it once
    per call (a generator-based ``with`` cost ~2 us of 20 a call).
    Pair with :func:`user_code_ends` in a ``finally``.
    """
    ident = threading.get_ident()
    _USER_CODE[ident] = _USER_CODE.get(ident, 0) + 1
    return ident


def user_code_ends(ident: int) -> None:
    """Undo one :func:`user_code_starts` of the thread ``ident``."""
    left = _USER_CODE.get(ident, 1) - 1
    if left > 0:
        _USER_CODE[ident] = left
    else:
        _USER_CODE.pop(ident, None)


def foreign_thread_ids() -> list[int]:
    """Native ids of this process's threads that Python does not know (a BLAS or OpenMP pool's).

    Read from ``/proc/self/task`` (~5 us), less :func:`threading.enumerate`
    and the calling thread, by its id read now: after ``os.fork()`` the
    thread's ``native_id`` is still its parent's (Python 3.10-3.13), and a
    fork worker counted its own thread as one Python did not know. A thread
    Python has just joined may still be listed for a moment while the
    system ends it. Empty where ``/proc`` cannot be read (not Linux).
    """
    known = {t.native_id for t in threading.enumerate()}
    known.add(threading.get_native_id())
    try:
        names = os.listdir("/proc/self/task")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit() and int(name) not in known]


def native_threads_run(settle_s: float = 0.0) -> bool:
    """Whether threads Python does not know run in this process (a BLAS or OpenMP pool's).

    The system's count of this process's threads (``/proc/self/stat``, ~5
    us) against :func:`threading.active_count`. A Python thread that has
    just ended may still be counted for a moment: with ``settle_s`` > 0
    (seconds), a count over Python's is read again after that long, and
    both must be over (a fork worker, right after its GIL watch's thread
    was joined). True where ``/proc`` cannot be read (not Linux): a caller
    that caps a pool caps it as if it ran.
    """
    if not _more_threads_than_python():
        return False
    if settle_s > 0:
        time.sleep(settle_s)
        return _more_threads_than_python()
    return True


def _more_threads_than_python() -> bool:
    try:
        fd = os.open("/proc/self/stat", os.O_RDONLY)
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
        threads = int(text[text.rindex(b")") + 2 :].split()[17])
    except (OSError, ValueError, IndexError):
        return True
    return threads > threading.active_count()


@contextlib.contextmanager
def running_user_code() -> Iterator[None]:
    """Mark the calling smartexec thread as running the user's code for the block."""
    ident = user_code_starts()
    try:
        yield
    finally:
        user_code_ends(ident)


#: Seconds :func:`fork_warning_checked` waits, at most, for busy known threads to go idle.
FORK_SETTLE_S = 0.1
#: Seconds between two looks while settling.
SETTLE_POLL_S = 0.002

#: Waits any known thread may be idle in: (module, function name).
_WAITS = frozenset(
    {
        ("threading", "wait"),  # Condition.wait, under Event.wait and queue.Queue.get
        ("threading", "_wait_for_tstate_lock"),
        ("threading", "join"),
        ("selectors", "select"),  # event loops, multiprocessing.connection.wait
    }
)


@dataclass(frozen=True)
class _Kind:
    """A library's background thread: how to know it, and where it waits."""

    #: For people: "joblib/loky's executor manager".
    label: str
    #: Top-level packages whose frames may be on its stack (besides the stdlib's).
    packages: frozenset[str]
    #: ``module:qualname`` of its class (a ``threading.Thread`` subclass) or of its target.
    runs: frozenset[str]
    #: Blocking C calls it is idle in: (module, function name, text of the call's line).
    calls: tuple[tuple[str, str, str], ...] = ()


_LOKY = frozenset({"joblib", "loky"})
_JUPYTER = frozenset({"ipykernel", "IPython", "zmq", "tornado", "jupyter_client", "traitlets"})

_KINDS: tuple[_Kind, ...] = (
    _Kind(
        "joblib/loky's executor manager",
        _LOKY,
        frozenset(
            {
                "joblib.externals.loky.process_executor:_ExecutorManagerThread",
                "loky.process_executor:_ExecutorManagerThread",
            }
        ),
    ),
    _Kind(
        "joblib/loky's queue feeder",
        _LOKY,
        frozenset(
            {
                "joblib.externals.loky.backend.queues:Queue._feed",
                "loky.backend.queues:Queue._feed",
            }
        ),
    ),
    _Kind("tqdm's monitor", frozenset({"tqdm"}), frozenset({"tqdm._monitor:TMonitor"})),
    _Kind(
        "the Jupyter kernel's",
        _JUPYTER,
        frozenset(
            {
                "ipykernel.iostream:IOPubThread._thread_main",
                "ipykernel.iostream:OutStream._watch_pipe_fd",
                "ipykernel.heartbeat:Heartbeat",
                "ipykernel.control:ControlThread",
                "ipykernel.shellchannel:ShellChannelThread",
                "ipykernel.parentpoller:ParentPollerUnix",
                "IPython.core.history:HistorySavingThread",
            }
        ),
        (
            ("ipykernel.iostream", "_watch_pipe_fd", "os.read("),
            ("ipykernel.parentpoller", "run", "time.sleep("),
            ("zmq.sugar", "device", "proxy("),
            ("ipykernel.heartbeat", "run", "zmq.device("),
        ),
    ),
)

_BY_RUNS = {name: kind for kind in _KINDS for name in kind.runs}


@dataclass(frozen=True)
class IgnoredThread:
    """A library thread found idle, which a fork may ignore.

    Attributes:
        name: the thread's name.
        owner: whose thread it is, for people ("tqdm's monitor").
        waiting_in: where it waits ("threading.wait", "selectors.select").
    """

    name: str
    owner: str
    waiting_in: str

    def __str__(self) -> str:
        return f"{self.name!r} ({self.owner}, idle in {self.waiting_in})"


@dataclass(frozen=True)
class ThreadCensus:
    """The threads of this process besides the calling one, sorted out.

    Attributes:
        running: names of the threads that count as the user's running
            threads (unknown threads, and known ones found busy).
        ignored: the library threads found idle (:class:`IgnoredThread`).
        own: smartexec's own threads alive (named ``smartexec-*``; paused or
            released around a fork, see :mod:`smartexec.backends.fork`).
        busy_known: how many of ``running`` are known library threads found
            busy (back in their wait soon, as a rule).
    """

    running: tuple[str, ...] = ()
    ignored: tuple[IgnoredThread, ...] = ()
    own: int = 0
    busy_known: int = 0

    def reason(self) -> str | None:
        """A sentence for ``explain()`` naming the threads left out, or None when none were."""
        if not self.ignored:
            return None
        owners: dict[str, list[str]] = {}
        for thread in self.ignored:
            owners.setdefault(thread.owner, []).append(f"{thread.name!r} in {thread.waiting_in}")
        listed = "; ".join(f"{owner}: {', '.join(names)}" for owner, names in owners.items())
        n = len(self.ignored)
        return (
            f"{n} library thread{'s' if n != 1 else ''} left out, not the user's running "
            f"threads: each is idle in a known wait, holding no lock a forked worker "
            f"could need ({listed})"
        )


def _module_of(frame: types.FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


def _kind_of(thread: threading.Thread) -> _Kind | None:
    """The known kind of ``thread`` by its class or its target, or None."""
    cls = type(thread)
    if cls is not threading.Thread:
        kind = _BY_RUNS.get(f"{cls.__module__}:{cls.__qualname__}")
        if kind is not None:
            return kind
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return _BY_RUNS.get(f"{module}:{qualname}")
    return None


#: (kind, innermost line, ids of the stack's code objects) -> (where it waits or
#: None, those code objects). What :func:`_waiting_in` finds depends on nothing
#: else (a code object runs in one module); the codes are kept so their ids are
#: not reused, never the frames (they would keep the threads' objects alive).
_ANSWERS: dict[tuple[object, ...], tuple[str | None, tuple[types.CodeType, ...]]] = {}
#: Entries of :data:`_ANSWERS` at most (it is emptied past that).
MAX_ANSWERS = 512


def _waiting_in(kind: _Kind, frame: types.FrameType | None) -> str | None:
    """Where the stack from ``frame`` waits, when it is idle for ``kind``; else None."""
    if frame is None:
        return None
    codes = []
    outer: types.FrameType | None = frame
    while outer is not None:
        codes.append(outer.f_code)
        outer = outer.f_back
    key = (kind.label, frame.f_lineno, *map(id, codes))
    known = _ANSWERS.get(key)
    if known is not None:
        return known[0]
    where = _read_stack(kind, frame)
    if len(_ANSWERS) >= MAX_ANSWERS:
        _ANSWERS.clear()
    _ANSWERS[key] = (where, tuple(codes))
    return where


def _read_stack(kind: _Kind, frame: types.FrameType) -> str | None:
    """:func:`_waiting_in`, worked out."""
    module, function = _module_of(frame), frame.f_code.co_name
    if (module, function) in _WAITS:
        where = f"{module}.{function}"
    else:
        where = ""
        for call_module, call_function, text in kind.calls:
            if module == call_module and function == call_function:
                line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
                if text in line:
                    where = f"{module}.{function}"
                    break
        if not where:
            return None
    stdlib = sys.stdlib_module_names
    outer: types.FrameType | None = frame
    while outer is not None:
        top = _module_of(outer).partition(".")[0]
        if top not in stdlib and top not in kind.packages:
            return None  # someone else's code runs on this stack
        outer = outer.f_back
    return where


def _sort(
    threads: list[threading.Thread],
    frames: dict[int, types.FrameType],
    own_user_code: bool = True,
) -> ThreadCensus:
    running: list[str] = []
    ignored: list[IgnoredThread] = []
    own = busy_known = 0
    for thread in threads:
        if thread in _OURS:
            if own_user_code and thread.ident in _USER_CODE:
                running.append(f"{thread.name} (running your code)")
            else:
                own += 1
            continue
        kind = _kind_of(thread)
        where = None
        if kind is not None and thread.ident is not None:
            where = _waiting_in(kind, frames.get(thread.ident))
        if kind is not None and where is not None:
            ignored.append(IgnoredThread(thread.name, kind.label, where))
        else:
            running.append(thread.name)
            busy_known += kind is not None
    return ThreadCensus(tuple(running), tuple(ignored), own, busy_known)


def _look(own_user_code: bool = True) -> ThreadCensus:
    # No cache across looks: it would have to keep other threads' frames alive
    # (a finished loky feeder's frame holds its queue's semaphores), and a
    # frame's id alone may be reused by another stack.
    current = threading.current_thread()
    threads = [thread for thread in threading.enumerate() if thread is not current]
    if not threads:
        return ThreadCensus()
    frames = sys._current_frames()
    try:
        return _sort(threads, frames, own_user_code)
    finally:
        del frames


def census(settle_s: float = 0.0, *, own_user_code: bool = True) -> ThreadCensus:
    """Sort the threads of this process besides the calling one.

    Args:
        settle_s: seconds to wait, at most, while every running thread is a
            known library thread that is busy (it may be back in its wait in
            a moment, as IPython's history thread after a write). 0 looks once.
        own_user_code: count smartexec's threads running the user's code
            (:func:`running_user_code`) as the user's running threads. False
            for a map on threads that may move to processes: its own chunks
            run there.

    Returns:
        A :class:`ThreadCensus`: the user's running threads, the library
        threads left out, and how many of smartexec's own are alive.
    """
    deadline = time.monotonic() + settle_s
    while True:
        found = _look(own_user_code)
        if settle_s <= 0:
            return found
        settling = found.running and found.busy_known == len(found.running)
        if not settling or time.monotonic() >= deadline:
            return found
        time.sleep(SETTLE_POLL_S)


@contextlib.contextmanager
def fork_warning_checked() -> Iterator[ThreadCensus]:
    """Around one of smartexec's own forks: hide Python's warning only for a risk checked here.

    Python 3.12+ warns (``DeprecationWarning``) when a process with several
    threads forks (it counts the threads :mod:`threading` knows, as
    :func:`census` does). When every thread but the calling one is a library
    thread found idle (after waiting up to :data:`FORK_SETTLE_S` for busy
    ones), that warning is about a risk already ruled out: it is silenced
    for this block. Otherwise (the user's threads, or smartexec's own that
    could not be paused) it is left as it is.

    Yields:
        The :class:`ThreadCensus` taken just before the block.
    """
    found = census(FORK_SETTLE_S)
    if found.running or found.own or not found.ignored:
        yield found
        return
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead",
            category=DeprecationWarning,
        )
        yield found


#: Modules that keep a reusable loky executor in ``_executor``.
_REUSABLE = ("joblib.externals.loky.reusable_executor", "loky.reusable_executor")
#: The parent's executors, copied into this child: kept, never collected
#: (collecting one would wake the parent's manager thread through a shared pipe).
_INHERITED: list[object] = []


def forget_inherited_pools() -> None:
    """In a forked worker: make loky (and joblib) start their own executor.

    A fork copies loky's reusable executor, whose manager thread and worker
    processes are the parent's: a ``joblib.Parallel`` run in the worker
    would hand its tasks to a copy nobody serves and wait for ever. The
    copies are kept (never collected) and the module forgets them.
    """
    for name in _REUSABLE:
        module = sys.modules.get(name)
        inherited = getattr(module, "_executor", None)
        if module is not None and inherited is not None:
            _INHERITED.append(inherited)
            module._executor = None  # type: ignore[attr-defined]
            module._executor_kwargs = None  # type: ignore[attr-defined]
