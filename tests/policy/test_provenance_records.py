"""Provenance in records: a verdict, receipt, manifest or report written before provenance existed
reads as "not traced"; one written with it reads back from a checkpoint's JSON lists; the
recorded form holds labels only."""

from __future__ import annotations

import json

import fencepost as fp
from fencepost.policy import Verdict
from fencepost.policy.stop_report import StopReport

OLD_VERDICT = {"call_id": "call-0001", "tool_name": "pay", "fingerprint": "f", "code": "allowed"}
OLD_RECEIPT = {"call_id": "call-0001", "tool_name": "pay", "status": "completed"}
OLD_MANIFEST = {
    "run_id": "r",
    "step": 1,
    "phase": "validate",
    "steps_remaining": 1,
    "tool_calls_remaining": 1,
    "outcome": "allowed",
}


def test_records_written_before_provenance_read_as_not_traced() -> None:
    assert Verdict.model_validate(OLD_VERDICT).provenance is None
    assert fp.Receipt.model_validate(OLD_RECEIPT).provenance is None
    assert fp.StepManifest.model_validate(OLD_MANIFEST).provenance is None
    report = StopReport.model_validate({"kind": "completed", "reason": "completed"})
    assert (report.answer_repeats_untrusted, report.answer_untrusted_calls) == (False, ())


def test_recorded_provenance_reads_back_from_json_lists() -> None:
    recorded = {"recipient": ["tool:call-0001", "user"], "amount": []}
    for kind, base in ((Verdict, OLD_VERDICT), (fp.Receipt, OLD_RECEIPT)):
        record = kind.model_validate(json.loads(json.dumps({**base, "provenance": recorded})))
        assert record.provenance == {"recipient": ("tool:call-0001", "user"), "amount": ()}
        again = kind.model_validate_json(record.model_dump_json())
        assert again == record
    manifest = fp.StepManifest.model_validate({**OLD_MANIFEST, "provenance": recorded})
    assert manifest.provenance == {"recipient": ("tool:call-0001", "user"), "amount": ()}


def test_the_recorded_form_is_labels_by_kind_and_call_id() -> None:
    source = fp.ValueSource(kind="tool", call_id="call-0003", tool="read_inbox", trusted=False)
    p = fp.Provenance(values={"recipient": ((source, fp.ValueSource(kind="user", trusted=True)),)})
    assert p.record() == {"recipient": ["tool:call-0003", "user"]}
    assert not p.only_untrusted("recipient")
