"""A healthy chat model that refuses to be copied (its ``__copy__`` raises, as a model holding a
lock or a live connection may declare) answers under ainvoke as it does under invoke: the
middleware's containment of a model's ``SystemExit`` under ainvoke works on a copy of the model,
and a model that will not be copied is sent as it is, never failed for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.messages import AIMessage

import fencepost as fp
from tests.adapters.fakes import FakeToolChatModel
from tests.middleware.kit import Ran, agent, ask, budget, ctx, lc_tools, specs, thread


def _script() -> Any:
    while True:
        yield AIMessage(content="checkout is down")


class _Uncopyable(FakeToolChatModel):
    def __copy__(self) -> Any:
        raise TypeError("this model holds a live connection and cannot be copied")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_chat_model_that_cannot_be_copied_answers_under_ainvoke_as_under_invoke(
    mode: str,
) -> None:
    tools = lc_tools(Ran())
    guard = fp.FencepostMiddleware(specs(tools), budget=budget(), model_retries=0)
    graph, config = agent(_Uncopyable(messages=_script()), tools, [guard]), thread()
    if mode == "invoke":
        out = graph.invoke(ask(), config, context=ctx())
    else:
        out = asyncio.run(graph.ainvoke(ask(), config, context=ctx()))
    assert (out["termination"], out["last_error_code"]) == ("completed", None)
