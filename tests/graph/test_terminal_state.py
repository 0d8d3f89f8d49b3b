"""One terminal node is the only way out; a finished thread refuses further work."""

from __future__ import annotations

import fencepost as fp
from tests.graph.kit import budget, call, context, final_citing_last, harness, thread


def test_second_invoke_on_a_finished_thread_returns_the_same_state_and_calls_nothing() -> None:
    h = harness([call(), final_citing_last, call(n=2)])
    config, ctx = thread(), context()
    first = fp.run_output(h.graph.invoke(fp.start("q", budget()), config, context=ctx))
    model_calls, tool_calls = h.model.calls, len(h.calls.log)
    again = fp.run_output(h.graph.invoke(None, config, context=ctx))
    restarted = fp.run_output(h.graph.invoke(fp.start("another q", budget()), config, context=ctx))
    assert first.termination is fp.TerminationReason.COMPLETED
    assert again == first
    assert restarted.termination is first.termination and restarted.budget == first.budget
    assert restarted.question == first.question
    assert (h.model.calls, len(h.calls.log)) == (model_calls, tool_calls)


def test_terminal_state_is_only_made_by_the_terminal_node() -> None:
    h = harness([call(), final_citing_last])
    config = thread()
    for chunk in h.graph.stream(
        fp.start("q", budget()), config, context=context(), stream_mode="updates"
    ):
        for node, update in chunk.items():
            if update and update.get("phase") is fp.policy.Phase.TERMINAL:
                assert node == "terminal"
    history = list(h.graph.get_state_history(config))
    terminal_writes = [
        s for s in history if s.metadata and "terminal" in (s.metadata.get("writes") or {})
    ]
    assert h.graph.get_state(config).next == ()
    assert len(terminal_writes) <= 1


def test_terminate_refuses_a_terminal_state() -> None:
    h = harness([fp.AbstainProposal(reason="insufficient_evidence")])
    state = h.run()
    try:
        fp.policy.terminate(state, fp.TerminationReason.FAILED)
    except fp.policy.TerminalStateError:
        pass
    else:  # pragma: no cover - the assertion is the point
        raise AssertionError("terminate accepted a terminal state")
