"""Tool events and the reducer that turns them into observations."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, JsonValue, Strict, TypeAdapter

from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.fingerprint import canonical_json, fits_checkpoint, with_encodable_text
from fencepost.policy.observation import Observation
from fencepost.policy.phase import Phase
from fencepost.policy.revised import revised
from fencepost.policy.state import AgentState


class ToolSucceeded(Frozen):
    """A tool returned; ``result`` is its JSON-serialized value."""

    call_id: str
    tool_name: str
    result: JsonValue = None


class ToolFailed(Frozen):
    """A tool failed; only the safe code and whether a retry may help are kept."""

    call_id: str
    tool_name: str
    error_code: Annotated[ErrorCode, Strict(False)]
    retryable: bool = False


RuntimeEvent = ToolSucceeded | ToolFailed

_JSON: TypeAdapter[JsonValue] = TypeAdapter(JsonValue)


class UnserializableResult(TypeError):
    """A tool returned something that is not JSON data."""

    safe_code = ErrorCode.UNSERIALIZABLE_RESULT


def serialize_tool_result(result: Any) -> JsonValue:
    """A tool's return value as JSON data: pydantic models are dumped, everything else checked.

    Text with no UTF-8 form (a lone surrogate, valid JSON from any page) is kept with U+FFFD in
    place of each such character: the result is untrusted data, shown to the model as such, and
    no checkpoint stores the character as it is."""
    try:
        # A model's dump is checked as any value is: a model may dump its own classes (a str
        # or dict subclass), and the records assembled from this value are not validated again.
        dumped = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
        value: JsonValue = _JSON.validate_python(dumped, strict=True)
        # NaN/Infinity pass the JsonValue check but are not JSON: they would not survive a JSON
        # checkpoint and would never compare equal after one.
        canonical_json(value)
    except Exception:
        raise UnserializableResult(type(result).__name__) from None
    if not fits_checkpoint(value):
        value = with_encodable_text(value)
        if not fits_checkpoint(value):
            raise UnserializableResult("integer out of range or nested too deep")
    return value


_SUCCEEDED_GIVEN = frozenset(("sequence", "step", "call_id", "tool_name", "kind", "result"))
_FAILED_GIVEN = frozenset(
    ("sequence", "step", "call_id", "tool_name", "kind", "error_code", "retryable")
)


def observation_for(event: RuntimeEvent, sequence: int, *, step: int = 0) -> Observation:
    """The observation an event becomes at position ``sequence``, answering a step's proposal."""
    kind = type(event)
    if (kind is ToolSucceeded or kind is ToolFailed) and _position(sequence, step):
        # An event of these exact types was validated when it was made (its result JSON data,
        # its code a safe one), and ``sequence`` and ``step`` are counts: the observation holds
        # the same values, so it is assembled as validation would make it, not validated again.
        fields = event.__dict__
        succeeded = kind is ToolSucceeded
        return assemble(
            Observation,
            {
                "sequence": sequence,
                "step": step,
                "call_id": fields["call_id"],
                "tool_name": fields["tool_name"],
                "kind": "tool_result" if succeeded else "tool_error",
                "result": fields["result"] if succeeded else None,
                "error_code": None if succeeded else fields["error_code"],
                "retryable": False if succeeded else fields["retryable"],
            },
            _SUCCEEDED_GIVEN if succeeded else _FAILED_GIVEN,
        )
    if isinstance(event, ToolSucceeded):
        return Observation(
            sequence=sequence,
            step=step,
            call_id=event.call_id,
            tool_name=event.tool_name,
            kind="tool_result",
            result=event.result,
        )
    return Observation(
        sequence=sequence,
        step=step,
        call_id=event.call_id,
        tool_name=event.tool_name,
        kind="tool_error",
        error_code=event.error_code,
        retryable=event.retryable,
    )


def _position(sequence: object, step: object) -> bool:
    return type(sequence) is int and type(step) is int and sequence >= 0 and step >= 0


def reduce_tool_events(state: AgentState, events: tuple[RuntimeEvent, ...]) -> AgentState:
    """Append one observation per event, numbered after the existing ones, in event order.

    The pending proposal each event answers (joined by call id) is kept beside it in
    ``state.proposals``, so a model can be shown its own earlier calls after a resume.
    """
    start = len(state.observations)
    added = tuple(
        observation_for(event, start + i, step=state.step) for i, event in enumerate(events)
    )
    pending = {entry.call_id: entry.proposal for entry in state.batch}
    answered = tuple(pending[e.call_id] for e in events if e.call_id in pending)
    return state.model_copy(
        update={
            "phase": Phase.OBSERVE,
            "observations": state.observations + added,
            "proposals": state.proposals + answered,
            "answered": revised(state.answered, {o.call_id: o.step for o in added}),
        }
    )


def reduce_tool_event(state: AgentState, event: RuntimeEvent) -> AgentState:
    """Append the observation for one event (the seed's reducer)."""
    return reduce_tool_events(state, (event,))
