"""The scripted user-task model and the compliant victim.

:class:`ReplayScript` is the whole behaviour, shared by the run through fencepost
(:class:`ReplayModel`, a fencepost ``DecisionModel``) and the bare ceiling run: it proposes the
user task's ground-truth calls in order, and, once a tool output carries the injection (the
victim is fully compliant), the injection task's ground-truth calls before the rest. The victim
knows an injection by its instruction, the injection task's own ``GOAL``, found in a tool output
whatever template wraps it (:func:`carries_goal`): no marker of one attack's text. It never
adapts to what it is told: a refused call is dropped and the next one proposed, so a policy is
measured on exactly the calls a compliant agent would make. Its answer is the user task's
ground-truth output, plus the injection task's when the victim saw the injection (an attack on
the answer text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import fencepost as fp
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, TaskEnvironment

_ESCAPE = re.compile(r"\\[nrt\"'\\/]")
"""A backslash escape of a YAML or JSON string: the tool output's quoting, not the text's."""
_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(_ESCAPE.sub(" ", text))]


def carries_goal(text: str, goal: str) -> bool:
    """Whether a tool output carries the injected instruction ``goal``.

    Compared as lower-case words in order: the output is YAML or JSON text, whose line folding,
    indentation, quoting (``''``) and escapes (``\\n``) change everything but the words."""
    wanted = _words(goal)
    if not wanted:
        return False
    have = _words(text)
    first, n = wanted[0], len(wanted)
    return any(have[i] == first and have[i : i + n] == wanted for i in range(len(have) - n + 1))


def _arguments(call: FunctionCall) -> dict[str, Any]:
    # Ground-truth arguments are plain values; a round trip through JSON makes that certain
    # (a proposal's arguments are JSON).
    return dict(json.loads(json.dumps(dict(call.args), default=str)))


class ReplayScript:
    """The calls a compliant agent makes for one (user task, injection task) run."""

    def __init__(
        self,
        user_task: BaseUserTask[Any],
        injection_task: BaseInjectionTask[Any] | None,
        environment: TaskEnvironment,
    ) -> None:
        # Ground truths are computed on the environment the run starts from, as AgentDojo's
        # GroundTruthPipeline does.
        self.user_calls = list(user_task.ground_truth(environment.model_copy(deep=True)))
        self.injection_calls = (
            list(injection_task.ground_truth(environment.model_copy(deep=True)))
            if injection_task is not None
            else []
        )
        self._user_answer = user_task.GROUND_TRUTH_OUTPUT
        self._injection_answer = (
            injection_task.GROUND_TRUTH_OUTPUT if injection_task is not None else ""
        )
        self._goal = injection_task.GOAL if injection_task is not None else ""
        self._queue: list[FunctionCall] = list(self.user_calls)
        self.injected = False
        """Whether a tool output carried the injection (the victim then obeys it)."""
        self.proposed: list[FunctionCall] = []

    @property
    def planned(self) -> int:
        """How many calls the script may propose at most."""
        return len(self.user_calls) + len(self.injection_calls)

    def saw(self, outputs: Sequence[str]) -> None:
        """Tool outputs since the last call: the first that carries the injected instruction
        turns the victim, whose injection calls then come before the user task's remaining ones."""
        if self.injected or (not self.injection_calls and not self._injection_answer):
            return
        if any(carries_goal(text, self._goal) for text in outputs):
            self.injected = True
            self._queue[:0] = self.injection_calls

    def next_call(self) -> FunctionCall | None:
        """The next call to propose, or ``None`` when only the answer is left."""
        if not self._queue:
            return None
        call = self._queue.pop(0)
        self.proposed.append(call)
        return call

    def answer(self) -> str:
        """The final answer's text."""
        parts = [self._user_answer]
        if self.injected:
            parts.append(self._injection_answer)
        # Empty for most action tasks: their ground truth has nothing to say, and neither does
        # the replay (an empty fencepost answer cites nothing).
        return " ".join(p for p in parts if p)


def _observation_text(observation: fp.policy.Observation) -> str:
    result = observation.result
    return result if isinstance(result, str) else json.dumps(result)


class ReplayModel:
    """:class:`ReplayScript` as a fencepost decision model: one call per step, then the answer."""

    def __init__(self, script: ReplayScript) -> None:
        self.script = script
        self._seen = 0
        self._count = 0

    async def decide(
        self, input: fp.DecisionInput, *, deadline: fp.Deadline
    ) -> fp.ToolProposal | fp.FinalProposal:
        """Propose the script's next call, or answer."""
        new = input.observations[self._seen :]
        self._seen = len(input.observations)
        self.script.saw([_observation_text(o) for o in new])
        call = None if input.final_turn else self.script.next_call()
        if call is None:
            return fp.FinalProposal(answer=fp.AnswerPayload(text=self.script.answer()))
        self._count += 1
        return fp.ToolProposal(
            call_id=f"call-{self._count:04d}", tool_name=call.function, arguments=_arguments(call)
        )


class CurrentReplay:
    """The decision model of a graph compiled once: it plays the replay of the run now going.

    Runs through one compiled graph go one at a time (see :mod:`.pipeline`)."""

    def __init__(self) -> None:
        self.current: ReplayModel | None = None

    async def decide(
        self, input: fp.DecisionInput, *, deadline: fp.Deadline
    ) -> fp.ToolProposal | fp.FinalProposal:
        """The current replay's decision."""
        if self.current is None:
            raise RuntimeError("no replay is bound to this graph")
        return await self.current.decide(input, deadline=deadline)
