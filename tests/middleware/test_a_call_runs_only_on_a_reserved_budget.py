"""Invariant 3 in the middleware binding: a tool runs only on a reservation of its budget, held
in the ledger, whatever the run's record in state says (DESIGN, "Isolation": limits are enforced
from the ledger, which ``update_state`` cannot reach)."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from fencepost.policy.fingerprint import proposal_fingerprint
from tests.middleware.kit import Ran, ask, budget, chat, ctx, lc_tools, specs, then_answer, thread


def _entry(record: dict[str, Any], call_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(e for e in record["batch"] if e["proposal"]["call_id"] == call_id)
    return found


def test_a_batch_entry_a_caller_allows_in_the_record_runs_only_within_the_tool_budget() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    both = AIMessage(
        content="",
        tool_calls=[
            {"name": "search_logs", "args": {"query": "first"}, "id": "call-0001"},
            {"name": "search_logs", "args": {"query": "second"}, "id": "call-0002"},
        ],
    )
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(steps=5, tools=1), denial="observe")
    graph = create_agent(
        chat(then_answer(both)),
        tools=tools,
        middleware=[guard],
        checkpointer=InMemorySaver(),
        context_schema=fp.RunContext,
        interrupt_before=["tools"],
    )
    config, caller = thread(), ctx()
    record = graph.invoke(ask(), config, context=caller)["fencepost_run"]
    allowed, refused = _entry(record, "call-0001"), _entry(record, "call-0002")
    assert refused["verdict"]["code"] == "budget_exhausted"
    # The caller rewrites the refused call's verdict as an allowed one for its own arguments.
    refused["verdict"] = dict(
        allowed["verdict"],
        call_id="call-0002",
        fingerprint=proposal_fingerprint("search_logs", {"query": "second"}),
    )
    graph.update_state(config, {"fencepost_run": record})
    out = graph.invoke(None, config, context=caller)
    assert ran.bodies == ["search_logs:first"]
    assert out["termination"] == "completed"
