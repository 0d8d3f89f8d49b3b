"""The graph's channels: one per AgentState field, the start request, and the messages view."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langgraph.managed import RemainingSteps
from pydantic import Field, ValidationError

# pydantic builds the JSON schemas from these; on Python < 3.12 only from typing_extensions'.
from typing_extensions import TypedDict

from fencepost.graph.channels import Coerced, Defaulted, Records, field_check
from fencepost.graph.conversation import Messages
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
from fencepost.policy._model import Frozen, assemble
from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import DEFAULT_STEPS, DEFAULT_TOOL_CALLS, default_budget
from fencepost.policy.run_check import stop
from fencepost.policy.stop_report import paused_report


def new_run_id() -> str:
    """A fresh run id (what a start request without one gets)."""
    return f"run-{uuid.uuid4().hex[:16]}"


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


def _unset(name: str, kind: type[Defaulted] = Defaulted) -> Defaulted:
    """The channel of AgentState field ``name``: read as the field's default until written."""
    return kind(AgentState.model_fields[name].annotation, default=field_default(name))


def _record(name: str, kind: Callable[[Any], Records]) -> Records:
    """The channel of AgentState field ``name``: a ``kind`` record of the field's type."""
    return kind(AgentState.model_fields[name].annotation)


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
    observations: Annotated[tuple[Observation, ...], _record("observations", Records.appended)]
    proposals: Annotated[tuple[ToolProposal, ...], _record("proposals", Records.appended)]
    batch: Annotated[tuple[BatchEntry, ...], _unset("batch", Coerced)]
    receipts: Annotated[tuple[Receipt, ...], _record("receipts", Records.appended)]
    fingerprints: Annotated[dict[str, int], _record("fingerprints", Records.counted)]
    evidence: Annotated[dict[str, str], _record("evidence", Records.latest)]
    answered: Annotated[dict[str, int], _record("answered", Records.latest)]
    final_answer: Annotated[AnswerPayload | None, _unset("final_answer")]
    termination: Annotated[TerminationReason | None, _unset("termination")]
    last_error_code: Annotated[str | None, _unset("last_error_code")]
    manifests: Annotated[tuple[StepManifest, ...], _record("manifests", Records.appended)]
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
        super().__init__('a run starts from {"request": {"question": ...}} or {"messages": [...]}')


def request_from(
    values: dict[str, Any], *, required: bool = True, run_id: str | None = None
) -> StartRequest | None:
    """The start request in a new run's channel values: ``request`` if given, else one made
    from the last human message in ``messages`` (with the default budget, and ``run_id`` or a
    generated id where none is named). Without either, raises :class:`NoQuestion`
    (``required=False``: returns ``None``)."""
    named: dict[str, Any] = {} if run_id is None else {"run_id": run_id}
    request = values.get("request")
    if request is not None:
        if isinstance(request, StartRequest):
            return request
        request = {**named, **request} if isinstance(request, dict) else request
        return StartRequest.model_validate(request, strict=False)
    for message in reversed(values.get("messages") or ()):
        if isinstance(message, HumanMessage):
            question = _text_of(message).strip()
            if question:
                return StartRequest(question=question, **named)
            break
    if required:
        raise NoQuestion
    return None


def fields_on(kind: Any) -> tuple[str, ...]:
    """The AgentState fields whose channel is a ``kind`` (a channel class, or a union)."""
    hints = get_type_hints(GraphState, include_extras=True)
    meta = {n: getattr(hints[n], "__metadata__", ()) for n in _FIELDS}
    return tuple(n for n in _FIELDS if any(isinstance(m, kind) for m in meta[n]))


_RECORDS = frozenset(fields_on(Records))
_ABSENT = object()
_INVALID = stop(TerminationReason.POLICY_DENIED, "invalid_state")
_NO_REQUEST = StartRequest(run_id="run-invalid", question="")
# Records' items are checked as they are written (``channels.typed``), here by type alone; a
# field holding contract records (budget view, stop, report, a batch's entries) is checked field
# by field too.
_CHECKS = {
    n: field_check(i, deep=n not in _RECORDS, records=n not in _RECORDS)
    for n, i in AgentState.model_fields.items()
}


class MendedState(AgentState):
    """AgentState from channel values not all exactly of their field's type: each such field
    holds its value's JSON form converted, else a stand-in (its default; for the run id, question
    and budget, the start request's). A node's writes from it carry the mended fields."""

    rewrite: tuple[str, ...] = ()
    """The fields whose channel holds something else, written back with the node's writes."""
    invalid: bool = False
    """A value had no form of its field's type: the run ends, its stop or ``invalid_state``."""


class InvalidState(Exception):
    """Raised by :func:`require_state` for an invalid state: a node that acts does not read
    stops, so ``node_io.twins`` writes the mended state instead (its stop ends the run)."""

    def __init__(self, state: MendedState) -> None:
        super().__init__(f"no valid value in state field(s) {', '.join(state.rewrite)}")
        self.state = state


def load_state(values: dict[str, Any]) -> AgentState | None:
    """AgentState from channel values (None before a run has started on this thread).

    Each value is checked against its field's type (``type(v) is X``: a step's cost); if all
    pass, they are assembled unvalidated, else validated in full and mended (:class:`MendedState`).
    """
    if "run_id" not in values:
        return None
    data: dict[str, Any] = {}
    wrong: list[str] = []
    for name, check in _CHECKS.items():
        value = data[name] = values.get(name, _ABSENT)  # absent: invalid, as no check passes it
        if not check(value):
            wrong.append(name)
        elif type(value) is list:
            data[name] = tuple(value)  # a checkpoint turns tuples into lists
    if data.get("phase") is Phase.TERMINAL and data.get("termination") is None:
        wrong.append("phase")  # terminal, but not made so by the terminal node
    if wrong:
        return _mended(values, data, wrong)
    return assemble(AgentState, data)


def _mended(values: dict[str, Any], data: dict[str, Any], wrong: list[str]) -> MendedState:
    request, invalid = values.get("request"), set[str]()
    try:
        state = AgentState.model_validate(data, strict=False)
    except Exception as exc:  # field names only: no value reaches state or a message
        # A record's own validator reading a half-read record inside it (a batch entry revived
        # with ``model_construct``) raises something else: where no field is named, every
        # field that failed its check stands in.
        errors = exc.errors() if isinstance(exc, ValidationError) else []
        invalid = {str(e["loc"][0]) for e in errors if e["loc"]} or set(wrong)
        data.update((name, _stand_in(name, request)) for name in invalid)
        state = AgentState.model_validate(data, strict=False)
    # Converted, exact too (an int a checkpoint holds); terminal only with a termination.
    late = {n for n in wrong if not _CHECKS[n](getattr(state, n))}
    late |= {"phase"} if state.is_terminal and state.termination is None else set()
    if late:
        invalid |= late
        state = state.model_copy(update={n: _stand_in(n, request) for n in late})
    if invalid and state.stop is None:
        invalid.add("stop")
        state = state.model_copy(update={"stop": _INVALID})
    rewrite = tuple(n for n in _FIELDS if n not in _RECORDS and (n in invalid or n in wrong))
    return MendedState.model_construct(**state.__dict__, rewrite=rewrite, invalid=bool(invalid))


def _stand_in(name: str, request: Any) -> Any:
    if not AgentState.model_fields[name].is_required():
        return field_default(name)
    return getattr(request if isinstance(request, StartRequest) else _NO_REQUEST, name)


def require_state(values: dict[str, Any]) -> AgentState:
    """AgentState from channel values of a thread a run has started on, for a node that acts:
    raises :class:`InvalidState` where :func:`load_state` mends an invalid value."""
    state = load_state(values)
    if state is None:
        raise RuntimeError("no run on this thread")
    if isinstance(state, MendedState) and state.invalid:
        raise InvalidState(state)
    return state


def run_output(values: dict[str, Any]) -> AgentState:
    """A run's output (``invoke``'s return value or ``get_state(...).values``) as AgentState.

    Its ``report`` is the stop report of a run that ended, or, for a run paused for approval,
    the one policy derives from the calls that wait (``waiting_for`` names them); ``None`` while
    a run is still going."""
    data = {name: values[name] for name in _FIELDS if name in values}
    state = AgentState.model_validate(data, strict=False)
    if state.report is None and not state.is_terminal:
        # Derived on the way out, never written: the checkpoint keeps the terminal node's
        # report as the only stored one.
        paused = paused_report(state)
        if paused is not None:
            state = state.model_copy(update={"report": paused})
    return state
