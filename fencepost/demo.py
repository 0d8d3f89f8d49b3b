"""The demo: an on-call assistant's tools, scripted models, and one scenario per way a run ends.

Everything here is offline and deterministic. The tools read canned data; the models are scripted
(or, for the incident investigation, a small rule-following model that picks its next tool from
what the first log said). ``fencepost demo`` runs :data:`SCENARIOS` through the real graph against
a real checkpointer; ``langgraph.json`` serves :data:`graph` to ``langgraph dev``.

Three scenarios use tools beyond the on-call registry (:func:`upload_registry`): a postmortem
upload that is only *accepted* (task-17) until a status check shows the finished document
(document-42, version 3, its access path), and an investigation delegated to a sub-agent
(:func:`child_run_registry`) whose run spends the parent's budget.

Example::

    from langgraph.checkpoint.memory import InMemorySaver
    from fencepost.demo import SCENARIOS, run_scenario

    result = run_scenario(SCENARIOS[0], InMemorySaver())
    result.termination  # TerminationReason.COMPLETED
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field

from fencepost.adapters.agent_graph import build_agent_graph
from fencepost.adapters.child_run import child_run_tool
from fencepost.adapters.scripted import ScriptedDecisionModel
from fencepost.graph import RunContext, cancel, run_output, start
from fencepost.policy import (
    AbstainProposal,
    Accepted,
    AgentState,
    AnswerPayload,
    Completed,
    Deadline,
    Decision,
    DecisionInput,
    DecisionModel,
    Effect,
    ErrorCode,
    FakeClock,
    FinalProposal,
    InMemoryLedger,
    Ledger,
    Observation,
    Principal,
    RuntimeBudget,
    TerminationReason,
    ToolContext,
    ToolError,
    ToolProposal,
    ToolRegistry,
    ToolSemanticError,
    ToolSpec,
)
from fencepost.policy.approval import ApprovalMode
from fencepost.policy.tool_decorator import tool

__all__ = [
    "DEMO_CAPABILITIES",
    "DEMO_TENANT",
    "SCENARIOS",
    "DemoRun",
    "IncidentTriageModel",
    "Scenario",
    "build_demo_graph",
    "child_run_registry",
    "demo_context",
    "demo_registry",
    "graph",
    "run_demo",
    "run_scenario",
    "upload_registry",
]

DEMO_TENANT = "acme"
DEMO_PRINCIPAL = "oncall-ana"
DEMO_CAPABILITIES = frozenset(
    {
        "logs:read",
        "deploys:read",
        "db:read",
        "orders:read",
        "status:read",
        "ops:write",
        "docs:write",
        "agents:delegate",
    }
)
"""What the demo's on-call engineer may do. ``pii:export`` is deliberately missing."""

# A fixed "today" for the refund rule, so the demo gives the same answer every day it is run.
REFUND_AS_OF = date(2026, 11, 29)
REFUND_WINDOW_DAYS = 30

Service = Literal["checkout", "orders-api", "payments"]


# --- canned data ----------------------------------------------------------------------------------

_LOGS: dict[str, dict[str, Any]] = {
    "checkout": {
        "signature": "exception_after_release",
        "first_seen": "14:02Z",
        "lines": [
            "14:02:11Z ERROR checkout PriceFormatter: NullPointerException (release 2026.11.3)",
            "14:02:12Z ERROR checkout POST /checkout 500 (x412 in 5 min)",
        ],
    },
    "orders-api": {
        "signature": "db_pool_exhausted",
        "first_seen": "09:40Z",
        "lines": [
            "09:40:03Z WARN orders-api timeout acquiring connection (pool 20/20, 143 waiting)",
            "09:40:05Z ERROR orders-api GET /orders/{id} 504 after 30s",
        ],
    },
    "payments": {"signature": "quiet", "first_seen": None, "lines": []},
}

_DEPLOYS: dict[str, list[dict[str, str]]] = {
    "checkout": [
        {"version": "2026.11.3", "at": "14:00Z", "change": "price formatting refactor"},
        {"version": "2026.11.2", "at": "yesterday 10:15Z", "change": "copy fixes"},
    ],
    "orders-api": [{"version": "2026.11.1", "at": "3 days ago", "change": "logging"}],
    "payments": [],
}

_DB_METRICS: dict[str, dict[str, Any]] = {
    "orders-db": {"connections": {"max": 20, "in_use_p95": 20, "since": "09:38Z"}},
    "checkout-db": {"connections": {"max": 50, "in_use_p95": 12, "since": None}},
}

# order id -> (tenant, purchase date, shipping status)
_ORDERS: dict[str, tuple[str, date, str]] = {
    "A-1042": (DEMO_TENANT, date(2026, 11, 12), "delivered"),
    "A-0977": (DEMO_TENANT, date(2026, 9, 30), "delivered"),
    "A-1101": (DEMO_TENANT, date(2026, 11, 20), "in_transit"),
    "Z-5001": ("globex", date(2026, 11, 25), "delivered"),
}


# --- tools: each signature is its strict args model (see fencepost.policy.tool_decorator) ------


@tool(effect=Effect.READ, capability="logs:read", timeout_seconds=5)
def search_logs(
    service: Service, window_minutes: Annotated[int, Field(ge=5, le=240)] = 60
) -> dict[str, Any]:
    """Search a service's error logs for the last N minutes."""
    found = _LOGS[service]
    return {"service": service, "window_minutes": window_minutes, **found}


@tool(effect=Effect.READ, capability="deploys:read", timeout_seconds=5)
def deployment_history(
    service: Service, limit: Annotated[int, Field(ge=1, le=20)] = 3
) -> dict[str, Any]:
    """Recent deployments of a service, newest first."""
    return {"service": service, "deploys": _DEPLOYS[service][:limit]}


@tool(effect=Effect.READ, capability="db:read", timeout_seconds=5)
def db_metrics(
    cluster: Literal["orders-db", "checkout-db"],
    metric: Literal["connections", "p99_latency_ms", "cpu"] = "connections",
) -> dict[str, Any]:
    """A database cluster metric over the last hour."""
    series = _DB_METRICS[cluster].get(metric)
    if series is None:
        raise ToolError(ErrorCode.NOT_FOUND)
    return {"cluster": cluster, "metric": metric, **series}


def refund_rule(purchased: date, shipping: str, *, as_of: date = REFUND_AS_OF) -> dict[str, Any]:
    """The refund rule, computed by code (the model only explains it).

    Refundable within 30 days of purchase, once delivered or before shipping; never in transit.

    >>> refund_rule(date(2026, 11, 12), "delivered")["eligible"]
    True
    """
    age = (as_of - purchased).days
    if shipping == "in_transit":
        return {"eligible": False, "rule": "not_while_in_transit", "days_since_purchase": age}
    if age > REFUND_WINDOW_DAYS:
        return {"eligible": False, "rule": "window_30_days_expired", "days_since_purchase": age}
    return {"eligible": True, "rule": "within_30_days", "days_since_purchase": age}


def _order_belongs_to_tenant(args: Any, state: AgentState) -> None:
    # Valid-looking arguments can still point at another tenant's order: a semantic rule.
    order = _ORDERS.get(args.order_id)
    if order is None or order[0] != state.tenant_id:
        raise ToolSemanticError("order_of_another_tenant")


@tool(
    effect=Effect.READ,
    capability="orders:read",
    timeout_seconds=5,
    semantic_validator=_order_belongs_to_tenant,
)
def refund_eligibility(order_id: Annotated[str, Field(pattern=r"^[A-Z]-\d{4}$")]) -> dict[str, Any]:
    """Whether an order can be refunded, computed by the refund rule."""
    _, purchased, shipping = _ORDERS[order_id]
    return {"order_id": order_id, "shipping": shipping, **refund_rule(purchased, shipping)}


class UpstreamUnavailable(ConnectionError):
    """What the status-page client raises; its message holds text that must never leak."""


@tool(effect=Effect.READ, capability="status:read", timeout_seconds=5)
def status_page(provider: Literal["cardpay", "shipfast"]) -> dict[str, Any]:
    """A third-party provider's status page."""
    # The message carries a fake secret on purpose: the run must only ever show "unavailable".
    raise UpstreamUnavailable(f"GET https://status.{provider}.example 503 token=sk-demo-7f3a")


@tool(effect=Effect.WRITE, capability="ops:write", timeout_seconds=10)
def restart_service(
    service: Service,
    reason: Annotated[str, Field(min_length=3, max_length=200)],
    ctx: ToolContext,
) -> dict[str, Any]:
    """Restart a service's pods (a write: needs a human's approval)."""
    return {"service": service, "restarted": True, "idempotency_key": ctx.idempotency_key}


@tool(effect=Effect.READ, capability="pii:export", timeout_seconds=10)
def export_customer_emails(segment: Literal["all", "churned", "vip"]) -> dict[str, Any]:
    """Export customer e-mail addresses for a segment."""
    return {"segment": segment, "rows": 0}  # never runs in the demo: the principal lacks pii:export


def demo_registry() -> ToolRegistry:
    """The demo's allowlist: six reads, one write that needs approval, one forbidden export."""
    return ToolRegistry(
        [
            search_logs,
            deployment_history,
            db_metrics,
            refund_eligibility,
            status_page,
            restart_service,
            export_customer_emails,
        ]
    )


# --- an upload that is only accepted, and the status check that shows it done --------------------

UPLOAD_TASK = "task-17"
UPLOADED_DOCUMENT = {
    "document_id": "document-42",
    "version": "3",
    "access_path": "/docs/postmortems/document-42/v3",
}
"""Where the upload's document ends up: what the status check returns as completion evidence."""


@tool(effect=Effect.WRITE, capability="docs:write", timeout_seconds=10)
def upload_postmortem(
    incident: Annotated[str, Field(min_length=3, max_length=120)], ctx: ToolContext
) -> Accepted:
    """Upload an incident's postmortem to the document store; returns a task id."""
    # The store only queues the upload: a task id is a receipt for work accepted, not work done.
    return Accepted(task_id=UPLOAD_TASK, detail={"queued_as": ctx.idempotency_key})


class UploadStatusArgs(BaseModel):
    """The arguments of ``upload_status``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    task_id: Annotated[str, Field(pattern=r"^task-\d{1,9}$")]


def _upload_status(args: UploadStatusArgs, ctx: ToolContext) -> Completed | dict[str, str]:
    if args.task_id != UPLOAD_TASK:
        raise ToolError(ErrorCode.NOT_FOUND)
    return Completed(task_id=args.task_id, evidence=dict(UPLOADED_DOCUMENT))


upload_status = ToolSpec(
    name="upload_status",
    description="The status of an upload task; once done, the document id, version and path.",
    args_model=UploadStatusArgs,
    effect=Effect.READ,
    capability="docs:write",
    timeout_seconds=5,
    execute=_upload_status,
    # Only a result carrying all three completes the upload's receipt ("done!" alone does not).
    completion_evidence=("document_id", "version", "access_path"),
    evidence_for=("upload_postmortem",),
    poll_interval_seconds=60,
)


def upload_registry(ledger: Ledger | None = None) -> ToolRegistry:
    """The demo registry plus the postmortem upload and its status check (``ledger`` is not needed:
    it is taken so every scenario's registry is built the same way)."""
    return ToolRegistry([*demo_registry(), upload_postmortem, upload_status])


# --- a sub-agent as a tool ----------------------------------------------------------------------

CHILD_BUDGET = RuntimeBudget(steps_remaining=4, tool_calls_remaining=3)
"""What one delegated investigation may spend, at most: and never more than the parent has left."""
CHILD_CAPABILITIES = frozenset({"logs:read", "deploys:read", "db:read"})
"""What the sub-agent may do: read-only, whatever its caller holds."""


def child_run_registry(ledger: Ledger | None = None) -> ToolRegistry:
    """The demo registry plus ``investigate``: a sub-agent (the incident model, read-only tools)
    run as a child of the calling run, on ``ledger`` — the parent graph's ledger, so the child's
    account is opened under the parent run's account."""
    shared = ledger if ledger is not None else InMemoryLedger()
    reads = ToolRegistry([search_logs, deployment_history, db_metrics])
    # The child's own checkpointer: its thread (derived from the parent run and the call id) is
    # resumed by a retried call instead of starting a second child.
    child = build_agent_graph(reads, IncidentTriageModel(), ledger=shared).compile(
        checkpointer=InMemorySaver()
    )
    investigate = child_run_tool(
        child,
        name="investigate",
        description="Hand an incident question to an investigation sub-agent (read-only tools).",
        budget=CHILD_BUDGET,
        capability="agents:delegate",
        capabilities=CHILD_CAPABILITIES,
        ledger=shared,
    )
    return ToolRegistry([*demo_registry(), investigate])


def demo_context(
    *,
    deadline_seconds: float = 30,
    clock: FakeClock | None = None,
    capabilities: frozenset[str] = DEMO_CAPABILITIES,
) -> RunContext:
    """The trusted context the demo runs with: tenant ``acme``, principal ``oncall-ana``."""
    return RunContext(
        tenant_id=DEMO_TENANT,
        principal=Principal(id=DEMO_PRINCIPAL, capabilities=capabilities),
        deadline=Deadline.after(deadline_seconds, clock=clock),
    )


# --- the incident investigation model ----------------------------------------------------------


def _results(inp: DecisionInput, tool: str) -> list[Observation]:
    return [o for o in inp.observations if o.tool_name == tool and o.is_evidence]


def _result(obs: Observation) -> dict[str, Any]:
    return obs.result if isinstance(obs.result, dict) else {}


_ORDER_ID = re.compile(r"\b[A-Z]-\d{4}\b")


class IncidentTriageModel:
    """A small deterministic model that investigates like an on-call engineer would.

    It reads the first log, then chooses: an exception right after a release sends it to the
    deployment history; a connection-pool timeout sends it to the database metrics. It answers
    with citations of the observations it used. A refund question goes to the refund rule tool;
    a restart request proposes the restart (a write, so the run pauses for approval).
    Stateless (everything it knows is in the :class:`DecisionInput`), so one instance can serve
    any number of runs — which is what a LangGraph Server deployment needs.
    """

    async def decide(self, input: DecisionInput, *, deadline: Deadline) -> Decision:
        """The next decision, from the question and what has been observed so far."""
        call_id = f"call-{input.step:04d}"
        question = input.question.lower()
        if "refund" in question:
            return self._refund(input, call_id)
        service: Service | None = (
            "checkout"
            if "checkout" in question
            else "orders-api"
            if "order" in question
            else "payments"
            if "payment" in question
            else None
        )
        if service is None:
            return AbstainProposal(reason="needs_clarification")
        if "restart" in question:
            return self._restart(input, call_id, service)
        logs = _results(input, "search_logs")
        if not logs:
            return ToolProposal(
                call_id=call_id, tool_name="search_logs", arguments={"service": service}
            )
        first = _result(logs[0])
        signature = first.get("signature")
        if signature == "exception_after_release":
            deploys = _results(input, "deployment_history")
            if not deploys:
                return ToolProposal(
                    call_id=call_id, tool_name="deployment_history", arguments={"service": service}
                )
            latest = (_result(deploys[0]).get("deploys") or [{}])[0]
            text = (
                f"{service} has returned 500s since {first.get('first_seen')}, two minutes after "
                f"release {latest.get('version')} ({latest.get('change')}) went out at "
                f"{latest.get('at')}; the errors are a NullPointerException in the changed "
                "PriceFormatter. Roll back the release."
            )
            return FinalProposal(
                answer=AnswerPayload(text=text, citations=(logs[0].call_id, deploys[0].call_id))
            )
        if signature == "db_pool_exhausted":
            metrics = _results(input, "db_metrics")
            if not metrics:
                return ToolProposal(
                    call_id=call_id,
                    tool_name="db_metrics",
                    arguments={"cluster": "orders-db", "metric": "connections"},
                )
            m = _result(metrics[0])
            text = (
                f"{service} is slow because orders-db's connection pool is exhausted "
                f"({m.get('in_use_p95')}/{m.get('max')} in use since {m.get('since')}); "
                "requests wait for a connection and time out. No deploy is involved."
            )
            return FinalProposal(
                answer=AnswerPayload(text=text, citations=(logs[0].call_id, metrics[0].call_id))
            )
        return AbstainProposal(reason="insufficient_evidence")

    def _restart(self, input: DecisionInput, call_id: str, service: Service) -> Decision:
        # A write: the graph pauses for a human's approval before it runs (approval="interrupt").
        tried = [o for o in input.observations if o.tool_name == "restart_service"]
        if not tried:
            return ToolProposal(
                call_id=call_id,
                tool_name="restart_service",
                arguments={"service": service, "reason": "on-call asked for a restart"},
            )
        done = [o for o in tried if o.is_evidence]
        if not done:
            return AbstainProposal(reason="insufficient_evidence")
        return FinalProposal(
            answer=AnswerPayload(text=f"{service} was restarted.", citations=(done[0].call_id,))
        )

    def _refund(self, input: DecisionInput, call_id: str) -> Decision:
        match = _ORDER_ID.search(input.question)
        if match is None:
            return AbstainProposal(reason="needs_clarification")
        rules = _results(input, "refund_eligibility")
        if not rules:
            return ToolProposal(
                call_id=call_id,
                tool_name="refund_eligibility",
                arguments={"order_id": match.group(0)},
            )
        r = _result(rules[0])
        verdict = "can" if r.get("eligible") else "cannot"
        text = (
            f"Order {r.get('order_id')} {verdict} be refunded: rule {r.get('rule')} "
            f"({r.get('days_since_purchase')} days since purchase, shipping {r.get('shipping')})."
        )
        return FinalProposal(answer=AnswerPayload(text=text, citations=(rules[0].call_id,)))


# --- scenarios ----------------------------------------------------------------------------------


def _call(n: int, tool: str, **arguments: Any) -> ToolProposal:
    return ToolProposal(call_id=f"call-{n:04d}", tool_name=tool, arguments=arguments)


def _final_citing_all(text: str) -> Callable[[DecisionInput], FinalProposal]:
    def decide(inp: DecisionInput) -> FinalProposal:
        cited = tuple(o.call_id for o in inp.observations if o.is_evidence)
        return FinalProposal(answer=AnswerPayload(text=text, citations=cited))

    return decide


class _ProviderOverloaded(Exception):
    """A model provider's 503; the message holds text that must never reach the run."""

    status_code = 503


def _slow_model_step(clock: FakeClock, seconds: float, then: ToolProposal) -> Callable[..., Any]:
    # The model "thinks" for longer than the run has left; the fake clock makes that instant.
    def decide(inp: DecisionInput) -> ToolProposal:
        clock.advance(seconds)
        return then

    return decide


def _status_of_pending(n: int) -> Callable[[DecisionInput], ToolProposal | AbstainProposal]:
    # The model is shown, as data, the tasks it started that are not done: it checks the first.
    def decide(inp: DecisionInput) -> ToolProposal | AbstainProposal:
        if not inp.pending_tasks:
            return AbstainProposal(reason="insufficient_evidence")
        return _call(n, "upload_status", task_id=inp.pending_tasks[0])

    return decide


def _answer_from_upload_status(inp: DecisionInput) -> FinalProposal | AbstainProposal:
    for obs in reversed(_results(inp, "upload_status")):
        evidence = _result(obs).get("evidence") or {}
        if evidence.get("document_id"):
            text = (
                f"The postmortem is uploaded: {evidence['document_id']}, version "
                f"{evidence.get('version')}, at {evidence.get('access_path')}."
            )
            return FinalProposal(answer=AnswerPayload(text=text, citations=(obs.call_id,)))
    return AbstainProposal(reason="insufficient_evidence")


def _answer_from_child(inp: DecisionInput) -> FinalProposal | AbstainProposal:
    # The child's result is typed data (a ChildRunResult as JSON), not the child's transcript.
    for obs in reversed(_results(inp, "investigate")):
        child = _result(obs)
        if child.get("termination") == TerminationReason.COMPLETED.value:
            text = (
                f"The investigation sub-agent (run {child.get('run_id')}, "
                f"{len(child.get('receipts') or ())} calls) found: {child.get('final_answer_text')}"
            )
            return FinalProposal(answer=AnswerPayload(text=text, citations=(obs.call_id,)))
    return AbstainProposal(reason="insufficient_evidence")


ModelFactory = Callable[[FakeClock], DecisionModel]
RegistryFactory = Callable[[Ledger], ToolRegistry]
Resume = Literal["approve", "reject", "cancel"]


def _on_call_registry(ledger: Ledger) -> ToolRegistry:
    return demo_registry()


@dataclass(frozen=True)
class Scenario:
    """One demo run: the question, the model that answers it, and how it is expected to end."""

    name: str
    """Short id shown in the table and stored in the checkpoint metadata as ``scenario``."""
    title: str
    """What the scenario shows, in a line."""
    question: str
    expected: TerminationReason
    model: ModelFactory
    """Builds a fresh decision model (scripted models are single-use) from the run's clock."""
    steps: int = 6
    tool_calls: int = 4
    approval: ApprovalMode = "terminate"
    resume: Resume | None = None
    """How a human answers when the run pauses for approval (``approval="interrupt"`` only)."""
    fake_clock: bool = False
    """Run on a :class:`FakeClock` the model can move (deadline scenarios)."""
    registry: RegistryFactory = _on_call_registry
    """Builds the scenario's tools on the run's ledger (a child run's tool needs that ledger)."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="incident-release",
        title="5xx after a release: first log -> deployment history -> cited answer",
        question="Why is checkout returning 500s since 14:00?",
        expected=TerminationReason.COMPLETED,
        model=lambda clock: IncidentTriageModel(),
    ),
    Scenario(
        name="incident-database",
        title="slow API: first log -> DB metrics -> cited answer",
        question="Why are order lookups timing out?",
        expected=TerminationReason.COMPLETED,
        model=lambda clock: IncidentTriageModel(),
    ),
    Scenario(
        name="refund-rule",
        title="refund question answered by the rule tool, explained by the model",
        question="Can order A-1042 still be refunded?",
        expected=TerminationReason.COMPLETED,
        model=lambda clock: IncidentTriageModel(),
    ),
    Scenario(
        name="needs-clarification",
        title="too vague to act on: the model abstains",
        question="Is it broken again?",
        expected=TerminationReason.NEEDS_CLARIFICATION,
        model=lambda clock: IncidentTriageModel(),
    ),
    Scenario(
        name="tool-failure",
        title="a tool fails (safe code 'unavailable', no secret), the model abstains",
        question="Is the card provider having an outage?",
        expected=TerminationReason.INSUFFICIENT_EVIDENCE,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "status_page", provider="cardpay"),
                AbstainProposal(reason="insufficient_evidence"),
            ]
        ),
    ),
    Scenario(
        name="model-failure",
        title="the model provider keeps failing: retried twice, each retry a step, then 'failed'",
        question="Why is checkout returning 500s?",
        expected=TerminationReason.FAILED,
        model=lambda clock: ScriptedDecisionModel(
            [_ProviderOverloaded("503 from provider; api_key=sk-demo-7f3a") for _ in range(3)]
        ),
    ),
    Scenario(
        name="step-budget",
        title="keeps widening the log window: out of model steps",
        question="Any errors in payments?",
        expected=TerminationReason.STEP_BUDGET_EXHAUSTED,
        steps=3,
        tool_calls=8,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(n, "search_logs", service="payments", window_minutes=minutes)
                for n, minutes in enumerate((15, 30, 60, 120, 240), start=1)
            ]
        ),
    ),
    Scenario(
        name="tool-budget",
        title="three different lookups on a budget of two tool calls",
        question="What changed in checkout, orders-api and payments?",
        expected=TerminationReason.TOOL_BUDGET_EXHAUSTED,
        tool_calls=2,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "deployment_history", service="checkout"),
                _call(2, "deployment_history", service="orders-api"),
                _call(3, "deployment_history", service="payments"),
            ]
        ),
    ),
    Scenario(
        name="deadline",
        title="the model takes 45 s of a 30 s deadline: the proposed call never runs",
        question="Why is checkout returning 500s?",
        expected=TerminationReason.DEADLINE_EXCEEDED,
        fake_clock=True,
        model=lambda clock: ScriptedDecisionModel(
            [_slow_model_step(clock, 45, _call(1, "search_logs", service="checkout"))]
        ),
    ),
    Scenario(
        name="unknown-tool",
        title="the model invents a tool, is told, invents it again: never executed",
        question="Clean up the noisy checkout logs.",
        expected=TerminationReason.INVALID_PROPOSAL,
        model=lambda clock: ScriptedDecisionModel(
            [
                # The first is given back as data (repair_attempts=1, the default); the
                # second ends the run.
                _call(1, "delete_all_logs", service="checkout"),
                _call(2, "delete_all_logs", service="checkout"),
            ]
        ),
    ),
    Scenario(
        name="repeated-call",
        title="the same search three times: stopped as no progress",
        question="Any errors in payments?",
        expected=TerminationReason.NO_PROGRESS,
        model=lambda clock: ScriptedDecisionModel(
            [_call(n, "search_logs", service="payments") for n in range(1, 5)]
        ),
    ),
    Scenario(
        name="capability-denied",
        title="asks for a PII export the principal may not run",
        question="Who are the customers affected by the checkout outage?",
        expected=TerminationReason.POLICY_DENIED,
        model=lambda clock: ScriptedDecisionModel(
            [_call(1, "export_customer_emails", segment="all")]
        ),
    ),
    Scenario(
        name="write-needs-approval",
        title="a restart proposed with no approver configured: ends approval_required",
        question="orders-api is stuck, fix it.",
        expected=TerminationReason.APPROVAL_REQUIRED,
        model=lambda clock: ScriptedDecisionModel(
            [_call(1, "restart_service", service="orders-api", reason="pool exhausted")]
        ),
    ),
    Scenario(
        name="write-approved",
        title="a restart pauses at the interrupt, a human approves, it runs once",
        question="orders-api is stuck, restart it.",
        expected=TerminationReason.COMPLETED,
        approval="interrupt",
        resume="approve",
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "search_logs", service="orders-api"),
                _call(2, "restart_service", service="orders-api", reason="pool exhausted"),
                _final_citing_all("orders-api was restarted after its connection pool filled up."),
            ]
        ),
    ),
    Scenario(
        name="write-cancelled",
        title="a restart pauses for approval; the operator cancels the run instead",
        question="Restart checkout.",
        expected=TerminationReason.CANCELLED,
        approval="interrupt",
        resume="cancel",
        model=lambda clock: ScriptedDecisionModel(
            [_call(1, "restart_service", service="checkout", reason="operator asked")]
        ),
    ),
    Scenario(
        name="upload-verified",
        title=(
            "upload returns task-17 (accepted, not done); 'uploaded successfully' is refused; "
            "status finds document-42, version 3 and its access path: completed"
        ),
        question="Upload the postmortem of the checkout incident.",
        expected=TerminationReason.COMPLETED,
        approval="interrupt",
        resume="approve",
        registry=upload_registry,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "upload_postmortem", incident="checkout 500s after 2026.11.3"),
                # A success sentence is not evidence: refused while task-17 is pending.
                _final_citing_all("The postmortem was uploaded successfully."),
                _status_of_pending(3),
                _answer_from_upload_status,
            ]
        ),
    ),
    Scenario(
        name="child-run",
        title=(
            "the investigation is delegated to a sub-agent whose steps and calls are charged to "
            "this run's budget; its result comes back typed"
        ),
        question="Why is checkout returning 500s since 14:00? Delegate the digging.",
        expected=TerminationReason.COMPLETED,
        steps=8,
        registry=child_run_registry,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "investigate", question="Why is checkout returning 500s since 14:00?"),
                _answer_from_child,
            ]
        ),
    ),
    Scenario(
        name="upload-budget-stop",
        title=(
            "upload accepted (task-17), a log search, then no tool call left for the status "
            "check: the report lists completed, never started and pending"
        ),
        question="Upload the checkout postmortem with the error log excerpt.",
        expected=TerminationReason.TOOL_BUDGET_EXHAUSTED,
        tool_calls=2,
        approval="interrupt",
        resume="approve",
        registry=upload_registry,
        model=lambda clock: ScriptedDecisionModel(
            [
                _call(1, "upload_postmortem", incident="checkout 500s after 2026.11.3"),
                _call(2, "search_logs", service="checkout"),
                _status_of_pending(3),
            ]
        ),
    ),
)
"""One scenario per terminal reason (and six ways to complete), among them the seed's cases: an
upload accepted then shown done, a child run, and a budget stop that leaves an upload pending."""


# --- running scenarios ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoRun:
    """The outcome of one scenario run."""

    scenario: Scenario
    run_id: str
    state: AgentState
    duration_seconds: float
    paused_for: tuple[str, ...] = ()
    """Tools the run paused for (approval), in order."""

    @property
    def termination(self) -> TerminationReason | None:
        """How the run ended (``None`` only if it is still paused)."""
        return self.state.termination

    @property
    def as_expected(self) -> bool:
        """Whether it ended the way the scenario says it should."""
        return self.state.termination is self.scenario.expected


ManifestHook = Callable[[Scenario, dict[str, Any]], None]
PauseHook = Callable[[Scenario, list[dict[str, Any]], str], None]


@dataclass
class _Hooks:
    on_manifest: ManifestHook | None = None
    on_pause: PauseHook | None = None
    paused_for: list[str] = field(default_factory=list)


def build_demo_graph(
    model: DecisionModel | None = None,
    *,
    approval: ApprovalMode = "interrupt",
    clock: FakeClock | None = None,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    registry: ToolRegistry | None = None,
    ledger: Ledger | None = None,
) -> Any:
    """The demo registry (or ``registry``) and a model, compiled (with ``checkpointer``, if
    given). ``ledger`` is the budget truth; pass the one a child run's tool was built on."""
    return build_agent_graph(
        registry if registry is not None else demo_registry(),
        model or IncidentTriageModel(),
        approval=approval,
        clock=clock,
        ledger=ledger,
    ).compile(checkpointer=checkpointer)


def _stream(
    compiled: Any,
    payload: Any,
    config: RunnableConfig,
    ctx: RunContext,
    scenario: Scenario,
    hooks: _Hooks,
) -> None:
    for chunk in compiled.stream(payload, config, context=ctx, stream_mode="custom"):
        if isinstance(chunk, dict) and chunk.get("fencepost") == "manifest" and hooks.on_manifest:
            hooks.on_manifest(scenario, chunk)


def run_scenario(
    scenario: Scenario,
    checkpointer: BaseCheckpointSaver[Any],
    *,
    on_manifest: ManifestHook | None = None,
    on_pause: PauseHook | None = None,
    run_id: str | None = None,
) -> DemoRun:
    """Run one scenario through the real graph on ``checkpointer``; its thread id is the run id.

    ``on_manifest`` sees each step manifest as it streams (LangGraph's ``custom`` stream mode);
    ``on_pause`` sees the calls a run paused for and the answer the demo is about to give.
    """
    clock = FakeClock() if scenario.fake_clock else None
    ledger = InMemoryLedger()
    compiled = build_demo_graph(
        scenario.model(clock or FakeClock()),
        approval=scenario.approval,
        clock=clock,
        checkpointer=checkpointer,
        registry=scenario.registry(ledger),
        ledger=ledger,
    )
    run_id = run_id or f"run-{uuid.uuid4().hex[:12]}"
    config: RunnableConfig = {
        "configurable": {"thread_id": run_id},
        "metadata": {"scenario": scenario.name},
    }
    ctx = demo_context(clock=clock)
    hooks = _Hooks(on_manifest=on_manifest, on_pause=on_pause)
    budget = RuntimeBudget(steps_remaining=scenario.steps, tool_calls_remaining=scenario.tool_calls)
    began = time.perf_counter()
    payload: Any = start(scenario.question, budget, run_id=run_id)
    # Bounded: each resume answers one pause, and a run has at most `steps` pauses.
    for _ in range(scenario.steps + 1):
        _stream(compiled, payload, config, ctx, scenario, hooks)
        snapshot = compiled.get_state(config)
        if not snapshot.interrupts:
            break
        calls = [c for i in snapshot.interrupts for c in (i.value or {}).get("calls", [])]
        hooks.paused_for.extend(str(c.get("tool_name")) for c in calls)
        answer = scenario.resume or "reject"
        if on_pause is not None:
            on_pause(scenario, calls, answer)
        if answer == "cancel":
            cancel(compiled, config, context=ctx)
            break
        payload = Command(resume=answer)
    state = run_output(compiled.get_state(config).values)
    return DemoRun(
        scenario=scenario,
        run_id=run_id,
        state=state,
        duration_seconds=time.perf_counter() - began,
        paused_for=tuple(hooks.paused_for),
    )


def run_demo(
    checkpointer: BaseCheckpointSaver[Any],
    scenarios: Sequence[Scenario] = SCENARIOS,
    *,
    on_manifest: ManifestHook | None = None,
    on_pause: PauseHook | None = None,
    on_done: Callable[[DemoRun], None] | None = None,
) -> list[DemoRun]:
    """Run every scenario in order on one checkpointer."""
    runs = []
    for scenario in scenarios:
        run = run_scenario(scenario, checkpointer, on_manifest=on_manifest, on_pause=on_pause)
        if on_done is not None:
            on_done(run)
        runs.append(run)
    return runs


graph = build_demo_graph()
"""The demo graph for ``langgraph dev`` / LangGraph Server (see ``langgraph.json``).

Compiled without a checkpointer: the server brings its own. Pass the trusted context as the run's
``context``, e.g. ``{"tenant_id": "acme", "principal": {"id": "oncall-ana", "capabilities":
["logs:read", "deploys:read", "db:read"]}}``; without one every run ends ``policy_denied``.
"""
