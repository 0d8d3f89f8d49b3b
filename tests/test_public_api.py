"""The public API is what ``fencepost`` exports: pinned here, and it is exactly what the README
and the docs use — every ``fp.<Name>`` they write exists, and every exported name is written
there (as ``fp.<Name>`` or in the reference)."""

from __future__ import annotations

import re
from pathlib import Path

import fencepost as fp

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {
    # building an agent
    "create_agent",
    "FencepostMiddleware",
    "build_agent_graph",
    "LoopSettings",
    "GraphConfigError",
    "ScriptedDecisionModel",
    "ChatModelDecider",
    # tools
    "tool",
    "tool_spec",
    "ToolSpec",
    "ToolRegistry",
    "ToolContext",
    "Injected",
    "Effect",
    "Accepted",
    "Completed",
    "ToolError",
    "ErrorCode",
    "child_run_tool",
    "ChildRunResult",
    # running
    "start",
    "run_output",
    "RunContext",
    "Principal",
    # approval policies
    "ApproverInput",
    "ApproverDecision",
    "ApprovalQuestion",
    "Remember",
    "ApprovalScope",
    # provenance
    "Trust",
    "ValueSource",
    "Provenance",
    "Deadline",
    "RuntimeBudget",
    "ModelPrice",
    "PriceTable",
    "PRICES",
    "conversation_account",
    "aconversation_account",
    "ConversationBudgetDenied",
    "cancel",
    "acancel",
    "CancelRefused",
    "NestedRunUnreachable",
    "LayoutRefused",
    "RunInProgress",
    "NoRun",
    "CommandRefused",
    # decisions
    "ToolProposal",
    "ToolBatch",
    "FinalProposal",
    "AnswerPayload",
    "AbstainProposal",
    "InvalidProposal",
    "DecisionInput",
    "Decided",
    # what a run leaves
    "AgentState",
    "TerminationReason",
    "StopReport",
    "StopKind",
    "Receipt",
    "ReceiptStatus",
    "current_receipts",
    "StepManifest",
    # budgets, ledgers, checkpoints
    "Ledger",
    "InMemoryLedger",
    "SqliteLedger",
    "PostgresLedger",
    "Window",
    "open_checkpointer",
    "aopen_checkpointer",
}


def _written() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


def _used() -> set[str]:
    text = _written()
    return set(re.findall(r"\bfp\.([A-Za-z_]\w*)", text)) | set(
        re.findall(r"^::: fencepost\.([A-Za-z_]\w*)", text, flags=re.M)
    )


def test_the_root_exports_exactly_the_public_api() -> None:
    assert set(fp.__all__) == PUBLIC
    assert len(fp.__all__) == len(set(fp.__all__))


def test_every_exported_name_resolves() -> None:
    for name in fp.__all__:
        assert getattr(fp, name) is not None, name


def test_every_fp_name_the_readme_and_docs_write_exists() -> None:
    missing = sorted(name for name in _used() if not hasattr(fp, name))
    assert missing == []


def test_the_root_exports_nothing_the_readme_and_docs_do_not_use() -> None:
    assert sorted(PUBLIC - _used()) == []


def test_the_readme_uses_the_root_not_submodules_for_what_users_write() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "fp.policy." not in readme and "from fencepost.adapters" not in readme
