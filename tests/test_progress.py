"""Progress bars count items (never chunks or futures) and always close.

Each test passes a tqdm factory through the public ``progress=`` argument and
reads the bars it made: ``bar.n`` is tqdm's own count, ``closed`` is set by
the subclass below.
"""

from __future__ import annotations

import gc
import io
import itertools
import os
import sys

import pytest
from tqdm import tqdm

from smartexec import SmartExecutor, parallel_map
from smartexec.progress import progress_factory

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["thread", "fork", "loky", "inline"]
N_ITEMS = 50


def square(x):
    return x * x


def fail_at_ten(x):
    if x == 10:
        raise ValueError(f"bad item {x}")
    return x


class ClosingBar(tqdm):
    """A tqdm bar writing to a buffer that remembers whether it was closed."""

    closed = False

    def close(self):
        self.closed = True
        super().close()


class Bars:
    """A progress factory that keeps every bar it makes."""

    def __init__(self):
        self.made: list[ClosingBar] = []

    def __call__(self, **kwargs):
        bar = ClosingBar(file=io.StringIO(), **kwargs)
        self.made.append(bar)
        return bar

    @property
    def only(self) -> ClosingBar:
        assert len(self.made) == 1, self.made
        return self.made[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunksize", [1, 7, None], ids=["chunksize=1", "chunksize=7", "auto"])
def test_bar_counts_every_item_whatever_the_chunksize(backend, chunksize):
    bars = Bars()
    with SmartExecutor(2, backend=backend) as ex:
        results = list(ex.map(square, range(N_ITEMS), chunksize=chunksize, progress=bars))
    assert results == [x * x for x in range(N_ITEMS)]
    assert bars.only.n == N_ITEMS
    assert bars.only.total == N_ITEMS
    assert bars.only.closed
    assert bars.only.desc.startswith("square")


@pytest.mark.parametrize("star", [False, True], ids=["one-iterable", "two-iterables"])
def test_bar_counts_items_when_the_executor_routes_and_measures(star):
    # No backend= and no chunksize: the first items run in this thread to be
    # measured, the rest may go to workers; each is counted once.
    bars = Bars()
    with SmartExecutor(2, progress=bars) as ex:
        if star:
            results = list(ex.map(pow, range(N_ITEMS), [2] * (N_ITEMS + 5)))
        else:
            results = list(ex.map(square, range(N_ITEMS)))
    assert results == [x * x for x in range(N_ITEMS)]
    assert bars.only.n == N_ITEMS
    assert bars.only.total == N_ITEMS  # the shortest input, as zip stops there
    assert bars.only.closed


def test_generator_input_has_no_total():
    bars = Bars()
    with SmartExecutor(2, backend="thread") as ex:
        results = list(ex.map(square, (x for x in range(N_ITEMS)), progress=bars))
    assert len(results) == N_ITEMS
    assert bars.only.total is None
    assert bars.only.n == N_ITEMS
    assert bars.only.closed


@pytest.mark.parametrize("backend", BACKENDS)
def test_bar_closes_at_an_items_exception(backend):
    bars = Bars()
    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(fail_at_ten, range(30), chunksize=7, progress=bars)
        taken = []
        with pytest.raises(ValueError, match="bad item 10"):
            for value in results:
                taken.append(value)
    assert taken == list(range(10))
    assert bars.only.n == 10
    assert bars.only.closed
    assert list(results) == []  # finished, as a generator is after raising


@pytest.mark.parametrize("backend", BACKENDS)
def test_bar_closes_when_the_iterator_is_closed_early(backend):
    bars = Bars()
    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(square, range(1000), chunksize=7, progress=bars)
        assert list(itertools.islice(results, 5)) == [0, 1, 4, 9, 16]
        results.close()
        results.close()  # idempotent
        assert bars.only.closed
        assert bars.only.n == 5
        assert list(results) == []
        # the executor stays usable after the abandoned map
        assert list(ex.map(square, range(3))) == [0, 1, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bar_closes_when_the_iterator_is_garbage_collected(backend):
    bars = Bars()
    with SmartExecutor(2, backend=backend) as ex:
        results = ex.map(square, range(1000), chunksize=7, progress=bars)
        next(results)
        del results
        gc.collect()
        assert bars.only.closed
        assert bars.only.n == 1


def test_map_argument_overrides_the_executor_default():
    bars = Bars()
    with SmartExecutor(backend="inline", progress=bars) as ex:
        assert list(ex.map(square, range(3), progress=False)) == [0, 1, 4]
        assert bars.made == []
        assert list(ex.map(square, range(4))) == [0, 1, 4, 9]
        assert bars.only.n == 4


def test_no_bar_is_made_when_map_rejects_its_arguments():
    bars = Bars()
    with SmartExecutor(backend="inline") as ex:
        with pytest.raises(ValueError, match="chunksize"):
            ex.map(square, range(3), chunksize=0, progress=bars)
    assert bars.made == []


def test_parallel_map_counts_items():
    bars = Bars()

    @parallel_map(max_workers=2, chunksize=7, progress=bars)
    def cube(x):
        return x**3

    assert cube(range(N_ITEMS)) == [x**3 for x in range(N_ITEMS)]
    assert bars.only.n == N_ITEMS
    assert bars.only.closed


def test_progress_true_makes_a_tqdm_bar():
    factory = progress_factory(True)
    assert factory is not None
    bar = factory(total=3, desc="x", unit="item", file=io.StringIO())
    assert isinstance(bar, tqdm)
    bar.close()


def test_progress_true_without_tqdm_names_the_extra(monkeypatch):
    for name in [
        "tqdm",
        "tqdm.auto",
        "tqdm.std",
        *(m for m in sys.modules if m.startswith("tqdm.")),
    ]:
        monkeypatch.setitem(sys.modules, name, None)  # import tqdm (or tqdm.x) now fails
    with pytest.raises(ImportError, match=r"pip install 'smartexec\[progress\]'"):
        SmartExecutor(progress=True)
    with SmartExecutor(backend="inline") as ex:
        with pytest.raises(ImportError, match=r"smartexec\[progress\]"):
            ex.map(square, range(3), progress=True)
    with pytest.raises(ImportError, match=r"smartexec\[progress\]"):
        parallel_map(progress=True)
    # a factory of one's own needs no tqdm
    made = []

    class Counter:
        def __init__(self, **kwargs):
            self.n = 0
            made.append(self)

        def update(self, n=1):
            self.n += n

        def close(self):
            pass

    with SmartExecutor(backend="inline", progress=Counter) as ex:
        assert list(ex.map(square, range(5))) == [0, 1, 4, 9, 16]
    assert made[0].n == 5


@pytest.mark.parametrize("bad", ["yes", 1, 2.0])
def test_progress_of_the_wrong_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match="progress must be"):
        SmartExecutor(progress=bad)


class ZMQInteractiveShell:
    """Named as the shell of a Jupyter kernel is."""


class TerminalInteractiveShell:
    """Named as the IPython terminal's shell is."""


def in_kernel(monkeypatch, shell=ZMQInteractiveShell):
    """Make this process look like a Jupyter kernel (what tqdm and smartexec test for)."""
    import types

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell()
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    for name in list(os.environ):
        if name == "QT_API" or name.startswith("SPYDER"):
            monkeypatch.delenv(name)


def test_a_plain_interpreter_is_no_notebook():
    from smartexec.progress import in_notebook_kernel

    assert not in_notebook_kernel()


def test_a_jupyter_kernel_is_a_notebook(monkeypatch):
    from smartexec.progress import in_notebook_kernel

    in_kernel(monkeypatch)
    assert in_notebook_kernel()
    monkeypatch.setenv("QT_API", "pyqt5")  # qtconsole: text only
    assert not in_notebook_kernel()


def test_the_ipython_terminal_is_no_notebook(monkeypatch):
    from smartexec.progress import in_notebook_kernel

    in_kernel(monkeypatch, TerminalInteractiveShell)
    monkeypatch.delitem(sys.modules, "ipykernel.zmqshell")
    assert not in_notebook_kernel()
    in_kernel(monkeypatch, type("ZMQTerminalQtShell", (), {}))
    assert not in_notebook_kernel()


def test_outside_a_notebook_the_bar_is_text(monkeypatch):
    from tqdm.std import tqdm as text_bar

    from smartexec import progress

    assert progress.bar_class() is text_bar
    monkeypatch.setattr(progress, "in_notebook_kernel", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed
    assert progress.bar_class() is text_bar


def test_a_notebook_with_ipywidgets_gets_the_widget(monkeypatch):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("IPython.display")
    from tqdm.notebook import tqdm as widget

    from smartexec import progress

    monkeypatch.setattr(progress, "in_notebook_kernel", lambda: True)
    assert progress.bar_class() is widget
    assert issubclass(progress_factory(True), widget)


def test_a_notebook_without_ipywidgets_gets_text_and_no_warning(monkeypatch):
    import warnings

    from tqdm.std import tqdm as text_bar

    in_kernel(monkeypatch)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed
    for name in ("tqdm.auto", "tqdm.autonotebook", "tqdm.notebook"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # chosen anew
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        factory = progress_factory(True)
    assert [str(w.message) for w in caught] == []  # tqdm.auto: "IProgress not found ..."
    assert issubclass(factory, text_bar)
    bar = factory(total=2, desc="x", unit="item", file=io.StringIO())
    bar.update(2)
    bar.close()


def run_in_kernel(client, code):
    """Run ``code`` in a Jupyter kernel; its stdout and stderr, and the kinds of displays it sent."""
    msg_id = client.execute(code)
    text, shown = [], []
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind == "display_data":
            shown.extend(content["data"])
        elif kind == "error":
            raise AssertionError(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(text), shown


@pytest.mark.timeout(120)
def test_in_a_real_kernel_the_widget_or_a_text_bar_and_no_warning():
    manager = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    kernel, client = manager.start_new_kernel(kernel_name="python3")
    try:
        setup = "import warnings; warnings.simplefilter('always')\n"
        a_map = (
            "from smartexec import SmartExecutor\n"
            "with SmartExecutor(backend='thread', progress=True) as ex:\n"
            "    print(sum(ex.map(abs, range(100))))\n"
        )
        text, shown = run_in_kernel(client, setup + a_map)
        assert "4950" in text and "IProgress" not in text
        assert "application/vnd.jupyter.widget-view+json" in shown  # the widget
        hide = "import sys; sys.modules['ipywidgets'] = None\n"
        for name in ("tqdm.notebook", "tqdm.auto", "tqdm.autonotebook"):
            hide += f"sys.modules.pop({name!r}, None)\n"
        text, shown = run_in_kernel(client, hide + a_map)
        assert "100/100" in text and "IProgress" not in text  # a text bar, no warning
        assert shown == []
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
