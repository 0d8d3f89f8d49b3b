"""A tool's own rules (its ``semantic_validator``, its ``progress_predicate``), run contained.

The gates (:mod:`fencepost.policy.gates`) call each rule through a
:class:`~fencepost.policy.rule_runner.RuleRunner`; the graph's runs it on a fencepost thread from
the run's tenant's share, as a sync tool body or an approver runs, and waits no longer than
:data:`~fencepost.policy.rule_runner.RULE_TIMEOUT_SECONDS` within the run's deadline: one that
blocks is left behind and the call fails closed (:class:`~fencepost.policy.rule_runner.
RuleTimedOut`). The wait blocks a thread, so over an event loop the gate judges a batch off the
loop (:meth:`~fencepost.graph.node_io.NodeIO.off_loop`) — only a batch that names a tool with a
rule: the others are judged in place, with no thread hop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar, cast

from fencepost.graph.containment.tools import run_callable_blocking
from fencepost.graph.node_io import NodeIO
from fencepost.policy.context import RunContext
from fencepost.policy.deadline import Clock, Deadline, stage_deadline
from fencepost.policy.registry import ToolRegistry
from fencepost.policy.rule_runner import RULE_TIMEOUT_SECONDS, RuleTimedOut

T = TypeVar("T")


class ContainedRules:
    """The graph's :class:`~fencepost.policy.rule_runner.RuleRunner` for one run's context."""

    __slots__ = ("_clock", "_ctx")

    def __init__(self, ctx: RunContext, clock: Clock) -> None:
        self._ctx = ctx
        self._clock = clock

    def __call__(self, rule: Callable[[], T], /) -> T:
        """Run ``rule`` on a fencepost thread; raise :class:`RuleTimedOut` if it did not answer
        in time (no time left included), else return or raise what it did."""
        clock = self._clock
        run_deadline = self._ctx.deadline or Deadline.after(RULE_TIMEOUT_SECONDS, clock=clock)
        timeout = stage_deadline(
            run_deadline, max_stage_seconds=RULE_TIMEOUT_SECONDS, clock=clock
        ).remaining_seconds(clock=clock)
        ran = run_callable_blocking(rule, timeout_seconds=timeout, tenant=self._ctx.tenant_id)
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


async def judged_with_rules(
    io: NodeIO,
    registry: ToolRegistry,
    tool_names: Iterable[str],
    judge: Callable[[], T],
) -> T:
    """Run ``judge`` (gating that may run the named tools' rules through
    :class:`ContainedRules`): in place when none of them has a rule, else off the event loop."""
    if not has_rules(registry, tool_names):
        return judge()
    return await io.off_loop(judge)


__all__ = ["ContainedRules", "has_rules", "judged_with_rules"]
