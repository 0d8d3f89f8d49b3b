"""Each gate fails with its own typed error; gate_proposal turns them into verdicts, as data."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from fencepost.policy import (
    DEFAULT_REPEAT_LIMIT,
    AgentState,
    Effect,
    HumanApprovalRequired,
    NoProgressDetected,
    TerminationReason,
    ToolPolicyDenied,
    ToolProposal,
    ToolRegistry,
    ToolSemanticError,
    UnknownTool,
    VerdictCode,
    authorize,
    check_progress,
    check_registered,
    check_schema,
    check_semantics,
    gate_proposal,
    proposal_fingerprint,
)
from fencepost.policy.gates import ArgumentsValidatorFailed
from tests.policy.factories import SearchArgs, make_proposal, make_spec, make_state, reader


def _repeated(proposal: ToolProposal, times: int) -> AgentState:
    """A state in which ``proposal``'s fingerprint has already been allowed ``times`` times."""
    fingerprint = proposal_fingerprint(proposal.tool_name, proposal.arguments)
    return make_state(fingerprints={fingerprint: times})


# Gate 1: registry -----------------------------------------------------------------------------


def test_unregistered_tool_fails_the_registry_gate() -> None:
    registry = ToolRegistry((make_spec(),))
    assert check_registered(registry, make_proposal()).name == "search_logs"
    with pytest.raises(UnknownTool):
        check_registered(registry, make_proposal(tool_name="drop_tables"))


# Gate 2: strict schema ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "location"),
    [
        ({"query": "checkout", "limit": "5"}, ("limit",)),
        ({"query": "checkout", "limit": 5.0}, ("limit",)),
        ({"query": "checkout", "limit": True}, ("limit",)),
        ({"query": "checkout", "tenant_id": "tenant-b"}, ("tenant_id",)),
        (
            {"query": "checkout", "window": {"service": "api", "tenant_id": "b"}},
            ("window", "tenant_id"),
        ),
        (
            {"query": "checkout", "window": {"service": "api", "max_hits": "3"}},
            ("window", "max_hits"),
        ),
        ({"query": 42}, ("query",)),
        ({}, ("query",)),
    ],
)
def test_strict_schema_rejects_coercion_and_unknown_keys(
    arguments: dict[str, Any], location: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as caught:
        check_schema(make_spec(), make_proposal(arguments))
    assert location in [error["loc"] for error in caught.value.errors()]


def test_strict_schema_accepts_well_typed_arguments() -> None:
    args = check_schema(
        make_spec(),
        make_proposal({"query": "checkout", "limit": 5, "window": {"service": "api"}}),
    )
    assert isinstance(args, SearchArgs)
    assert args.limit == 5
    assert args.window is not None and args.window.service == "api"


def test_strict_schema_reads_dates_as_the_iso_text_json_carries() -> None:
    args = check_schema(
        make_spec(),
        make_proposal({"query": "checkout", "start": "2026-01-01", "end": "2026-01-31"}),
    )
    assert isinstance(args, SearchArgs)
    assert (args.start, args.end) == (date(2026, 1, 1), date(2026, 1, 31))
    with pytest.raises(ValidationError):
        check_schema(make_spec(), make_proposal({"query": "checkout", "start": "yesterday"}))


# Gate 3: semantic rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "query", ["", "   ", "*", "null", "None", "undefined", "N/A", "'nil'", '""']
)
def test_empty_like_query_is_a_semantic_error(query: str) -> None:
    args = SearchArgs(query=query)
    with pytest.raises(ToolSemanticError) as caught:
        check_semantics(make_spec(), args, make_state())
    assert caught.value.rule == "empty_query"


def test_reversed_date_range_is_a_semantic_error() -> None:
    args = SearchArgs(query="checkout", start=date(2026, 2, 1), end=date(2026, 1, 1))
    with pytest.raises(ToolSemanticError) as caught:
        check_semantics(make_spec(), args, make_state())
    assert caught.value.rule == "reversed_range_start_end"


def test_meaningful_query_and_ordered_range_pass_the_semantic_gate() -> None:
    for start, end in [(date(2026, 1, 1), date(2026, 1, 2)), (date(2026, 1, 1), date(2026, 1, 1))]:
        check_semantics(
            make_spec(), SearchArgs(query="null pointer", start=start, end=end), make_state()
        )


def test_tool_semantic_validator_runs_with_the_args_and_the_state() -> None:
    seen: list[tuple[Any, AgentState]] = []

    def no_wildcards(args: Any, state: AgentState) -> None:
        seen.append((args, state))
        if "%" in args.query:
            raise ToolSemanticError("wildcard_query")

    spec = make_spec(semantic_validator=no_wildcards)
    state = make_state()
    check_semantics(spec, SearchArgs(query="checkout"), state)
    with pytest.raises(ToolSemanticError) as caught:
        check_semantics(spec, SearchArgs(query="check%"), state)
    assert caught.value.rule == "wildcard_query"
    assert seen[0] == (SearchArgs(query="checkout"), state)


@given(query=st.sampled_from(["", " ", "*", "null", "'nil'"]) | st.text(max_size=12))
def test_a_tool_that_allows_an_empty_query_is_never_refused_by_the_empty_query_rule(
    query: str,
) -> None:
    check_semantics(make_spec(allow_empty_query=True), SearchArgs(query=query), make_state())


def test_allowing_an_empty_query_keeps_the_range_rule_and_the_tools_own_validator() -> None:
    def no_limit_zero(args: Any, state: AgentState) -> None:
        if args.limit == 0:
            raise ToolSemanticError("zero_limit")

    spec = make_spec(allow_empty_query=True, semantic_validator=no_limit_zero)
    reversed_range = SearchArgs(query="", start=date(2026, 2, 1), end=date(2026, 1, 1))
    with pytest.raises(ToolSemanticError, match="reversed_range_start_end"):
        check_semantics(spec, reversed_range, make_state())
    with pytest.raises(ToolSemanticError, match="zero_limit"):
        check_semantics(spec, SearchArgs(query="", limit=0), make_state())


# Gate 4: no progress --------------------------------------------------------------------------


def test_default_repeat_limit_is_two() -> None:
    assert DEFAULT_REPEAT_LIMIT == 2


def test_repeat_below_the_limit_passes_and_returns_the_fingerprint() -> None:
    proposal = make_proposal()
    fingerprint = check_progress(make_spec(), proposal, _repeated(proposal, 1))
    assert fingerprint == proposal_fingerprint("search_logs", {"query": "checkout 500"})


def test_repeat_at_the_limit_is_no_progress() -> None:
    proposal = make_proposal()
    with pytest.raises(NoProgressDetected) as caught:
        check_progress(make_spec(), proposal, _repeated(proposal, DEFAULT_REPEAT_LIMIT))
    assert caught.value.fingerprint == proposal_fingerprint(proposal.tool_name, proposal.arguments)


def test_repeat_is_recognised_whatever_the_key_order() -> None:
    seen = make_proposal({"query": "checkout", "limit": 5})
    again = make_proposal({"limit": 5, "query": "checkout"}, call_id="call-0002")
    with pytest.raises(NoProgressDetected):
        check_progress(make_spec(), again, _repeated(seen, 2))


def test_a_different_argument_is_not_a_repeat() -> None:
    seen = make_proposal({"query": "checkout"})
    check_progress(make_spec(), make_proposal({"query": "checkout 502"}), _repeated(seen, 5))


def test_repeat_limit_can_be_raised_per_call() -> None:
    proposal = make_proposal()
    state = _repeated(proposal, 2)
    check_progress(make_spec(), proposal, state, repeat_limit=3)
    with pytest.raises(NoProgressDetected):
        check_progress(make_spec(), proposal, state, repeat_limit=1)


@pytest.mark.parametrize("own", [1, 3, 5])
def test_a_tools_own_repeat_limit_replaces_the_graphs(own: int) -> None:
    proposal = make_proposal()
    spec = make_spec(repeat_limit=own)
    check_progress(spec, proposal, _repeated(proposal, own - 1), repeat_limit=2)
    with pytest.raises(NoProgressDetected):
        check_progress(spec, proposal, _repeated(proposal, own), repeat_limit=2)


def test_progress_predicate_allows_a_repeat_it_calls_progress() -> None:
    proposal = make_proposal({"query": "task-42 status"})
    state = _repeated(proposal, 7)
    calls: list[ToolProposal] = []

    def status_changed(p: ToolProposal, s: AgentState) -> bool:
        calls.append(p)
        return True

    check_progress(make_spec(progress_predicate=status_changed), proposal, state)
    assert calls == [proposal]
    with pytest.raises(NoProgressDetected):
        check_progress(make_spec(progress_predicate=lambda p, s: False), proposal, state)


# Gate 5: authorization and effect -------------------------------------------------------------


def test_missing_capability_is_policy_denied() -> None:
    with pytest.raises(ToolPolicyDenied):
        authorize(make_spec(capability="logs:read"), reader("metrics:read"))


@pytest.mark.parametrize("effect", [Effect.WRITE, Effect.EXTERNAL])
def test_write_and_external_effects_require_human_approval(effect: Effect) -> None:
    spec = make_spec(effect=effect, capability="tickets:write")
    with pytest.raises(HumanApprovalRequired):
        authorize(spec, reader("tickets:write"))
    authorize(spec, reader("tickets:write"), approved=True)


def test_read_effect_needs_no_approval() -> None:
    authorize(make_spec(effect=Effect.READ), reader("logs:read"))


def test_approval_does_not_replace_the_capability() -> None:
    spec = make_spec(effect=Effect.WRITE, capability="tickets:write")
    with pytest.raises(ToolPolicyDenied):
        authorize(spec, reader("logs:read"), approved=True)


# gate_proposal: the verdict as data -----------------------------------------------------------

REGISTRY = ToolRegistry(
    (
        make_spec(),
        make_spec("create_ticket", effect=Effect.WRITE, capability="tickets:write"),
        make_spec("send_email", effect=Effect.EXTERNAL, capability="mail:send"),
    )
)
EVERYONE = reader("logs:read", "tickets:write", "mail:send")


@pytest.mark.parametrize(
    ("proposal", "principal", "code"),
    [
        (make_proposal(), EVERYONE, VerdictCode.ALLOWED),
        (make_proposal(tool_name="drop_tables"), EVERYONE, VerdictCode.UNKNOWN_TOOL),
        (make_proposal({"query": "x", "limit": "5"}), EVERYONE, VerdictCode.SCHEMA_VIOLATION),
        (make_proposal({"query": "x", "tenant_id": "b"}), EVERYONE, VerdictCode.SCHEMA_VIOLATION),
        (make_proposal({"query": "*"}), EVERYONE, VerdictCode.SEMANTIC_VIOLATION),
        (
            make_proposal({"query": "x", "start": "2026-02-01", "end": "2026-01-01"}),
            EVERYONE,
            VerdictCode.SEMANTIC_VIOLATION,
        ),
        (make_proposal(), reader("metrics:read"), VerdictCode.CAPABILITY_DENIED),
        (make_proposal(tool_name="create_ticket"), EVERYONE, VerdictCode.APPROVAL_REQUIRED),
        (make_proposal(tool_name="send_email"), EVERYONE, VerdictCode.APPROVAL_REQUIRED),
    ],
)
def test_gate_proposal_returns_the_matching_verdict(
    proposal: ToolProposal, principal: Any, code: VerdictCode
) -> None:
    verdict = gate_proposal(REGISTRY, proposal, make_state(), principal)
    assert verdict.code is code
    assert verdict.allowed is (code is VerdictCode.ALLOWED)
    assert verdict.call_id == proposal.call_id
    assert verdict.tool_name == proposal.tool_name
    assert verdict.fingerprint == proposal_fingerprint(proposal.tool_name, proposal.arguments)


def test_gate_proposal_reports_no_progress_at_the_repeat_limit() -> None:
    proposal = make_proposal()
    verdict = gate_proposal(REGISTRY, proposal, _repeated(proposal, 2), EVERYONE)
    assert verdict.code is VerdictCode.NO_PROGRESS
    assert verdict.termination is TerminationReason.NO_PROGRESS


def test_gate_proposal_allows_an_approved_write() -> None:
    proposal = make_proposal(tool_name="create_ticket")
    verdict = gate_proposal(REGISTRY, proposal, make_state(), EVERYONE, approved=True)
    assert verdict.code is VerdictCode.ALLOWED


def test_gates_run_in_order_registry_schema_semantics_progress_authorization() -> None:
    nobody = reader("nothing")
    schema_and_capability = make_proposal({"query": "x", "limit": "5"})
    assert gate_proposal(REGISTRY, schema_and_capability, make_state(), nobody).code is (
        VerdictCode.SCHEMA_VIOLATION
    )
    semantic_and_capability = make_proposal({"query": ""})
    assert gate_proposal(REGISTRY, semantic_and_capability, make_state(), nobody).code is (
        VerdictCode.SEMANTIC_VIOLATION
    )
    # A repeat ends as no_progress before anything else is decided about it.
    repeat = make_proposal()
    assert gate_proposal(REGISTRY, repeat, _repeated(repeat, 2), nobody).code is (
        VerdictCode.NO_PROGRESS
    )


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (VerdictCode.ALLOWED, None),
        (VerdictCode.UNKNOWN_TOOL, TerminationReason.INVALID_PROPOSAL),
        (VerdictCode.SCHEMA_VIOLATION, TerminationReason.INVALID_PROPOSAL),
        (VerdictCode.SEMANTIC_VIOLATION, TerminationReason.INVALID_PROPOSAL),
        (VerdictCode.NO_PROGRESS, TerminationReason.NO_PROGRESS),
        (VerdictCode.CAPABILITY_DENIED, TerminationReason.POLICY_DENIED),
        (VerdictCode.APPROVAL_REQUIRED, TerminationReason.APPROVAL_REQUIRED),
    ],
)
def test_denying_verdicts_map_to_their_termination_reason(
    code: VerdictCode, reason: TerminationReason | None
) -> None:
    verdict = gate_proposal(REGISTRY, make_proposal(), make_state(), EVERYONE).model_copy(
        update={"code": code}
    )
    assert verdict.termination is reason


def test_gating_never_runs_the_tool_nor_spends_budget() -> None:
    ran: list[Any] = []
    registry = ToolRegistry((make_spec(execute=lambda args, ctx: ran.append(args)),))
    state = make_state()
    verdict = gate_proposal(registry, make_proposal(), state, EVERYONE)
    assert verdict.allowed
    assert ran == []
    assert state == make_state()


def test_semantic_error_is_not_mistaken_for_a_schema_error() -> None:
    # ToolSemanticError subclasses ValueError; the gate must still report it as semantic.
    def reject(args: BaseModel, state: AgentState) -> None:
        raise ToolSemanticError("custom_rule")

    registry = ToolRegistry((make_spec(semantic_validator=reject),))
    verdict = gate_proposal(registry, make_proposal(), make_state(), EVERYONE)
    assert verdict.code is VerdictCode.SEMANTIC_VIOLATION


# The rules check_semantics documents, written out here on purpose: a name dropped from the
# gate's own lists must fail these tests, not shrink them.
_QUERY_LIKE = ("query", "q", "search", "search_query", "text", "keywords")
_RANGES = (
    ("start", "end"),
    ("since", "until"),
    ("from_date", "to_date"),
    ("start_date", "end_date"),
    ("start_time", "end_time"),
    ("date_from", "date_to"),
    ("after", "before"),
)


def _args_model(*names: str) -> type[BaseModel]:
    fields: dict[str, Any] = {n: (Any, None) for n in names}
    return create_model("WideArgs", **fields)


@pytest.mark.parametrize("name", _QUERY_LIKE)
def test_every_query_like_field_of_any_arguments_model_is_checked(name: str) -> None:
    # The rules a model can break are worked out once per model: each field must still count.
    model = _args_model(*_QUERY_LIKE, "limit")
    with pytest.raises(ToolSemanticError) as caught:
        check_semantics(make_spec(), model(**{name: " * "}), make_state())
    assert caught.value.rule == f"empty_{name}"
    check_semantics(make_spec(), model(**{name: "checkout"}), make_state())


@pytest.mark.parametrize(("low", "high"), _RANGES)
def test_every_range_pair_of_any_arguments_model_is_checked(low: str, high: str) -> None:
    model = _args_model(*(n for pair in _RANGES for n in pair))
    reversed_range = {low: date(2026, 2, 1), high: date(2026, 1, 1)}
    with pytest.raises(ToolSemanticError) as caught:
        check_semantics(make_spec(), model(**reversed_range), make_state())
    assert caught.value.rule == f"reversed_range_{low}_{high}"
    half = _args_model(low)  # a model with only one end of the pair has no range to check
    check_semantics(make_spec(), half(**{low: date(2026, 2, 1)}), make_state())


def test_an_extra_field_is_not_taken_for_a_declared_one() -> None:
    # A model that allows extras keeps them apart from its fields: an extra "query" was never
    # checked, and working the rules out per model must not start checking it either way.
    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        limit: int = 1

    check_semantics(make_spec(), Loose.model_validate({"limit": 2, "query": ""}), make_state())


def test_the_schema_gate_validates_through_a_models_own_model_validate_json() -> None:
    # The gate calls pydantic's validator directly only for a model that keeps pydantic's own
    # model_validate_json; one that overrides it is judged by its override.
    seen: list[str] = []

    class Audited(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        query: str

        @classmethod
        def model_validate_json(cls, json_data: Any, **kwargs: Any) -> Audited:
            seen.append(json_data)
            if "forbidden" in json_data:
                raise ValueError("refused by the model's own hook")
            return super().model_validate_json(json_data, **kwargs)

    spec = make_spec(args_model=Audited)
    args = check_schema(spec, make_proposal({"query": "checkout"}))
    assert isinstance(args, Audited) and seen == ['{"query":"checkout"}']
    # What the hook raised is a schema refusal like a broken validator's, its text not kept.
    with pytest.raises(ArgumentsValidatorFailed) as refused:
        check_schema(spec, make_proposal({"query": "forbidden"}))
    assert "own hook" not in str(refused.value) and refused.value.__cause__ is None
    plain = check_schema(make_spec(), make_proposal({"query": "checkout", "limit": 3}))
    assert plain == SearchArgs(query="checkout", limit=3)
    with pytest.raises(ValidationError):
        check_schema(make_spec(), make_proposal({"query": "checkout", "limit": "3"}))


def test_the_gate_hands_a_batch_the_spec_and_repeat_key_it_found_on_the_way() -> None:
    from fencepost.policy import ToolRegistry, VerdictCode
    from fencepost.policy.gates import gate_proposal, gate_with_findings
    from fencepost.policy.progress import repeat_key

    spec = make_spec()
    registry = ToolRegistry([spec])
    state = make_state()
    proposal = make_proposal()
    verdict, found, key = gate_with_findings(registry, proposal, state, reader())
    assert verdict == gate_proposal(registry, proposal, state, reader())
    assert verdict.code is VerdictCode.ALLOWED
    assert found is registry.get("search_logs")
    assert key == repeat_key(verdict.fingerprint, state)
    # An unknown tool: no spec; a refusal before the repeat check: no key.
    unknown = make_proposal(tool_name="drop_tables")
    assert gate_with_findings(registry, unknown, state, reader())[1:] == (None, None)
    refused = gate_with_findings(registry, make_proposal({"query": ""}), state, reader())
    assert refused[0].code is VerdictCode.SEMANTIC_VIOLATION
    assert refused[1:] == (found, None)
    # A polling tool's repeats are keyed by time, not by the call.
    polling = ToolRegistry([make_spec(poll_interval_seconds=5)])
    assert gate_with_findings(polling, proposal, state, reader())[2] is None


class _StaticHook(BaseModel):
    """A model that replaces model_validate_json with a staticmethod (no ``__func__``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: str

    @staticmethod
    def model_validate_json(json_data: Any, **kwargs: Any) -> _StaticHook:  # type: ignore[override]
        if "forbidden" in json_data:
            raise ValueError("refused by the model's own hook")
        return _StaticHook.__pydantic_validator__.validate_json(json_data, **kwargs)  # type: ignore[no-any-return]


def test_a_schema_whose_model_validate_json_is_a_staticmethod_is_validated_through_it() -> None:
    # A staticmethod (or any callable that is not a bound method) has no ``__func__``: the gate
    # calls the model's own hook whatever kind of callable it is.
    spec = make_spec(args_model=_StaticHook)
    args = check_schema(spec, make_proposal({"query": "checkout"}))
    assert isinstance(args, _StaticHook) and args.query == "checkout"
    # What the hook raised is a schema refusal with no text (a broken validator's, pinned in
    # tests/invariants/test_1_every_run_ends_typed.py).
    with pytest.raises(ArgumentsValidatorFailed):
        check_schema(spec, make_proposal({"query": "forbidden"}))


def test_what_the_gate_works_out_once_per_tool_keeps_no_tool_alive() -> None:
    import gc
    import weakref

    def rule(args: Any, state: Any, context: Any) -> None:
        return None

    spec = make_spec("made_per_request", semantic_validator=rule)
    proposal = make_proposal(tool_name="made_per_request")
    assert gate_proposal(ToolRegistry([spec]), proposal, make_state(), reader()).allowed
    gone = weakref.ref(spec)
    del spec
    gc.collect()
    assert gone() is None
