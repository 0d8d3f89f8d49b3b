"""ChatModelDecider: any LangChain chat model with bind_tools as the DecisionModel.

The fast path: a ``GenericFakeChatModel`` subclass with ``bind_tools`` (tests/adapters/fakes.py)
driving the real compiled graph, for the same scenarios test_openai_loopback.py runs against
ChatOpenAI over HTTP. Property tests feed arbitrary replies to the parser.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from fencepost.adapters.chat_model import (
    DeciderConfigError,
    parse_ai_message,
)
from fencepost.policy.decision_model import DecisionInput
from fencepost.policy.observation import Observation
from tests.adapters.fakes import (
    SECRET,
    RateLimitError,
    ToolLog,
    ai_call,
    ai_calls,
    ai_final,
    arun,
    build,
    data_block,
    decider,
    decision_input,
    final_citing_all,
    langchain_registry,
    tool_observation,
)
from tests.strategies import json_tree

# -- the scenarios, through the full graph ------------------------------------------------------


async def test_one_tool_call_runs_and_its_result_returns_as_data_joined_by_call_id() -> None:
    log = ToolLog()
    model, chat = decider(
        [ai_call("search_logs", {"query": "5xx"}, "call_0000000001"), final_citing_all]
    )
    state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer is not None
    assert state.final_answer.citations == ("call_0000000001",)
    assert log.names() == ["search_logs"]
    second = chat.received[1]
    ai, tool_msg = second[2], second[3]
    assert isinstance(ai, AIMessage) and isinstance(tool_msg, ToolMessage)
    assert [c["id"] for c in ai.tool_calls] == ["call_0000000001"]
    assert ai.tool_calls[0]["args"] == {"query": "5xx"}
    assert tool_msg.tool_call_id == "call_0000000001"
    assert data_block(tool_msg) == {"query": "5xx", "hits": ["500 /checkout (5xx)"]}


async def test_parallel_tool_calls_are_one_batch_and_results_join_by_call_id_not_arrival() -> None:
    log = ToolLog()
    # "...a" sleeps longer than "...b": the second call finishes first.
    model, chat = decider(
        [
            ai_calls(
                ("search_logs", {"query": "slow-a"}, "call_aaaaaaaa01"),
                ("search_logs", {"query": "fast-b"}, "call_bbbbbbbb02"),
            ),
            final_citing_all,
        ]
    )
    state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert sorted(log.names()) == ["search_logs", "search_logs"]
    assert [o.call_id for o in state.observations] == ["call_aaaaaaaa01", "call_bbbbbbbb02"]
    shown = {m.tool_call_id: data_block(m) for m in chat.received[1] if isinstance(m, ToolMessage)}
    assert shown["call_aaaaaaaa01"]["query"] == "slow-a"
    assert shown["call_bbbbbbbb02"]["query"] == "fast-b"
    # One AI turn holds both calls, as the model made them.
    ai_turns = [m for m in chat.received[1] if isinstance(m, AIMessage)]
    assert len(ai_turns) == 1 and len(ai_turns[0].tool_calls) == 2
    assert state.final_answer is not None
    assert set(state.final_answer.citations) == {"call_aaaaaaaa01", "call_bbbbbbbb02"}


async def test_invalid_tool_calls_end_as_invalid_proposal_and_nothing_runs() -> None:
    log = ToolLog()
    broken = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "type": "invalid_tool_call",
                "id": "call_bad0000001",
                "name": "search_logs",
                "args": '{"query": "5xx"',
                "error": "not valid JSON",
            }
        ],
    )
    model, _ = decider([broken])
    state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "invalid_tool_calls"
    assert log.calls == []


async def test_plain_text_is_a_final_answer_without_citations() -> None:
    model, _ = decider(["The 09:00 deploy broke checkout."])
    state = await arun(build(langchain_registry(ToolLog()), model))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer == fp.AnswerPayload(text="The 09:00 deploy broke checkout.")


async def test_plain_text_without_citations_is_refused_when_the_policy_requires_them() -> None:
    model, _ = decider(["The 09:00 deploy broke checkout."])
    graph = build(langchain_registry(ToolLog()), model, require_citations=True)
    state = await arun(graph)

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL


async def test_provider_refusal_is_a_typed_outcome_not_completed() -> None:
    refusal = AIMessage(content="", additional_kwargs={"refusal": "I can't help with that."})
    model, _ = decider([refusal])
    state = await arun(build(langchain_registry(ToolLog()), model))

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "model_refusal"
    assert state.final_answer is None


async def test_rate_limit_ends_failed_with_its_safe_code_after_one_step() -> None:
    model, chat = decider([RateLimitError(f"slow down, {SECRET}"), "never reached"])
    state = await arun(build(langchain_registry(ToolLog()), model, model_retries=0), steps=4)

    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "rate_limited"
    assert state.budget.steps_remaining == 3  # the failed call spent its reserved step
    assert len(chat.received) == 1
    assert "hunter2" not in state.model_dump_json()


async def test_a_rate_limit_is_retried_by_the_graph_at_the_next_step() -> None:
    model, chat = decider([RateLimitError(f"slow down, {SECRET}"), "The deploy broke it."])
    state = await arun(build(langchain_registry(ToolLog()), model), steps=4)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.budget.steps_used == 2  # the failed call and its retry each spent a step
    assert len(chat.received) == 2


async def test_abstain_tool_ends_with_the_models_reason() -> None:
    model, _ = decider([ai_call("abstain", {"reason": "needs_clarification"}, "call_abst000001")])
    state = await arun(build(langchain_registry(ToolLog()), model))

    assert state.termination is fp.TerminationReason.NEEDS_CLARIFICATION


async def test_tool_calls_from_an_unfinished_stream_are_an_invalid_proposal() -> None:
    # A provider integration always reports why it stopped; a reply with tool calls and no
    # finish reason is a stream cut short, its arguments possibly completed by a lenient parser.
    cut = ai_call(
        "search_logs",
        {"query": "5x"},
        "call_cut0000001",
        response_metadata={"model_provider": "openai"},
    )
    log = ToolLog()
    model, _ = decider([cut])
    state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "unfinished_stream"
    assert log.calls == []


async def test_token_usage_is_recorded_on_the_step_manifest() -> None:
    reply = AIMessage(
        content="done",
        usage_metadata={"input_tokens": 321, "output_tokens": 12, "total_tokens": 333},
    )
    model, _ = decider([reply])
    state = await arun(build(langchain_registry(ToolLog()), model))

    decide = [m for m in state.manifests if m.decision_kind == "final"]
    assert decide and decide[0].input_tokens == 321 and decide[0].output_tokens == 12
    assert state.budget.tokens_used == 333


async def test_short_or_reused_call_ids_are_replaced_and_recorded() -> None:
    log = ToolLog()
    model, chat = decider(
        [
            ai_call("search_logs", {"query": "one"}, "1"),
            ai_call("search_logs", {"query": "two"}, "call_same000001"),
            # The model reuses an id it already used: it must not be taken for the same call.
            ai_call("search_logs", {"query": "three"}, "call_same000001"),
            final_citing_all,
        ]
    )
    state = await arun(build(langchain_registry(log), model), steps=6, tools=5)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert log.names() == ["search_logs"] * 3
    ids = [o.call_id for o in state.observations]
    assert len(set(ids)) == 3
    assert ids[1] == "call_same000001"
    assert ids[0].startswith("fp-call-") and ids[2].startswith("fp-call-")
    # The model sees the ids that actually ran, each result under its own id.
    shown = [m.tool_call_id for m in chat.received[-1] if isinstance(m, ToolMessage)]
    assert shown == ids


async def test_a_reused_call_id_is_replaced_for_an_input_built_without_answered() -> None:
    # A DecisionInput made by hand names no ``answered``: the observations' ids are the used ones.
    model, _ = decider([ai_call("search_logs", {"query": "again"}, "call_seen0000001")])
    seen = Observation(
        sequence=1, step=1, call_id="call_seen0000001", tool_name="search_logs", kind="tool_result"
    )
    inp = DecisionInput(
        run_id="run-h",
        question="q",
        observations=(seen,),
        catalog=(),
        budget=fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=3),
        step=2,
    )
    decided = await model.decide(inp, deadline=fp.Deadline.after(5))
    assert isinstance(decided, fp.Decided)
    assert isinstance(decided.decision, fp.ToolProposal)
    assert decided.decision.call_id != "call_seen0000001"
    assert decided.generated_call_ids == (decided.decision.call_id,)


async def test_generated_call_ids_are_listed_on_the_decision() -> None:
    decided = parse_ai_message(
        ai_calls(("search_logs", {"query": "a"}, ""), ("search_logs", {"query": "b"}, "x" * 200)),
        run_id="run-1",
        step=1,
    )
    assert isinstance(decided.decision, fp.ToolBatch)
    ids = tuple(c.call_id for c in decided.decision.calls)
    assert decided.generated_call_ids == ids
    # Deterministic: the same reply at the same step gets the same ids (stable across retries).
    again = parse_ai_message(
        ai_calls(("search_logs", {"query": "a"}, ""), ("search_logs", {"query": "b"}, "x" * 200)),
        run_id="run-1",
        step=1,
    )
    assert again.generated_call_ids == ids


async def test_tool_errors_reach_the_model_as_their_safe_code_only() -> None:
    model, chat = decider(
        [
            ai_call("explode", {"reason": "boom"}, "call_expl000001"),
            "Could not find out.",
        ]
    )
    state = await arun(build(langchain_registry(ToolLog()), model))

    assert state.observations[0].error_code is fp.ErrorCode.INTERNAL_ERROR
    tool_msg = next(m for m in chat.received[1] if isinstance(m, ToolMessage))
    assert json.loads(str(tool_msg.content)) == {"tool_error": "internal_error", "retryable": False}
    assert tool_msg.status == "error"
    assert all("hunter2" not in str(m.content) for m in chat.received[1])


async def test_system_prompt_is_fixed_and_never_holds_observation_text() -> None:
    marker = "OBSERVED-MARKER-7731"
    log = ToolLog()
    model, chat = decider(
        [
            ai_call("search_logs", {"query": marker}, "call_mark000001"),
            ai_call("search_logs", {"query": "again"}, "call_mark000002"),
            final_citing_all,
        ],
        system_prompt="You are the checkout on-call assistant.",
    )
    await arun(build(langchain_registry(log), model))

    assert len(chat.received) == 3
    for messages in chat.received:
        systems = [m for m in messages if isinstance(m, SystemMessage)]
        assert len(systems) == 1 and messages[0] is systems[0]
        assert systems[0].content == model.system_prompt
        assert marker not in str(systems[0].content)
    assert model.system_prompt.startswith("You are the checkout on-call assistant.")


async def test_the_catalog_and_the_two_ending_tools_are_bound() -> None:
    model, chat = decider(["ok"])
    await arun(build(langchain_registry(ToolLog()), model))

    names = [t["function"]["name"] for t in chat.bound_tools[0]]
    assert names == ["search_logs", "explode", "final_answer", "abstain"]
    search = chat.bound_tools[0][0]["function"]["parameters"]
    assert search["additionalProperties"] is False


async def test_a_fresh_decider_rebuilds_the_conversation_from_the_input_alone() -> None:
    # A resume in a fresh process: the decider never saw the proposals that led here, and the
    # model is still shown each step's calls with the arguments they ran with.
    model, _ = decider(["ok"])
    first = fp.ToolProposal(
        call_id="call_0000000001", tool_name="search_logs", arguments={"query": "a"}
    )
    second = fp.ToolProposal(
        call_id="call_0000000002", tool_name="search_logs", arguments={"query": "b"}
    )
    third = fp.ToolProposal(
        call_id="call_0000000003", tool_name="search_logs", arguments={"query": "c"}
    )
    inp = fp.DecisionInput(
        run_id="run-x",
        question="q",
        observations=(
            fp.policy.Observation(
                sequence=0,
                step=1,
                call_id=first.call_id,
                tool_name="search_logs",
                kind="tool_result",
                result={"n": 1},
            ),
            fp.policy.Observation(
                sequence=1,
                step=2,
                call_id=second.call_id,
                tool_name="search_logs",
                kind="tool_error",
                error_code=fp.ErrorCode.TIMEOUT,
                retryable=True,
            ),
            fp.policy.Observation(
                sequence=2,
                step=2,
                call_id=third.call_id,
                tool_name="search_logs",
                kind="tool_result",
                result={"n": 3},
            ),
        ),
        proposals=(first, second, third),
        catalog=(),
        budget=fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=3),
        step=3,
    )
    messages = model.messages(inp)
    assert [type(m) for m in messages] == [
        SystemMessage,
        HumanMessage,
        AIMessage,
        ToolMessage,
        AIMessage,  # step 2 proposed two calls at once: one turn
        ToolMessage,
        ToolMessage,
    ]
    assert messages[2].tool_calls[0]["args"] == {"query": "a"}  # type: ignore[attr-defined]
    assert [c["args"] for c in messages[4].tool_calls] == [{"query": "b"}, {"query": "c"}]  # type: ignore[attr-defined]
    assert [m.tool_call_id for m in messages if isinstance(m, ToolMessage)] == [
        "call_0000000001",
        "call_0000000002",
        "call_0000000003",
    ]


async def test_the_deadline_bounds_a_slow_model_call() -> None:
    cut: list[bool] = []

    class SlowModel(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cut.append(True)
                raise
            raise AssertionError("unreachable")

    model = ChatModelDecider(SlowModel(messages=iter([])))
    graph = build(langchain_registry(ToolLog()), model, model_timeout_seconds=0.2)
    state = await arun(graph)

    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "timeout"
    # Bounded, not waited out: the call was cancelled (a stopwatch would stop on a busy machine).
    for _ in range(3000):
        if cut:
            break
        await asyncio.sleep(0.01)
    assert cut


def test_a_model_without_bind_tools_is_refused_up_front() -> None:
    with pytest.raises(DeciderConfigError, match="bind_tools"):
        ChatModelDecider(GenericFakeChatModel(messages=iter([])))


async def test_a_registry_tool_named_like_an_ending_tool_fails_loudly() -> None:
    model, _ = decider(["ok"])
    with pytest.raises(DeciderConfigError, match="final_answer"):
        model.tools_for([{"name": "final_answer", "description": "x", "parameters": {}}])
    renamed, _ = decider(["ok"], final_tool="finish")
    names = [t["function"]["name"] for t in renamed.tools_for([])]
    assert names == ["finish", "abstain"]


# -- the parser, one rule each ------------------------------------------------------------------


def _parse(message: Any, **kw: Any) -> fp.Decided:
    return parse_ai_message(message, run_id="run-1", step=1, **kw)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (
            ai_call(
                "search_logs",
                {"q": 1},
                "call_0000000001",
                response_metadata={"finish_reason": "length"},
            ),
            "truncated_output",
        ),
        (
            AIMessage(content="partial answ", response_metadata={"stop_reason": "max_tokens"}),
            "truncated_output",
        ),
        (
            AIMessage(content="", response_metadata={"finish_reason": "content_filter"}),
            "model_refusal",
        ),
        (AIMessage(content=[{"type": "refusal", "refusal": "no"}]), "model_refusal"),
        (AIMessage(content=""), "empty_response"),
        (
            ai_calls(
                ("search_logs", {"query": "a"}, "call_0000000001"),
                ("final_answer", {"text": "x", "citations": []}, "call_0000000002"),
            ),
            "mixed_ending_and_tool_calls",
        ),
        (
            ai_call("final_answer", {"text": "", "citations": ["call-0001"]}, "call_0000000001"),
            "malformed_final_answer",
        ),
        (
            ai_call("final_answer", {"text": "x", "citations": [], "extra": 1}, "call_0000000001"),
            "malformed_final_answer",
        ),
        (ai_call("abstain", {"reason": "bored"}, "call_0000000001"), "malformed_abstention"),
        (ai_call("Not-A-Tool!", {}, "call_0000000001"), "malformed_tool_call"),
        (
            AIMessageChunk(
                content="",
                tool_call_chunks=[
                    {
                        "name": "search_logs",
                        "args": '{"query": "5',
                        "id": "call_0000000001",
                        "index": 0,
                    }
                ],
            ),
            "unfinished_stream",
        ),
        ("just a string", "malformed_decision"),
    ],
)
def test_malformed_replies_are_invalid_proposals_with_their_code(message: Any, code: str) -> None:
    with pytest.raises(fp.InvalidProposal) as err:
        _parse(message)
    assert err.value.code == code


def test_non_object_arguments_are_an_invalid_proposal() -> None:
    message = ai_call("search_logs", {}, "call_0000000001")
    message.tool_calls[0]["args"] = ["not", "an", "object"]  # type: ignore[typeddict-item]
    with pytest.raises(fp.InvalidProposal) as err:
        _parse(message)
    assert err.value.code == "non_object_arguments"


def test_text_next_to_tool_calls_is_not_an_answer() -> None:
    message = AIMessage(
        content="Let me look that up.",
        tool_calls=[{"name": "search_logs", "args": {"query": "a"}, "id": "call_0000000001"}],
    )
    assert isinstance(_parse(message).decision, fp.ToolProposal)


def test_finish_reason_is_required_only_from_provider_integrations() -> None:
    bare = ai_call("search_logs", {"query": "a"}, "call_0000000001")
    assert isinstance(_parse(bare).decision, fp.ToolProposal)
    with pytest.raises(fp.InvalidProposal):
        _parse(bare, require_finish_reason=True)
    finished = ai_call(
        "search_logs",
        {"query": "a"},
        "call_0000000001",
        response_metadata={"model_provider": "openai", "finish_reason": "tool_calls"},
    )
    assert isinstance(_parse(finished).decision, fp.ToolProposal)


# -- properties: any reply is a decision or an InvalidProposal, never anything else -------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = json_tree(json_scalars, max_leaves=8)
names = st.sampled_from(
    ["search_logs", "final_answer", "abstain", "Bad Name", "", "x" * 80]
) | st.text(max_size=12)
ids = st.none() | st.text(max_size=140) | st.sampled_from(["call_0000000001", "used_call_0001"])
tool_calls = st.lists(
    st.fixed_dictionaries({"name": names, "args": json_values, "id": ids}), max_size=4
)
contents = st.text(max_size=40) | st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "refusal", "reasoning"]), "text": st.text(max_size=10)}
    ),
    max_size=3,
)
metadata = st.fixed_dictionaries(
    {},
    optional={
        "finish_reason": st.sampled_from(["stop", "tool_calls", "length", "content_filter", None]),
        "model_provider": st.sampled_from(["openai", "anthropic"]),
    },
)


# The forms a run's used call ids come in: a set, the run's ``answered`` mapping (looked up as
# given), a list, a one-shot generator (copied first).
used_forms = st.sampled_from(
    [
        lambda used: used,
        lambda used: dict.fromkeys(used, 1),
        lambda used: sorted(used),
        lambda used: (i for i in sorted(used)),
    ]
)


@settings(max_examples=300, deadline=None)
@given(calls=tool_calls, content=contents, meta=metadata, form=used_forms)
def test_any_reply_parses_to_a_decision_or_an_invalid_proposal(
    calls: list[dict[str, Any]], content: Any, meta: dict[str, Any], form: Any
) -> None:
    message = AIMessage(content=content, response_metadata=meta)
    # Set after construction: LangChain's own validation would reject some of these shapes.
    message.tool_calls = [{**c, "type": "tool_call"} for c in calls]  # type: ignore[misc]
    used = {"used_call_0001", "used_call_0002"}
    try:
        decided = parse_ai_message(message, run_id="run-p", step=2, used_call_ids=form(used))
    except fp.InvalidProposal as exc:
        assert exc.code and "\n" not in exc.code
        return
    decision = decided.decision
    if isinstance(decision, fp.ToolProposal | fp.ToolBatch):
        proposals = decision.calls if isinstance(decision, fp.ToolBatch) else (decision,)
        got = [p.call_id for p in proposals]
        assert len(set(got)) == len(got)
        assert not used & set(got)
        assert all(8 <= len(i) <= 128 for i in got)
        assert set(decided.generated_call_ids) <= set(got)
        assert len(proposals) == len(calls)
    else:
        assert isinstance(decision, fp.FinalProposal | fp.AbstainProposal)


@settings(max_examples=200, deadline=None)
@given(args=json_values)
def test_any_final_answer_arguments_give_an_answer_or_an_invalid_proposal(args: Any) -> None:
    message = ai_final("x")
    message.tool_calls[0]["args"] = args  # type: ignore[typeddict-item]
    try:
        decided = _parse(message)
    except fp.InvalidProposal:
        return
    assert isinstance(decided.decision, fp.FinalProposal)
    assert isinstance(args, dict) and isinstance(args.get("text"), str)


async def test_graph_refuses_a_call_id_reused_across_steps() -> None:
    from fencepost.adapters.scripted import ScriptedDecisionModel

    log = ToolLog()
    same = "call-same-0001"
    model = ScriptedDecisionModel(
        [
            fp.ToolProposal(call_id=same, tool_name="search_logs", arguments={"query": "one"}),
            fp.ToolProposal(call_id=same, tool_name="search_logs", arguments={"query": "two"}),
            fp.AbstainProposal(reason="insufficient_evidence"),
        ]
    )
    state = await arun(build(langchain_registry(log), model), steps=6, tools=4)

    # Either it is refused, or it runs and is observed; never charged-and-dropped.
    refused = state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert refused or len(log.calls) == state.budget.tool_calls_used == 2


@settings(max_examples=50, deadline=None)
@given(results=st.lists(json_values, max_size=6), question=st.text(max_size=20))
def test_the_model_is_given_exactly_the_conversation_the_decider_renders(
    results: list[Any], question: str
) -> None:
    # The conversation reaches the chat model as a prompt value, not as a list LangChain
    # converts and validates message by message again: the model is still given every message
    # messages() renders, in order, whatever the tool results and the question hold.
    observations = tuple(tool_observation(n, {"value": r}) for n, r in enumerate(results))
    inp = decision_input(observations, {"query": "q"}).model_copy(update={"question": question})
    model, chat = decider([ai_final("done")])
    asyncio.run(model.decide(inp, deadline=fp.Deadline.after(5)))
    assert chat.received == [model.messages(inp)]
