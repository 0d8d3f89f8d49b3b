"""Stopping is not undoing: who may cancel, when a child may start (what a stop keeps of the
work it cut short: tests/policy/test_terminate.py)."""

from __future__ import annotations

from typing import Any

import pytest

from fencepost.policy import (
    Balance,
    Principal,
    RunContext,
    TerminationReason,
)
from fencepost.policy.keys import run_tag
from fencepost.policy.reservations import first_step_amounts
from fencepost.policy.stopping import cancel_refusal, child_start_refusal

OWNER = {"tenant": "acme", "principal": "u-1", "run": run_tag("run-1")}


def ctx(tenant: str = "acme", principal: str = "u-1") -> RunContext:
    return RunContext(tenant_id=tenant, principal=Principal(id=principal))


def refusal(owner: dict[str, str] | None, who: RunContext | None, **state: Any) -> str | None:
    identity = {"tenant_id": "acme", "principal_id": "u-1", "run_id": "run-1"} | state
    return cancel_refusal(owner, who, **identity)


def test_only_the_identity_the_account_records_may_cancel() -> None:
    assert refusal(OWNER, ctx()) is None
    assert refusal(OWNER, ctx(tenant="globex")) == "context_mismatch"
    assert refusal(OWNER, ctx(principal="u-2")) == "context_mismatch"
    assert refusal(OWNER, ctx(), run_id="run-2") == "account_conflict"


def test_the_ledger_decides_over_an_identity_rewritten_in_state() -> None:
    # A state update can rewrite tenant_id; it cannot reach the account's owner.
    assert refusal(OWNER, ctx(tenant="globex"), tenant_id="globex") == "context_mismatch"
    assert refusal(OWNER, ctx(), tenant_id="globex") is None


def test_without_an_account_the_identity_in_state_decides() -> None:
    assert refusal(None, ctx()) is None
    assert refusal(None, ctx(tenant="globex")) == "context_mismatch"
    assert refusal(None, ctx(), tenant_id=None, principal_id=None) is None


def test_the_operators_cancel_names_no_context() -> None:
    assert refusal(OWNER, None) is None


def balance(account: str, limits: dict[str, float], held: dict[str, float], **kw: Any) -> Balance:
    return Balance(account=account, parent=None, limits=limits, held=held, **kw)


def test_a_child_starts_only_if_its_whole_chain_can_fund_its_first_step() -> None:
    amounts = first_step_amounts(0)
    assert amounts == {"steps": 1.0, "tokens": 1.0}
    roomy = balance("parent", {"steps": 10}, {"steps": 3})
    spent = balance("parent", {"steps": 10}, {"steps": 10})
    assert child_start_refusal({"steps": 5}, [roomy], amounts) is None
    refused = child_start_refusal({"steps": 5}, [spent], amounts)
    assert refused is not None
    assert refused.reason is TerminationReason.STEP_BUDGET_EXHAUSTED
    assert refused.error_code == "steps_exhausted"
    # A grandparent that cannot pay refuses it too; so does the child's own zero.
    assert child_start_refusal({"steps": 5}, [roomy, spent], amounts) is not None
    assert child_start_refusal({"steps": 0}, [roomy], amounts) is not None
    tokens = balance("parent", {"tokens": 100}, {"tokens": 100})
    refused = child_start_refusal({}, [tokens], first_step_amounts(50))
    assert refused is not None and refused.error_code == "tokens_exhausted"


@pytest.mark.parametrize(
    ("closed", "reason"),
    [("cancelled", TerminationReason.CANCELLED), ("completed", TerminationReason.POLICY_DENIED)],
)
def test_no_child_starts_under_a_closed_parent(closed: str, reason: TerminationReason) -> None:
    parent = balance("parent", {"steps": 10}, {}, closed=closed)
    refused = child_start_refusal({"steps": 5}, [parent], first_step_amounts(0))
    assert refused is not None and refused.reason is reason
