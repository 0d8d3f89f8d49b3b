"""A run's ledger account records whom it was opened for: the caller's identity and the run.

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
from fencepost.policy.run_check import RUN, check_owner, run_owner

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
