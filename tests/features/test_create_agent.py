"""``fp.create_agent(model, tools, checkpointer=...)``: one call builds the compiled agent from a
chat model or a DecisionModel and a list of tools, with the loop's budget and approval settings."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import tool as langchain_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from tests.adapters import fakes

USER = fp.RunContext(
    tenant_id="acme",
    principal=fp.Principal(id="u-1", capabilities={"logs:read", "deploys:read", "notes:write"}),
)


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [f"500 on /checkout ({query})"]}


@langchain_tool
def search_deploys(service: str) -> dict[str, Any]:
    """Recent deployments of a service."""
    return {"deploys": [{"id": "deploy-42", "service": service}]}


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


notes: list[str] = []
write_note = fp.ToolSpec(
    name="write_note",
    description="Save a note.",
    args_model=NoteArgs,
    effect="write",
    capability="notes:write",
    execute=lambda args, ctx: notes.append(args.note) or {"saved": True},
)


def _config() -> dict[str, Any]:
    return fakes.thread()


def test_a_decision_model_and_decorated_tools_make_a_compiled_agent() -> None:
    model = fp.ScriptedDecisionModel(
        [
            fp.ToolProposal(call_id="call-0001", tool_name="search_logs", arguments={"query": "x"}),
            fp.FinalProposal(answer=fp.AnswerPayload(text="deploy 42", citations=("call-0001",))),
        ]
    )
    agent = fp.create_agent(model, [search_logs])
    assert isinstance(agent, CompiledStateGraph)
    state = fp.run_output(agent.invoke(fp.start("why?"), context=USER))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer is not None and state.final_answer.citations == ("call-0001",)


def test_a_chat_model_with_langchain_and_fencepost_tools_runs_under_the_given_checkpointer() -> (
    None
):
    chat = fakes.fake_model(
        [
            fakes.ai_calls(
                ("search_logs", {"query": "checkout"}, "call-a-0001"),
                ("search_deploys", {"service": "checkout"}, "call-b-0001"),
            ),
            fakes.final_citing_all,
        ]
    )
    saver = InMemorySaver()
    agent = fp.create_agent(
        chat,
        [search_logs, fp.tool(search_deploys, effect="read", capability="deploys:read")],
        checkpointer=saver,
        system_prompt="You are the on-call assistant.",
    )
    config = _config()
    state = fp.run_output(agent.invoke(fp.start("why?"), config, context=USER))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert {o.tool_name for o in state.observations} == {"search_logs", "search_deploys"}
    assert agent.get_state(config).values["run"]["termination"] == "completed"
    system = chat.received[0][0]
    assert str(system.content).startswith("You are the on-call assistant.")


def test_approval_and_budget_settings_reach_the_loop() -> None:
    notes.clear()
    model = fp.ScriptedDecisionModel(
        [
            fp.ToolProposal(call_id="call-0001", tool_name="write_note", arguments={"note": "hi"}),
            fp.AbstainProposal(reason="needs_clarification"),
        ]
    )
    ledger = fp.InMemoryLedger()
    agent = fp.create_agent(
        model, [write_note], checkpointer=InMemorySaver(), approval="interrupt", ledger=ledger
    )
    config = _config()
    paused = agent.invoke(fp.start("note it"), config, context=USER)
    assert paused["__interrupt__"] and notes == []
    state = fp.run_output(agent.invoke(Command(resume="approve"), config, context=USER))
    assert notes == ["hi"]
    assert state.termination is fp.TerminationReason.NEEDS_CLARIFICATION


def test_a_langchain_tool_without_a_capability_is_refused_naming_fp_tool() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.create_agent(fp.ScriptedDecisionModel([]), [search_deploys])
    message = str(raised.value)
    assert "search_deploys" in message and "capability=" in message and "tool_spec(" in message


def test_a_model_that_is_neither_a_chat_model_nor_a_decision_model_is_named() -> None:
    with pytest.raises(fp.GraphConfigError, match=r"model: must be a LangChain chat model"):
        fp.create_agent("gpt-4.1-mini", [search_logs])


def test_build_agent_graph_stays_for_compiling_your_own() -> None:
    graph = fp.build_agent_graph(fp.ToolRegistry([search_logs]), fp.ScriptedDecisionModel([]))
    assert not isinstance(graph, CompiledStateGraph)
    assert isinstance(graph.compile(), CompiledStateGraph)
