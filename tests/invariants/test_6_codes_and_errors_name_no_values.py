"""Invariant 6, for what names a refusal: a code, never the text of what was refused.

- A semantic rule names itself with a safe code (``^[a-z][a-z0-9_]{0,63}$``). A
  ``ToolSemanticError`` given a sentence instead (which may quote the model's arguments) refuses
  the call all the same, as ``unnamed_rule``: its text is in the developer's log
  (``fencepost.gate``) and in no verdict, receipt, manifest, stream chunk, model input,
  checkpoint or span.
- An ``InvalidProposal`` a model adapter raises with a code that is no safe code ends the run
  ``malformed_decision``; its text goes to ``fencepost.model``'s log only.
- ``fp.run_output``'s ``ValidationError`` for a record that does not validate names the fields,
  never the values (not in its text, ``repr``, ``errors()`` or JSON, nor in an exception it
  carries as its context).

Over both bindings (the ``binding`` parameter, ``tests/invariants/bindings.py``: fencepost's graph,
and ``create_agent`` with ``fp.FencepostMiddleware``), at the end of this file: a semantic rule
given as a sentence, ending the run or as data. The other tests drive the graph's own state, nodes
or settings (``update_state``, ``Command(update=...)``, channels, ``interrupt_before``, repair, the
approver, token estimates, savers and ledgers by URL), which the middleware binding does not have:
they stay graph-only.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

import fencepost as fp
from fencepost.policy import ToolSemanticError
from tests.adapters.fakes import FakeToolChatModel, ai_call, ai_final
from tests.graph.kit import context, harness, saver_bytes, thread
from tests.invariants import bindings as bd
from tests.invariants.test_6_tool_output_is_untrusted_data import (
    STREAM_MODES,
    RecordingDecider,
)
from tests.middleware import kit as mw
from tests.telemetry_kit import assert_only_in_one_traceback, every_text

MARK = "rule-text-5c1e9a"
"""Only in the text a rule or an adapter raised: never in the arguments, so found nowhere else."""


def _on_file(order_id: str) -> None:
    raise ToolSemanticError(f"order {order_id} is not one of this tenant's orders ({MARK})")


def _order_rule(args: Any, state: fp.AgentState) -> None:
    _on_file(args.order_id)


@fp.tool(effect="read", capability="logs:read", semantic_validator=_order_rule)
def order(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"status": "shipped"}


def _sweep(
    graph: Any,
    config: dict[str, Any],
    saver: Any,
    tmp_path: Path,
    chunks: list[Any],
    spans: InMemorySpanExporter,
) -> fp.AgentState:
    """The run's state, after checking ``MARK`` is in no checkpoint, stream chunk or span."""
    state = fp.run_output(graph.get_state(config).values)
    assert state.is_terminal
    assert MARK not in repr(state)
    if isinstance(saver, InMemorySaver):
        assert MARK.encode() not in saver_bytes(saver)
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("runs"))
    assert MARK.encode() not in stored
    assert {mode for mode, _ in chunks} >= {"values", "updates", "custom"}
    assert MARK not in repr(chunks)
    assert MARK not in every_text(spans.get_finished_spans())
    return state


@pytest.mark.parametrize("saver_kind", ["InMemorySaver", "SqliteSaver"])
@pytest.mark.parametrize("denial", ["end_run", "observe"])
def test_a_rule_given_as_a_sentence_refuses_the_call_as_unnamed_rule_and_its_text_is_only_logged(
    denial: str,
    saver_kind: str,
    tmp_path: Path,
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    chat = FakeToolChatModel(
        messages=iter([ai_call("order", {"order_id": "A-1001"}, "call-0001"), ai_final("none")])
    )
    decider = RecordingDecider(chat)
    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    saver = InMemorySaver() if saver_kind == "InMemorySaver" else SqliteSaver(conn)
    graph = fp.create_agent(decider, [order], checkpointer=saver, denial=denial)
    caplog.set_level("DEBUG", logger="fencepost")
    config = thread()
    chunks = list(
        graph.stream(
            fp.start("where is A-1001?"), config, context=context(), stream_mode=STREAM_MODES
        )
    )
    conn.commit()
    state = _sweep(graph, config, saver, tmp_path, chunks, spans)
    conn.close()
    assert any(m.verdict == "semantic_violation" for m in state.manifests)
    # The verdict (in the stream's updates) names the rule by its code.
    assert "rule: unnamed_rule" in repr(chunks)
    if denial == "observe":
        (receipt,) = state.receipts
        assert receipt.status is fp.ReceiptStatus.DENIED and receipt.rule == "unnamed_rule"
    assert MARK not in repr(decider.inputs) and MARK not in repr(chat.received)
    assert_only_in_one_traceback(caplog.records, MARK, "fencepost.gate")


@pytest.mark.parametrize(
    "code", [f"the model wrote {MARK}", f"{MARK}", "ok_code\n", "code\ud800"], ids=repr
)
def test_an_invalid_proposal_code_that_is_no_safe_code_ends_the_run_malformed_decision(
    code: str, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    def adapter(inp: fp.DecisionInput) -> Any:
        raise fp.InvalidProposal(code)

    conn = sqlite3.connect(tmp_path / "runs.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    h = harness([adapter], checkpointer=saver)
    caplog.set_level("DEBUG", logger="fencepost")
    config = thread()
    chunks = list(
        h.graph.stream(
            fp.start("q"), config, context=context(), stream_mode=["values", "updates", "custom"]
        )
    )
    conn.commit()
    state = _sweep(h.graph, config, saver, tmp_path, chunks, spans)
    conn.close()
    assert state.termination is fp.TerminationReason.INVALID_PROPOSAL
    assert state.last_error_code == "malformed_decision"
    assert code not in repr(chunks)
    if MARK in code:
        assert_only_in_one_traceback(caplog.records, MARK, "fencepost.model")


def test_run_outputs_validation_error_names_fields_never_values() -> None:
    values = {
        "run": {
            "run_id": "run-1",
            "question": "q",
            "tenant_id": [f"{MARK}-tenant"],
            "budget": {"steps_remaining": f"{MARK}-steps", "tool_calls_remaining": 1},
            "fingerprints": {f"{MARK}-key": f"{MARK}-count"},
            "final_answer": {"text": "answer", "citations": 5},
        }
    }
    with pytest.raises(ValidationError) as caught:
        fp.run_output(values)
    exc = caught.value
    shown = [str(exc), repr(exc), repr(exc.errors()), exc.json()]
    assert all(MARK not in text for text in shown)
    assert exc.__context__ is None and exc.__cause__ is None
    where = {".".join(map(str, e["loc"])) for e in exc.errors()}
    assert where == {
        "tenant_id",
        "budget.steps_remaining",
        "fingerprints.*",
        "final_answer.citations",
    }
    assert all(e["input"] is None for e in exc.errors())


# -- over both bindings: fencepost's graph, and create_agent + FencepostMiddleware -------------


@pytest.mark.parametrize("denial", ["end_run", "observe"])
def test_a_rule_given_as_a_sentence_is_unnamed_rule_and_its_text_only_logged_in_either_binding(
    binding: type[bd.Binding], denial: str, caplog: pytest.LogCaptureFixture
) -> None:
    @lc_tool
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    b = binding(
        bd.then_answer(bd.call("lookup_order", {"order_id": "A-1001"}, 1)),
        steps=4,
        tools=4,
        denial=denial,
        extra_tools=[(lookup_order, {**bd.READ, "semantic_validator": _order_rule})],
    )
    caplog.set_level("DEBUG", logger="fencepost")
    out = b.start(mw.ctx())
    assert out.bodies == [] and b.reservation("call-0001") is None
    if denial == "observe":
        assert out.termination == fp.TerminationReason.COMPLETED.value
        (shown,) = [m for m in out.received[-1] if isinstance(m, ToolMessage)]
        assert "invalid_argument" in str(shown.content)
    else:
        assert (out.termination, out.error_code) == (
            fp.TerminationReason.INVALID_PROPOSAL.value,
            "semantic_violation",
        )
    assert MARK not in repr(out.received)
    assert MARK not in repr(b.graph.get_state(b.config).values)
    assert_only_in_one_traceback(caplog.records, MARK, "fencepost.gate")
