"""How a tool's own rules are run: its ``semantic_validator`` and its ``progress_predicate``.

A rule is application code run while a batch is gated. One that raises is already contained
(:func:`~fencepost.policy.gates.check_semantics`); one that blocks or never returns must not
hold the run past its deadline either. The gates call each rule through a :class:`RuleRunner`:
by default the rule is called directly (policy runs no threads); the graph's gate passes one that
runs it on a fencepost thread and leaves it behind after at most :data:`RULE_TIMEOUT_SECONDS`
(or the run's deadline, if sooner), raising :class:`RuleTimedOut`. Fail closed: a semantic
validator that did not answer in time refuses the call with the rule :data:`RULE_TIMEOUT`; a
progress predicate that did not answer has shown no progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")

RULE_TIMEOUT_SECONDS = 10.0
"""The longest a tool's rule is given for one call (the run's deadline may cut it)."""

RULE_TIMEOUT = "rule_timeout"
"""The rule of a semantic refusal whose validator did not answer in time (fail closed)."""


class RuleTimedOut(Exception):
    """A rule did not answer in time: it was left behind, its late answer is never heard."""


class RuleRunner(Protocol):
    """Runs one rule (a callable of no arguments): returns what it returned, raises what it
    raised, or raises :class:`RuleTimedOut` when it did not answer in time."""

    def __call__(self, rule: Callable[[], T], /) -> T:
        """Run ``rule`` and return its value."""
        ...


def run_directly(rule: Callable[[], T], /) -> T:
    """The default :class:`RuleRunner`: call the rule on the calling thread, with no limit."""
    return rule()


__all__ = ["RULE_TIMEOUT", "RULE_TIMEOUT_SECONDS", "RuleRunner", "RuleTimedOut", "run_directly"]
