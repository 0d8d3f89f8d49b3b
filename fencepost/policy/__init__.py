"""The application contract. Imports pydantic and the standard library only — never LangGraph."""

from fencepost.policy.approval import ApprovalMode
from fencepost.policy.approver import Approver, ApproverDecision, ApproverInput
from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import (
    BudgetAxis,
    BudgetExhausted,
    RuntimeBudget,
    budget_view,
    reason_for_axis,
)
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import (
    Clock,
    Deadline,
    DeadlineExceeded,
    FakeClock,
    SystemClock,
    stage_deadline,
)
from fencepost.policy.decision import (
    AbstainProposal,
    Decision,
    DecisionKind,
    FinalProposal,
    InvalidProposal,
    ToolBatch,
    ToolProposal,
    parse_decision,
)
from fencepost.policy.decision_model import Decided, DecisionInput, DecisionModel
from fencepost.policy.error_codes import ErrorCode, ToolError, error_code_for, is_retryable
from fencepost.policy.events import (
    RuntimeEvent,
    ToolFailed,
    ToolSucceeded,
    UnserializableResult,
    reduce_tool_event,
    reduce_tool_events,
    serialize_tool_result,
)
from fencepost.policy.fingerprint import canonical_json, fits_checkpoint, proposal_fingerprint
from fencepost.policy.gates import (
    DEFAULT_REPEAT_LIMIT,
    HumanApprovalRequired,
    NoProgressDetected,
    ToolPolicyDenied,
    ToolSemanticError,
    authorize,
    check_progress,
    check_registered,
    check_schema,
    check_semantics,
    gate_proposal,
)
from fencepost.policy.ledger import (
    AccountClosed,
    Attempt,
    Balance,
    InMemoryLedger,
    InvalidLedgerKey,
    Ledger,
    LedgerConflict,
    Reservation,
    ReservationStatus,
    UnknownAccount,
    UnknownReservation,
)
from fencepost.policy.manifest import StepManifest
from fencepost.policy.observation import AnswerPayload, Observation
from fencepost.policy.outcome import CallOutcome, receipt_for
from fencepost.policy.phase import Phase, TerminationReason
from fencepost.policy.provenance import Provenance, ValueSource
from fencepost.policy.receipt import Accepted, Completed, Receipt, ReceiptStatus, current_receipts
from fencepost.policy.registry import ToolRegistry, UnknownTool
from fencepost.policy.state import AgentState, StopRequest
from fencepost.policy.stop_report import (
    ReportedCall,
    StopKind,
    StopReport,
    Waiting,
    kind_of,
    stop_report,
)
from fencepost.policy.terminate import (
    MissingCitation,
    TerminalStateError,
    UnsupportedCitation,
    terminate,
    validate_final_answer,
)
from fencepost.policy.tool import Effect, Injected, Principal, ToolContext, ToolSpec
from fencepost.policy.trust import Trust
from fencepost.policy.usage import UsageKind, UsageReport, usage_report
from fencepost.policy.verdict import Verdict, VerdictCode, seal_verdict, verdict_is_sealed
from fencepost.policy.windows import Window

# ToolSpec's callable fields name AgentState and ToolProposal; resolve them once both exist.
ToolSpec.model_rebuild(_types_namespace={"AgentState": AgentState, "ToolProposal": ToolProposal})

__all__ = [
    "DEFAULT_REPEAT_LIMIT",
    "AbstainProposal",
    "Accepted",
    "AccountClosed",
    "AgentState",
    "AnswerPayload",
    "Approver",
    "ApproverDecision",
    "ApproverInput",
    "Completed",
    "current_receipts",
    "ApprovalMode",
    "BatchEntry",
    "CallOutcome",
    "RunContext",
    "UsageKind",
    "UsageReport",
    "budget_view",
    "receipt_for",
    "usage_report",
    "Attempt",
    "Balance",
    "BudgetAxis",
    "BudgetExhausted",
    "Clock",
    "Decided",
    "Decision",
    "DecisionKind",
    "Deadline",
    "DeadlineExceeded",
    "DecisionInput",
    "DecisionModel",
    "Effect",
    "ErrorCode",
    "FakeClock",
    "FinalProposal",
    "HumanApprovalRequired",
    "InMemoryLedger",
    "Window",
    "Provenance",
    "Trust",
    "ValueSource",
    "Injected",
    "InvalidLedgerKey",
    "InvalidProposal",
    "Ledger",
    "LedgerConflict",
    "MissingCitation",
    "NoProgressDetected",
    "Observation",
    "Phase",
    "Principal",
    "Receipt",
    "ReceiptStatus",
    "ReportedCall",
    "Reservation",
    "ReservationStatus",
    "RuntimeBudget",
    "RuntimeEvent",
    "StepManifest",
    "StopKind",
    "StopReport",
    "StopRequest",
    "SystemClock",
    "TerminalStateError",
    "TerminationReason",
    "ToolBatch",
    "ToolContext",
    "ToolError",
    "ToolFailed",
    "ToolPolicyDenied",
    "ToolProposal",
    "ToolRegistry",
    "ToolSemanticError",
    "ToolSpec",
    "ToolSucceeded",
    "UnknownAccount",
    "UnknownReservation",
    "UnknownTool",
    "UnserializableResult",
    "UnsupportedCitation",
    "Verdict",
    "VerdictCode",
    "Waiting",
    "authorize",
    "canonical_json",
    "check_progress",
    "check_registered",
    "check_schema",
    "check_semantics",
    "error_code_for",
    "fits_checkpoint",
    "gate_proposal",
    "is_retryable",
    "kind_of",
    "parse_decision",
    "proposal_fingerprint",
    "reason_for_axis",
    "reduce_tool_event",
    "reduce_tool_events",
    "seal_verdict",
    "serialize_tool_result",
    "stop_report",
    "stage_deadline",
    "terminate",
    "validate_final_answer",
    "verdict_is_sealed",
]
