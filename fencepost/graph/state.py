"""The graph's channels: one per AgentState field, the start request, and the messages view."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langgraph.managed import RemainingSteps
from pydantic import Field

# pydantic builds the published JSON schemas from these TypedDicts, and on Python < 3.12 it
# accepts only typing_extensions' TypedDict.
from typing_extensions import TypedDict

from fencepost.graph.channels import Appended, Counted, Defaulted, Latest, Messages
from fencepost.policy import (
    AgentState,
    AnswerPayload,
    Observation,
    Phase,
    Receipt,
    RuntimeBudget,
    StepManifest,
    StopReport,
    StopRequest,
    TerminationReason,
    ToolProposal,
)
from fencepost.policy._model import Frozen
from fencepost.policy.batch import BatchEntry

DEFAULT_STEPS = 8
"""Model steps a run may take when its start request names no budget."""
DEFAULT_TOOL_CALLS = 8
"""Tool calls a run may start when its start request names no budget."""


def new_run_id() -> str:
    """A fresh run id (what a start request without one gets)."""
    return f"run-{uuid.uuid4().hex[:16]}"


def default_budget() -> RuntimeBudget:
    """The budget of a run whose start request names none: 8 model steps, 8 tool calls."""
    return RuntimeBudget(steps_remaining=DEFAULT_STEPS, tool_calls_remaining=DEFAULT_TOOL_CALLS)


class StartRequest(Frozen):
    """The input that starts a run. Made by :func:`start`, or sent as JSON by a server client
    (``{"question": "..."}`` is enough: ``run_id`` and ``budget`` have defaults)."""

    run_id: str = Field(
        default_factory=new_run_id,
        min_length=1,
        max_length=128,
        description="The run's id in reports and traces (default: a generated one).",
    )
    question: str = Field(description="The question the run answers.")
    budget: RuntimeBudget = Field(
        default_factory=default_budget,
        description=f"What the run may spend (default: {DEFAULT_STEPS} model steps, "
        f"{DEFAULT_TOOL_CALLS} tool calls).",
    )


def field_default(name: str) -> Any:
    """The default of AgentState field ``name`` (a fresh one where it has a factory)."""
    return AgentState.model_fields[name].get_default(call_default_factory=True)


def _unset(name: str) -> Defaulted:
    """The channel of AgentState field ``name``: read as the field's default until written."""
    return Defaulted(AgentState.model_fields[name].annotation, default=field_default(name))


class GraphState(TypedDict, total=False):
    """LangGraph state schema: AgentState's fields as channels (validates back into AgentState)."""

    request: StartRequest
    run_id: str
    tenant_id: Annotated[str | None, _unset("tenant_id")]
    principal_id: Annotated[str | None, _unset("principal_id")]
    question: str
    phase: Phase
    budget: RuntimeBudget
    step: Annotated[int, _unset("step")]
    observations: Annotated[tuple[Observation, ...], Appended]
    proposals: Annotated[tuple[ToolProposal, ...], Appended]
    batch: Annotated[tuple[BatchEntry, ...], _unset("batch")]
    receipts: Annotated[tuple[Receipt, ...], Appended]
    fingerprints: Annotated[dict[str, int], Counted]
    evidence: Annotated[dict[str, str], Latest]
    answered: Annotated[dict[str, int], Latest]
    final_answer: Annotated[AnswerPayload | None, _unset("final_answer")]
    termination: Annotated[TerminationReason | None, _unset("termination")]
    last_error_code: Annotated[str | None, _unset("last_error_code")]
    manifests: Annotated[tuple[StepManifest, ...], Appended]
    open_tasks: Annotated[tuple[str, ...], _unset("open_tasks")]
    repairs: Annotated[int, _unset("repairs")]
    repair_notes: Annotated[tuple[str, ...], _unset("repair_notes")]
    model_failures: Annotated[int, _unset("model_failures")]
    stop: Annotated[StopRequest | None, _unset("stop")]
    report: Annotated[StopReport | None, _unset("report")]
    messages: Annotated[list[AnyMessage], Messages]
    """The run as a conversation, for chat UIs and ``stream_mode="messages"``: a view of the
    fields above, derived by :mod:`fencepost.graph.messages`, never read by the loop."""
    remaining_steps: RemainingSteps


class InputState(TypedDict, total=False):
    """What ``invoke`` takes to start a run, one of:

    - ``{"request": StartRequest}`` (see :func:`start`; as JSON ``{"request": {"question":
      "..."}}``, ``run_id`` and ``budget`` optional);
    - ``{"messages": [...]}``: the last human message is the question; the run gets a generated
      run id and the default budget (:func:`default_budget`).

    With both, ``request`` starts the run and ``messages`` is kept as given.
    """

    request: StartRequest
    messages: Annotated[list[AnyMessage], Messages]


_FIELDS = tuple(AgentState.model_fields)
_TUPLE_FIELDS = (
    "observations",
    "proposals",
    "batch",
    "receipts",
    "manifests",
    "repair_notes",
    "open_tasks",
)


def start(
    question: str,
    budget: RuntimeBudget | None = None,
    *,
    run_id: str | None = None,
    steps: int = DEFAULT_STEPS,
    tool_calls: int = DEFAULT_TOOL_CALLS,
) -> InputState:
    """The input for ``invoke``/``stream`` that starts a run.

    >>> start("why is checkout slow?", RuntimeBudget(steps_remaining=6, tool_calls_remaining=3))["request"].question
    'why is checkout slow?'
    """
    return {
        "request": StartRequest(
            run_id=run_id or new_run_id(),
            question=question,
            budget=budget or RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tool_calls),
        )
    }


def _text_of(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        block if isinstance(block, str) else str(block.get("text") or "")
        for block in content
        if isinstance(block, str) or block.get("type") == "text"
    )


class NoQuestion(ValueError):
    """A run was started with neither a start request nor a human message to answer."""

    def __init__(self) -> None:
        super().__init__(
            'a run starts from {"request": {"question": ...}} or {"messages": [...]} with a '
            "human message"
        )


def request_from(values: dict[str, Any], *, required: bool = True) -> StartRequest | None:
    """The start request in a new run's channel values: ``request`` if given, else one made
    from the last human message in ``messages`` (with the default run id and budget).

    Without either, raises :class:`NoQuestion` (``required=False``: returns ``None``).
    """
    request = values.get("request")
    if request is not None:
        if isinstance(request, StartRequest):
            return request
        return StartRequest.model_validate(request, strict=False)
    for message in reversed(values.get("messages") or ()):
        if isinstance(message, HumanMessage):
            question = _text_of(message).strip()
            if question:
                return StartRequest(question=question)
            break
    if required:
        raise NoQuestion
    return None


def load_state(values: dict[str, Any]) -> AgentState | None:
    """AgentState from channel values (None before a run has started on this thread).

    In-process values are already validated instances, so they are assembled without a second
    validation; anything that is not (a mapping from a foreign client) is validated in full.
    """
    if "run_id" not in values:
        return None
    data = {name: values[name] for name in _FIELDS if name in values}
    if isinstance(data.get("budget"), RuntimeBudget):
        # A checkpoint turns tuples into lists; their items are revived, validated models.
        revived = True
        for name in _TUPLE_FIELDS:
            items = data.get(name)
            if type(items) is list:
                revived = revived and not (items and isinstance(items[0], dict))
                data[name] = tuple(items)
        if revived:
            return AgentState.model_construct(**data)
    # Values that did not come back as fencepost types (a foreign client, a serializer without
    # fencepost's allowlist) are validated in full rather than half-read.
    return AgentState.model_validate(data, strict=False)


def require_state(values: dict[str, Any]) -> AgentState:
    """AgentState from channel values of a thread a run has started on."""
    state = load_state(values)
    if state is None:
        raise RuntimeError("no run on this thread")
    return state


def run_output(values: dict[str, Any]) -> AgentState:
    """A run's output (``invoke``'s return value or ``get_state(...).values``) as AgentState."""
    data = {name: values[name] for name in _FIELDS if name in values}
    return AgentState.model_validate(data, strict=False)
