"""Per tool: the built-in empty-query rule can be turned off (a search that takes ``query=""``
with another filter), and the repeat guard has the tool's own limit (three equal transfers)."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

import fencepost as fp
from tests.graph.kit import budget, thread


def _transfer(n: int) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id=f"call-{n:04d}",
        tool_name="send_money",
        arguments={"recipient": "GB29NWBK60161331926819", "amount": 10.0},
    )


def _bank(sent: list[dict[str, Any]], **rules: Any) -> fp.ToolSpec:
    @fp.tool(effect="read", capability="bank:pay", name="send_money", **rules)
    def send_money(recipient: str, amount: float) -> dict[str, Any]:
        """Send money (a read here, so no approval is needed in this test)."""
        sent.append({"recipient": recipient, "amount": amount})
        return {"sent": True}  # the same result every time: only the limit tells repeats apart

    return send_money


def _run(spec: fp.ToolSpec, script: list[Any], **build: Any) -> fp.AgentState:
    graph = fp.build_agent_graph(
        fp.ToolRegistry([spec]), fp.ScriptedDecisionModel(script), **build
    ).compile(checkpointer=InMemorySaver())
    ctx = fp.RunContext(
        tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"bank:pay"})
    )
    return fp.run_output(graph.invoke(fp.start("pay rent", budget(8, 6)), thread(), context=ctx))


def test_a_tool_with_its_own_repeat_limit_runs_three_equal_transfers() -> None:
    sent: list[dict[str, Any]] = []
    done = fp.FinalProposal(answer=fp.AnswerPayload(text=""))
    state = _run(_bank(sent, repeat_limit=3), [_transfer(1), _transfer(2), _transfer(3), done])
    assert state.termination is fp.TerminationReason.COMPLETED
    assert len(sent) == 3


def test_a_fourth_equal_transfer_past_the_tools_limit_is_no_progress_and_never_runs() -> None:
    sent: list[dict[str, Any]] = []
    script = [_transfer(n) for n in range(1, 5)]
    state = _run(_bank(sent, repeat_limit=3), script)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert len(sent) == 3
    assert state.budget.tool_calls_used == 3


def test_without_a_limit_of_its_own_a_tool_has_the_graphs() -> None:
    sent: list[dict[str, Any]] = []
    state = _run(_bank(sent), [_transfer(1), _transfer(2), _transfer(3)], repeat_limit=2)
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert len(sent) == 2


def _mail(seen: list[tuple[str, str]], **rules: Any) -> fp.ToolSpec:
    @fp.tool(effect="read", capability="mail:read", **rules)
    def search_emails(query: str, sender: str = "") -> dict[str, Any]:
        """Search the mailbox by text, sender or both."""
        seen.append((query, sender))
        return {"emails": []}

    return search_emails


def _search(query: str) -> fp.ToolProposal:
    return fp.ToolProposal(
        call_id="call-0001",
        tool_name="search_emails",
        arguments={"query": query, "sender": "lily@example.com"},
    )


def test_a_tool_that_allows_an_empty_query_runs_a_search_by_sender_alone() -> None:
    seen: list[tuple[str, str]] = []
    done = fp.FinalProposal(answer=fp.AnswerPayload(text="no mail from Lily"))
    graph = fp.build_agent_graph(
        fp.ToolRegistry([_mail(seen, allow_empty_query=True)]),
        fp.ScriptedDecisionModel([_search(""), done]),
    ).compile(checkpointer=InMemorySaver())
    ctx = fp.RunContext(
        tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"mail:read"})
    )
    state = fp.run_output(graph.invoke(fp.start("mail from Lily?"), thread(), context=ctx))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert seen == [("", "lily@example.com")]


def test_the_empty_query_rule_still_refuses_an_empty_query_for_any_other_tool() -> None:
    seen: list[tuple[str, str]] = []
    graph = fp.build_agent_graph(
        fp.ToolRegistry([_mail(seen)]), fp.ScriptedDecisionModel([_search("")])
    ).compile(checkpointer=InMemorySaver())
    ctx = fp.RunContext(
        tenant_id="acme", principal=fp.Principal(id="u-1", capabilities={"mail:read"})
    )
    state = fp.run_output(graph.invoke(fp.start("mail from Lily?"), thread(), context=ctx))
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert seen == []
