"""With ``tool_catalog="permitted"`` the model is shown only the tools its caller may use.

Each model step is shown the tools whose capability the run's principal holds (the gate's own
check), worked out per step from the run's context: two callers of one graph each see their own
catalog, and after a lead's approval the run goes on with the requester's catalog, as its calls
are gated under the requester's capabilities. ``"all"`` (the default) shows every tool. The
filter is not the enforcement: a call to a tool the model was not shown is still refused.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.policy import TerminationReason
from tests.adapters import fakes
from tests.graph.kit import Calls, budget, call, context, final_citing_last, make_registry, thread

ENDINGS = {"final_answer", "abstain"}

sent: list[str] = []


@fp.tool(effect="read", capability="logs:read")
def search_logs(query: str) -> dict[str, Any]:
    """Search the service logs."""
    return {"hits": [f"500 on /checkout ({query})"]}


@fp.tool(effect="external", capability="payments:write")
def send_money(recipient: str, amount: int) -> dict[str, Any]:
    """Send money to a recipient."""
    sent.append(recipient)
    return {"sent": amount}


TOOLS = [search_logs, send_money]


def caller(principal: str, *caps: str) -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id=principal, capabilities=frozenset(caps)),
    )


READER = caller("u-reader", "logs:read")
PAYER = caller("u-payer", "logs:read", "payments:write")


def shown(tools: list[dict[str, Any]]) -> set[str]:
    """The registry's tools a model call was bound to (the two ending tools left out)."""
    return {t["function"]["name"] for t in tools} - ENDINGS


def search_then_answer(messages: list[BaseMessage]) -> Any:
    if any(isinstance(m, ToolMessage) for m in messages):
        return fakes.final_citing_all(messages)
    return fakes.ai_call("search_logs", {"query": "checkout"}, "call-0001")


def test_a_principal_without_the_capability_is_not_shown_the_tool() -> None:
    chat = fakes.fake_model([search_then_answer, search_then_answer])
    agent = fp.create_agent(chat, TOOLS, checkpointer=InMemorySaver(), tool_catalog="permitted")
    out = fp.run_output(agent.invoke(fp.start("why?"), fakes.thread(), context=READER))
    assert out.termination is TerminationReason.COMPLETED
    assert [shown(tools) for tools in chat.bound_tools] == [{"search_logs"}] * 2


def test_a_principal_holding_the_capability_is_shown_it() -> None:
    chat = fakes.fake_model([fakes.ai_final("nothing to do")])
    agent = fp.create_agent(chat, TOOLS, checkpointer=InMemorySaver(), tool_catalog="permitted")
    agent.invoke(fp.start("pay"), fakes.thread(), context=PAYER)
    assert shown(chat.bound_tools[0]) == {"search_logs", "send_money"}


def test_all_shows_every_tool_whatever_the_principal_holds() -> None:
    for kw in ({}, {"tool_catalog": "all"}):
        chat = fakes.fake_model([fakes.ai_final("nothing to do")])
        agent = fp.create_agent(chat, TOOLS, checkpointer=InMemorySaver(), **kw)
        agent.invoke(fp.start("why?"), fakes.thread(), context=READER)
        assert shown(chat.bound_tools[0]) == {"search_logs", "send_money"}


def test_two_principals_running_at_once_on_one_graph_each_see_their_own_catalog() -> None:
    # Both runs reach the model before either goes on (a barrier in the model), so their steps
    # interleave on one graph, one decider and one chat model.
    both_asked = threading.Barrier(2, timeout=60)

    def first_then_answer(messages: list[BaseMessage]) -> Any:
        if not any(isinstance(m, ToolMessage) for m in messages):
            both_asked.wait()
        return search_then_answer(messages)

    chat = fakes.fake_model([first_then_answer] * 4)
    agent = fp.create_agent(chat, TOOLS, checkpointer=InMemorySaver(), tool_catalog="permitted")

    async def both() -> list[Any]:
        return await asyncio.gather(
            agent.ainvoke(fp.start("reader's question"), fakes.thread(), context=READER),
            agent.ainvoke(fp.start("payer's question"), fakes.thread(), context=PAYER),
        )

    outs = asyncio.run(both())
    assert all(fp.run_output(o).termination is TerminationReason.COMPLETED for o in outs)
    by_question: dict[str, list[set[str]]] = {}
    for messages, tools in chat.requests:
        question = next(m.content for m in messages if isinstance(m, HumanMessage))
        by_question.setdefault(str(question), []).append(shown(tools))
    assert by_question == {
        "reader's question": [{"search_logs"}] * 2,
        "payer's question": [{"search_logs", "send_money"}] * 2,
    }


def test_a_call_to_a_tool_the_model_was_not_shown_is_still_refused_by_the_gate() -> None:
    sent.clear()
    chat = fakes.fake_model(
        [fakes.ai_call("send_money", {"recipient": "mallory", "amount": 100}, "call-0001")]
    )
    agent = fp.create_agent(chat, TOOLS, checkpointer=InMemorySaver(), tool_catalog="permitted")
    out = fp.run_output(agent.invoke(fp.start("pay"), fakes.thread(), context=READER))
    assert shown(chat.bound_tools[0]) == {"search_logs"}
    assert out.termination is TerminationReason.POLICY_DENIED
    assert out.report is not None
    assert out.report.missing_capabilities == ("payments:write",)
    assert sent == []


def test_after_a_leads_approval_the_model_is_shown_the_requesters_catalog() -> None:
    # The lead holds "admin" and the engineer does not: the step after the lead's answer is
    # the engineer's, shown the tools the engineer's recorded capabilities allow.
    catalogs: list[set[str]] = []

    def recording(step: Any) -> Any:
        def decide(inp: fp.DecisionInput) -> Any:
            catalogs.append({entry["name"] for entry in inp.catalog})
            return step(inp) if callable(step) else step

        return decide

    engineer = context(principal="oncall-ana", seconds=None)
    lead = context(
        principal="lead-bo", caps=frozenset({"approve:notes:write", "admin"}), seconds=None
    )
    calls = Calls()
    model = fp.ScriptedDecisionModel(
        [recording(call("write_note", 1, note="restart checkout")), recording(final_citing_last)]
    )
    graph = fp.build_agent_graph(
        make_registry(calls), model, approval="interrupt", tool_catalog="permitted"
    ).compile(checkpointer=InMemorySaver())
    config = thread()
    graph.invoke(fp.start("fix checkout", budget()), config, context=engineer)
    out = fp.run_output(graph.invoke(Command(resume="approve"), config, context=lead))
    assert out.termination is TerminationReason.COMPLETED
    engineers = {"search_logs", "write_note", "explode", "hang"}
    assert catalogs == [engineers, engineers]


@pytest.mark.parametrize("value", ["some", "ALL", None, ["permitted"]])
def test_a_bad_tool_catalog_is_refused_naming_the_field(value: Any) -> None:
    builds = [
        lambda: fp.create_agent(fp.ScriptedDecisionModel([]), TOOLS, tool_catalog=value),
        lambda: fp.build_agent_graph(
            fp.ToolRegistry(TOOLS), fp.ScriptedDecisionModel([]), tool_catalog=value
        ),
        lambda: fp.FencepostMiddleware(TOOLS, tool_catalog=value),
    ]
    for build in builds:
        with pytest.raises(fp.GraphConfigError) as raised:
            build()
        assert raised.value.field == "tool_catalog"
