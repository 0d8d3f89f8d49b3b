"""A run's ledger account records whom it was opened for: the caller's identity and the run;
and an account funds only the runs of the principal it records, or of those it grants.

``check_owner`` is what every reservation, the terminal node's close and its completion judgement
ask: another identity is ``context_mismatch``; another run on the account (a second run on one
thread id, or a run id rewritten in state) is ``account_conflict``; an account opened before
owners named the run (an older version's, still in flight) is judged on what it records.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import fencepost as fp
from fencepost.policy.keys import run_tag
from fencepost.policy.ledger import validate_owner
from fencepost.policy.ownership import (
    GRANT,
    RUN,
    check_funding,
    check_owner,
    recorded_capabilities,
    run_owner,
)

CTX = fp.RunContext(tenant_id="acme", principal=fp.Principal(id="u-1"))


@given(run_id=st.text(max_size=200))
def test_a_run_owner_holds_only_clean_names_and_passes_for_its_own_run(run_id: str) -> None:
    owner = run_owner(CTX, run_id)
    assert owner[RUN] == run_tag(run_id) and owner[RUN].isalnum()
    assert check_owner(owner, CTX, run_id) is None


def test_another_run_on_the_account_is_a_conflict() -> None:
    refused = check_owner(run_owner(CTX, "run-a"), CTX, "run-b")
    assert refused is not None and refused.error_code == "account_conflict"


def test_another_identity_is_a_context_mismatch_whatever_the_run() -> None:
    other = fp.RunContext(tenant_id="globex", principal=fp.Principal(id="u-1"))
    refused = check_owner(run_owner(CTX, "run-a"), other, "run-a")
    assert refused is not None and refused.error_code == "context_mismatch"


def test_an_account_whose_owner_names_no_run_is_judged_by_identity_alone() -> None:
    assert check_owner(CTX.owner(), CTX, "any-run") is None
    assert check_owner({}, CTX, "any-run") is None


def _funds(owner: dict[str, str], principal: str = "u-1", tenant: str = "acme") -> bool:
    ctx = fp.RunContext(tenant_id=tenant, principal=fp.Principal(id=principal))
    refused = check_funding(owner, ctx)
    assert refused is None or refused.error_code == "budget_account_denied"
    return refused is None


def test_an_account_funds_its_principal_its_grantees_and_a_pool_funds_its_tenant() -> None:
    principals = {"tenant": "acme", "principal": "u-1"}
    assert _funds(principals, "u-1")
    assert not _funds(principals, "u-2")
    assert _funds({**principals, f"{GRANT}u-2": ""}, "u-2")
    assert _funds({"tenant": "acme"}, "u-2")  # the tenant's pool
    assert _funds({}, "u-2")  # no owner: open to all
    assert not _funds({"tenant": "globex"}, "u-1")


def test_a_run_account_funds_only_its_own_principals_runs_whatever_it_grants() -> None:
    owner = {**run_owner(CTX, "run-a"), f"{GRANT}u-2": ""}
    assert _funds(owner, "u-1")
    assert not _funds(owner, "u-2")


@given(capabilities=st.frozensets(st.text(max_size=600), max_size=8))
def test_a_run_owner_records_the_requesters_capabilities_and_is_compared_by_identity_alone(
    capabilities: frozenset[str],
) -> None:
    ctx = fp.RunContext(
        tenant_id="acme", principal=fp.Principal(id="u-1", capabilities=capabilities)
    )
    owner = run_owner(ctx, "run-a")
    assert validate_owner(owner) == owner  # every ledger backend stores it as it is
    recorded = recorded_capabilities(owner)
    # Recorded exactly, or (a name no ledger stores) not at all: never a part of them.
    assert recorded == capabilities or (
        recorded is None and owner == {**ctx.owner(), RUN: run_tag("run-a")}
    )
    # Another set of capabilities is the same caller: the owner check is on identity alone.
    assert check_owner(owner, CTX, "run-a") is None
    assert check_owner(run_owner(CTX, "run-a"), ctx, "run-a") is None


def test_an_owner_recorded_before_capabilities_records_none() -> None:
    assert recorded_capabilities({**CTX.owner(), RUN: run_tag("run-a")}) is None
    assert recorded_capabilities(run_owner(CTX, "run-a")) == frozenset()
