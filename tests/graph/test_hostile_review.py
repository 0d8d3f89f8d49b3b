"""A hostile review of the refactored loop, from three seats.

1. A caller holding a thread's config: any ``Command(update=..., resume=..., goto=...)`` or
   ``update_state``.
2. Another tenant sharing the process (one ledger, one compiled graph or one per tenant).
3. The process itself: hostile tools, validators, usage reports, values and recursion limits.

Each test is named after the rule it pins. A strict xfail marks a rule fencepost breaks today;
its reason names the bug.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from tests.graph.kit import (
    ABSTAIN,
    allowed_verdict,
    budget,
    call,
    context,
    harness,
    saver_bytes,
    thread,
)

CANARY = "canary-s3cr3t-7f1e"


# -- seat 1: a caller who can write the thread's state --------------------------------------------


def _pause_before_execute(h: Any, ctx: fp.RunContext, tools: int = 1) -> dict[str, Any]:
    config = thread()
    h.graph.invoke(
        fp.start("q", budget(steps=6, tools=tools)),
        config,
        context=ctx,
        interrupt_before=["execute"],
    )
    return config


def _finish(h: Any, ctx: fp.RunContext) -> dict[str, Any]:
    config = thread()
    done = fp.run_output(
        h.graph.invoke(fp.start("q", budget(steps=6, tools=2)), config, context=ctx)
    )
    assert done.is_terminal
    return config


REOPEN = {
    "run": {
        "run_id": "run-reborn",
        "phase": fp.policy.Phase.OBSERVE,
        "termination": None,
        "stop": None,
        "budget": fp.RuntimeBudget(steps_remaining=50, tool_calls_remaining=50),
    }
}


INTRUDER = fp.RunContext(
    tenant_id="other-tenant",
    principal=fp.Principal(id="intruder", capabilities=frozenset({"notes:write"})),
)
REBIND = {
    "run": {"tenant_id": "other-tenant", "principal_id": "intruder", "run_id": "run-mine-now"}
}


def _rebind_paused_write(**build: Any) -> tuple[Any, fp.AgentState]:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt", **build)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    out = h.graph.invoke(Command(update=REBIND, resume="approve"), config, context=INTRUDER)
    return h, fp.run_output(out)


# -- seat 2: another tenant sharing the process ---------------------------------------------------

BETA = context(tenant="beta", principal="b-1")


# -- seat 3: the process itself -------------------------------------------------------------------


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    note: str


class Boom(BaseException):
    """A BaseException no handler expects."""


def _spec(name: str, execute: Any, **extra: Any) -> fp.ToolSpec:
    return fp.ToolSpec(
        name=name,
        description="A hostile tool.",
        args_model=NoteArgs,
        effect=fp.Effect.READ,
        capability="logs:read",
        timeout_seconds=extra.pop("timeout_seconds", 2),
        execute=execute,
        **extra,
    )


def _note(name: str, n: int = 1, note: str = "x") -> fp.ToolProposal:
    return fp.ToolProposal(call_id=f"call-{n:04d}", tool_name=name, arguments={"note": note})


def _run_hostile(
    spec: fp.ToolSpec, script: list[Any], mode: str = "sync"
) -> tuple[fp.AgentState, InMemorySaver]:
    saver = InMemorySaver()
    h = harness(script, registry=fp.ToolRegistry([spec]), checkpointer=saver)
    inp, config, ctx = fp.start("q", budget()), thread(), context()
    if mode == "sync":
        out = h.graph.invoke(inp, config, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=ctx))
    return fp.run_output(out), saver


def _raise(exc: BaseException) -> Any:
    def body(args: NoteArgs, ctx: fp.ToolContext) -> Any:
        raise exc

    return body


def _araise(exc: BaseException) -> Any:
    async def body(args: NoteArgs, ctx: fp.ToolContext) -> Any:
        raise exc

    return body


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "exc",
    [SystemExit(CANARY), KeyboardInterrupt(CANARY), Boom(CANARY), GeneratorExit(CANARY)],
    ids=["SystemExit", "KeyboardInterrupt", "Boom", "GeneratorExit"],
)
@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_base_exception_from_a_tool_is_contained_and_its_text_never_checkpointed(
    mode: str, exc: BaseException, kind: str
) -> None:
    body = _raise(exc) if kind == "def" else _araise(exc)
    state, saver = _run_hostile(_spec("boom", body), [_note("boom"), ABSTAIN], mode)
    assert state.is_terminal
    assert state.receipts[0].status is fp.policy.ReceiptStatus.FAILED
    assert CANARY.encode() not in saver_bytes(saver)


def _decided(**usage: Any) -> fp.policy.Decided:
    return fp.policy.Decided.model_construct(decision=call(n=1), generated_call_ids=(), **usage)


def _nested_value(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_recursion_limit_of_one_ends_typed_and_raises_nothing() -> None:
    h = harness([call(n=1), ABSTAIN])
    cfg = {**thread(), "recursion_limit": 1}
    out = h.graph.invoke(fp.start("q", budget()), cfg, context=context())
    assert fp.run_output(out).termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED


MALFORMED = [
    "yes",
    True,
    42,
    ["approve"],
    {"decision": "edit", "arguments": "rm -rf"},
    {"decision": "edit"},
    {"decision": "edit", "arguments": {"note": 5}},
    {"decision": "edit", "arguments": {"note": "x", "extra": 1}},
    {"decision": "approve", "arguments": {"note": "smuggled"}},
    {"call-9999": "approve"},
    {"call-0001": "yes"},
    {"\x00": "approve"},
]


NESTED_ANSWERS = [
    {"call-0001": {"decision": "edit", "arguments": _nested_value(2_000)}},
    {"decision": _nested_value(2_000)},
]


@pytest.mark.parametrize("answer", NESTED_ANSWERS, ids=["edit-args", "decision"])
def test_a_resume_answer_nested_past_the_serializer_limit_does_not_escape_invoke(
    answer: Any,
) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert "__interrupt__" in out or fp.run_output(out).is_terminal


@pytest.mark.parametrize("answer", NESTED_ANSWERS, ids=["edit-args", "decision"])
def test_a_resume_answer_no_checkpoint_can_hold_never_runs_and_the_run_still_ends_typed(
    answer: Any,
) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert h.calls.count("write_note") == 0
    out = fp.run_output(h.graph.invoke(Command(resume="approve"), config, context=ctx))
    assert h.calls.log == [("write_note", {"note": "hi"}, "call-0001")]
    assert out.is_terminal


def _pending(proposal: fp.ToolProposal) -> fp.policy.BatchEntry:
    verdict = allowed_verdict(proposal).model_copy(
        update={"code": fp.policy.VerdictCode.APPROVAL_PENDING}
    )
    return fp.policy.BatchEntry(proposal=proposal, verdict=verdict)


FORGED_PENDING = {
    "unknown-tool": fp.ToolProposal(call_id="call-0077", tool_name="rm_rf", arguments={}),
    "read-tool": call(n=77, query="*"),
    "bad-args": fp.ToolProposal(
        call_id="call-0077", tool_name="write_note", arguments={"note": 5, "x": 1}
    ),
}
