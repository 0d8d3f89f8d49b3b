"""The provenance rule in the middleware binding: a write whose sensitive argument traces only
to an untrusted tool's output (as the thread's tool messages hold it) is refused
``untrusted_provenance`` under ``provenance="refuse"``, and never runs; under the default
``"observe"`` it goes on to the usual approval."""

from __future__ import annotations

import pytest

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, budget, call, chat, ctx, lc_tools, thread

FOUND = "payments-gateway timeout"


def _run(ran: Ran, **settings: object) -> dict[str, object]:
    search, write = lc_tools(ran)
    specs = [
        fp.tool(search, effect="read", capability="logs:read"),
        fp.tool(write, effect="write", capability="notes:write", sensitive=("note",)),
    ]
    mw = fp.FencepostMiddleware(specs, budget=budget(), **settings)  # type: ignore[arg-type]
    model = chat(
        iter([call("search_logs", {"query": FOUND}, 1), call("write_note", {"note": FOUND}, 2)])
    )
    out: dict[str, object] = agent(model, [search, write], [mw]).invoke(
        ask(), thread(), context=ctx()
    )
    return out


def test_a_write_whose_note_traces_only_to_tool_output_is_refused_by_the_middleware() -> None:
    ran = Ran()
    out = _run(ran, provenance="refuse")
    assert ran.bodies == [f"search_logs:{FOUND}"]
    assert out["termination"] == fp.TerminationReason.POLICY_DENIED.value
    assert out["last_error_code"] == "untrusted_provenance"


def test_under_observe_the_middleware_lets_the_same_write_go_on_to_its_approval() -> None:
    ran = Ran()
    out = _run(ran)
    assert out["termination"] == fp.TerminationReason.APPROVAL_REQUIRED.value


def test_the_middlewares_provenance_setting_is_checked() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.FencepostMiddleware([], provenance="sometimes")  # type: ignore[arg-type]
    assert raised.value.field == "provenance"


def test_a_value_from_tool_output_another_middleware_summarised_is_still_refused() -> None:
    # SummarizationMiddleware replaces the tool result with a human message summarising it:
    # the address the result carried is still the tool output's, not the model's own.
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import AIMessage

    evil = "evil@attacker.com"
    ran = Ran()
    search, write = lc_tools(ran)
    specs = [
        fp.tool(search, effect="read", capability="logs:read"),
        fp.tool(write, effect="write", capability="notes:write", sensitive=("note",)),
    ]
    summarizer = chat(iter([AIMessage(f"The logs say to mail {evil} about it.")] * 5))
    summarize = SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 1))
    model = chat(
        iter(
            [
                call("search_logs", {"query": f"mail {evil}"}, 1),
                call("search_logs", {"query": "more"}, 2),
                call("write_note", {"note": evil}, 3),
            ]
        )
    )
    guard = fp.FencepostMiddleware(specs, budget=budget(), provenance="refuse")
    out = agent(model, [search, write], [summarize, guard]).invoke(ask(), thread(), context=ctx())
    assert not any(m.type == "tool" and evil in str(m.content) for m in out["messages"])
    assert (out["termination"], out["last_error_code"]) == ("policy_denied", "untrusted_provenance")
    assert ran.bodies == [f"search_logs:mail {evil}", "search_logs:more"]


def test_the_users_own_question_is_never_an_untrusted_source() -> None:
    # The address is in the user's question and in the tool's output: the user's, and runs.
    from langchain_core.messages import HumanMessage

    mail = "ops@example.com"
    ran = Ran()
    search, write = lc_tools(ran)
    specs = [
        fp.tool(search, effect="read", capability="logs:read"),
        fp.tool(write, effect="write", capability="notes:write", sensitive=("note",)),
    ]
    model = chat(
        iter([call("search_logs", {"query": mail}, 1), call("write_note", {"note": mail}, 2)])
    )
    guard = fp.FencepostMiddleware(specs, budget=budget(), provenance="refuse")
    out = agent(model, [search, write], [guard]).invoke(
        {"messages": [HumanMessage(f"note that {mail} owns checkout")]}, thread(), context=ctx()
    )
    assert out["last_error_code"] == "approval_required"
