"""ChatOpenAI (langchain-openai, the real HTTP client) against a loopback Chat Completions server.

The server (tests/adapters/openai_replay.py) replays Chat Completions responses in the API's wire
format and records every request, so each test checks both what the run ended with and exactly
what the model was sent. The full compiled graph runs in every case.

Retries: with ``max_retries=0`` a 429 ends the run as ``failed``/``rate_limited`` after one step.
With ``max_retries=1`` the *openai client* retries internally (honouring ``retry-after-ms``)
inside the same model step: the server sees two requests, the run spends one step. Such retries
are bounded by the step's deadline, not by the step budget.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_openai import ChatOpenAI

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from tests.adapters.fakes import ToolLog, arun, build, ctx, langchain_registry
from tests.adapters.openai_replay import (
    Reply,
    rate_limited_reply,
    refusal_reply,
    replay_server,
    stream_chunks,
    text_reply,
    text_stream,
    tool_call,
    tool_calls_reply,
)


def chat(base_url: str, **kw: Any) -> ChatOpenAI:
    kw.setdefault("max_retries", 0)
    return ChatOpenAI(
        model="gpt-4.1-mini", base_url=base_url, api_key="sk-test-not-a-key", timeout=10, **kw
    )  # type: ignore[arg-type]


def final_call(call_id: str, text: str, citations: list[str], n: int = 9) -> Reply:
    return tool_calls_reply(
        tool_call(call_id, "final_answer", json.dumps({"text": text, "citations": citations})), n=n
    )


def tool_messages(request: dict[str, Any]) -> dict[str, Any]:
    """tool_call_id -> the data inside its untrusted block, from a recorded request."""
    out = {}
    for message in request["messages"]:
        if message["role"] == "tool":
            content = json.loads(message["content"])
            assert set(content) == {"untrusted_tool_output"}
            out[message["tool_call_id"]] = content["untrusted_tool_output"]
    return out


async def test_one_tool_call_runs_and_the_result_goes_back_joined_by_call_id() -> None:
    log = ToolLog()
    script = [
        tool_calls_reply(tool_call("call_Qx1abc23def45", "search_logs", '{"query": "5xx"}')),
        final_call("call_Fin0000000001", "deploy 42 broke checkout", ["call_Qx1abc23def45"]),
    ]
    with replay_server(script) as server:
        model = ChatModelDecider(chat(server.base_url))
        state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer is not None
    assert state.final_answer.citations == ("call_Qx1abc23def45",)
    assert log.names() == ["search_logs"]
    first, second = server.requests
    assert [t["function"]["name"] for t in first["tools"]] == [
        "search_logs",
        "explode",
        "final_answer",
        "abstain",
    ]
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant = second["messages"][2]
    assert assistant["tool_calls"][0]["id"] == "call_Qx1abc23def45"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"query": "5xx"}
    assert tool_messages(second) == {
        "call_Qx1abc23def45": {"query": "5xx", "hits": ["500 /checkout (5xx)"]}
    }


async def test_two_parallel_tool_calls_are_a_batch_and_both_results_join_by_call_id() -> None:
    log = ToolLog()
    script = [
        tool_calls_reply(
            tool_call("call_AAAA00000001", "search_logs", '{"query": "slow-a"}'),
            tool_call("call_BBBB00000002", "search_logs", '{"query": "fast-b"}'),
        ),
        final_call("call_Fin0000000002", "both", ["call_AAAA00000001", "call_BBBB00000002"]),
    ]
    with replay_server(script) as server:
        state = await arun(build(langchain_registry(log), ChatModelDecider(chat(server.base_url))))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert log.names() == ["search_logs", "search_logs"]
    assert [r.call_id for r in state.receipts] == ["call_AAAA00000001", "call_BBBB00000002"]
    shown = tool_messages(server.requests[1])
    assert shown["call_AAAA00000001"]["query"] == "slow-a"
    assert shown["call_BBBB00000002"]["query"] == "fast-b"
    assistant = [m for m in server.requests[1]["messages"] if m["role"] == "assistant"]
    assert len(assistant) == 1 and len(assistant[0]["tool_calls"]) == 2


async def test_malformed_json_arguments_end_as_invalid_proposal() -> None:
    log = ToolLog()
    script = [tool_calls_reply(tool_call("call_Bad000000001", "search_logs", '{"query": "5xx"'))]
    with replay_server(script) as server:
        state = await arun(build(langchain_registry(log), ChatModelDecider(chat(server.base_url))))

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "invalid_tool_calls"
    assert log.calls == []


async def test_final_text_is_a_completed_answer_and_usage_is_on_the_manifest() -> None:
    with replay_server([text_reply("The 09:00 deploy broke checkout.")]) as server:
        state = await arun(
            build(langchain_registry(ToolLog()), ChatModelDecider(chat(server.base_url)))
        )

    assert state.termination is fp.TerminationReason.COMPLETED
    assert state.final_answer == fp.AnswerPayload(text="The 09:00 deploy broke checkout.")
    final = next(m for m in state.manifests if m.decision_kind == "final")
    assert (final.input_tokens, final.output_tokens) == (120, 30)


async def test_a_429_without_client_retries_ends_failed_rate_limited_after_one_step() -> None:
    script = [rate_limited_reply("org-secret-hunter2"), text_reply("never asked")]
    with replay_server(script) as server:
        state = await arun(
            build(
                langchain_registry(ToolLog()),
                ChatModelDecider(chat(server.base_url)),
                model_retries=0,
            ),
            steps=3,
        )

    assert state.termination is fp.TerminationReason.FAILED
    assert state.last_error_code == "rate_limited"
    assert state.budget.steps_remaining == 2
    assert len(server.requests) == 1
    assert "hunter2" not in state.model_dump_json()


async def test_a_429_is_retried_by_the_graph_with_a_step_of_its_own() -> None:
    script = [rate_limited_reply("org-secret-hunter2"), text_reply("The deploy broke it.")]
    with replay_server(script) as server:
        model = ChatModelDecider(chat(server.base_url))
        state = await arun(build(langchain_registry(ToolLog()), model), steps=3)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert len(server.requests) == 2
    assert state.budget.steps_remaining == 1  # the 429 spent a step, the retry another


async def test_a_429_then_success_is_retried_inside_one_step_by_the_client() -> None:
    script = [rate_limited_reply(), text_reply("The deploy broke it.")]
    with replay_server(script) as server:
        model = ChatModelDecider(chat(server.base_url, max_retries=1))
        state = await arun(build(langchain_registry(ToolLog()), model), steps=3)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert len(server.requests) == 2  # the client's own retry
    assert state.budget.steps_remaining == 2  # one model step, not two


async def test_a_refusal_is_a_typed_outcome_not_completed() -> None:
    with replay_server([refusal_reply()]) as server:
        state = await arun(
            build(langchain_registry(ToolLog()), ChatModelDecider(chat(server.base_url)))
        )

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "model_refusal"
    assert state.final_answer is None


async def test_a_stream_cut_before_its_finish_reason_is_not_executed() -> None:
    # The client's lenient parser completes '{"query": "5x' into {"query": "5x"}: only the
    # missing finish_reason shows the call was cut short.
    log = ToolLog()
    cut = Reply(stream=stream_chunks("call_Cut000000001", "search_logs", ['{"que', 'ry": "5x']))
    with replay_server([cut]) as server:
        model = ChatModelDecider(chat(server.base_url, streaming=True))
        state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "unfinished_stream"
    assert log.calls == []


async def test_a_complete_stream_runs_normally() -> None:
    chunks = stream_chunks("call_Str000000001", "search_logs", ['{"que', 'ry": "5xx"}'])
    chunks.append(
        {**chunks[0], "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    )
    log = ToolLog()
    script = [Reply(stream=chunks), Reply(stream=text_stream("done"))]
    with replay_server(script) as server:
        model = ChatModelDecider(chat(server.base_url, streaming=True))
        state = await arun(build(langchain_registry(log), model))

    assert state.termination is fp.TerminationReason.COMPLETED
    assert log.calls == [("search_logs", {"query": "5xx", "limit": 10})]


def test_the_sync_graph_drives_the_async_client_too() -> None:
    log = ToolLog()
    script = [
        tool_calls_reply(tool_call("call_Sync00000001", "search_logs", '{"query": "5xx"}')),
        final_call("call_Fin0000000003", "found", ["call_Sync00000001"]),
    ]
    with replay_server(script) as server:
        graph = build(langchain_registry(log), ChatModelDecider(chat(server.base_url)))
        out = graph.invoke(
            fp.start("why?", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=2)),
            {"configurable": {"thread_id": "t-sync"}},
            context=ctx(),
        )
    state = fp.run_output(out)

    assert state.termination is fp.TerminationReason.COMPLETED
    assert log.names() == ["search_logs"]
