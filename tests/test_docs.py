"""Every Python block in the docs pages runs — each page in order, in a namespace of its own — as
tests/test_readme.py runs the README's; the pages the docs promise exist, the graph shown is the
one ``fencepost graph`` prints, and every test file the docs and the README name exists. (``make docs`` builds them with ``mkdocs --strict``; ``make
test`` runs that build.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))


def python_blocks(page: str) -> list[str]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_a_docs_pages_python_blocks_run(page: str, capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page[:-3]}"}
    for block in python_blocks(page):
        # Our own docs, executed on purpose.
        exec(compile(block, str(DOCS / page), "exec"), namespace)


def test_the_quickstart_pages_real_model_block_runs_with_a_stand_in_for_the_chat_model() -> None:
    # As tests/test_readme.py runs the README's: the titled block is skipped above (it needs a
    # key), so it runs here after the page's first block, the chat model a local stand-in.
    from tests.adapters import fakes

    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    [block] = re.findall(r'```python title="openai"\n(.*?)```', text, flags=re.S)
    namespace: dict[str, Any] = {"__name__": "docs_quickstart"}
    exec(compile(python_blocks("quickstart.md")[0], str(DOCS / "quickstart.md"), "exec"), namespace)

    def stand_in(**_: Any) -> Any:
        return fakes.fake_model(
            [
                fakes.ai_call("search_logs", {"query": "checkout 500"}, "call-model-01"),
                fakes.final_citing_all,
            ]
        )

    import_line = "from langchain_openai import ChatOpenAI"
    assert block.startswith(import_line)
    source = block.replace(import_line, "ChatOpenAI = stand_in", 1)
    ran: dict[str, Any] = {**namespace, "stand_in": stand_in}
    exec(compile(source, str(DOCS / "quickstart.md"), "exec"), ran)
    assert ran["state"].termination.value == "completed"


def test_the_docs_have_the_promised_pages_and_the_nav_lists_them_all() -> None:
    promised = {
        "quickstart.md",
        "concepts.md",
        "tools.md",
        "approvals.md",
        "budgets.md",
        "persistence.md",
        "server.md",
        "streaming.md",
        "model-protocol.md",
        "cli.md",
        "observability.md",
        "reference.md",
    }
    assert promised <= set(PAGES)
    # mkdocs.yml holds a python tag (for a superfences formatter): read it as data only.
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    assert listed == set(PAGES)


class _Loader(yaml.SafeLoader):
    """A safe loader that reads ``!!python/name:`` tags as their text, importing nothing."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def test_the_docs_graph_block_is_what_fencepost_graph_prints() -> None:
    from typer.testing import CliRunner

    from fencepost.cli import app

    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    [block] = re.findall(r"```mermaid\n(.*?)```", text, flags=re.S)
    printed = CliRunner().invoke(app, ["graph"])
    assert printed.exit_code == 0
    assert block == printed.stdout


def test_the_model_protocol_page_shows_the_prompt_the_decider_sends() -> None:
    from fencepost.adapters.chat_model import DEFAULT_SYSTEM_PROMPT

    text = " ".join((DOCS / "model-protocol.md").read_text(encoding="utf-8").split())
    assert DEFAULT_SYSTEM_PROMPT in text
    assert "final_answer(text, citations)" in text and "abstain(reason)" in text
    assert "require_citations=True" in text


def test_every_module_the_layout_names_exists() -> None:
    # docs/concepts.md says where each decision lives: a module it names that is gone (moved,
    # renamed) would send a newcomer looking for nothing.

    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout") :]
    named = set(re.findall(r"`((?:graph/|policy/)?[a-z_/]+\.py)`", layout)) - {"tests/test_docs.py"}
    assert len(named) > 20, named
    package = ROOT / "fencepost"
    missing = []
    for name in sorted(named):
        where = [package / name] if "/" in name else [package / "policy" / name]
        if not any(p.exists() for p in where):
            missing.append(name)
    assert missing == []


def test_every_test_file_the_docs_and_the_readme_name_exists() -> None:
    # The pages point readers at the tests that pin a rule: a test file moved must take its
    # mentions along.
    named = {
        path
        for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
        for path in re.findall(r"tests/[\w/]+\.py", page.read_text(encoding="utf-8"))
    }
    assert named
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
