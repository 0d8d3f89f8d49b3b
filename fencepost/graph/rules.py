"""A tool's own rules (its ``semantic_validator``, its ``progress_predicate``), run contained.

The gates (:mod:`fencepost.policy.gates`) call each rule through a
:class:`~fencepost.policy.rule_runner.RuleRunner`; the graph's is :class:`ContainedRules`, which
gives a rule no longer than :data:`~fencepost.policy.rule_runner.RULE_TIMEOUT_SECONDS` within
the run's deadline: one that blocks is left behind and the call fails closed
(:class:`~fencepost.policy.rule_runner.RuleTimedOut`). Only a batch that names a tool with a rule
pays for it (:func:`judged_with_rules`); the others are judged in place, with no thread hop.

- The sync graph judges the batch on its own thread, and each rule runs on a fencepost thread
  from the run's tenant's share (as a sync tool body or an approver runs) while that thread
  waits: one hop a rule.
- The async graph must not block its loop: it judges the whole batch on one fencepost thread
  from the tenant's share, and the rules run there, in line, while the loop watches the clock of
  the rule that is running: one hop a batch. A rule past its limit leaves that thread behind;
  the batch is then judged again off the loop, each rule that answered given the same answer
  (the judgement is a pure function of the batch, the state and those answers), the one that
  blocked :class:`~fencepost.policy.rule_runner.RuleTimedOut`, and any later rule run contained.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from fencepost.graph.containment.tools import run_callable_blocking, run_callable_watched
from fencepost.graph.node_io import AsyncIO, NodeIO
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Clock, Deadline, stage_deadline
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.rule_runner import RULE_TIMEOUT_SECONDS, RuleTimedOut

T = TypeVar("T")

_Answer = tuple[bool, Any]
"""How a rule ended: ``(True, what it returned)`` or ``(False, what it raised)``."""


class _InLine:
    """The rules a judgement running on a fencepost thread has called, in order, and the
    instant the one running now must answer by (read by the loop that watches it)."""

    __slots__ = ("answers", "left", "lock", "until")

    def __init__(self, start_by: float) -> None:
        self.lock = threading.Lock()
        self.answers: list[_Answer] = []
        self.until = start_by
        """Until the first rule starts: no thread is waited for longer than it would be given."""
        self.left = False
        """The loop stopped waiting: no further rule is called here (the judgement is made
        again off the loop, and a rule must not be called by both)."""

    def run(self, rule: Callable[[], T], seconds: float) -> T:
        """On the judging thread: run ``rule`` here, given ``seconds``."""
        if not seconds > 0:  # NaN included: no time left, the rule is never called
            self._answered((False, RuleTimedOut()))
            raise RuleTimedOut
        until = time.monotonic() + seconds
        with self.lock:
            if self.left:
                raise RuleTimedOut
            self.until = until
        try:
            value = rule()
        except BaseException as exc:  # contained: the gate decides what it means
            answer: _Answer = (False, exc)
        else:
            answer = (True, value)
        if time.monotonic() > until:
            answer = (False, RuleTimedOut())  # a late answer is never heard
        self._answered(answer)
        if not answer[0]:
            raise answer[1]
        return cast(T, answer[1])

    def _answered(self, answer: _Answer) -> None:
        with self.lock:
            self.answers.append(answer)
            self.until = math.inf

    def answer_by(self) -> float:
        """On the loop: when to look again (the running rule's limit; none running: never)."""
        with self.lock:
            return self.until

    def gives_up(self) -> bool:
        """On the loop: whether the running rule (or the wait for a thread) is past its time;
        if so, no further rule is called here, atomically with the answer."""
        with self.lock:
            if self.until <= time.monotonic():
                self.left = True
            return self.left

    def heard(self) -> list[_Answer]:
        """The answers heard before the loop gave up."""
        with self.lock:
            return list(self.answers)


class _Replayed:
    """A judgement made again after its thread was left behind: the first rules answer as they
    did, the next one did not answer in time, and any after it run contained."""

    __slots__ = ("answers", "called")

    def __init__(self, answers: list[_Answer]) -> None:
        self.answers = answers
        self.called = 0

    def run(self, rule: Callable[[], T], contained: Callable[[Callable[[], T]], T]) -> T:
        k = self.called
        self.called += 1
        if k < len(self.answers):
            ok, value = self.answers[k]
            if not ok:
                raise value
            return cast(T, value)
        if k == len(self.answers):
            raise RuleTimedOut
        return contained(rule)


_judging: ContextVar[_InLine | _Replayed | None] = ContextVar("fencepost_judging", default=None)
"""How the judgement in progress runs its rules: in line on its own fencepost thread, replayed,
or (``None``) each on a fencepost thread of its own."""


class ContainedRules:
    """The graph's :class:`~fencepost.policy.rule_runner.RuleRunner` for one run's context."""

    __slots__ = ("_clock", "_ctx")

    def __init__(self, ctx: RunContext, clock: Clock) -> None:
        self._ctx = ctx
        self._clock = clock

    def _seconds(self) -> float:
        """How long a rule starting now is given: the rule's limit, within the run's deadline."""
        clock = self._clock
        run_deadline = self._ctx.deadline or Deadline.after(RULE_TIMEOUT_SECONDS, clock=clock)
        return stage_deadline(
            run_deadline, max_stage_seconds=RULE_TIMEOUT_SECONDS, clock=clock
        ).remaining_seconds(clock=clock)

    def __call__(self, rule: Callable[[], T], /) -> T:
        """Run ``rule`` contained; raise :class:`RuleTimedOut` if it did not answer in time (no
        time left included), else return or raise what it did."""
        judging = _judging.get()
        if isinstance(judging, _InLine):
            return judging.run(rule, self._seconds())
        if isinstance(judging, _Replayed):
            return judging.run(rule, self._on_a_thread)
        return self._on_a_thread(rule)

    def _on_a_thread(self, rule: Callable[[], T]) -> T:
        ran = run_callable_blocking(
            rule, timeout_seconds=self._seconds(), tenant=self._ctx.tenant_id
        )
        if not ran.finished:
            raise RuleTimedOut
        if ran.raised is not None:
            raise ran.raised
        return cast(T, ran.value)


def has_rules(registry: ToolRegistry, tool_names: Iterable[str]) -> bool:
    """Whether any of the named registered tools has a rule of its own to run."""
    for name in tool_names:
        if name in registry:
            spec = registry.get(name)
            if spec.semantic_validator is not None or spec.progress_predicate is not None:
                return True
    return False


def _judged_as(judging: _InLine | _Replayed, judge: Callable[[], T]) -> T:
    token = _judging.set(judging)
    try:
        return judge()
    finally:
        _judging.reset(token)


async def judged_with_rules(
    io: NodeIO,
    registry: ToolRegistry,
    tool_names: Iterable[str],
    judge: Callable[[], T],
    rules: ContainedRules | None = None,
) -> T:
    """Run ``judge`` (gating that may run the named tools' rules through
    :class:`ContainedRules`): in place when none of them has a rule; else, in the sync graph,
    in place with each rule on a fencepost thread, and in the async graph on one fencepost
    thread of the share of ``rules``' tenant (see the module docstring). Without ``rules``, the
    async graph judges off the loop with each rule on a thread of its own."""
    if not has_rules(registry, tool_names):
        return judge()
    if rules is None or not isinstance(io, AsyncIO):
        return await io.off_loop(judge)
    in_line = _InLine(time.monotonic() + max(0.0, rules._seconds()))
    ran = await run_callable_watched(
        lambda: _judged_as(in_line, judge),
        tenant=rules._ctx.tenant_id,
        answer_by=in_line.answer_by,
        gives_up=in_line.gives_up,
    )
    if ran.finished:
        if ran.raised is not None:
            raise ran.raised
        return cast(T, ran.value)
    # A rule did not answer in time (or no thread came for the judgement): judged again off the
    # loop, the rules that answered as they did, the next one timed out, any later contained.
    replayed = _Replayed(in_line.heard())
    return await io.off_loop(lambda: _judged_as(replayed, judge))


__all__ = ["ContainedRules", "has_rules", "judged_with_rules"]
