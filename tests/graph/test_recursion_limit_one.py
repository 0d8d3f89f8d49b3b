"""No run ends in GraphRecursionError: even ``recursion_limit=1``, where LangGraph raises after
the terminal node has recorded the run's end, returns the ended state with its reason."""

from __future__ import annotations

import asyncio

import pytest

import fencepost as fp
from tests.graph.kit import budget, call, context, harness, thread


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_recursion_limit_of_one_ends_the_run_with_a_reason_instead_of_raising(mode: str) -> None:
    h = harness([call(n=1)])
    config = {**thread(), "recursion_limit": 1}
    inp, ctx = fp.start("q", budget()), context()
    if mode == "invoke":
        out = h.graph.invoke(inp, config, context=ctx)
    else:
        out = asyncio.run(h.graph.ainvoke(inp, config, context=ctx))
    state = fp.run_output(out)
    assert state.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
    assert state.last_error_code == "recursion_limit"
    assert h.calls.log == []
    # Invoking the ended thread again returns it, still ended, and raises nothing.
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    assert again.termination is fp.TerminationReason.STEP_BUDGET_EXHAUSTED
