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
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.adapters import SqliteLedger
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    allowed_verdict,
    budget,
    call,
    context,
    harness,
    make_registry,
    saver_bytes,
    state_of,
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


def test_a_forged_batch_entry_never_runs_a_call_whose_budget_was_not_reserved() -> None:
    h = harness([call(n=1), ABSTAIN])
    ctx = context()
    config = _pause_before_execute(h, ctx, tools=1)
    forged = call(n=9, query="never gated")
    entry = fp.policy.BatchEntry(proposal=forged, verdict=allowed_verdict(forged))
    h.graph.update_state(
        config, {"run": {"batch": (*state_of(h, config).batch, entry)}}, as_node="decide"
    )
    try:
        h.graph.invoke(None, config, context=ctx)
    finally:
        ran = [a["query"] for _, a, _ in h.calls.log]
    assert ran == ["checkout 500 #1"]
    state = state_of(h, config)
    assert state.is_terminal
    assert state.budget.tool_calls_used <= 1


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


def test_rewriting_the_run_id_does_not_reopen_a_finished_run_on_the_default_ledger() -> None:
    h = harness([call(n=1), ABSTAIN, *(call(n=i) for i in range(2, 12))])
    ctx = context()
    config = _finish(h, ctx)
    ran = h.calls.count("search_logs")
    h.graph.update_state(config, REOPEN, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == ran
    assert state.is_terminal


def test_rewriting_the_run_id_does_not_reopen_a_finished_run_on_a_durable_ledger(
    tmp_path: Path,
) -> None:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    h = harness([call(n=1), ABSTAIN, *(call(n=i) for i in range(2, 12))], ledger=ledger)
    ctx = context()
    config = _finish(h, ctx)
    ran = h.calls.count("search_logs")
    h.graph.update_state(config, REOPEN, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert h.calls.count("search_logs") == ran
    assert state.termination is fp.TerminationReason.POLICY_DENIED


INTRUDER = fp.RunContext(
    tenant_id="other-tenant",
    principal=fp.Principal(id="intruder", capabilities=frozenset({"notes:write"})),
)
REBIND = {
    "run": {"tenant_id": "other-tenant", "principal_id": "intruder", "run_id": "run-mine-now"}
}


def test_rebinding_a_paused_write_by_renaming_the_run_is_refused_on_the_default_ledger() -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    out = h.graph.invoke(Command(update=REBIND, resume="approve"), config, context=INTRUDER)
    assert h.calls.count("write_note") == 0
    assert fp.run_output(out).termination is fp.TerminationReason.POLICY_DENIED


def _rebind_paused_write(**build: Any) -> tuple[Any, fp.AgentState]:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt", **build)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    out = h.graph.invoke(Command(update=REBIND, resume="approve"), config, context=INTRUDER)
    return h, fp.run_output(out)


def test_rebinding_a_paused_write_by_renaming_the_run_is_refused_with_a_durable_ledger(
    tmp_path: Path,
) -> None:
    h, state = _rebind_paused_write(ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    assert h.calls.count("write_note") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED


def test_with_a_verdict_key_renaming_the_run_cannot_rebind_a_paused_write() -> None:
    h, state = _rebind_paused_write(verdict_key=b"operator-secret-0123456789ab")
    assert h.calls.count("write_note") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED


def test_two_runs_whose_names_share_a_separator_do_not_share_an_account() -> None:
    h = harness([call(n=1), ABSTAIN, call(n=2), ABSTAIN])
    ctx = context()
    h.graph.invoke(
        fp.start("q", budget(), run_id="r\x1fx"),
        {"configurable": {"thread_id": "t"}},
        context=ctx,
    )
    second = fp.run_output(
        h.graph.invoke(
            fp.start("q", budget(), run_id="x"),
            {"configurable": {"thread_id": "t\x1fr"}},
            context=ctx,
        )
    )
    assert h.calls.count("search_logs") == 2
    assert second.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


# -- seat 2: another tenant sharing the process ---------------------------------------------------

BETA = context(tenant="beta", principal="b-1")


def test_another_tenant_choosing_the_same_names_cannot_close_a_paused_run() -> None:
    ledger = fp.policy.InMemoryLedger()
    a = harness([call("write_note", 1, note="a"), ABSTAIN], approval="interrupt", ledger=ledger)
    b = harness([ABSTAIN], approval="interrupt", ledger=ledger)
    config = {"configurable": {"thread_id": "support-1"}}
    a.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=context())
    b.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=BETA)
    out = a.graph.invoke(Command(resume="approve"), config, context=context())
    assert a.calls.count("write_note") == 1
    assert fp.run_output(out).termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


def test_another_tenant_choosing_the_same_names_cannot_spend_on_a_run_account() -> None:
    ledger = fp.policy.InMemoryLedger()
    a = harness([call(n=1), ABSTAIN], ledger=ledger)
    b = harness([call(n=1), call(n=2), ABSTAIN], ledger=ledger)
    config = {"configurable": {"thread_id": "support-1"}}
    a.graph.invoke(
        fp.start("q", budget(), run_id="run-1"),
        config,
        context=context(),
        interrupt_before=["execute"],
    )
    out = fp.run_output(
        b.graph.invoke(fp.start("q", budget(), run_id="run-1"), config, context=BETA)
    )
    assert b.calls.count("search_logs") == 0
    assert out.termination is fp.TerminationReason.POLICY_DENIED


def test_a_run_cannot_open_under_another_tenants_budget_account() -> None:
    ledger = fp.policy.InMemoryLedger()
    ledger.open_account("acme-pool", {"tool_calls": 3}, owner={"tenant": "acme"})
    h = harness([call(n=1), call(n=2), call(n=3), ABSTAIN], ledger=ledger)
    thief = BETA.model_copy(update={"budget_account": "acme-pool"})
    out = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=thief))
    assert ledger.balance("acme-pool").held.get("tool_calls", 0.0) == 0
    assert h.calls.count("search_logs") == 0
    assert out.termination is fp.TerminationReason.POLICY_DENIED


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_unknown_budget_account_ends_typed_never_as_an_exception(mode: str) -> None:
    h = harness([call(n=1), ABSTAIN])
    ctx = context().model_copy(update={"budget_account": "no-such-pool"})
    inp = fp.start("q", budget())
    if mode == "sync":
        out = h.graph.invoke(inp, thread(), context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, thread(), context=ctx))
    state = fp.run_output(out)
    assert h.calls.count("search_logs") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED
    assert state.last_error_code == "unknown_budget_account"


def test_children_under_one_parent_never_spend_more_than_the_parent_holds() -> None:
    ledger = fp.policy.InMemoryLedger()
    ledger.open_account("pool", {"tool_calls": 3}, owner={"tenant": "acme", "principal": "u-1"})
    ctx = context().model_copy(update={"budget_account": "pool"})
    calls = Calls()
    for _ in range(3):
        h = harness(
            [call(n=1), call(n=2), ABSTAIN],
            ledger=ledger,
            calls=calls,
            registry=make_registry(calls),
        )
        h.graph.invoke(fp.start("q", budget(steps=6, tools=2)), thread(), context=ctx)
    ran = calls.count("search_logs")
    assert ran == 3
    assert ledger.balance("pool").held["tool_calls"] == 3


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


def test_an_async_tool_raising_cancelled_error_itself_is_that_calls_failure() -> None:
    body = _araise(asyncio.CancelledError(CANARY))
    state, saver = _run_hostile(_spec("boom", body), [_note("boom"), ABSTAIN], "async")
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("hook", ["semantic_validator", "progress_predicate"])
@pytest.mark.parametrize(
    "exc", [RuntimeError(CANARY), RecursionError(CANARY)], ids=["RuntimeError", "RecursionError"]
)
def test_a_breaking_validator_or_predicate_ends_typed_and_its_text_never_checkpointed(
    mode: str, hook: str, exc: BaseException
) -> None:
    def broken(*_: Any) -> Any:
        raise exc

    spec = _spec("note", lambda args, ctx: {"ok": True}, **{hook: broken})
    script = [_note("note", n) for n in range(1, 6)] + [ABSTAIN]
    state, saver = _run_hostile(spec, script, mode)
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


@pytest.mark.parametrize("hook", ["semantic_validator", "progress_predicate"])
def test_a_validator_or_predicate_raising_a_base_exception_ends_typed(hook: str) -> None:
    def broken(*_: Any) -> Any:
        raise SystemExit(CANARY)

    spec = _spec("note", lambda args, ctx: {"ok": True}, **{hook: broken})
    state, saver = _run_hostile(spec, [_note("note", n) for n in range(1, 6)] + [ABSTAIN])
    assert state.is_terminal
    assert CANARY.encode() not in saver_bytes(saver)


def _decided(**usage: Any) -> fp.policy.Decided:
    return fp.policy.Decided.model_construct(decision=call(n=1), generated_call_ids=(), **usage)


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": -5, "output_tokens": 3},
        {"input_tokens": 2**64, "output_tokens": 2**70},
        {"input_tokens": "lots", "output_tokens": None},
        {"input_tokens": float("nan"), "output_tokens": float("inf")},
        {"input_tokens": True, "output_tokens": [1]},
        {"input_tokens": 9_000_000, "output_tokens": 9_000_000},
    ],
    ids=["negative", "huge", "text", "nan-inf", "bool-list", "sum-too-big"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hostile_usage_report_is_charged_the_estimate_and_ends_typed(
    usage: dict[str, Any], mode: str
) -> None:
    h = harness([_decided(**usage), ABSTAIN], tokens_per_step=100)
    limited = fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=4, tokens_remaining=1_000)
    inp, config = fp.start("q", limited), thread()
    if mode == "sync":
        out = h.graph.invoke(inp, config, context=context())
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=context()))
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert state.budget.tokens_used == 200


def _nested_value(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [120, 1_000, 20_000])
def test_arguments_nested_past_any_limit_end_typed(depth: int) -> None:
    raw = {
        "kind": "tool",
        "call_id": "call-0001",
        "tool_name": "search_logs",
        "arguments": {"query": _nested_value(depth)},
    }
    saver = InMemorySaver()
    h = harness([lambda _: raw, ABSTAIN], checkpointer=saver)
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.is_terminal
    assert h.calls.count("search_logs") == 0


@pytest.mark.parametrize("depth", [120, 1_000, 20_000])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_result_nested_past_any_limit_ends_typed(depth: int, mode: str) -> None:
    spec = _spec("deep", lambda args, ctx: _nested_value(depth, CANARY))
    state, _ = _run_hostile(spec, [_note("deep"), ABSTAIN], mode)
    assert state.is_terminal
    assert state.receipts[0].status in (
        fp.policy.ReceiptStatus.COMPLETED,
        fp.policy.ReceiptStatus.FAILED,
    )


@pytest.mark.parametrize(
    "call_id", ["\x00\x00\x00\x00\x00\x00", "        ", "\t\n\r\x0b\x0c ", "call-\x00-1\u2028"]
)
def test_hostile_call_ids_end_typed_and_never_collide(call_id: str, tmp_path: Path) -> None:
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    raw = {
        "kind": "tool",
        "call_id": call_id,
        "tool_name": "search_logs",
        "arguments": {"query": "q"},
    }
    h = harness([lambda _: raw, ABSTAIN], ledger=ledger)
    state = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=context()))
    assert state.is_terminal
    assert h.calls.count("search_logs") <= 1


@pytest.mark.parametrize("limit", [2, 3, 4, 5])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tiny_recursion_limit_ends_with_a_reason(limit: int, mode: str) -> None:
    h = harness([call(n=1), call(n=2), ABSTAIN])
    inp, config, ctx = fp.start("q", budget()), thread(), context()
    cfg = {**config, "recursion_limit": limit}
    if mode == "sync":
        out = h.graph.invoke(inp, cfg, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, cfg, context=ctx))
    assert fp.run_output(out).termination is not None


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


@pytest.mark.parametrize("answer", MALFORMED, ids=[f"a{i}" for i in range(len(MALFORMED))])
def test_a_malformed_approval_answer_never_runs_the_write_or_escapes(answer: Any) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    ran = h.calls.log
    assert all(args == {"note": "hi"} or name != "write_note" for name, args, _ in ran)
    assert "__interrupt__" in out or fp.run_output(out).is_terminal


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


@pytest.mark.parametrize("answer", ["approve", "reject"])
@pytest.mark.parametrize(
    "forged",
    ["unknown-tool", "read-tool", "bad-args"],
)
def test_a_forged_pending_entry_is_regated_on_approval_and_never_escapes(
    forged: str, answer: str
) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN, ABSTAIN], approval="interrupt")
    config, ctx = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=ctx)
    batch = (*state_of(h, config).batch, _pending(FORGED_PENDING[forged]))
    out = h.graph.invoke(
        Command(update={"run": {"batch": batch}}, resume=answer), config, context=ctx
    )
    if "__interrupt__" in out:
        out = h.graph.invoke(Command(resume=answer), config, context=ctx)
    assert fp.run_output(out).is_terminal
    assert [name for name, _, _ in h.calls.log] in ([], ["write_note"])
    assert all(key == "call-0001" for _, _, key in h.calls.log)
