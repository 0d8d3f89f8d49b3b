"""The identity bound to a thread at start is the only one that can act on or end its run.

DESIGN, isolation: the identity bound to a thread at start cannot be changed by any state update;
limits and the terminal status are enforced from the ledger; the account records the identity
(and the run) it was opened for. A state edit renaming the run's tenant, principal or run id (with
the default ledger, a durable one, or sealed verdicts) never lets another identity approve its
paused write, nor moves the run to another account. A cancel that names a context is a caller's
cancel: for a context that is not the run's owner it changes nothing — no account closed, no
state written, no terminal node run, nested runs included — and says so with a typed error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import fencepost as fp
from fencepost.adapters import SqliteLedger
from fencepost.policy import TerminationReason
from fencepost.policy.keys import completed_key, run_account
from tests.graph.kit import (
    ABSTAIN,
    DOCS,
    UPLOAD,
    budget,
    call,
    context,
    final_citing_all,
    forge_completion,
    harness,
    paused_for_approval,
    start_upload,
    state_of,
    thread,
    thread_account,
    two_tenants,
    upload_graph,
)
from tests.graph.nested_kit import approved, nested_config, nested_paused


@pytest.mark.parametrize(
    "stranger",
    [context(tenant="globex", principal="u-9"), context(principal="u-2")],
    ids=["another-tenant", "another-principal"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_cancel_by_someone_else_changes_nothing_and_says_so(
    stranger: fp.RunContext, mode: str
) -> None:
    ledger = fp.InMemoryLedger()
    h, config, owner = paused_for_approval(ledger=ledger)
    before = h.graph.get_state(config)
    with pytest.raises(fp.CancelRefused) as refused:
        if mode == "sync":
            fp.cancel(h.graph, config, context=stranger)
        else:
            await fp.acancel(h.graph, config, context=stranger)
    assert refused.value.code == "context_mismatch"
    # Nothing written: the same head checkpoint, the account open, the run still paused.
    after = h.graph.get_state(config)
    assert after.config == before.config and after.next == ("approve",)
    assert ledger.balance(thread_account(config)).closed is None
    assert state_of(h, config).stop is None
    # The owner's run goes on as if nobody had asked.
    out = h.graph.invoke(Command(resume="approve"), config, context=owner)
    assert fp.run_output(out).termination is fp.TerminationReason.COMPLETED
    assert h.calls.count("write_note") == 1


def test_the_owners_cancel_still_ends_the_run() -> None:
    ledger = fp.InMemoryLedger()
    h, config, owner = paused_for_approval(ledger=ledger)
    state = fp.cancel(h.graph, config, context=owner)
    assert state is not None and state.termination is fp.TerminationReason.CANCELLED
    assert ledger.balance(thread_account(config)).closed == "cancelled"
    assert h.calls.count("write_note") == 0


# -- a state edit cannot rebind a run to another identity --------------------------------------


@pytest.mark.parametrize("key", [None, b"operator-secret-0123456789ab"])
def test_a_state_update_cannot_rebind_a_paused_write_to_another_tenant(key: bytes | None) -> None:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt", verdict_key=key)
    config, owner = thread(), context()
    h.graph.invoke(fp.start("q", budget()), config, context=owner)
    intruder = fp.RunContext(
        tenant_id="other-tenant",
        principal=fp.Principal(id="intruder", capabilities=frozenset({"notes:write"})),
    )
    update = {"run": {"tenant_id": "other-tenant", "principal_id": "intruder"}}
    # Written with the answer, the rewrite is refused before anything is saved
    # (tests/features/test_approval_by_people.py); written first, it reaches state.
    h.graph.invoke(Command(update=update), config, context=intruder)
    out = h.graph.invoke(Command(resume="approve"), config, context=intruder)
    assert h.calls.count("write_note") == 0
    # The ledger's owner, not the rewritten state, says whose run it is: not taken.
    assert out["__interrupt__"][0].value["error"]["code"] == "wrong_tenant"
    assert fp.run_output(out).termination is None
    # The owner can still answer; the run is the owner's again only if state says so too.
    out = h.graph.invoke(Command(resume="approve"), config, context=owner)
    assert h.calls.count("write_note") == 0
    assert fp.run_output(out).termination is fp.TerminationReason.POLICY_DENIED


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
    out = _rebind_then_answer(h, config)
    assert h.calls.count("write_note") == 0
    assert out["__interrupt__"][0].value["error"]["code"] == "wrong_tenant"


def _rebind_then_answer(h: Any, config: Any) -> Any:
    """The intruder's rewrite of whose run it is, then its answer: an answer's own update may
    not write the identity (refused, nothing saved), so the rewrite comes first, as an update
    of its own, and reaches state."""
    h.graph.invoke(Command(update=REBIND), config, context=INTRUDER)
    return h.graph.invoke(Command(resume="approve"), config, context=INTRUDER)


def _rebind_paused_write(**build: Any) -> tuple[Any, fp.AgentState]:
    h = harness([call("write_note", 1, note="hi"), ABSTAIN], approval="interrupt", **build)
    config = thread()
    h.graph.invoke(fp.start("q", budget()), config, context=context())
    return h, fp.run_output(_rebind_then_answer(h, config))


def test_rebinding_a_paused_write_by_renaming_the_run_is_refused_with_a_durable_ledger(
    tmp_path: Path,
) -> None:
    h, state = _rebind_paused_write(ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    assert h.calls.count("write_note") == 0
    assert state.termination is None and state.last_error_code == "wrong_tenant"


def test_with_a_verdict_key_renaming_the_run_cannot_rebind_a_paused_write() -> None:
    h, state = _rebind_paused_write(verdict_key=b"operator-secret-0123456789ab")
    assert h.calls.count("write_note") == 0
    assert state.termination is fp.TerminationReason.POLICY_DENIED


@pytest.mark.parametrize(
    "edit",
    [
        {"run": {"run_id": "run-elsewhere"}},
        {"run": {"tenant_id": "globex"}},
        {"run": {"principal_id": "intruder"}},
    ],
    ids=["run_id", "tenant_id", "principal_id"],
)
def test_rewriting_the_run_identity_in_state_never_moves_it_to_an_account_with_markers(
    edit: dict[str, Any],
) -> None:
    # The account is named from the thread alone: a new run id does not point it at an unknown
    # (re-openable) account, and a new identity is refused by the account's owner.
    ledger = fp.InMemoryLedger()
    h = upload_graph([UPLOAD, final_citing_all, final_citing_all, ABSTAIN], ledger=ledger)
    config, ctx = thread(), context(caps=DOCS)
    start_upload(h, config, ctx)
    forge_completion(h, config)
    h.graph.update_state(config, edit, as_node="execute")
    state = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert state.termination is not TerminationReason.COMPLETED
    assert ledger.get(completed_key(thread_account(config), "call-0001")) is None


# -- someone else's cancel ---------------------------------------------------------------------


# Tenant B, on its own checkpointer but the shared ledger and A's thread id, has a state of its
# own that is not terminal (its refused run, stopped before the terminal node): a cancel that
# names a context closes only an account opened for that caller and run.
def test_another_tenants_cancel_on_its_own_thread_never_closes_this_runs_account() -> None:
    t = two_tenants([UPLOAD, final_citing_all, ABSTAIN])
    ledger, config, ctx_a, ctx_b, a, b = t.ledger, t.config, t.ctx_a, t.ctx_b, t.a, t.b
    b.graph.invoke(
        fp.start("upload", budget()), config, context=ctx_b, interrupt_before=["terminal"]
    )
    with pytest.raises(fp.CancelRefused):  # refused, and said so: tests/isolation pins it
        fp.cancel(b.graph, config, context=ctx_b)
    assert ledger.balance(thread_account(config)).closed is None
    state = fp.run_output(a.graph.invoke(None, config, context=ctx_a))
    assert state.termination is TerminationReason.COMPLETED


def test_another_tenants_cancel_of_a_nested_run_closes_nothing() -> None:
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, nested, config, ctx, calls = nested_paused(ledger, saver, own_saver=True)
    with pytest.raises(fp.CancelRefused):  # refused, and said so: tests/isolation pins it
        fp.cancel(nested, nested_config(parent, config), context=context(tenant="tenant-other"))
    assert approved(parent, config, ctx, calls) == ({"out": "completed:None"}, 1)


def test_another_tenant_naming_a_nested_runs_namespace_closes_nothing_without_its_state() -> None:
    # The nested graph compiled without a saver: cancel cannot read the run, so the owner
    # check is all that stands between another tenant and the account.
    saver, ledger = InMemorySaver(), fp.InMemoryLedger()
    parent, nested, config, ctx, calls = nested_paused(ledger, saver, own_saver=False)
    own = nested_config(parent, config)
    account = run_account(
        config["configurable"]["thread_id"], "", own["configurable"]["checkpoint_ns"]
    )
    # Refused, and said so: a stranger's cancel changes nothing.
    for stranger in (context(tenant="tenant-other"), context(principal="u-other")):
        with pytest.raises(fp.CancelRefused):
            fp.cancel(nested, own, context=stranger)
    assert ledger.balance(account).closed is None
    assert approved(parent, config, ctx, calls) == ({"out": "completed:None"}, 1)
