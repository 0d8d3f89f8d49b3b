"""Step manifests stream on the custom stream mode and stay in state, one per step and phase."""

from __future__ import annotations

import fencepost as fp
from tests.graph.kit import budget, call, context, harness, thread


def test_manifests_stream_on_custom_mode_and_stay_in_state() -> None:
    h = harness([call(), fp.AbstainProposal(reason="insufficient_evidence")])
    config = thread()
    streamed = [
        chunk
        for chunk in h.graph.stream(
            fp.start("q", budget()), config, context=context(), stream_mode="custom"
        )
        if chunk.get("fencepost") == "manifest"
    ]
    state = fp.run_output(h.graph.get_state(config).values)
    assert [{k: v for k, v in c.items() if k != "fencepost"} for c in streamed] == [
        m.model_dump(mode="json") for m in state.manifests
    ]
    assert [m.phase for m in state.manifests] == [
        fp.policy.Phase.VALIDATE,
        fp.policy.Phase.EXECUTE,
        fp.policy.Phase.DECIDE,
        fp.policy.Phase.TERMINAL,
    ]
