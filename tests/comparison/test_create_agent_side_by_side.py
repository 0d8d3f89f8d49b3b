"""LangChain's ``create_agent`` and fencepost, side by side on the same scenarios.

Both systems get the same LangChain ``@tool`` functions and the same scripted chat model (a fake
``BaseChatModel`` with ``bind_tools``), compiled into real graphs with ``InMemorySaver``. Each test
asserts what each system was observed to do (langchain 1.5.2, langgraph 1.2.24), so the README's
comparison can claim exactly this and no more. If a LangChain upgrade changes a behaviour, the
test that pins it fails and the README's claim must be revisited.

Scenarios: how a run ends when limits are hit; whether budgets hold across a resume; whether a
tool exception's text reaches the next model input. Crash/retry needs processes and is pinned for
fencepost alone in ``tests/graph/test_crash_resume.py``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    ModelCallLimitMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)
from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError
from langchain.agents.middleware.tool_call_limit import ToolCallLimitExceededError
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.chat_model import ChatModelDecider
from fencepost.adapters.tools import tool_spec
from fencepost.policy.approval import ApprovalMode
from tests.adapters.fakes import FakeToolChatModel
from tests.unhurried import UNHURRIED_SECONDS

SECRET = "password=hunter2"
QUESTION = "why is checkout failing?"
APPROVE_ALL = {"decisions": [{"type": "approve"}]}
"""A ``HumanInTheLoopMiddleware`` (batched mode) answer approving the one gated call."""


# --- the shared scenario: tools, scripted model, both systems -----------------------------------


@dataclass
class Ran:
    """Every tool body that actually ran, in order."""

    bodies: list[str] = field(default_factory=list)


def lc_tools(ran: Ran) -> list[BaseTool]:
    """The LangChain tools both systems are given."""

    @tool
    def search_logs(query: str) -> str:
        """Search the service logs."""
        ran.bodies.append(f"search_logs:{query}")
        return f"500 /checkout ({query})"

    @tool
    def write_note(note: str) -> str:
        """Write an incident note."""
        ran.bodies.append(f"write_note:{note}")
        return "written"

    return [search_logs, write_note]


def exploding_tool(error: type[Exception]) -> BaseTool:
    """A tool whose exception message carries a secret."""

    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise error(SECRET)

    return explode


def tool_call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n:04d}"}])


def search_forever(*, write_first: bool = False) -> Iterator[AIMessage]:
    """A model that never stops calling tools (fresh arguments each time, so no repeat)."""
    if write_first:
        yield tool_call("write_note", {"note": "rollback deploy 42"}, 0)
    for n in itertools.count(1):
        yield tool_call("search_logs", {"query": f"checkout 500 #{n}"}, n)


def chat(script: Iterator[AIMessage]) -> FakeToolChatModel:
    return FakeToolChatModel(messages=script)


def thread() -> RunnableConfig:
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:12]}"}}


def agent(
    model: FakeToolChatModel,
    tools: Sequence[BaseTool],
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    *,
    saver: InMemorySaver | None = None,
    **kw: Any,
) -> Any:
    """``create_agent`` as documented: model, tools, middleware, a checkpointer."""
    return create_agent(
        model,
        tools=list(tools),
        middleware=list(middleware),
        checkpointer=saver or InMemorySaver(),
        **kw,
    )


def ask() -> dict[str, Any]:
    return {"messages": [HumanMessage(QUESTION)]}


def fp_graph(
    model: FakeToolChatModel,
    tools: Sequence[BaseTool],
    *,
    saver: InMemorySaver | None = None,
    approval: ApprovalMode = "terminate",
) -> Any:
    """fencepost on the same tools and the same chat model (through ``ChatModelDecider``)."""

    def spec(t: BaseTool) -> fp.ToolSpec:
        if t.name == "write_note":
            return tool_spec(t, effect=fp.Effect.WRITE, capability="notes:write", timeout_seconds=5)
        return tool_spec(t, effect=fp.Effect.READ, capability="logs:read", timeout_seconds=5)

    registry = fp.ToolRegistry([spec(t) for t in tools])
    return fp.build_agent_graph(registry, ChatModelDecider(model), approval=approval).compile(
        checkpointer=saver or InMemorySaver()
    )


def ctx() -> fp.RunContext:
    return fp.RunContext(
        tenant_id="acme",
        principal=fp.Principal(id="u-1", capabilities=frozenset({"logs:read", "notes:write"})),
        deadline=fp.Deadline.after(UNHURRIED_SECONDS),
    )


def fp_start(steps: int, tools: int) -> Any:
    return fp.start(QUESTION, fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools))


def last(out: dict[str, Any]) -> Any:
    return out["messages"][-1]


def checkpoint_text(saver: InMemorySaver, config: RunnableConfig) -> str:
    """Everything the saver holds for a thread — checkpoints, metadata, pending writes."""
    return "".join(repr(t) for t in saver.list(config))


# --- 1. how a run ends when limits are hit ------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3])
def test_create_agent_tool_limit_end_stops_after_n_tools_with_a_sentence_while_fencepost_ends_with_a_typed_reason(
    limit: int,
) -> None:
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    limiter = ToolCallLimitMiddleware(run_limit=limit, exit_behavior="end")
    out = agent(lc_model, lc_tools(ran_lc), [limiter]).invoke(ask(), thread())
    # create_agent: the count is right (N bodies ran, the N+1th model call's tool call was
    # blocked), and the run returns normally — but the only record of why is a sentence in an
    # AIMessage that, by type, looks like any final answer.
    assert len(ran_lc.bodies) == limit
    assert len(lc_model.received) == limit + 1
    assert set(out) == {"messages"}
    assert isinstance(last(out), AIMessage) and not last(out).tool_calls
    assert last(out).content == (
        f"Tool call limit reached: run limit exceeded ({limit + 1}/{limit} calls)."
    )
    # fencepost: the same N bodies and model calls; the reason is a typed field of the state.
    state = fp.run_output(
        fp_graph(fp_model, lc_tools(ran_fp)).invoke(fp_start(10, limit), thread(), context=ctx())
    )
    assert len(ran_fp.bodies) == limit
    assert len(fp_model.received) == limit + 1
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert state.budget.tool_calls_used == limit


def test_create_agent_tool_limit_default_continue_lets_a_looping_model_reach_graph_recursion_error_while_fencepost_ends_tool_budget_exhausted() -> (
    None
):
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    limiter = ToolCallLimitMiddleware(run_limit=3)
    # The default exit_behavior blocks the tool but asks the model again: a model that ignores
    # "Do not make additional tool calls." keeps being called until LangGraph's recursion limit.
    assert limiter.exit_behavior == "continue"
    with pytest.raises(GraphRecursionError):
        agent(lc_model, lc_tools(ran_lc), [limiter]).invoke(
            ask(), {**thread(), "recursion_limit": 40}
        )
    assert len(ran_lc.bodies) == 3
    assert len(lc_model.received) > 10
    state = fp.run_output(
        fp_graph(fp_model, lc_tools(ran_fp)).invoke(
            fp_start(10, 3), {**thread(), "recursion_limit": 40}, context=ctx()
        )
    )
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert len(ran_fp.bodies) == 3
    assert len(fp_model.received) == 4


def test_create_agent_model_limit_default_end_stops_after_n_model_calls_with_a_sentence_while_fencepost_ends_step_budget_exhausted() -> (
    None
):
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    limiter = ModelCallLimitMiddleware(run_limit=3)
    assert limiter.exit_behavior == "end"
    out = agent(lc_model, lc_tools(ran_lc), [limiter]).invoke(ask(), thread())
    # The count holds as well as fencepost's: three model calls, three tool bodies.
    assert len(lc_model.received) == 3
    assert len(ran_lc.bodies) == 3
    assert set(out) == {"messages"}
    assert isinstance(last(out), AIMessage) and not last(out).tool_calls
    assert last(out).content == "Model call limits exceeded: run limit (3/3)"
    state = fp.run_output(
        fp_graph(fp_model, lc_tools(ran_fp)).invoke(fp_start(3, 10), thread(), context=ctx())
    )
    assert len(fp_model.received) == 3
    # fencepost keeps the last step for answering (answer_margin=1): the third turn may answer
    # or abstain but not call a tool, so two tool bodies ran; the stop is still typed.
    assert len(ran_fp.bodies) == 2
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "answer_margin"
    assert state.budget.steps_used == 3


@pytest.mark.parametrize(
    ("limiter", "error", "stuck_at"),
    [
        (
            ToolCallLimitMiddleware(run_limit=3, exit_behavior="error"),
            ToolCallLimitExceededError,
            "ToolCallLimitMiddleware.after_model",
        ),
        (
            ModelCallLimitMiddleware(run_limit=3, exit_behavior="error"),
            ModelCallLimitExceededError,
            "ModelCallLimitMiddleware.before_model",
        ),
    ],
    ids=["tool_limit", "model_limit"],
)
def test_create_agent_limit_error_raises_out_of_invoke_and_a_retry_runs_n_more_while_fencepost_returns_the_reason_and_a_retry_runs_nothing(
    limiter: AgentMiddleware[Any, Any, Any], error: type[Exception], stuck_at: str
) -> None:
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    graph, config = agent(lc_model, lc_tools(ran_lc), [limiter]), thread()
    with pytest.raises(error):
        graph.invoke(ask(), config)
    assert len(ran_lc.bodies) == 3
    # The thread is left mid-run at the limiting node, not finished ...
    assert graph.get_state(config).next == (stuck_at,)
    # ... and retrying it (invoke(None)) starts a fresh run count: three more tools run.
    with pytest.raises(error):
        graph.invoke(None, config)
    assert len(ran_lc.bodies) == 6

    fp_g, fp_config = fp_graph(fp_model, lc_tools(ran_fp)), thread()
    first = fp.run_output(fp_g.invoke(fp_start(10, 3), fp_config, context=ctx()))
    assert first.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert fp_g.get_state(fp_config).next == ()
    again = fp.run_output(fp_g.invoke(None, fp_config, context=ctx()))
    assert again == first
    assert len(ran_fp.bodies) == 3


def test_create_agent_without_limit_middleware_ends_in_graph_recursion_error_while_fencepost_ends_step_budget_exhausted_before_the_recursion_limit() -> (
    None
):
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    graph = agent(lc_model, lc_tools(ran_lc))
    # create_agent's own ceiling is LangGraph's recursion limit, raised to 9,999 supersteps.
    assert graph.config["recursion_limit"] == 9_999
    with pytest.raises(GraphRecursionError):
        graph.invoke(ask(), {**thread(), "recursion_limit": 10})
    assert len(ran_lc.bodies) == 5
    # fencepost under the same small recursion limit and a budget larger than it: it ends as data
    # a couple of supersteps before LangGraph would raise.
    state = fp.run_output(
        fp_graph(fp_model, lc_tools(ran_fp)).invoke(
            fp_start(100, 100), {**thread(), "recursion_limit": 10}, context=ctx()
        )
    )
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "recursion_limit"
    assert len(ran_fp.bodies) == 4


# --- 2. budgets across a resume ------------------------------------------------------------------


def test_create_agent_run_limit_resets_on_a_new_invocation_and_thread_limit_persists_while_each_new_fencepost_message_is_a_run_with_its_own_budget() -> (
    None
):
    per_invoke: dict[str, list[int]] = {}
    for name, limiter in {
        "run_limit": ToolCallLimitMiddleware(run_limit=2, exit_behavior="end"),
        "run_and_thread_limit": ToolCallLimitMiddleware(
            run_limit=2, thread_limit=3, exit_behavior="end"
        ),
    }.items():
        ran = Ran()
        graph, config = agent(chat(search_forever()), lc_tools(ran), [limiter]), thread()
        per_invoke[name] = []
        for _ in range(3):
            graph.invoke({"messages": [HumanMessage("and now?")]}, config)
            per_invoke[name].append(len(ran.bodies))
    # run_limit is per invocation: each new message on the thread gets two more tool calls.
    assert per_invoke["run_limit"] == [2, 4, 6]
    # thread_limit persists in the checkpoint: three in all, whatever the number of invocations.
    assert per_invoke["run_and_thread_limit"] == [2, 3, 3]

    ran_fp = Ran()
    fp_model = chat(search_forever())
    fp_g, config = fp_graph(fp_model, lc_tools(ran_fp)), thread()
    first = fp.run_output(fp_g.invoke(fp_start(10, 2), config, context=ctx()))
    assert first.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert fp.run_output(fp_g.invoke(None, config, context=ctx())) == first  # resumes nothing
    second = fp.run_output(fp_g.invoke(fp_start(10, 2), config, context=ctx()))
    # New input on a finished fencepost thread is the thread's next run, with the budget it
    # names (its own ledger account): two more calls, as run_limit gives, and each run ends typed.
    assert second.run_id != first.run_id
    assert second.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert [t.run_id for t in second.turns] == [first.run_id]
    assert len(ran_fp.bodies) == 4


def test_create_agent_run_limits_reset_on_every_resume_after_interrupt_before_tools_while_fencepost_budget_continues() -> (
    None
):
    ran_lc, ran_fp = Ran(), Ran()
    lc_model, fp_model = chat(search_forever()), chat(search_forever())
    limiters: list[AgentMiddleware[Any, Any, Any]] = [
        ToolCallLimitMiddleware(run_limit=2, exit_behavior="end"),
        ModelCallLimitMiddleware(run_limit=2),
    ]
    graph = agent(lc_model, lc_tools(ran_lc), limiters, interrupt_before=["tools"])
    config = thread()
    graph.invoke(ask(), config)
    for _ in range(5):
        graph.invoke(None, config)
    # Both run counters live in UntrackedValue channels, which are not checkpointed: each resume
    # starts them at zero, so neither limit of 2 ever trips.
    assert len(ran_lc.bodies) == 5
    assert len(lc_model.received) == 6
    assert graph.get_state(config).next == ("tools",)

    fp_g, config = fp_graph(fp_model, lc_tools(ran_fp)), thread()
    fp_g.invoke(fp_start(10, 2), config, context=ctx(), interrupt_before=["execute"])
    for _ in range(5):
        fp_g.invoke(None, config, context=ctx(), interrupt_before=["execute"])
    state = fp.run_output(fp_g.get_state(config).values)
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert len(ran_fp.bodies) == 2
    assert len(fp_model.received) == 3
    assert fp_g.get_state(config).next == ()


def _hitl_run(limiter: AgentMiddleware[Any, Any, Any], *, limit_first: bool) -> tuple[int, int]:
    """create_agent gating write_note for approval; returns (tool bodies, model calls)."""
    ran, model = Ran(), chat(search_forever(write_first=True))
    hitl = HumanInTheLoopMiddleware(interrupt_on={"write_note": True})
    middleware = [limiter, hitl] if limit_first else [hitl, limiter]
    graph, config = agent(model, lc_tools(ran), middleware), thread()
    paused = graph.invoke(ask(), config)
    assert "__interrupt__" in paused and ran.bodies == []
    graph.invoke(Command(resume=APPROVE_ALL), config)
    return len(ran.bodies), len(model.received)


def _fp_approval_run(steps: int, tools: int) -> tuple[fp.AgentState, int, int]:
    ran, model = Ran(), chat(search_forever(write_first=True))
    graph, config = fp_graph(model, lc_tools(ran), approval="interrupt"), thread()
    graph.invoke(fp_start(steps, tools), config, context=ctx())
    assert ran.bodies == [] and graph.get_state(config).next == ("approve",)
    state = fp.run_output(graph.invoke(Command(resume="approve"), config, context=ctx()))
    return state, len(ran.bodies), len(model.received)


def test_create_agent_run_limit_listed_after_hitl_resets_across_the_approval_while_fencepost_budget_continues() -> (
    None
):
    # The limit's after_model counts the gated call, then HumanInTheLoopMiddleware interrupts
    # (after_model hooks run in reverse list order); the resume loses that run count.
    tools_ran, _ = _hitl_run(
        ToolCallLimitMiddleware(run_limit=2, exit_behavior="end"), limit_first=False
    )
    assert tools_ran == 3  # over a run_limit of 2
    _, model_calls = _hitl_run(ModelCallLimitMiddleware(run_limit=2), limit_first=False)
    assert model_calls == 3  # over a run_limit of 2

    state, tools_ran, _ = _fp_approval_run(steps=10, tools=2)
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert tools_ran == 2
    state, _, model_calls = _fp_approval_run(steps=2, tools=10)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert model_calls == 2


def test_create_agent_run_limit_listed_before_hitl_holds_across_the_approval_as_fencepost_budget_does() -> (
    None
):
    # Listed first, the limit's after_model runs after the interrupt resolves: nothing was
    # counted before the pause, so nothing is lost. The same limit, another list order.
    tools_ran, _ = _hitl_run(
        ToolCallLimitMiddleware(run_limit=2, exit_behavior="end"), limit_first=True
    )
    assert tools_ran == 2
    _, model_calls = _hitl_run(ModelCallLimitMiddleware(run_limit=2), limit_first=True)
    assert model_calls == 2

    _, tools_ran, _ = _fp_approval_run(steps=10, tools=2)
    assert tools_ran == 2


def test_create_agent_thread_limit_holds_across_resume_as_fencepost_budget_does() -> None:
    for limit_first in (True, False):
        tools_ran, _ = _hitl_run(
            ToolCallLimitMiddleware(thread_limit=2, exit_behavior="end"), limit_first=limit_first
        )
        assert tools_ran == 2
        _, model_calls = _hitl_run(
            ModelCallLimitMiddleware(thread_limit=2), limit_first=limit_first
        )
        assert model_calls == 2
    ran, model = Ran(), chat(search_forever())
    limiters: list[AgentMiddleware[Any, Any, Any]] = [
        ToolCallLimitMiddleware(thread_limit=2, exit_behavior="end"),
        ModelCallLimitMiddleware(thread_limit=3),
    ]
    graph = agent(model, lc_tools(ran), limiters, interrupt_before=["tools"])
    config = thread()
    graph.invoke(ask(), config)
    for _ in range(5):
        graph.invoke(None, config)
    assert len(ran.bodies) == 2
    assert len(model.received) == 3
    assert graph.get_state(config).next == ()

    state, tools_ran, _ = _fp_approval_run(steps=10, tools=2)
    assert state.termination is fp.TerminationReason.TOOL_BUDGET_EXHAUSTED
    assert tools_ran == 2


# --- 3. a tool exception's text -------------------------------------------------------------------


def _explode_then_answer() -> Iterator[AIMessage]:
    return iter([tool_call("explode", {"reason": "x"}, 1), AIMessage(content="checkout is down")])


@pytest.mark.parametrize("error", [RuntimeError, ToolException])
def test_create_agent_default_tool_node_reraises_the_tool_exception_and_checkpoints_its_text_while_fencepost_shows_the_model_a_safe_code_and_completes(
    error: type[Exception],
) -> None:
    lc_model, lc_saver, config = chat(_explode_then_answer()), InMemorySaver(), thread()
    graph = agent(lc_model, [exploding_tool(error)], saver=lc_saver)
    with pytest.raises(error, match=SECRET):
        graph.invoke(ask(), config)
    # The run stops at the tools node; the model is never called again, so the text does not
    # reach a model input — but it is the exception the caller gets, and the checkpoint keeps it
    # as the failed task's error.
    assert len(lc_model.received) == 1
    stuck = graph.get_state(config)
    assert stuck.next == ("tools",)
    assert SECRET in repr(stuck.tasks[0].error)
    assert SECRET in checkpoint_text(lc_saver, config)

    fp_model, fp_saver, config = (
        chat(_explode_then_answer()),
        InMemorySaver(),
        thread(),
    )
    fp_g = fp_graph(fp_model, [exploding_tool(error)], saver=fp_saver)
    state = fp.run_output(fp_g.invoke(fp_start(5, 5), config, context=ctx()))
    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    shown = [m for m in fp_model.received[1] if isinstance(m, ToolMessage)]
    assert [m.content for m in shown] == ['{"tool_error": "internal_error", "retryable": false}']
    assert all(SECRET not in repr(m) for turn in fp_model.received for m in turn)
    assert SECRET not in checkpoint_text(fp_saver, config)


def test_create_agent_tool_retry_middleware_default_sends_the_exception_text_to_the_model_while_fencepost_sends_a_safe_code() -> (
    None
):
    lc_model, config = chat(_explode_then_answer()), thread()
    retry = ToolRetryMiddleware(max_retries=0)
    assert retry.on_failure == "continue"
    out = agent(lc_model, [exploding_tool(RuntimeError)], [retry]).invoke(ask(), config)
    tool_messages = [m for m in lc_model.received[1] if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages] == [
        f"Tool 'explode' failed after 1 attempt with RuntimeError: {SECRET}. Please try again."
    ]
    assert last(out).content == "checkout is down"

    fp_model = chat(_explode_then_answer())
    state = fp.run_output(
        fp_graph(fp_model, [exploding_tool(RuntimeError)]).invoke(
            fp_start(5, 5), thread(), context=ctx()
        )
    )
    assert state.termination is fp.TerminationReason.COMPLETED
    assert all(SECRET not in repr(m) for turn in fp_model.received for m in turn)
