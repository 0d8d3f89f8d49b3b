"""The permitted catalog is exactly the tools the gate would not refuse for a capability: the
filter and the gate ask one check, so the model is never shown a tool the gate refuses, nor
kept from one the gate allows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import ToolRegistry, VerdictCode, gate_proposal
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import SystemClock
from fencepost.policy.decide import StepPlan, StepSettings, plan_step
from fencepost.policy.registry import ToolCatalog
from fencepost.policy.tool import Principal
from tests.policy.factories import make_proposal, make_spec, make_state


def shown_catalog(
    registry: ToolRegistry, principal: Principal | None, mode: ToolCatalog
) -> tuple[dict[str, object], ...]:
    """The catalog a model step's plan shows the model, acting for ``principal``."""
    settings = StepSettings(
        registry=registry,
        tool_catalog=mode,
        tokens_per_step=0,
        price=None,
        answer_margin=0,
        model_retries=0,
        require_citations=False,
    )
    if principal is None:
        # No trusted principal: the step acts in no context, and nothing is planned to be shown.
        return StepPlan(stop=None, settings=settings).decision_input(make_state()).catalog
    state = make_state()  # acting for user-1, the principal the tests hold
    ctx = RunContext(tenant_id=state.tenant_id or "", principal=principal)
    plan = plan_step(state, ctx, settings, given=ctx, remaining_steps=None, clock=SystemClock())
    assert plan.stop is None
    return plan.decision_input(state).catalog


CAPABILITIES = ["logs:read", "notes:write", "payments:write", "admin"]
NAMES = ["search_logs", "write_note", "send_money", "admin_reset", "read_more", "pay_more"]


@given(
    tools=st.lists(st.sampled_from(CAPABILITIES), min_size=0, max_size=len(NAMES)),
    held=st.frozensets(st.sampled_from([*CAPABILITIES, "approve:notes:write"])),
)
def test_the_permitted_catalog_is_every_tool_the_gate_does_not_refuse_for_a_capability(
    tools: list[str], held: frozenset[str]
) -> None:
    registry = ToolRegistry(
        make_spec(name, capability=capability)
        for name, capability in zip(NAMES, tools, strict=False)
    )
    principal = Principal(id="user-1", capabilities=held)
    allowed_by_gate = [
        name
        for name in registry.names()
        if gate_proposal(registry, make_proposal(tool_name=name), make_state(), principal).code
        is not VerdictCode.CAPABILITY_DENIED
    ]
    assert [e["name"] for e in shown_catalog(registry, principal, "permitted")] == allowed_by_gate
    assert list(shown_catalog(registry, principal, "all")) == registry.model_catalog()


def test_no_principal_is_shown_no_tool() -> None:
    registry = ToolRegistry([make_spec()])
    assert shown_catalog(registry, None, "permitted") == ()
