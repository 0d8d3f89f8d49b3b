"""A graph's own ledger (none passed) does not keep every ended run: a long-lived service that
relies on the default would otherwise grow without bound."""

from __future__ import annotations

import fencepost as fp
from fencepost.graph.settings import settings_of
from fencepost.policy.keys import run_account, step_key
from tests.graph.kit import budget, call, context, harness, thread


def test_the_default_ledger_forgets_a_run_once_it_ends_and_a_passed_ledger_keeps_it() -> None:
    own = harness([call(n=1), fp.AbstainProposal(reason="insufficient_evidence")])
    config = thread()
    state = fp.run_output(own.graph.invoke(fp.start("q", budget()), config, context=context()))
    settings = settings_of(own.graph)
    assert settings is not None
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert settings.ledger.get(step_key(account, 1)) is None
    assert settings.ledger.balance(account).held["steps"] == state.budget.steps_used

    passed = fp.InMemoryLedger()
    kept = harness([call(n=1), fp.AbstainProposal(reason="insufficient_evidence")], ledger=passed)
    config = thread()
    state = fp.run_output(kept.graph.invoke(fp.start("q", budget()), config, context=context()))
    account = run_account(config["configurable"]["thread_id"], state.run_id)
    assert passed.get(step_key(account, 1)) is not None
