"""No cache may cross runs: one ChatModelDecider serving two tenants shows each only its own data.

Both tenants pick every name a caller or model can choose alike: the same run id, the same thread
id, and a provider that omits call ids (so the adapter generates the same ones for both). A
message one run's integration or callback edits in place (a prompt-caching hint, an id) never
reaches another run, and the turns cached for one run's records are never shown to another run
whose records landed at the same addresses.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters import ChatModelDecider
from fencepost.policy.decision_model import DecisionInput
from fencepost.policy.observation import Observation
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
from tests.unhurried import UNHURRIED_SECONDS


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


# -- messages a caller or integration edits in place -------------------------------------------


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
            deadline=fp.Deadline.after(UNHURRIED_SECONDS),
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


# -- rendered turns are keyed by the objects, never by a reused address ------------------------


def _tenant_observation(n: int, secret: str) -> Observation:
    # Same call ids and steps for every tenant: only the content tells whose turn it is.
    return tool_observation(n, {"secret": secret, "n": n})


def _tenant_input(observations: tuple[Observation, ...], secret: str) -> DecisionInput:
    return decision_input(observations, {"q": secret}, run_id="run-same-for-everyone")


def _secrets_shown(messages: list[BaseMessage]) -> set[str]:
    shown: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            for secret in _SECRETS:
                if secret in str(m.content):
                    shown.add(secret)
        if isinstance(m, AIMessage):
            for tc in m.tool_calls:
                shown.add(tc["args"].get("q", ""))
    return shown


ROOT = Path(__file__).resolve().parents[2]
_SECRETS = [f"tenant-{i:03d}-secret" for i in range(200)]


REUSES = 5
"""How many times a tenant must have landed on another's freed address for the probe to count."""


def reused_address_probe() -> tuple[int, int]:
    """Pairs of runs until an address was reused REUSES times: (reused, tried). Each pair asserts
    that tenant B, at tenant A's freed addresses, is shown only its own turns."""
    # Tenant A's run dies, and tenant B's observations are made at once: the allocator hands B
    # A's freed addresses (same call ids, same steps), the key the decider's cache is held
    # under. B must be rendered from its own records, never from A's cached turns.
    decider = idle_decider()
    reused = tried = 0
    while reused < REUSES and tried < 5_000:
        a, b = _SECRETS[(2 * tried) % 200], _SECRETS[(2 * tried + 1) % 200]
        tried += 1
        records_a = tuple(_tenant_observation(n, a) for n in range(3))
        first_a, last_a = id(records_a[0]), id(records_a[-1])
        assert _secrets_shown(decider.messages(_tenant_input(records_a, a))) == {a}
        del records_a  # freed here (no cycle holds it): its blocks are the next ones handed out
        records_b = tuple(_tenant_observation(n, b) for n in range(3))
        reused += id(records_b[0]) == first_a or id(records_b[-1]) == last_a
        assert _secrets_shown(decider.messages(_tenant_input(records_b, b))) == {b}
        del records_b
    return reused, tried


def test_a_tenant_at_a_reused_address_is_never_shown_another_tenants_turns() -> None:
    # In a process of its own: after a long session the allocator's free lists are fragmented
    # and a freed block is rarely the next one handed out, so the probe would prove nothing.
    code = (
        "from tests.adapters.test_decider_isolation import reused_address_probe;"
        "print(*reused_address_probe())"
    )
    # Every pair asserts the rule; the reuses are only the probe's precondition. A process
    # whose allocator happened not to hand freed blocks back (seen once in CI, 1 reuse in
    # 5,000 pairs, never reproduced) proved nothing either way: another process probes again.
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        reused, tried = map(int, proc.stdout.split()[-2:])
        if reused >= REUSES:
            break
    assert reused >= REUSES, f"an address was reused {reused} times in {tried} pairs of runs"


class _CollectingLock:
    """The decider's lock, running a garbage collection while held: weakref callbacks fire
    inside ``_remember_prefix`` (and ``_rendered_prefix``) as the collector may fire them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()
        gc.collect()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.fixture
def collector_sees_only_this_test() -> Iterator[None]:
    """Everything alive before the test is left out of every collection until it ends.

    The collections the lock runs then walk only what the test made (its decider and its runs'
    records and cycles, which they free as before) instead of the whole process's heap, which
    made each one cost a large share of a second late in the suite.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.mark.usefixtures("collector_sees_only_this_test")
def test_runs_dying_in_a_collection_inside_the_lock_neither_deadlock_nor_leak_nor_cross() -> None:
    decider = idle_decider()
    decider._lock = _CollectingLock()  # type: ignore[assignment]
    errors: list[BaseException] = []

    def tenant(index: int) -> None:
        try:
            secret = _SECRETS[index]
            for _ in range(3):  # each pass a new run; the last one's records die in a cycle
                records = tuple(_tenant_observation(n, secret) for n in range(4))
                cycle: list[Any] = [records]
                cycle.append(cycle)  # only the collector frees them, inside some lock holder
                for k in range(1, 5):
                    shown = _secrets_shown(decider.messages(_tenant_input(records[:k], secret)))
                    assert shown == {secret}, (secret, shown)
                del records, cycle
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=tenant, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung: a callback waited on the lock"
    assert not errors, errors[0]
    gc.collect()
    live = (_tenant_observation(0, _SECRETS[199]),)
    decider.messages(_tenant_input(live, _SECRETS[199]))  # a step of a live run tidies up
    assert len(decider._rendered) == 1  # every dead run's turns are gone: only the live one
    assert decider._gone == []
