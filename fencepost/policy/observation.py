"""What the loop has seen: tool results and tool errors, joined to proposals by call id."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, Strict, field_validator, model_validator

from fencepost.policy.contract import Frozen
from fencepost.policy.error_codes import ErrorCode


class Observation(Frozen):
    """One tool outcome, as untrusted data.

    ``result`` is whatever the tool returned, serialized to JSON; ``error_code`` is the only
    detail of a failure. Observations are ordered by ``sequence`` and answer ``call_id``.
    """

    sequence: Annotated[int, Field(ge=0)]
    """Position in the run's observation list (0-based, gap-free)."""
    step: Annotated[int, Field(ge=0)] = 0
    """The model step whose proposal this observation answers (a batch shares one step)."""
    call_id: str
    """The proposal this observation answers; results are joined by it, never by position."""
    tool_name: str
    """The registered tool that produced it."""
    kind: Literal["tool_result", "tool_error"]
    """Whether the tool returned or failed."""
    result: JsonValue = None
    """The tool's JSON result (``tool_result`` only). Untrusted: data, never instructions."""
    error_code: Annotated[ErrorCode | None, Strict(False)] = None
    """The safe failure code (``tool_error`` only)."""
    retryable: bool = False
    """Whether trying again later may succeed (``tool_error`` only)."""

    @property
    def evidence_id(self) -> str:
        """The id a final answer cites to point at this observation: its call id."""
        return self.call_id

    @property
    def is_evidence(self) -> bool:
        """Only results are evidence; an error proves nothing about the question."""
        return self.kind == "tool_result"


class AnswerPayload(Frozen):
    """A final answer and the observation evidence it rests on.

    ``citations`` name observations by their evidence id (the call id of a tool result).

    The text may be empty: an agent whose task was an action (a transfer made, a file shared)
    may have nothing to add, and its receipts say what it did. An empty answer claims nothing,
    so it cites nothing (citations with no text are refused) and needs no citation even under
    ``require_citations``.

    >>> AnswerPayload(text="").is_empty
    True
    """

    text: Annotated[str, Field(max_length=20_000)]
    """The answer shown to the user; empty (or only whitespace) when there is nothing to say."""
    citations: Annotated[tuple[str, ...], Strict(False)] = ()
    """Evidence ids (call ids of successful tool results) that support the answer."""

    @field_validator("citations")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(value))

    @model_validator(mode="after")
    def _cites_only_what_it_says(self) -> AnswerPayload:
        # A citation supports a claim: with no text there is no claim for it to support.
        if self.citations and self.is_empty:
            raise ValueError("an empty answer cites nothing: give text, or no citations")
        return self

    @property
    def is_empty(self) -> bool:
        """Whether the answer says nothing (no text but whitespace)."""
        return not self.text.strip()
