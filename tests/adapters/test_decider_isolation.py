"""No cache may cross runs: one ChatModelDecider serving two tenants shows each only its own data.

Both tenants pick every name a caller or model can choose alike: the same run id, the same thread
id, and a provider that omits call ids (so the adapter generates the same ones for both).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from tests.adapters.fakes import fake_model


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def lookup(_: NoArgs, ctx: fp.ToolContext) -> dict[str, str]:
    return {"account_note": f"private-note-of-{ctx.tenant_id}"}


REGISTRY = fp.ToolRegistry(
    [
        fp.ToolSpec(
            name="lookup_account",
            description="Look up the caller's account note.",
            args_model=NoArgs,
            effect=fp.Effect.READ,
            capability="accounts:read",
            timeout_seconds=5,
            execute=lookup,
        )
    ]
)


def _call_without_id() -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "lookup_account", "args": {}, "id": None}])


def _final(messages: list[BaseMessage]) -> AIMessage:
    return AIMessage(content="done")


def _run(decider: ChatModelDecider, tenant: str) -> fp.AgentState:
    graph = fp.build_agent_graph(REGISTRY, decider).compile(checkpointer=InMemorySaver())
    context = fp.RunContext(
        tenant_id=tenant,
        principal=fp.Principal(id="u-1", capabilities=frozenset({"accounts:read"})),
    )
    out = graph.invoke(
        fp.start("what is on my account?", run_id="run-shared"),
        {"configurable": {"thread_id": "thread-shared"}},
        context=context,
    )
    return fp.run_output(out)


def _text(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


def test_a_shared_decider_never_shows_one_tenant_another_tenants_tool_output() -> None:
    chat = fake_model([_call_without_id(), _final, _call_without_id(), _final])
    decider = ChatModelDecider(chat)
    first = _run(decider, "tenant-a")
    second = _run(decider, "tenant-b")
    assert first.termination is second.termination is fp.TerminationReason.COMPLETED
    # Both runs used the same generated call id: every caller- or model-chosen name is shared.
    assert first.observations[0].call_id == second.observations[0].call_id
    shown_to_b: Any = _text(chat.received[3])
    assert "private-note-of-tenant-b" in shown_to_b
    assert "private-note-of-tenant-a" not in shown_to_b
