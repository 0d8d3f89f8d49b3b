"""Isolation: a run spends only from accounts its principal owns or was granted.

``RunContext.budget_account`` names the account a run's own is opened under. A run account's
name follows from its thread id, so a caller of the same tenant can name another principal's
run account there: it must fund nothing of that run. A run account funds only runs of its own
principal (its child runs); an account that records a principal funds that principal's runs
and those it grants (an owner key ``grant:<principal id>``); an account that records only a
tenant is that tenant's pool, open to every principal of it.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.policy.keys import run_account
from fencepost.policy.ownership import GRANT, check_funding, run_owner
from tests.graph.kit import (
    ABSTAIN,
    Calls,
    budget,
    call,
    context,
    harness,
    make_registry,
    thread,
)


def graph_on(ledger: fp.Ledger, script: list[Any], calls: Calls) -> Any:
    model = ScriptedDecisionModel(script)
    return fp.build_agent_graph(
        make_registry(calls), model, ledger=ledger, approval="interrupt"
    ).compile(checkpointer=InMemorySaver())


def test_a_context_naming_another_principals_run_account_spends_nothing_of_it() -> None:
    ledger = fp.InMemoryLedger()
    calls = Calls()
    # u-1's run: one search, then paused at the approval of a write, two tool calls left.
    victim = graph_on(ledger, [call(n=1), call("write_note", 2, note="x"), ABSTAIN], calls)
    config = thread()
    budget = fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=2)
    victim.invoke(fp.start("q", budget), config, context=context(principal="u-1"))
    state = fp.run_output(victim.get_state(config).values)
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    before = ledger.balance(account).held
    # u-2, same tenant, names u-1's run account as the account its run is funded from.
    thief = graph_on(ledger, [call(n=11), call(n=12), call(n=13)], calls)
    ctx = context(principal="u-2").model_copy(update={"budget_account": account})
    stolen = fp.run_output(
        thief.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=6, tool_calls_remaining=6)),
            thread(),
            context=ctx,
        )
    )
    assert stolen.termination is fp.TerminationReason.POLICY_DENIED
    assert stolen.last_error_code == "budget_account_denied"
    assert ledger.balance(account).held == before
    assert calls.count("search_logs") == 1  # only u-1's own search ran
    # u-1's run goes on with the budget it had.
    done = fp.run_output(
        victim.invoke(Command(resume="approve"), config, context=context(principal="u-1"))
    )
    assert calls.count("write_note") == 1
    assert done.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


@pytest.mark.parametrize(
    ("owner", "principal", "allowed"),
    [
        ({"tenant": "acme", "principal": "u-1"}, "u-1", True),
        ({"tenant": "acme", "principal": "u-1"}, "u-2", False),
        ({"tenant": "acme", "principal": "u-1", f"{GRANT}u-2": "spend"}, "u-2", True),
        ({"tenant": "acme"}, "u-2", True),
        ({}, "u-2", True),
        ({"tenant": "globex"}, "u-1", False),
    ],
    ids=["own", "another-principals", "granted", "tenant-pool", "no-owner", "another-tenant"],
)
def test_an_account_funds_runs_of_its_principal_its_grantees_or_its_whole_tenant(
    owner: dict[str, str], principal: str, allowed: bool
) -> None:
    ledger = fp.InMemoryLedger()
    ledger.open_account("pool", {"tool_calls": 5}, owner=owner)
    calls = Calls()
    graph = graph_on(ledger, [call(n=1), ABSTAIN], calls)
    ctx = context(principal=principal).model_copy(update={"budget_account": "pool"})
    state = fp.run_output(
        graph.invoke(
            fp.start("q", fp.RuntimeBudget(steps_remaining=4, tool_calls_remaining=4)),
            thread(),
            context=ctx,
        )
    )
    if allowed:
        assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
        assert ledger.balance("pool").held["tool_calls"] == 1.0
    else:
        assert state.termination is fp.TerminationReason.POLICY_DENIED
        assert state.last_error_code == "budget_account_denied"
        assert ledger.balance("pool").held == {}
        assert calls.log == []


def test_a_run_account_is_never_another_principals_parent_even_if_it_grants() -> None:
    ctx = context(principal="u-1")
    owner = {**run_owner(ctx, "run-a"), f"{GRANT}u-2": "spend"}
    own = check_funding(owner, ctx)
    other = check_funding(owner, context(principal="u-2"))
    assert own is None  # its own principal's child run
    assert other is not None and other.error_code == "budget_account_denied"


BETA = context(tenant="beta", principal="b-1", seconds=None)


def test_a_run_cannot_open_under_another_tenants_budget_account() -> None:
    ledger = fp.policy.InMemoryLedger()
    ledger.open_account("acme-pool", {"tool_calls": 3}, owner={"tenant": "acme"})
    h = harness([call(n=1), call(n=2), call(n=3), ABSTAIN], ledger=ledger)
    thief = BETA.model_copy(update={"budget_account": "acme-pool"})
    out = fp.run_output(h.graph.invoke(fp.start("q", budget()), thread(), context=thief))
    assert ledger.balance("acme-pool").held.get("tool_calls", 0.0) == 0
    assert h.calls.count("search_logs") == 0
    assert out.termination is fp.TerminationReason.POLICY_DENIED
