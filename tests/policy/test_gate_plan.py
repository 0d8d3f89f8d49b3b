"""The gate phase's plans: what the ledger is asked about a batch, who decides per call whether
it needs approval (failing closed for a call nobody asked), which remembered scope approves a
call and which "approve always" answer is remembered, and what the run records of a refused,
stopped, repaired, settled or unfunded batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fencepost.policy import Effect, Principal, ToolRegistry
from fencepost.policy.conditional_approval import ApprovalQuestion
from fencepost.policy.context import RunContext
from fencepost.policy.decision import ToolProposal
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gating import GatedBatch, GatePlan, GateSettings, end_gate, plan_gate
from fencepost.policy.manifest import ManifestBase, manifest_base
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.receipt import ReceiptStatus
from fencepost.policy.remembered import Remember, new_scope, scopes_named, scopes_to_remember
from fencepost.policy.rule_runner import run_directly
from fencepost.policy.state import AgentState, stop
from fencepost.policy.verdict import VerdictCode
from tests.policy.factories import make_proposal, make_spec, make_state


def _over_100(question: ApprovalQuestion) -> bool:
    return bool(question.proposal.arguments.get("query") == "big")


SEND = make_spec("send_money", effect=Effect.WRITE, capability="payments:send")
DECIDED = make_spec("decided_read", needs_approval=_over_100)
REGISTRY = ToolRegistry([make_spec(), SEND, DECIDED])
CTX = RunContext(
    tenant_id="tenant-a",
    principal=Principal(id="user-1", capabilities=frozenset({"logs:read", "payments:send"})),
)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _settings(**changes: object) -> GateSettings:
    fields: dict[str, object] = {
        "registry": REGISTRY,
        "repeat_limit": 3,
        "approval": "interrupt",
        "denial": "end_run",
        "provenance": "observe",
        "approver": False,
        "needs_approval": None,
        "repair_attempts": 0,
    }
    fields.update(changes)
    return GateSettings(**fields)  # type: ignore[arg-type]


def _base(state: AgentState) -> ManifestBase:
    return manifest_base(state.run_id, state.step, state.budget, Phase.VALIDATE, None)


def _judged(
    calls: list[ToolProposal], **settings: object
) -> tuple[GatePlan, AgentState, GatedBatch]:
    plan = plan_gate(calls, _settings(**settings))
    state = make_state()
    gated = plan.judge(state, CTX, now=NOW, remembered={}, outputs=None, run_rule=run_directly)
    return plan, state, gated


def test_the_ledger_is_asked_only_about_dependencies_outside_the_batch() -> None:
    first = make_proposal(call_id="call-0001")
    second = ToolProposal(
        call_id="call-0002",
        tool_name="search_logs",
        arguments={"query": "x"},
        depends_on=("call-0001", "call-0000"),
    )
    assert plan_gate([first, second], _settings()).outside == frozenset({"call-0000"})
    assert plan_gate([first], _settings()).outside == frozenset()


def test_only_registered_writes_have_their_remembered_scopes_read() -> None:
    calls = [
        make_proposal(call_id="call-0001"),
        make_proposal(tool_name="send_money", call_id="call-0002"),
        make_proposal(tool_name="nowhere", call_id="call-0003"),
    ]
    assert plan_gate(calls, _settings()).scoped == ("send_money",)


def test_a_call_of_a_deciding_tool_nobody_asked_needs_approval() -> None:
    calls = [make_proposal(tool_name="decided_read", call_id="call-0001")]
    plan = plan_gate(calls, _settings())
    assert set(plan.deciders) == {"call-0001"}
    assert plan.needs_approval({}) == {"call-0001": True}
    assert plan.needs_approval({"call-0001": False}) == {"call-0001": False}


def test_needs_approval_is_asked_only_about_calls_that_passed_every_other_check() -> None:
    good = make_proposal(tool_name="decided_read", call_id="call-0001")
    bad = make_proposal({"query": 3}, tool_name="decided_read", call_id="call-0002")
    plan, _, gated = _judged([good, bad])
    asked = [q.proposal.call_id for _, q in plan.questions(gated, CTX)]
    assert asked == ["call-0001"]


def test_a_live_scope_of_the_tenant_approves_only_the_call_it_matches() -> None:
    args = {"query": "checkout 500"}
    scope = new_scope(
        Remember(scope="arguments"),
        tenant_id="tenant-a",
        tool_name="send_money",
        fingerprint=proposal_fingerprint("send_money", args),
        created_by="user-1",
        answered_by="human",
        run_id="run-0000",
        call_id="call-0000",
        now=NOW - timedelta(days=1),
    )
    same = make_proposal(args, tool_name="send_money", call_id="call-0001")
    other = make_proposal({"query": "else"}, tool_name="send_money", call_id="call-0002")
    plan = plan_gate([same, other], _settings())
    scopes = {"send_money": [scope]}
    assert plan.remembered(scopes, "tenant-a", NOW) == {"call-0001": scope}
    assert plan.remembered(scopes, "tenant-b", NOW) == {}


def test_a_refused_batch_records_one_denied_manifest_with_the_usage_and_stops() -> None:
    state = make_state()
    calls = [make_proposal(call_id="call-0001"), make_proposal(call_id="call-0001")]
    plan = plan_gate(calls, _settings())
    refused = plan.refused(state, ())
    assert refused is not None and refused.error_code == "duplicate_call_id"
    end = end_gate(plan, state, refused, {"input_tokens": 7}, _base(state))
    assert not end.reserves
    [manifest] = end.manifests
    assert manifest.model_dump(exclude_unset=True) == {
        "run_id": state.run_id,
        "step": state.step,
        "phase": Phase.VALIDATE,
        "steps_remaining": state.budget.steps_remaining,
        "tool_calls_remaining": state.budget.tool_calls_remaining,
        "tokens_used": state.budget.tokens_used,
        "deadline_remaining_ms": None,
        "outcome": "denied",
        "decision_kind": "tool",
        "code": "duplicate_call_id",
        "input_tokens": 7,
    }
    assert end.state.stop == refused and end.state.phase is Phase.VALIDATE


def test_each_call_has_its_manifest_and_only_the_first_carries_the_usage() -> None:
    calls = [make_proposal(call_id="call-0001"), make_proposal({"query": "b"}, call_id="call-0002")]
    plan, state, gated = _judged(calls)
    end = end_gate(plan, state, gated, {"input_tokens": 7}, _base(state))
    assert [m.input_tokens for m in end.manifests] == [7, None]
    assert [m.verdict for m in end.manifests] == [VerdictCode.ALLOWED, VerdictCode.ALLOWED]
    assert ["input_tokens" in m.model_fields_set for m in end.manifests] == [True, False]
    assert end.reserves and end.gated["batch"] == gated.batch


def test_a_stopped_batch_is_reserved_nowhere_and_a_repairable_one_is_given_back() -> None:
    calls = [make_proposal({"query": 3}, call_id="call-0001")]
    plan, state, gated = _judged(calls)
    assert gated.stop is not None
    end = end_gate(plan, state, gated, {}, _base(state))
    assert not end.reserves and end.state.stop == gated.stop
    plan, state, gated = _judged(calls, repair_attempts=1)
    given = end_gate(plan, state, gated, {}, _base(state))
    assert not given.reserves and given.state.stop is None
    assert given.state.repairs == 1 and given.state.batch == ()


def test_a_denial_observed_as_data_is_receipted_now_and_the_rest_is_reserved() -> None:
    denied = make_proposal(tool_name="send_money", call_id="call-0001")
    allowed = make_proposal(call_id="call-0002")
    plan = plan_gate([denied, allowed], _settings(denial="observe"))
    state = make_state()
    reader_only = RunContext(
        tenant_id="tenant-a",
        principal=Principal(id="user-1", capabilities=frozenset({"logs:read"})),
    )
    gated = plan.judge(
        state, reader_only, now=NOW, remembered={}, outputs=None, run_rule=run_directly
    )
    end = end_gate(plan, state, gated, {}, _base(state))
    assert end.reserves
    assert [(r.call_id, r.status) for r in end.state.receipts] == [
        ("call-0001", ReceiptStatus.DENIED)
    ]


def test_a_reservation_that_stops_the_batch_receipts_every_unfunded_call() -> None:
    calls = [make_proposal(call_id="call-0001")]
    plan, state, gated = _judged(calls)
    end = end_gate(plan, state, gated, {}, _base(state))
    unfunded = gated.batch[0].with_verdict(
        gated.batch[0].verdict.model_copy(update={"code": VerdictCode.BUDGET_EXHAUSTED})
    )
    ran_out = stop(TerminationReason.TOOL_BUDGET_EXHAUSTED, "tool_calls")
    closed = end.reserved(state.model_copy(update={"batch": (unfunded,)}), ran_out)
    assert closed.stop == ran_out
    assert [(r.call_id, r.status) for r in closed.receipts] == [("call-0001", ReceiptStatus.DENIED)]
    assert end.reserved(state, None) is state


def test_only_a_call_the_approval_let_through_remembers_its_scope() -> None:
    calls = [make_proposal(call_id="call-0001"), make_proposal({"query": 3}, call_id="call-0002")]
    _, _, gated = _judged(calls)
    remember = {"call-0001": Remember(scope="tool"), "call-0002": Remember(scope="tool")}
    scopes = scopes_to_remember(
        gated.batch,
        remember,
        tenant_id="tenant-a",
        created_by="lead-1",
        answered_by="approver",
        run_id="run-0001",
        now=NOW,
    )
    assert [(c, s.tenant_id, s.created_by, s.tool_name) for c, s in scopes] == [
        ("call-0001", "tenant-a", "lead-1", "search_logs")
    ]
    named = scopes_named(gated.batch, {"call-0001": scopes[0][1].scope_id})
    assert [e.verdict.scope_id for e in named] == [scopes[0][1].scope_id, None]
    assert scopes_named(gated.batch, {}) is gated.batch


def test_a_batch_of_reads_nobody_decides_is_judged_in_place() -> None:
    reads = [make_proposal(call_id="call-0001"), make_proposal(call_id="call-0002")]
    assert plan_gate(reads, _settings()).in_place
    # An unknown tool is refused by the registry gate: nobody is asked about it either.
    assert plan_gate([make_proposal(tool_name="nowhere")], _settings()).in_place


def test_a_write_a_decider_a_rule_or_a_dependency_takes_the_judging_off_the_node() -> None:
    def rule(args: object, state: object) -> None:
        return None

    ruled = make_spec("ruled_read", semantic_validator=rule)
    polled = make_spec("polled_read", progress_predicate=lambda proposal, state: False)
    registry = ToolRegistry([make_spec(), SEND, DECIDED, ruled, polled])
    read = make_proposal(call_id="call-0001")
    for other in (
        make_proposal(tool_name="send_money", call_id="call-0002"),
        make_proposal(tool_name="decided_read", call_id="call-0002"),
        make_proposal(tool_name="ruled_read", call_id="call-0002"),
        make_proposal(tool_name="polled_read", call_id="call-0002"),
        ToolProposal(
            call_id="call-0002",
            tool_name="search_logs",
            arguments={"query": "x"},
            depends_on=("call-0000",),
        ),
    ):
        assert not plan_gate([read, other], _settings(registry=registry)).in_place
    # The graph's own ``needs_approval`` decides every call, a read's too.
    assert not plan_gate([read], _settings(needs_approval=_over_100)).in_place
