"""Usage known only after a call (model tokens): judged, then settled against its estimate.

A step reserves an estimate before the model is called; what the model then reports is a typed
:class:`UsageReport`, never an exception. A report that is missing, not a number, negative or
absurdly large is charged the estimate: usage is never trusted blindly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, Strict

from fencepost.policy._model import Frozen
from fencepost.policy.budget import BudgetAxis, RuntimeBudget

MAX_PLAUSIBLE_TOKENS = 10_000_000
"""More tokens than any model call can use: a report above it is a provider bug, not usage."""


class UsageKind(StrEnum):
    """How a step's usage report was judged."""

    REPORTED = "reported"
    UNREPORTED = "unreported"
    IMPLAUSIBLE = "implausible"


class UsageReport(Frozen):
    """A step's token usage as judged, and what it is charged."""

    kind: Annotated[UsageKind, Strict(False)]
    charged: Annotated[int, Field(ge=0)]
    """Tokens the step is charged: the report when it is plausible, else the estimate."""
    input_tokens: int | None = None
    """The provider's input count, when plausible (kept for the trace)."""
    output_tokens: int | None = None
    """The provider's output count, when plausible (kept for the trace)."""


def _count(value: Any) -> int | bool | None:
    """A plausible token count, ``None`` when absent, ``False`` when present but not plausible."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    if not 0 <= value <= MAX_PLAUSIBLE_TOKENS:
        return False
    return value


def usage_report(input_tokens: Any, output_tokens: Any, *, estimate: int) -> UsageReport:
    """Judge a provider's usage report for one step reserved at ``estimate`` tokens.

    >>> usage_report(-5, 10, estimate=100).charged
    100
    """
    counts = (_count(input_tokens), _count(output_tokens))
    if any(c is False for c in counts) or sum(c or 0 for c in counts) > MAX_PLAUSIBLE_TOKENS:
        return UsageReport(kind=UsageKind.IMPLAUSIBLE, charged=estimate)
    if all(c is None for c in counts):
        return UsageReport(kind=UsageKind.UNREPORTED, charged=estimate)
    tokens_in = counts[0] if isinstance(counts[0], int) else None
    tokens_out = counts[1] if isinstance(counts[1], int) else None
    return UsageReport(
        kind=UsageKind.REPORTED,
        charged=(tokens_in or 0) + (tokens_out or 0),
        input_tokens=tokens_in,
        output_tokens=tokens_out,
    )


def step_amounts(estimate: int) -> dict[str, float]:
    """What a model step reserves before the model is called: one step and the token estimate."""
    amounts: dict[str, float] = {BudgetAxis.STEPS.value: 1.0}
    if estimate > 0:
        amounts[BudgetAxis.TOKENS.value] = float(estimate)
    return amounts


def step_settlement(
    report: UsageReport, estimate: int
) -> tuple[dict[str, float], dict[str, float]]:
    """``(actual, overage)`` for settling a step reserved at ``estimate``.

    ``actual`` settles the step's reservation (the unused estimate is refunded); ``overage`` is
    reported usage beyond the estimate, reserved on its own so that it, too, must fit the limits.
    """
    charged = float(report.charged)
    actual: dict[str, float] = {BudgetAxis.STEPS.value: 1.0}
    if estimate > 0:
        actual[BudgetAxis.TOKENS.value] = min(charged, float(estimate))
    overage = charged - float(estimate)
    return actual, ({BudgetAxis.TOKENS.value: overage} if overage > 0 else {})


_INTEGER_AXES = (BudgetAxis.STEPS, BudgetAxis.TOOL_CALLS, BudgetAxis.TOKENS, BudgetAxis.MUTATIONS)


def budget_view(limits: dict[str, float], held: dict[str, float]) -> RuntimeBudget:
    """The run's :class:`RuntimeBudget` as its ledger account holds it: limit and use per axis.

    State carries this view for the trace and the report; limits are checked by the ledger.
    """
    fields: dict[str, Any] = {}
    for axis in BudgetAxis:
        used = held.get(axis.value, 0.0)
        limit = limits.get(axis.value)
        left = None if limit is None else max(0.0, limit - used)
        if axis in _INTEGER_AXES:
            fields[f"{axis.value}_used"] = round(used)
            fields[f"{axis.value}_remaining"] = None if left is None else round(left)
        else:
            fields[f"{axis.value}_used"] = used
            fields[f"{axis.value}_remaining"] = left
    for required in ("steps_remaining", "tool_calls_remaining"):
        if fields[required] is None:
            fields[required] = 0
    return RuntimeBudget.model_construct(**fields)
