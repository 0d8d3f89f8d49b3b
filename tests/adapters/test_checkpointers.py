"""open_checkpointer / aopen_checkpointer: savers by URL, set up, with fencepost's serializer.

Real SQLite files and a real Postgres (``postgres_schema``: a throwaway schema per test). A run is
written through one opener and read back through a fresh one, so the types must survive the
round trip under ``LANGGRAPH_STRICT_MSGPACK=true`` — which only the allowlisted serializer allows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fencepost as fp
from fencepost.adapters import CheckpointerError, aopen_checkpointer, open_checkpointer
from fencepost.adapters.checkpointers import (
    CheckpointerUnavailable,
    UnsupportedCheckpointerURL,
    mask_url,
)
from fencepost.adapters.scripted import ScriptedDecisionModel
from tests.adapters.fakes import ctx

CONFIG = {"configurable": {"thread_id": "t-ckpt"}}


def _registry() -> fp.ToolRegistry:
    from tests.adapters.fakes import ToolLog, langchain_registry

    return langchain_registry(ToolLog())


def _model() -> ScriptedDecisionModel:
    return ScriptedDecisionModel(
        [
            fp.ToolProposal(
                call_id="call-ckpt-0001", tool_name="search_logs", arguments={"query": "5xx"}
            ),
            lambda inp: fp.FinalProposal(
                answer=fp.AnswerPayload(text="found it", citations=(inp.observations[-1].call_id,))
            ),
        ]
    )


def _start() -> Any:
    return fp.start("why?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2))


def write_run(url: str) -> fp.AgentState:
    with open_checkpointer(url) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        return fp.run_output(graph.invoke(_start(), CONFIG, context=ctx()))


def read_run(url: str) -> dict[str, Any]:
    with open_checkpointer(url) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        return dict(graph.get_state(CONFIG).values)


def assert_revived(values: dict[str, Any], written: fp.AgentState) -> None:
    # The record comes back as the plain data it was stored as, and reads as the run it was.
    record = values["run"]
    assert isinstance(record["budget"], dict)
    assert all(isinstance(o, dict) for o in record["observations"])
    assert fp.run_output(values) == written


def test_memory_url_gives_a_saver_that_stores_and_revives_a_run() -> None:
    with open_checkpointer("memory://") as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        written = fp.run_output(graph.invoke(_start(), CONFIG, context=ctx()))
        assert_revived(dict(graph.get_state(CONFIG).values), written)
    assert written.termination is fp.TerminationReason.COMPLETED


def test_sqlite_run_survives_reopening_and_the_connection_is_closed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    assert url.startswith("sqlite:////")  # absolute path: four slashes
    written = write_run(url)
    assert written.termination is fp.TerminationReason.COMPLETED
    assert_revived(read_run(url), written)

    with open_checkpointer(url) as saver:
        conn = saver.conn  # type: ignore[attr-defined]
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")


def test_sqlite_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    written = write_run("sqlite:///relative-runs.db")
    assert (tmp_path / "relative-runs.db").exists()
    assert_revived(read_run("sqlite:///relative-runs.db"), written)


def test_setup_has_run_before_the_saver_is_handed_over(tmp_path: Path) -> None:
    with open_checkpointer(f"sqlite:///{tmp_path / 'fresh.db'}"):
        pass
    tables = {
        row[0]
        for row in sqlite3.connect(tmp_path / "fresh.db").execute(
            "SELECT name FROM sqlite_master WHERE type='table'"
        )
    }
    assert {"checkpoints", "writes"} <= tables


def test_sqlite_in_a_missing_directory_is_a_clear_error_naming_the_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'runs.db'}"
    with pytest.raises(CheckpointerUnavailable) as err, open_checkpointer(url):
        pass
    assert url in str(err.value)
    assert isinstance(err.value, CheckpointerError)


@pytest.mark.parametrize(
    "url",
    ["redis://:hunter2@cache:6379/0", "mysql://app:hunter2@db/runs", "runs.db", "file:///tmp/x"],
)
def test_an_unknown_scheme_is_refused_with_the_password_masked(url: str) -> None:
    with pytest.raises(UnsupportedCheckpointerURL) as err, open_checkpointer(url):
        pass
    message = str(err.value)
    assert "hunter2" not in message
    assert "unsupported scheme" in message
    assert err.value.url == mask_url(url)


def test_an_unreachable_postgres_is_a_clear_error_with_the_password_masked() -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/runs"
    with pytest.raises(CheckpointerUnavailable) as err, open_checkpointer(url):
        pass
    assert "postgresql://app:***@127.0.0.1:1/runs" in str(err.value)
    assert "hunter2" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_postgres_run_survives_reopening_and_the_connection_is_closed(postgres_schema: str) -> None:
    written = write_run(postgres_schema)
    assert written.termination is fp.TerminationReason.COMPLETED
    assert_revived(read_run(postgres_schema), written)

    with open_checkpointer(postgres_schema) as saver:
        conn = saver.conn  # type: ignore[attr-defined]
    assert conn.closed


def test_postgres_scheme_alias_is_accepted(postgres_schema: str) -> None:
    alias = "postgres://" + postgres_schema.split("://", 1)[1]
    with open_checkpointer(alias) as saver:
        assert type(saver).__name__ == "PostgresSaver"


# -- the async twin -----------------------------------------------------------------------------


async def _awrite_and_read(url: str) -> tuple[fp.AgentState, dict[str, Any]]:
    async with aopen_checkpointer(url) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        written = fp.run_output(await graph.ainvoke(_start(), CONFIG, context=ctx()))
    async with aopen_checkpointer(url) as saver:
        graph = fp.build_agent_graph(_registry(), _model()).compile(checkpointer=saver)
        values = dict((await graph.aget_state(CONFIG)).values)
    return written, values


async def test_async_sqlite_run_survives_reopening(tmp_path: Path) -> None:
    written, values = await _awrite_and_read(f"sqlite:///{tmp_path / 'aruns.db'}")
    assert written.termination is fp.TerminationReason.COMPLETED
    assert_revived(values, written)


async def test_async_postgres_run_survives_reopening(postgres_schema: str) -> None:
    written, values = await _awrite_and_read(postgres_schema)
    assert written.termination is fp.TerminationReason.COMPLETED
    assert_revived(values, written)


async def test_async_memory_and_errors_match_the_sync_opener(tmp_path: Path) -> None:
    async with aopen_checkpointer("memory://") as saver:
        assert type(saver).__name__ == "InMemorySaver"
    with pytest.raises(UnsupportedCheckpointerURL):
        async with aopen_checkpointer("redis://:hunter2@x/0"):
            pass
    with pytest.raises(CheckpointerUnavailable) as err:
        async with aopen_checkpointer("postgresql://app:hunter2@127.0.0.1:1/runs"):
            pass
    assert "hunter2" not in str(err.value)


# -- masking ------------------------------------------------------------------------------------

passwords = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters="@/?#:%&= \\"), min_size=4, max_size=20
)


@given(password=passwords, scheme=st.sampled_from(["postgresql", "redis", "sqlite", "x"]))
def test_mask_url_never_shows_the_password(password: str, scheme: str) -> None:
    templates = (
        f"{scheme}://user:{{}}@host:5432/db",
        f"{scheme}://host/db?sslmode=require&password={{}}",
        "host=db user=app password={} dbname=runs",
    )
    # A password that is also part of the URL's own text ("post" in "postgresql") would be
    # "shown" by the scheme, not by a leak: such draws say nothing about masking.
    assume(all(password not in t.replace("{}", "\0") + "***" for t in templates))
    for template in templates:
        assert password not in mask_url(template.format(password)).replace("***", "")


def test_an_unreachable_database_error_keeps_no_driver_text() -> None:
    from fencepost.adapters.checkpointers import CheckpointerUnavailable

    url = "postgresql://app:s3cret@127.0.0.1:1/runs?connect_timeout=2"
    with pytest.raises(CheckpointerUnavailable) as err, open_checkpointer(url):
        pass
    text = str(err.value)
    assert "s3cret" not in text and "refused" not in text.lower() and "127.0.0.1:1" in text
    assert err.value.__cause__ is None and err.value.__suppress_context__
