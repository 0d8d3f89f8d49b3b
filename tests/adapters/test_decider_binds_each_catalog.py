"""A decider whose callers are shown different catalogs (``tool_catalog="permitted"``) binds the
chat model to each input's own catalog, and keeps each binding: steps of callers with different
rights, interleaved, never see each other's tools nor bind the model again at every step."""

from __future__ import annotations

import asyncio
from typing import Any

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from tests.adapters.fakes import FakeToolChatModel, ai_final


class CountingChat(FakeToolChatModel):
    """A fake chat model that counts how often it is bound to tools."""

    binds: int = 0

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        self.binds += 1
        return super().bind_tools(tools, tool_choice=tool_choice, **kwargs)


def entry(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"The {name} tool.", "parameters": {"type": "object"}}


def step(catalog: tuple[dict[str, Any], ...], n: int) -> fp.DecisionInput:
    return fp.DecisionInput(
        run_id=f"run-{n}",
        question="q",
        observations=(),
        catalog=catalog,
        budget=fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4),
        step=1,
    )


def test_interleaved_callers_are_each_bound_to_their_own_catalog_once() -> None:
    reader = (entry("search_logs"),)
    payer = (entry("search_logs"), entry("send_money"))
    chat = CountingChat(messages=iter([ai_final("ok") for _ in range(6)]))
    decider = ChatModelDecider(chat)
    deadline = fp.Deadline.after(60)
    catalogs = [reader, payer, reader, payer, payer, reader]

    async def steps() -> None:
        for n, catalog in enumerate(catalogs):
            await decider.decide(step(catalog, n), deadline=deadline)

    asyncio.run(steps())
    shown = [
        {t["function"]["name"] for t in tools} - {"final_answer", "abstain"}
        for tools in chat.bound_tools
    ]
    assert shown == [{e["name"] for e in c} for c in catalogs]
    assert chat.binds == 2
