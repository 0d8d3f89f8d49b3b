"""``fp.check_middleware``: ``create_agent`` hands a middleware nothing of the list it is in,
so the list is checked before it is given to ``create_agent``: exactly one
``FencepostMiddleware``, listed after every middleware that wraps tool calls (LangChain composes
``wrap_tool_call`` first-listed outermost), and none of the middleware it replaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents.middleware import (
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    ModelCallLimitMiddleware,
    PIIMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)

import fencepost as fp
from tests.middleware.kit import Ran, agent, ask, budget, chat, ctx, lc_tools, search_forever, specs
from tests.middleware.kit import thread as new_thread


def _fencepost() -> fp.FencepostMiddleware:
    return fp.FencepostMiddleware(specs(lc_tools(Ran())), budget=budget(tools=1))


class AuditToolCalls(AgentMiddleware):  # type: ignore[type-arg]
    """Another team's tool wrapper (async only: it wraps tool calls all the same)."""

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


def _retry() -> ToolRetryMiddleware:
    return ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)


@pytest.mark.parametrize("wrapper", [_retry, AuditToolCalls], ids=["retry", "custom"])
def test_a_tool_wrapper_listed_after_fencepost_is_refused_and_before_it_is_kept(
    wrapper: Callable[[], AgentMiddleware],  # type: ignore[type-arg]
) -> None:
    mw = _fencepost()
    with pytest.raises(fp.MiddlewareOrderError) as raised:
        fp.check_middleware([mw, wrapper()])
    assert raised.value.field == "middleware"
    assert type(wrapper()).__name__ in str(raised.value)
    kept = [wrapper(), mw]
    assert fp.check_middleware(kept) == kept


@pytest.mark.parametrize(
    "replaced",
    [
        lambda: ToolCallLimitMiddleware(run_limit=1),
        lambda: ModelCallLimitMiddleware(run_limit=3),
        lambda: HumanInTheLoopMiddleware(interrupt_on={"write_note": True}),
    ],
    ids=["tool_call_limit", "model_call_limit", "human_in_the_loop"],
)
def test_the_middleware_fencepost_replaces_is_refused_beside_it(
    replaced: Callable[[], AgentMiddleware],  # type: ignore[type-arg]
) -> None:
    with pytest.raises(fp.MiddlewareOrderError) as raised:
        fp.check_middleware([replaced(), _fencepost()])
    assert "is replaced by fp.FencepostMiddleware" in str(raised.value)


@pytest.mark.parametrize("count", [0, 2])
def test_a_list_without_exactly_one_fencepost_middleware_is_refused(count: int) -> None:
    with pytest.raises(fp.MiddlewareOrderError, match="exactly one"):
        fp.check_middleware([_fencepost() for _ in range(count)])


def test_summarization_and_pii_middleware_listed_before_it_pass_the_check_and_run() -> None:
    ran = Ran()
    tools = lc_tools(ran)
    summarize = SummarizationMiddleware(
        chat(search_forever()), trigger=("messages", 50), keep=("messages", 10)
    )
    mw = fp.FencepostMiddleware(specs(tools), budget=budget(tools=1))
    listed = fp.check_middleware([summarize, PIIMiddleware("email", strategy="redact"), mw])
    out = agent(chat(search_forever()), tools, listed).invoke(ask(), new_thread(), context=ctx())
    assert out["termination"] == fp.TerminationReason.TOOL_BUDGET_EXHAUSTED.value
    assert len(ran.bodies) == 1
