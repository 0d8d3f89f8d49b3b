"""A thread is a conversation: new input on a thread whose run ended starts a new run.

Each run has its own run id, ledger account, budget, receipts and stop report; the model is shown
the earlier turns (question and final answer) as data; an earlier run's tool results are evidence
for that run only; ``run_output(values, run_id=...)`` reads an earlier run; ``fencepost runs``
lists every run of every thread. Input on a thread whose run is still going or paused is refused
(:class:`fencepost.RunInProgress`) before anything is saved.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from typer.testing import CliRunner

import fencepost as fp
from fencepost.cli import app
from fencepost.policy.budget import default_budget
from fencepost.policy.decide import StepPlan, StepSettings
from fencepost.policy.turns import TURN_WINDOW, Turn
from tests.adapters import fakes
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread
from tests.policy.factories import make_state


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[SqliteSaver, Path]]:
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    try:
        yield SqliteSaver(conn), tmp_path / "runs.db"
    finally:
        conn.close()


def count_checkpoints(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [f"500 on /checkout ({query})"]}


def final(text: str) -> Any:
    def answer(inp: fp.DecisionInput) -> fp.FinalProposal:
        return fp.FinalProposal(
            answer=fp.AnswerPayload(text=text, citations=(inp.observations[-1].call_id,))
        )

    return answer


def two_turns(saver: Any) -> tuple[Any, dict[str, Any], fp.AgentState, fp.AgentState]:
    h = harness(
        [call(n=1), final("deploy 42 broke checkout"), call(n=2), final("roll back deploy 42")],
        checkpointer=saver,
    )
    config = thread()
    first = fp.run_output(
        h.graph.invoke(
            {"messages": [HumanMessage("why is checkout failing?")]}, config, context=context()
        )
    )
    # The second message as a chat UI sends it: a role/content map.
    second = fp.run_output(
        h.graph.invoke(
            {"messages": [{"role": "user", "content": "what should we do?"}]},
            config,
            context=context(),
        )
    )
    return h, config, first, second


@pytest.mark.parametrize("saver", ["memory", "sqlite"])
def test_a_second_message_on_a_thread_starts_a_second_run_with_its_own_id_and_budget(
    saver: str, store: tuple[SqliteSaver, Path]
) -> None:
    h, _, first, second = two_turns(InMemorySaver() if saver == "memory" else store[0])
    assert first.termination is fp.TerminationReason.COMPLETED
    assert second.termination is fp.TerminationReason.COMPLETED
    assert second.run_id != first.run_id
    assert second.question == "what should we do?"
    assert second.final_answer is not None and second.final_answer.text == "roll back deploy 42"
    # Its own budget and records: two steps and one call of its own, nothing of the first run's.
    assert second.step == 2
    assert second.budget.tool_calls_remaining == default_budget().tool_calls_remaining - 1
    assert [r.call_id for r in second.receipts] == ["call-0002"]
    assert [o.call_id for o in second.observations] == ["call-0002"]
    assert second.report is not None and second.report.reason is fp.TerminationReason.COMPLETED
    assert h.calls.count("search_logs") == 2


def test_a_start_request_on_a_thread_whose_run_ended_starts_a_new_run_with_its_budget() -> None:
    h = harness([call(n=1), final_citing_last, final_citing_last], checkpointer=InMemorySaver())
    config = thread()
    first = h.run(config=config)
    out = h.graph.invoke(fp.start("and now?", budget(steps=3, tools=1)), config, context=context())
    second = fp.run_output(out)
    assert second.run_id != first.run_id
    assert second.question == "and now?"
    assert second.budget.steps_remaining == 2
    assert second.budget.tool_calls_remaining == 1


def test_the_model_is_shown_the_earlier_turns_as_data() -> None:
    h, _, first, _ = two_turns(InMemorySaver())
    asked = h.model.inputs[2]  # the second run's first step
    assert asked.question == "what should we do?"
    assert [(t.question, t.answer) for t in asked.turns] == [
        ("why is checkout failing?", "deploy 42 broke checkout")
    ]
    assert asked.turns[0].run_id == first.run_id
    assert asked.turns_left_out == 0
    assert h.model.inputs[0].turns == ()


def test_the_messages_view_shows_every_turn_once_in_order() -> None:
    h, config, _first, _second = two_turns(InMemorySaver())
    messages = h.graph.get_state(config).values["messages"]
    kinds = [type(m).__name__ for m in messages]
    assert kinds == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [
        "why is checkout failing?",
        "what should we do?",
    ]
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tools] == ["call-0001", "call-0002"]
    endings = [m for m in messages if isinstance(m, AIMessage) and not m.tool_calls]
    assert [m.content for m in endings] == ["deploy 42 broke checkout", "roll back deploy 42"]
    assert len({m.id for m in messages}) == len(messages)


def test_a_citation_in_a_later_run_must_name_a_call_of_that_run() -> None:
    cite_first_run = fp.FinalProposal(
        answer=fp.AnswerPayload(text="deploy 42, as before", citations=("call-0001",))
    )
    h = harness([call(n=1), final_citing_last, cite_first_run], checkpointer=InMemorySaver())
    config = thread()
    assert h.run(config=config).termination is fp.TerminationReason.COMPLETED
    second = fp.run_output(
        h.graph.invoke({"messages": [HumanMessage("so?")]}, config, context=context())
    )
    assert second.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert second.last_error_code == "unsupported_citation"
    assert second.final_answer is None


def test_input_while_a_run_is_paused_is_refused_typed_and_nothing_is_saved(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, path = store
    h = harness(
        [call("write_note", note="deploy 42"), final_citing_last],
        checkpointer=saver,
        approval="interrupt",
    )
    config = thread()
    h.graph.invoke(fp.start("note it", budget()), config, context=context())
    assert h.graph.get_state(config).next == ("approve",)
    saved = count_checkpoints(path)
    for given in ({"messages": [HumanMessage("anything new?")]}, fp.start("again", budget())):
        with pytest.raises(fp.RunInProgress) as refused:
            h.graph.invoke(given, config, context=context())
        assert "paused" in str(refused.value)
    assert count_checkpoints(path) == saved
    # The paused run is still there and still resumes, once.
    out = h.graph.invoke(Command(resume="approve"), config, context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


async def test_async_input_while_a_run_is_paused_is_refused_too() -> None:
    h = harness(
        [call("write_note", note="deploy 42"), final_citing_last],
        checkpointer=InMemorySaver(),
        approval="interrupt",
    )
    config = thread()
    await h.graph.ainvoke(fp.start("note it", budget()), config, context=context())
    with pytest.raises(fp.RunInProgress):
        await h.graph.ainvoke(
            {"messages": [HumanMessage("anything new?")]}, config, context=context()
        )


def test_run_output_reads_an_earlier_run_by_its_id() -> None:
    h, config, first, second = two_turns(InMemorySaver())
    values = h.graph.get_state(config).values
    assert fp.run_output(values).run_id == second.run_id
    earlier = fp.run_output(values, run_id=first.run_id)
    assert earlier.run_id == first.run_id
    assert earlier.question == "why is checkout failing?"
    assert earlier.termination is fp.TerminationReason.COMPLETED
    assert earlier.final_answer == first.final_answer
    assert earlier.receipts == first.receipts
    assert earlier.report == first.report
    assert fp.run_output(values, run_id=second.run_id) == fp.run_output(values)
    with pytest.raises(fp.NoRun):
        fp.run_output(values, run_id="run-nope")


def test_cli_runs_lists_both_runs_and_show_takes_either_id(
    store: tuple[SqliteSaver, Path],
) -> None:
    saver, path = store
    _, config, first, second = two_turns(saver)
    db = f"sqlite:///{path.resolve()}"
    listed = CliRunner().invoke(app, ["runs", "--db", db, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    thread_id = config["configurable"]["thread_id"]
    # Both runs of the thread, newest first, each with its own ending.
    assert [(r["run_id"], r["status"]) for r in rows if r["thread_id"] == thread_id] == [
        (second.run_id, "completed"),
        (first.run_id, "completed"),
    ]
    assert first.run_id != second.run_id
    shown = CliRunner().invoke(app, ["show", first.run_id, "--db", db, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["run"]["run_id"] == first.run_id
    latest = CliRunner().invoke(app, ["show", thread_id, "--db", db, "--json"])
    assert json.loads(latest.output)["run"]["run_id"] == second.run_id


def _conversation_block(messages: list[Any]) -> dict[str, Any] | None:
    for m in messages:
        if isinstance(m, HumanMessage) and "fencepost_conversation" in str(m.content):
            text = str(m.content)
            block: dict[str, Any] = json.loads(text[text.index("{") : text.rindex("}") + 1])
            return block["fencepost_conversation"]
    return None


def test_a_chat_model_is_shown_the_earlier_turns_as_a_data_block_before_the_question() -> None:
    chat = fakes.fake_model(
        [
            fakes.ai_call("search_logs", {"query": "checkout"}, "call-0001"),
            fakes.final_citing_all,
            fakes.ai_final("roll back deploy 42", ["call-0001"]),
        ]
    )
    agent = fp.create_agent(chat, [search_logs], checkpointer=InMemorySaver())
    config = fakes.thread()
    user = fakes.ctx()
    agent.invoke({"messages": [HumanMessage("why is checkout failing?")]}, config, context=user)
    assert _conversation_block(chat.received[0]) is None
    second = fp.run_output(
        agent.invoke({"messages": [HumanMessage("what now?")]}, config, context=user)
    )
    shown = chat.received[2]
    block = _conversation_block(shown)
    assert block is not None
    assert [(t["question"], t["answer"]) for t in block["earlier_turns"]] == [
        ("why is checkout failing?", "deploy 42 broke checkout")
    ]
    assert "fencepost_notice" not in block
    # The earlier run's tool result is not shown, and citing it is no evidence for this run.
    assert not any(isinstance(m, ToolMessage) for m in shown)
    assert [type(m).__name__ for m in shown][-1] == "HumanMessage"
    assert shown[-1].content == "what now?"
    assert second.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert second.last_error_code == "unsupported_citation"


def test_turns_past_the_window_are_left_out_with_a_notice() -> None:
    turns = tuple(
        Turn(
            run_id=f"run-{n}",
            question=f"q{n}",
            budget=budget(),
            final_answer=fp.AnswerPayload(text=f"a{n}"),
            termination=fp.TerminationReason.COMPLETED,
        )
        for n in range(TURN_WINDOW + 3)
    )
    settings = StepSettings(
        registry=fp.ToolRegistry([]),
        tool_catalog="all",
        tokens_per_step=0,
        price=None,
        answer_margin=0,
        model_retries=0,
        require_citations=False,
    )
    state = make_state(turns=turns)
    planned = StepPlan(stop=None, settings=settings).decision_input(state)
    shown, left_out = planned.turns, planned.turns_left_out
    assert left_out == 3
    assert [t.question for t in shown] == [f"q{n}" for n in range(3, TURN_WINDOW + 3)]
    inp = fp.DecisionInput(
        run_id="run-x",
        question="q",
        observations=(),
        catalog=(),
        budget=budget(),
        step=1,
        turns=shown,
        turns_left_out=left_out,
    )
    block = _conversation_block(fp.ChatModelDecider(fakes.fake_model([])).messages(inp))
    assert block is not None
    assert block["fencepost_notice"] == {"earlier_turns_not_shown": 3}
    assert len(block["earlier_turns"]) == TURN_WINDOW


def test_the_same_start_sent_again_is_that_run_not_a_new_one() -> None:
    h = harness([call(n=1), final_citing_last], checkpointer=InMemorySaver())
    config = thread()
    given = fp.start("why is checkout failing?", budget(), run_id="run-checkout-1")
    first = fp.run_output(h.graph.invoke(given, config, context=context()))
    again = fp.run_output(h.graph.invoke(given, config, context=context()))
    assert again == first
    assert again.turns == ()
    assert h.calls.count("search_logs") == 1


@pytest.mark.parametrize("saver", ["memory", "sqlite"])
def test_a_later_run_pauses_for_approval_resumes_once_and_cancels_on_its_own_account(
    saver: str, store: tuple[SqliteSaver, Path]
) -> None:
    h = harness(
        [
            call(n=1),
            final_citing_last,
            call("write_note", n=2, note="roll back"),
            final_citing_last,
            call("write_note", n=3, note="page oncall"),
        ],
        checkpointer=InMemorySaver() if saver == "memory" else store[0],
        approval="interrupt",
    )
    config = thread()
    first = h.run(config=config)
    h.graph.invoke({"messages": [HumanMessage("note it")]}, config, context=context())
    assert h.graph.get_state(config).next == ("approve",)
    paused = fp.run_output(h.graph.get_state(config).values)
    assert paused.run_id != first.run_id and paused.report is not None
    out = h.graph.invoke(Command(resume="approve"), config, context=context())
    second = fp.run_output(out)
    assert second.termination is fp.TerminationReason.COMPLETED
    assert [r.call_id for r in second.receipts] == ["call-0002"]
    assert h.calls.count("write_note") == 1
    # A third run, paused, then cancelled: it ends cancelled, the earlier two keep their endings.
    h.graph.invoke({"messages": [HumanMessage("page them")]}, config, context=context())
    cancelled = fp.cancel(h.graph, config, context=context())
    assert cancelled is not None and cancelled.termination is fp.TerminationReason.CANCELLED
    assert [t.termination for t in cancelled.turns] == [
        fp.TerminationReason.COMPLETED,
        fp.TerminationReason.COMPLETED,
    ]
    assert h.calls.count("write_note") == 1
    out = h.graph.invoke(None, config, context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.CANCELLED


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_each_later_run_s_first_write_stores_only_the_run_it_follows(
    kind: str, tmp_path: Path
) -> None:
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    try:
        saver = InMemorySaver() if kind == "memory" else SqliteSaver(conn)
        h = harness(
            [fp.FinalProposal(answer=fp.AnswerPayload(text=f"answer {n}")) for n in range(4)],
            checkpointer=saver,
        )
        config, ctx = thread(), context()
        for n in range(4):
            h.graph.invoke({"messages": [HumanMessage(f"question {n}?")]}, config, context=ctx)
        firsts = [
            value
            for tup in saver.list(config)
            for _, channel, value in tup.pending_writes or ()
            if channel == "run" and isinstance(value, dict) and "__follows__" in value
        ]
        # Three later runs, each first write one turn long: storage grows by a turn a run.
        assert sorted(len(w["turns"]) for w in firsts) == [1, 1, 1]
        latest = fp.run_output(h.graph.get_state(config).values)
        assert [t.question for t in latest.turns] == [f"question {n}?" for n in range(3)]
        assert [t.final_answer.text for t in latest.turns if t.final_answer] == [
            f"answer {n}" for n in range(3)
        ]
        # Every checkpoint still reads its run's whole conversation.
        history = [
            fp.run_output(s.values)
            for s in h.graph.get_state_history(config)
            if "run_id" in s.values.get("run", {})
        ]
        assert sorted({len(s.turns) for s in history}) == [0, 1, 2, 3]
        assert all(
            [t.question for t in s.turns] == [f"question {n}?" for n in range(len(s.turns))]
            for s in history
        )
    finally:
        conn.close()
