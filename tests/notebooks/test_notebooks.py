"""The notebooks run offline, top to bottom, and are committed with the outputs of a clean run."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
EXPECTED = [
    "01_quickstart.ipynb",
    "02_persistence_and_approval.ipynb",
    "03_evaluating_runs.ipynb",
]


def test_the_three_notebooks_are_there() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_top_to_bottom_without_a_cell_error(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # A fresh kernel on this interpreter (jupyter_client maps the spec's "python" to it); a cell
    # that raises makes execute() raise CellExecutionError, failing the test with its traceback.
    # The waits are generous: a kernel's start, a cell and a cell's output all take wall-clock
    # time that a machine whose cores are all busy stretches many times over (nbclient's own
    # defaults: 60 s to start, and 4 s for output, after which it is dropped without an error).
    client = NotebookClient(
        nb,
        timeout=600,
        startup_timeout=600,
        iopub_timeout=60,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    with _signal_handlers_put_back():
        client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
    # What a reader is promised holds in this run too, not only in the committed outputs.
    if name == "01_quickstart.ipynb":
        assert_the_graph_is_drawn_as_an_image(nb)
    if name == "03_evaluating_runs.ipynb":
        assert_every_run_is_its_own_dot(nb)


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_committed_with_the_outputs_of_a_clean_run(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # Executed once, in order, from a fresh kernel: counts 1..n with no gaps or reruns.
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    # Something to read on a code host: most cells show an output.
    assert sum(bool(c.outputs) for c in code) >= len(code) // 2


@contextmanager
def _signal_handlers_put_back() -> Iterator[None]:
    """The SIGINT and SIGTERM handlers as they were, however the run ended.

    nbclient sets its event loop's handlers for both (asyncio's no-op, which swallows Ctrl-C)
    and removes them only if the kernel started: a kernel that did not (its start timed out on
    a loaded machine) left them for every later test of the worker, and its Ctrl-C tests got no
    KeyboardInterrupt. The loop is the main thread's own, which nbclient set and never closes.
    """
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        loop = asyncio.get_event_loop_policy().get_event_loop()
        for sig, handler in kept.items():
            loop.remove_signal_handler(sig)  # and the loop's wake-up descriptor with the last
            if handler is not None:
                signal.signal(sig, handler)


def _cell(nb: nbformat.NotebookNode, marker: str) -> nbformat.NotebookNode:
    [cell] = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    return cell


def _committed(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def assert_the_graph_is_drawn_as_an_image(nb: nbformat.NotebookNode) -> None:
    cell = _cell(nb, "draw_mermaid")
    shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
    assert any("image/png" in o.data for o in shown)
    plain = " ".join(str(o.data.get("text/plain", "")) for o in shown)
    assert "IPython.core.display" not in plain


def assert_every_run_is_its_own_dot(nb: nbformat.NotebookNode) -> None:
    cell = _cell(nb, "Budget use per run")
    [printed] = [o.text for o in cell.outputs if o.output_type == "stream"]
    match = re.search(r"(\d+) runs; distinct dots: (\d+) \(steps\), (\d+) \(tool calls\)", printed)
    assert match is not None
    runs, steps, tool_calls = map(int, match.groups())
    assert runs > 1 and runs == steps == tool_calls


def test_the_quickstart_draws_the_graph_as_an_image_any_reader_sees() -> None:
    assert_the_graph_is_drawn_as_an_image(_committed("01_quickstart.ipynb"))


def test_the_budget_plot_shows_every_run_as_its_own_dot() -> None:
    assert_every_run_is_its_own_dot(_committed("03_evaluating_runs.ipynb"))
