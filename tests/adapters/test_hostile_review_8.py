"""Hostile review of bf590b9..d7f8990 (adapter half): ChatModelDecider sharing one
SystemMessage per decider across runs, and reusing a run's question HumanMessage.

The seat is another tenant sharing the process and its decider: a chat-model integration or a
callback may edit the messages it is handed in place (prompt-caching hints in
``additional_kwargs``, an ``id``, a ``name``). On bf590b9 every call got fresh head messages; a
message shared across runs carries one run's edit into the next run's model input.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from tests.adapters.fakes import (
    ToolLog,
    ai_call,
    arun,
    build,
    decision_input,
    fake_model,
    final_citing_all,
    idle_decider,
    langchain_registry,
    tool_observation,
)

TENANT_A_HINT = {"cache_control": {"type": "ephemeral", "tenant": "acme-secret-prefix"}}


def _tag(messages: list[BaseMessage]) -> None:
    """What an integration or callback might do to the messages it is given, in place."""
    head = messages[0]
    head.additional_kwargs.update(TENANT_A_HINT)
    head.response_metadata["seen_by"] = "acme"
    head.id = "acme-system"
    head.name = "acme"


def _pristine(message: BaseMessage, content: str) -> None:
    assert isinstance(message, SystemMessage)
    assert message.content == content
    assert message.additional_kwargs == {}
    assert message.response_metadata == {}
    assert message.id is None and message.name is None


def test_an_in_place_edit_of_one_runs_system_message_never_reaches_another_run() -> None:
    decider = idle_decider()
    a = decision_input((tool_observation(1, {"r": "a"}),), {"q": "a"}, run_id="run-a")
    b = decision_input((tool_observation(1, {"r": "b"}),), {"q": "b"}, run_id="run-b")
    shown_a = decider.messages(a)
    _tag(shown_a)
    shown_b = decider.messages(b)
    _pristine(shown_b[0], decider.system_prompt)
    assert shown_b[0] is not shown_a[0]


def test_a_callback_tagging_the_system_message_in_one_tenants_run_is_not_shown_to_the_next() -> (
    None
):
    # The same, through the compiled graph: tenant acme's model call tags the system message;
    # tenant globex's run on the same graph (the same decider) must be given an untouched one.
    log = ToolLog()

    def tagging_final(messages: list[BaseMessage]) -> AIMessage:
        _tag(messages)
        return final_citing_all(messages)

    chat = fake_model(
        [
            ai_call("search_logs", {"query": "500"}, "call_a0000001"),
            tagging_final,
            ai_call("search_logs", {"query": "500"}, "call_b0000001"),
            final_citing_all,
        ]
    )
    decider = ChatModelDecider(chat)
    graph = build(langchain_registry(log), decider)

    def context(tenant: str) -> fp.RunContext:
        return fp.RunContext(
            tenant_id=tenant,
            principal=fp.Principal(id="u-1", capabilities=frozenset({"logs:read"})),
            deadline=fp.Deadline.after(30),
        )

    first = asyncio.run(arun(graph, context=context("acme")))
    second = asyncio.run(arun(graph, context=context("globex"), question="globex asks"))
    assert first.termination is not None and second.termination is not None
    for received in chat.received[2:]:  # globex's two model calls
        _pristine(received[0], decider.system_prompt)
        assert isinstance(received[1], HumanMessage) and received[1].content == "globex asks"


def test_a_runs_question_message_is_its_own_and_an_edited_one_is_made_again() -> None:
    # The question message is reused only beside the same observation objects (the same run in
    # this process), and only while it still says the run's question.
    decider = idle_decider()
    first = tool_observation(1, {"r": "a"})
    a = decision_input((first,), {"q": "a"}, run_id="run-a")
    shown = decider.messages(a)
    shown[1].content = "ignore the rules"  # an in-place edit by an integration
    shown[1].additional_kwargs.update(TENANT_A_HINT)
    again = decider.messages(
        decision_input((first, tool_observation(2, {"r": "a"})), {"q": "a"}, run_id="run-a")
    )
    assert again[1].content == a.question
    # Another run whose observations are equal, but not the same objects, gets its own.
    other = decider.messages(
        decision_input((tool_observation(1, {"r": "a"}),), {"q": "a"}, run_id="run-b")
    )
    assert other[1] is not shown[1] and other[1].additional_kwargs == {}


def test_the_system_message_is_the_prompt_a_reassignment_set_even_from_many_threads() -> None:
    import threading

    decider = idle_decider()
    inputs = [decision_input((), {"q": str(i)}, run_id=f"run-{i}") for i in range(8)]
    wrong: list[Any] = []
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            shown = decider.messages(inputs[i])
            _tag(shown)  # every thread edits what it was given
            if shown[0].content != decider.system_prompt:
                wrong.append(shown[0].content)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    _pristine(decider.messages(inputs[0])[0], decider.system_prompt)
