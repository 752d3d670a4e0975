"""Progress bars for ``map``: a tqdm bar that counts items, never chunks or futures.

``SmartExecutor(progress=True)``, ``ex.map(..., progress=True)`` and
``@parallel_map(progress=True)`` wrap the iterator that ``map`` returns in a
:class:`ProgressIterator`, which advances a bar by one for every result it
hands out. Counting at that point makes the count right whatever ran the
items: one-item or thousand-item chunks, fork, loky or thread workers, the
inline route, or the first items that ``map`` measured in the calling thread.
The bar's total is the input's length when every iterable has one
(:func:`smartexec._inputs.common_length`), else None (tqdm then shows a
count and a rate).

The bar moves as results are *taken*, in input order (as they complete with
``ordered=False``), which is what ``tqdm(ex.map(...))`` would show; it is closed when the results run out, when
an item's exception is raised, and when the iterator is closed early
(``.close()``, ``break`` out of a ``with contextlib.closing(...)``, garbage
collection).

tqdm is optional: ``pip install 'smartexec[progress]'``. Any tqdm-like
factory works in place of ``True``, e.g. ``tqdm.notebook.tqdm`` or
``functools.partial(tqdm.tqdm, leave=False)``; it is called with the keyword
arguments ``total``, ``desc`` and ``unit`` (see :data:`ProgressFactory`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

__all__ = [
    "ProgressBar",
    "ProgressFactory",
    "ProgressIterator",
    "bar_class",
    "in_notebook_kernel",
    "progress_factory",
    "track",
]

T = TypeVar("T")

#: How to install tqdm, as said in every error about it.
INSTALL_HINT = "pip install 'smartexec[progress]'"


class ProgressBar(Protocol):
    """What smartexec needs of a progress bar: tqdm's ``update`` and ``close``."""

    def update(self, n: int = 1) -> object:
        """Advance the bar by ``n`` items."""

    def close(self) -> object:
        """Finish the bar; called exactly once."""


#: A tqdm-like factory: called as ``factory(total=..., desc=..., unit="item")``
#: (``total``: the number of items, or None when unknown; ``desc``: the
#: callable's name) and returning a :class:`ProgressBar`. ``tqdm.tqdm`` and
#: ``tqdm.auto.tqdm`` are such factories.
ProgressFactory = Callable[..., ProgressBar]


def progress_factory(progress: bool | ProgressFactory | None) -> ProgressFactory | None:
    """Turn a ``progress=`` argument into a bar factory, or None for no bar.

    Called where the argument is given (``SmartExecutor(...)``, ``map``,
    ``@parallel_map(...)``), so a missing tqdm fails there, before any work.

    Args:
        progress: ``True`` for a tqdm bar (see :func:`bar_class`: a widget
            in a Jupyter kernel with ipywidgets, text elsewhere), ``False``
            or None for none, or a tqdm-like :data:`ProgressFactory`.

    Returns:
        The factory, or None when no bar is wanted.

    Raises:
        ImportError: ``progress`` is True and tqdm is not installed; the
            message says to ``pip install 'smartexec[progress]'``.
        TypeError: ``progress`` is neither a bool, None nor callable.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        try:
            tqdm = bar_class()
        except ImportError as exc:
            raise ImportError(
                f"progress=True draws a tqdm bar, but tqdm is not installed: {INSTALL_HINT} "
                f"(or pip install tqdm). Or pass a tqdm-like factory as progress=, "
                f"or progress=False.",
                name="tqdm",
            ) from exc
        # tqdm starts a monitor thread with its first bar (monitor_interval
        # 10 s): with it alive, every later fork of a worker would be a fork
        # of a multi-threaded process. Our bars do without it.
        factory: ProgressFactory = _without_monitor(tqdm)
        return factory
    if callable(progress):
        return progress
    raise TypeError(
        f"progress must be True, False, None or a tqdm-like factory such as tqdm.tqdm, "
        f"got {progress!r} ({type(progress).__qualname__})"
    )


class ProgressIterator(Iterator[T]):
    """Iterate a map's results, advancing ``bar`` by one for each result.

    Closing it (explicitly, by garbage collection, or because the results ran
    out or raised) closes the bar once and closes ``results`` too, so the
    chunks of an abandoned map are cancelled as they would be without a bar.

    Args:
        results: the iterator ``map`` returned.
        bar: the bar to advance; owned (and closed) by this iterator.
    """

    def __init__(self, results: Iterator[T], bar: ProgressBar):
        self._results: Iterator[T] | None = results
        self._bar: ProgressBar | None = bar

    def __iter__(self) -> ProgressIterator[T]:
        return self

    def __next__(self) -> T:
        results = self._results
        if results is None:
            raise StopIteration
        try:
            value = next(results)
        except BaseException:  # StopIteration, an item's exception, Ctrl-C
            self.close()
            raise
        if self._bar is not None:
            self._bar.update(1)
        return value

    def close(self) -> None:
        """Stop iterating: close the results (cancelling chunks not started) and the bar.

        Idempotent, as a generator's ``close()`` is.
        """
        results, self._results = self._results, None
        bar, self._bar = self._bar, None
        try:
            close = getattr(results, "close", None)
            if close is not None:
                close()
        finally:
            if bar is not None:
                bar.close()

    def __del__(self) -> None:
        self.close()


def track(
    results: Iterator[T], factory: ProgressFactory, *, total: int | None, desc: str
) -> ProgressIterator[T]:
    """Wrap a map's ``results`` in a :class:`ProgressIterator` with a new bar.

    Args:
        results: the iterator ``map`` returned; closed here if the factory fails.
        factory: makes the bar, called as ``factory(total=total, desc=desc,
            unit="item")``.
        total: how many items the map has, or None when unknown.
        desc: the label, e.g. the callable's name.

    Returns:
        An iterator over the same results, in the same order.

    Raises:
        Exception: whatever ``factory`` raises; ``results`` is closed first.
    """
    try:
        bar = factory(total=total, desc=desc, unit="item")
    except BaseException:
        close = getattr(results, "close", None)
        if close is not None:
            close()
        raise
    return ProgressIterator(results, bar)


def in_notebook_kernel() -> bool:
    """Whether this process is a Jupyter kernel that draws widgets.

    True in the notebook, JupyterLab, VS Code and Colab (an IPython kernel
    whose shell talks to a front end: ``ipykernel.zmqshell`` is loaded) and
    in JupyterLite; False in a plain interpreter, the IPython terminal,
    ``jupyter console``, qtconsole and Spyder, which show text only. The
    tests that tqdm's ``autonotebook`` makes, without importing anything.
    """
    if "IPython.utils._process_emscripten" in sys.modules:  # JupyterLite (pyodide)
        return True
    if "ipykernel.zmqshell" not in sys.modules:
        return False
    if any(name == "QT_API" or name.startswith("SPYDER") for name in os.environ):
        return False
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    if shell is None:
        return False
    kind = type(shell).__name__.lower()
    return "qt" not in kind and "spyder" not in kind


def bar_class() -> Any:
    """The tqdm class that ``progress=True`` draws with.

    ``tqdm.notebook.tqdm`` (a widget) inside a Jupyter kernel
    (:func:`in_notebook_kernel`) where ipywidgets is installed, else
    ``tqdm.std.tqdm`` (a text bar on stderr, which a notebook shows as
    text). Chosen here rather than by ``tqdm.auto``, which in a kernel
    without ipywidgets warns "IProgress not found" (a ``TqdmWarning``) and
    with them a ``TqdmExperimentalWarning``; this choice warns never.

    Returns:
        The class.

    Raises:
        ImportError: tqdm is not installed.
    """
    from tqdm.std import tqdm

    if in_notebook_kernel() and _installed("ipywidgets"):
        try:
            from tqdm.notebook import IProgress
            from tqdm.notebook import tqdm as widget
        except ImportError:  # IPython.display missing, or a broken ipywidgets
            return tqdm
        if IProgress is not None:
            return widget
    return tqdm


def _installed(name: str) -> bool:
    """Whether ``import name`` would find the package (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: a module without __spec__
        return False


def _without_monitor(tqdm_class: Any) -> Any:
    """A subclass of ``tqdm_class`` that starts no monitor thread."""
    return type(tqdm_class.__name__, (tqdm_class,), {"monitor_interval": 0})
