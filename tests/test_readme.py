"""Every Python block in README.md runs, in order, in one namespace — the README cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_runnable_examples() -> None:
    assert len(python_blocks()) >= 2


def test_readme_python_blocks_run(capsys: object) -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in python_blocks():
        # Our own README, executed on purpose.
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make demo" in text


def test_readme_graph_block_is_what_fencepost_graph_prints() -> None:
    from typer.testing import CliRunner

    from fencepost.cli import app

    [block] = re.findall(r"```mermaid\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    printed = CliRunner().invoke(app, ["graph"])
    assert printed.exit_code == 0
    assert block == printed.stdout
