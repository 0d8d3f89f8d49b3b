"""Whatever a model emits, the run ends with exactly one typed reason and nothing escapes invoke."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fencepost as fp
from tests.graph.kit import context, harness, thread
from tests.strategies import any_text

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(any_text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)

tool_like = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["tool", "final", "abstain", "other"]),
        "call_id": any_text(max_size=20),
        "tool_name": st.sampled_from(
            ["search_logs", "write_note", "admin_reset", "Bad Name", "rm"]
        ),
        "arguments": json_values,
    }
)

outputs = st.one_of(json_values, tool_like, any_text(max_size=40))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(outputs, min_size=1, max_size=4))
def test_any_model_output_ends_in_one_typed_reason(script: list[Any]) -> None:
    h = harness(script)
    out = h.graph.invoke(
        fp.start("q", fp.RuntimeBudget(steps_remaining=5, tool_calls_remaining=3)),
        thread(),
        context=context(),
    )
    state = fp.run_output(out)
    assert state.phase is fp.policy.Phase.TERMINAL
    assert isinstance(state.termination, fp.TerminationReason)
    # Only a registered read tool with valid arguments may have run.
    assert {name for name, _, _ in h.calls.log} <= {"search_logs"}
    assert state.budget.tool_calls_used <= 3
    if state.termination is fp.TerminationReason.COMPLETED:
        assert state.final_answer is not None


def test_build_time_config_errors_name_the_field() -> None:
    from tests.graph.kit import Calls, make_registry

    registry = make_registry(Calls())
    model = harness([]).model
    for kwargs, field in (
        ({"approval": "sometimes"}, "approval"),
        ({"repeat_limit": 0}, "repeat_limit"),
        ({"model_timeout_seconds": 0}, "model_timeout_seconds"),
        ({"model_timeout_seconds": float("inf")}, "model_timeout_seconds"),
        ({"model_timeout_seconds": float("nan")}, "model_timeout_seconds"),
        ({"ledger": object()}, "ledger"),
        ({"max_concurrent_tools": 0}, "max_concurrent_tools"),
        ({"model_retries": -1}, "model_retries"),
    ):
        try:
            fp.build_agent_graph(registry, model, **kwargs)
        except fp.GraphConfigError as exc:
            assert exc.field == field and field in str(exc)
        else:  # pragma: no cover
            raise AssertionError(f"{field} accepted a bad value")
