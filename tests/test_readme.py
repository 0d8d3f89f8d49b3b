"""Every Python block in README.md runs, in order, in one namespace — the README cannot rot.

The first screen is pinned too: an install line from this repository, and a quickstart of at most
15 lines that uses ``@fp.tool`` and runs offline; the real-model block after it runs as written
with the chat model swapped for a local stand-in (the one line that changes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(tag: str = "") -> list[str]:
    fence = "```python" + (f' title="{tag}"' if tag else "") + "\n"
    text = README.read_text(encoding="utf-8")
    return re.findall(re.escape(fence) + r"(.*?)```", text, flags=re.S)


def test_readme_has_runnable_examples() -> None:
    assert len(python_blocks()) >= 2


def test_readme_python_blocks_run(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in python_blocks():
        # Our own README, executed on purpose.
        exec(compile(block, str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    [shown] = re.findall(r"```text\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert printed.startswith(shown), "the quickstart's output is shown as it prints"


def test_the_first_screen_installs_from_the_repository_and_starts_in_15_lines() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = text[: text.index("## Quickstart")]
    assert len(first_screen.splitlines()) <= 25
    assert "pip install -e ." in first_screen and "not on the package index" in first_screen
    assert "pip install fencepost" not in text  # it is not on the index
    quickstart = python_blocks()[0]
    assert "@fp.tool(" in quickstart and "fp.create_agent(" in quickstart
    assert len(quickstart.strip().splitlines()) <= 15


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 350


def test_the_real_model_block_is_the_quickstart_with_one_line_changed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.adapters import fakes

    [block] = python_blocks("openai")
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(python_blocks()[0], str(README), "exec"), namespace)
    capsys.readouterr()

    def stand_in(**_: Any) -> Any:
        # What gpt-4.1-mini would do here: search, then answer citing the search.
        return fakes.fake_model(
            [
                fakes.ai_call("search_logs", {"query": "checkout 500"}, "call-model-01"),
                fakes.final_citing_all,
            ]
        )

    import_line = "from langchain_openai import ChatOpenAI"
    assert block.startswith(import_line)
    source = block.replace(import_line, "ChatOpenAI = stand_in", 1)
    exec(compile(source, str(README), "exec"), {**namespace, "stand_in": stand_in})
    assert capsys.readouterr().out.startswith("stop report completed")


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make demo" in text


def test_the_speed_section_lives_in_results_md_and_make_bench_keeps_it() -> None:
    import importlib.util

    results = README.parent / "benchmarks" / "results.md"
    assert "(benchmarks/results.md)" in README.read_text(encoding="utf-8")
    spec = importlib.util.spec_from_file_location(
        "bench", README.parent / "benchmarks" / "bench.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(results.parent))
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(results.parent))
    kept = bench.kept_notes(results)
    assert kept.lstrip().startswith(bench.NOTES_MARK)
    assert "Where the gap to the floor goes" in kept or "3.45x" in kept
