"""A run's provenance sources, read off its state: what the gate traces a proposal's values
against, and what the stop report checks a final answer against.

The sources are the run's request (and the thread's earlier requests: the user's words too),
its trusted context's ``app_data``, and the results its calls returned, each trusted only if its
registered tool declares ``output_trust=Trust.TRUSTED``
(:mod:`fencepost.policy.provenance` has the matching and its limits).
"""

from __future__ import annotations

from collections.abc import Sequence

from fencepost.policy.context import RunContext
from fencepost.policy.provenance import (
    ObservedOutput,
    RunSources,
    answer_traceable,
    observed_outputs,
    run_sources,
)
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.state import AgentState
from fencepost.policy.trust import Trust


def sources_of(
    state: AgentState,
    context: RunContext | None,
    registry: ToolRegistry,
    outputs: Sequence[ObservedOutput] | None = None,
) -> RunSources:
    """The run's sources now: its request (and the thread's earlier requests), its context's
    app data, and its earlier outputs — ``outputs`` when given, else the state's observations,
    each trusted only if its registered tool declares ``output_trust=Trust.TRUSTED`` (a tool no
    longer registered: untrusted)."""

    def trusted(name: str) -> bool:
        return name in registry and registry.get(name).output_trust is Trust.TRUSTED

    request = "\n".join([*(t.question for t in state.turns), state.question])
    found = observed_outputs(state.observations, trusted) if outputs is None else outputs
    return run_sources(
        request,
        context.app_data if context is not None else None,
        found,
        app_owner=context,
    )


def answer_untrusted(
    state: AgentState, context: RunContext | None, registry: ToolRegistry
) -> tuple[str, ...]:
    """The call ids of the untrusted outputs the run's final answer repeats text of (empty:
    none, or no answer): see :func:`~fencepost.policy.provenance.answer_repeats_untrusted`."""
    answer = state.final_answer
    # The answer's own text first: one too short to hold a span, naming no identifier, costs
    # what it is long, not what the run observed.
    if answer is None or answer.is_empty or not state.observations:
        return ()
    if not answer_traceable(answer.text):
        return ()
    return sources_of(state, context, registry).answer_repeats(answer.text)
