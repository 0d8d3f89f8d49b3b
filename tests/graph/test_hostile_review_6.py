"""Hostile review of the Command refusal (19ea812: graph.bounded refuses a Command that would make
two writers of one field), endings.unsealed_end / owned, run-tagged account owners, namespaced
accounts for nested runs, started markers for accepted work, and fp.cancel's namespace.

Three seats: a caller holding the thread's config (any Command, ``update_state``, JSON forms);
another tenant or run sharing the process and the ledger; the process itself (crashes, a lost
in-memory ledger, a nested run, the async graph). A probe that found a bug is a strict xfail
whose reason names the repro and a fix; the others pin a rule worth keeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, Send

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import TerminationReason
from tests.graph.kit import (
    DOCS,
    STATUS,
    UPLOAD,
    astart_upload,
    budget,
    context,
    final_citing_all,
    paused_for_approval,
    state_of,
    thread,
    upload_graph,
)
from tests.graph.nested_kit import nested_paused

# === Seat 1: a caller holding the thread's config ===============================================


# A goto is only sugar for a write to LangGraph's own channels: `branch:to:<node>` (an
# EphemeralValue that triggers the node), `__pregel_tasks` (a Send) and `__start__`. _refusal
# looks only at Command.goto and at last-value *state* fields, so the same second writer sent as
# an update is taken: saved, then InvalidUpdateError (or the pushed node's RuntimeError /
# NoQuestion) at every later invoke of the thread.
_OWN_CHANNEL_UPDATES = {
    "branch-to-execute": Command(update={"branch:to:execute": "__start__"}),
    "branch-to-terminal": Command(update={"branch:to:terminal": "__start__"}),
    "branch-to-decide": Command(update={"branch:to:decide": "__start__"}),
    "start-twice": Command(update=[("__start__", {}), ("__start__", {})]),
    "send-as-update": Command(update={"__pregel_tasks": Send("execute", {})}),
}


# Fixed: graph.bounded refuses an update of anything but the state's own fields, and any Send.
@pytest.mark.parametrize("command", list(_OWN_CHANNEL_UPDATES), ids=list(_OWN_CHANNEL_UPDATES))
def test_a_command_naming_langgraphs_own_channels_never_leaves_the_thread_stuck(
    command: str,
) -> None:
    h, config, ctx = paused_for_approval()
    try:
        h.graph.invoke(_OWN_CHANNEL_UPDATES[command], config, context=ctx)
    except fp.CommandRefused:
        assert h.graph.get_state(config).next == ("approve",)
    if h.graph.get_state(config).next == ("approve",):
        h.graph.invoke(Command(resume="approve"), config, context=ctx)
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config).termination is not None


def test_a_send_a_caller_sends_to_an_ended_thread_never_leaves_it_raising() -> None:
    h, config, ctx = paused_for_approval()
    h.graph.invoke(Command(resume="approve"), config, context=ctx)
    assert state_of(h, config).termination is TerminationReason.COMPLETED
    with contextlib.suppress(fp.CommandRefused):
        h.graph.invoke(Command(goto=Send("execute", {})), config, context=ctx)
    h.graph.invoke(None, config, context=ctx)
    assert state_of(h, config).termination is TerminationReason.COMPLETED


@pytest.mark.parametrize(
    "command",
    [Command(resume="approve"), Command(goto="approve", resume="approve")],
    ids=["resume-alone", "goto-the-waiting-node"],
)
def test_a_resume_or_a_goto_of_the_waiting_node_is_taken_on_the_async_graph(
    command: Command[Any],
) -> None:
    h, config, ctx = paused_for_approval()
    out = asyncio.run(h.graph.ainvoke(command, config, context=ctx))
    state = fp.run_output(out)
    assert state.termination is TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1
    assert "command refused" not in json.dumps(state.model_dump(mode="json"))


_FORGED_COMPLETED: dict[str, Any] = {
    "run": {
        "phase": "terminal",
        "termination": "completed",
        "stop": None,
        "last_error_code": None,
        "final_answer": {"text": "Uploaded.", "citations": ["call-0001"]},
    }
}


# === Seat 2: another tenant or run sharing the process and the ledger ===========================


class _CrashBeforeFirstStep(SqliteLedger):
    """A SqliteLedger whose process dies reserving a model step: the account was opened, the
    decide node's writes never reach a checkpoint. The text carries a secret."""

    def reserve(self, account: str, key: str, amounts: Any) -> fp.policy.Reservation:
        if ":step:" in key:
            raise RuntimeError("power cut password=hunter2")
        return super().reserve(account, key, amounts)


_STARTS: dict[str, Any] = {
    "start": fp.start("why is checkout failing?", budget()),
    "messages": {"messages": [HumanMessage("why is checkout failing?")]},
    "json-request": {"request": {"question": "why is checkout failing?"}},
}
# Before (e68fe36): a run started from {'messages': [...]} or {'request': {'question': ...}} got
# a new run id each time its start was read; its first decide dying after open_run left a
# durable account whose owner names another run, and the re-run ended account_conflict for good.
# A start that names no run id now gets one derived from the thread and its first task
# (keys.task_run_id), the same on the re-run.


# === Seat 3: the process ========================================================================


def test_a_nested_run_resumed_after_its_approval_keeps_one_account() -> None:
    ledger = fp.InMemoryLedger()
    opened: list[str] = []
    open_account = ledger.open_account

    def spy(account: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(account)
        return open_account(account, *args, **kwargs)

    ledger.open_account = spy  # type: ignore[method-assign]
    parent, _, config, ctx, calls = nested_paused(ledger, InMemorySaver())
    out = parent.invoke(Command(resume="approve"), config, context=ctx)
    assert out == {"out": "completed:None"}
    assert len(set(opened)) == 1
    assert ledger.balance(opened[0]).closed == TerminationReason.COMPLETED.value
    assert calls.count("write_note") == 1


def test_a_lost_in_memory_ledger_after_an_accepted_call_still_completes_on_the_async_graph() -> (
    None
):
    # reopen_lost carries the started marker of the accepted upload: the genuine status check
    # completes it, and a final answer before it would still be held up.
    saver = InMemorySaver()
    config, ctx = thread(), context(caps=DOCS)
    asyncio.run(astart_upload(upload_graph([UPLOAD], checkpointer=saver), config, ctx))
    again = upload_graph([final_citing_all, STATUS, final_citing_all], checkpointer=saver)
    state = fp.run_output(asyncio.run(again.graph.ainvoke(None, config, context=ctx)))
    assert state.termination is TerminationReason.COMPLETED
    assert [m.code for m in state.manifests if m.code == "tasks_pending"] == ["tasks_pending"]
    done = [r.completed_by for r in state.receipts if r.call_id == "call-0001"]
    assert done == [None, "call-0002"]
