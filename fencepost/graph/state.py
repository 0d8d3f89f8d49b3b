"""The graph's channels: one per AgentState field, the start request, and the messages view."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, get_type_hints

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langgraph.managed import RemainingSteps
from pydantic import Field

# pydantic builds the published JSON schemas from these TypedDicts, and on Python < 3.12 it
# accepts only typing_extensions' TypedDict.
from typing_extensions import TypedDict

from fencepost.graph.channels import Appended, Counted, Defaulted, Latest, Messages, Records
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
from fencepost.policy.revised import changes_since

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


def _unset(name: str) -> Defaulted:
    """The channel of AgentState field ``name``: read as the field's default until written."""
    field = AgentState.model_fields[name]
    return Defaulted(field.annotation, default=field.get_default(call_default_factory=True))


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
_FIELD_SET = frozenset(_FIELDS)
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


_APPENDED = frozenset({"observations", "proposals", "receipts", "manifests"})
_UNSET: dict[str, Any] = {
    name: AgentState.model_fields[name].get_default(call_default_factory=True)
    for name, hint in get_type_hints(GraphState, include_extras=True).items()
    if any(isinstance(m, Defaulted | Records) for m in getattr(hint, "__metadata__", ()))
    and name in AgentState.model_fields
}
"""Fields whose channel reads as the field's default until written: a new run leaves them
unwritten while they hold it."""
_RESET = tuple(
    name
    for name, hint in get_type_hints(GraphState, include_extras=True).items()
    if any(isinstance(m, Defaulted) for m in getattr(hint, "__metadata__", ()))
)


class Writes(dict[str, Any]):
    """A node's channel writes (what :func:`changed` returns), with the two states they were
    made from: the messages view is derived from those, not from the writes read back into
    state a second time. Never handed to LangGraph itself (see ``node_io.twins``)."""

    __slots__ = ("after", "before")

    before: AgentState | None
    after: AgentState


def changed(before: AgentState | None, after: AgentState) -> Writes:
    """The channel writes that turn ``before`` into ``after``: fields that changed, and for the
    append-only record channels only the items added."""
    writes = Writes()
    writes.before, writes.after = before, after
    if before is None:
        for name in _FIELDS:
            value = getattr(after, name)
            if name in _UNSET and _same(value, _UNSET[name]):
                continue  # its channel reads as the default unwritten (see channels.Defaulted)
            # Plain dicts: a revised record carries its changes beside it, never into a checkpoint.
            writes[name] = dict(value) if isinstance(value, dict) else value
        return writes
    for name in _FIELDS:
        value = getattr(after, name)
        old = getattr(before, name)
        if value is old:
            continue
        if name in ("fingerprints", "evidence", "answered"):
            added = changes_since(old, value)
            if added:
                writes[name] = added
            continue
        if name in _APPENDED:
            if len(value) < len(old) or value[: len(old)] != old:
                raise ValueError(f"{name} is append-only")
            if len(value) > len(old):
                writes[name] = value[len(old) :]
        elif not _same(value, old):
            # An equal value made again (the budget view after a settlement that changed no
            # balance) is not written: each write is a serialized blob and a new channel
            # version in every checkpoint that follows.
            writes[name] = value
    return writes


def _same(value: Any, old: Any) -> bool:
    """Equal and of the same type: a caller's ``"terminal"`` equals ``Phase.TERMINAL`` (a str
    enum) but is not it, and the loop tests the phase by identity, so it is written over."""
    return type(value) is type(old) and value == old


def started(values: dict[str, Any], writes: Any) -> Any:
    """A node's writes (what it returned), made safe for a run's first: a field the new run
    leaves at its default is still written when its channel holds something else, a value a
    caller wrote to the thread before the run began (``update_state`` on a fresh thread), so
    no run starts with a stop, a batch or a termination it did not make."""
    if not isinstance(writes, Writes) or writes.before is not None:
        return writes
    after = writes.after
    for name in _RESET:
        value = getattr(after, name)
        if name not in writes and not _same(values.get(name, value), value):
            writes[name] = value
    return writes


def applied(before: AgentState | None, writes: dict[str, Any]) -> AgentState | None:
    """The state ``writes`` (what :func:`changed` returned) turn ``before`` into: its inverse.
    ``None`` when there is still no run (a node that wrote nothing to a fresh thread)."""
    if before is None:
        if "run_id" not in writes:
            return None
        return AgentState.model_construct(**{n: writes[n] for n in _FIELDS if n in writes})
    update: dict[str, Any] = {}
    for name, value in writes.items():
        if name not in _FIELD_SET:
            continue
        if name in _APPENDED:
            update[name] = getattr(before, name) + tuple(value)
        elif name in ("evidence", "answered"):
            update[name] = {**getattr(before, name), **value}
        elif name == "fingerprints":
            counts = dict(before.fingerprints)
            for key, count in value.items():
                counts[key] = max(count, counts.get(key, 0))
            update[name] = counts
        else:
            update[name] = value
    return before.model_copy(update=update)


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
