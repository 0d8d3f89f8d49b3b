"""A decision model that plays back a script: for tests, demos and notebooks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from fencepost.policy import (
    Deadline,
    Decided,
    Decision,
    DecisionInput,
    InvalidProposal,
    parse_decision,
)

SCRIPT_EXHAUSTED = "script_exhausted"
"""The code a run ends with when its script has no entry left for the step it is asked."""

ScriptEntry = Decision | Decided | dict[str, Any] | str | Callable[[DecisionInput], Any]
"""One entry of a script: a decision as it is, raw model output to parse, or a callable of the
input returning either."""


class ScriptedDecisionModel:
    """Returns the next entry of a script on each call.

    Entries are decisions, raw dicts/JSON (parsed as untrusted model output, so a malformed one
    becomes an invalid proposal), exceptions to raise, or callables of the :class:`DecisionInput`
    returning any of those. Asked past the end of the script, it has no decision to give: the
    run ends ``invalid_proposal`` with code ``script_exhausted`` (its stop report says to add
    entries or end the script with a FinalProposal or an AbstainProposal), never as if the model
    had abstained.

    Example::

        model = ScriptedDecisionModel([
            ToolProposal(call_id="call-0001", tool_name="search_logs", arguments={"query": "5xx"}),
            lambda inp: FinalProposal(answer=AnswerPayload(
                text="deploy 42 broke checkout", citations=(inp.observations[-1].call_id,))),
        ])
    """

    def __init__(self, script: Sequence[ScriptEntry | BaseException]) -> None:
        self._script = list(script)
        self._lock = threading.Lock()
        self.calls = 0
        """How many times the model was asked (a crashed attempt counts too)."""
        self.inputs: list[DecisionInput] = []
        """Every input the model was given, in order."""

    async def decide(self, input: DecisionInput, *, deadline: Deadline) -> Decision | Decided:
        with self._lock:
            index = self.calls
            self.calls += 1
            self.inputs.append(input)
        if index >= len(self._script):
            raise InvalidProposal(SCRIPT_EXHAUSTED)
        entry: Any = self._script[index]
        if callable(entry) and not isinstance(entry, BaseException):
            entry = entry(input)
            if hasattr(entry, "__await__"):
                entry = await entry
        if isinstance(entry, BaseException):
            raise entry
        if isinstance(entry, Decision | Decided):
            return entry
        try:
            return parse_decision(entry)
        except InvalidProposal:
            raise
