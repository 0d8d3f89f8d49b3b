"""An answer whose citations point at no evidence of the run is refused where it is proposed:
it is never streamed, nor checkpointed, as a completed stop before the run ends
``invalid_proposal``."""

from __future__ import annotations

import fencepost as fp
from tests.graph.kit import budget, call, context, harness, thread


def test_an_answer_whose_citations_fail_is_never_streamed_or_checkpointed_as_completed() -> None:
    """DESIGN, "Decisions and answers" (a final answer whose citations point at no evidence of
    the run is rejected) and invariant 1 (one TerminationReason: ``invalid_proposal``, never
    ``completed``): the model step judges the citations before it writes a stop, so no
    ``values``/``updates`` chunk, and no checkpoint of the thread's history (``get_state_history``,
    a fork), ever shows the unsupported answer as a completed stop."""
    answer = "an answer no tool of the run supports"
    unsupported = fp.FinalProposal(answer=fp.AnswerPayload(text=answer, citations=("call-0099",)))
    h = harness([call(n=1), unsupported])
    config, ctx = thread(), context()
    shown = [
        repr(chunk)
        for _, chunk in h.graph.stream(
            fp.start("q", budget()), config, context=ctx, stream_mode=["values", "updates"]
        )
    ]
    ended = fp.run_output(h.graph.get_state(config).values)
    assert ended.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert ended.last_error_code == "unsupported_citation"
    stops = [s.values["run"].get("stop") for s in h.graph.get_state_history(config)]
    assert not [stop for stop in stops if stop and stop.get("reason") == "completed"]
    assert not [chunk for chunk in shown if answer in chunk]
