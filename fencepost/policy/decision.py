"""What a model may say: a tool proposal (or a batch of them), a final answer, or an abstention.

Nothing else: :data:`Decision` is the one union of them, and :func:`parse_decision` the one way
untrusted model output becomes one.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, JsonValue, Strict, TypeAdapter, field_validator

from fencepost.policy.contract import Frozen
from fencepost.policy.fingerprint import canonical_json
from fencepost.policy.observation import AnswerPayload

CALL_ID_MIN, CALL_ID_MAX = 8, 128
TOOL_NAME_PATTERN = r"^[a-z][a-z0-9_]{1,63}$"


class ToolProposal(Frozen):
    """A model's request to call a tool. A proposal, never a command: every gate checks it first."""

    kind: Literal["tool"] = "tool"
    call_id: Annotated[str, Field(min_length=CALL_ID_MIN, max_length=CALL_ID_MAX)]
    """The model's id for this call; results are joined to it, and it is the idempotency key."""
    tool_name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    """The tool asked for. Looked up in the registry, never imported or ``getattr``-ed."""
    arguments: dict[str, JsonValue]
    """Untrusted arguments; the tool's strict schema decides what they mean."""
    depends_on: Annotated[tuple[str, ...], Field(max_length=64), Strict(False)] = ()
    """Call ids whose verified result this call needs first (of its batch, or already completed
    earlier in the run). Independent calls of a batch run in parallel; a dependent one waits."""

    @field_validator("arguments")
    @classmethod
    def _json_numbers(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        # json.loads accepts NaN/Infinity, JSON does not: such a proposal could never be
        # fingerprinted, so the gate would crash instead of returning a verdict.
        try:
            canonical_json(value)
        except ValueError:
            raise ValueError("arguments must not contain NaN or infinite numbers") from None
        return value


class FinalProposal(Frozen):
    """A model's final answer; its citations are checked against the observations."""

    kind: Literal["final"] = "final"
    answer: AnswerPayload


class AbstainProposal(Frozen):
    """A model declining to answer, with the reason it gives."""

    kind: Literal["abstain"] = "abstain"
    reason: Literal["insufficient_evidence", "needs_clarification"]


class ToolBatch(Frozen):
    """Several tool proposals made in one model turn: gated and reserved as a whole."""

    kind: Literal["batch"] = "batch"
    calls: Annotated[tuple[ToolProposal, ...], Strict(False), Field(min_length=1)]


Decision = ToolProposal | ToolBatch | FinalProposal | AbstainProposal
"""The decision union: what a model may say, discriminated on ``kind``. A decision model returns
one (or a :class:`~fencepost.policy.decision_model.Decided` holding one)."""

DecisionKind = Literal["tool", "final", "abstain", "invalid"]
"""The kind of decision a step's manifest records: a proposal or a batch is ``tool``; ``invalid``
is model output that was no decision."""

_DECISION: TypeAdapter[Decision] = TypeAdapter(Annotated[Decision, Field(discriminator="kind")])


class InvalidProposal(Exception):
    """Model output that is not a valid decision. ``code`` says which rule; no input text is kept."""

    def __init__(self, code: str = "malformed_decision") -> None:
        super().__init__(code)
        self.code = code


def parse_decision(raw: object) -> Decision:
    """Parse untrusted model output (a mapping, or JSON text/bytes) into a decision.

    Raises :class:`InvalidProposal` for anything else, and never any other exception.

    >>> parse_decision({"kind": "abstain", "reason": "insufficient_evidence"}).kind
    'abstain'
    """
    try:
        if isinstance(raw, Decision):
            return raw
        if isinstance(raw, str | bytes | bytearray):
            raw = json.loads(raw)
        # No call-time ``strict=True``: it would override the ``Strict(False)`` on tuple fields
        # (citations arrive as a JSON list); the models are strict through their config.
        return _DECISION.validate_python(raw)
    except InvalidProposal:
        raise
    except RecursionError:
        raise InvalidProposal("malformed_decision") from None
    except Exception:
        # Deliberately broad: the contract is "a decision or InvalidProposal" for any input.
        raise InvalidProposal("malformed_decision") from None
