"""Usage known only after a call (model tokens): judged, then settled against its estimate.

A step holds an estimate before the model is called (``reservations.step_hold``); what the model then
reports is a typed :class:`UsageReport`, never an exception. A missing report is charged the
estimate; one that is not a number, negative, absurdly large or smaller than the reply's length
allows is charged the estimate, or what the reply's length must have cost if more: usage is
never trusted blindly.
Whatever is charged is charged in full, past the limit too (``Ledger.charge``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, Strict

from fencepost.policy.budget import BudgetAxis, RuntimeBudget
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.decision import AbstainProposal, FinalProposal, ToolProposal
from fencepost.policy.decision_model import ToolBatch

MAX_PLAUSIBLE_TOKENS = 10_000_000
"""More tokens than any model call can use: a report above it is a provider bug, not usage."""

MOST_CHARACTERS_PER_TOKEN = 256
"""More characters than any tokenizer packs into one token: a reply of ``n`` characters cost at
least ``n / 256`` output tokens, so a report of fewer (0 tokens for a megabyte) is not usage."""


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


def reply_size(decision: object) -> int:
    """Characters the model must have written to give ``decision``: the text of its answer and
    citations, or each call's tool name and arguments (every key and string, a character for
    any other value). A lower bound, cheap to take: nothing is serialised."""
    if isinstance(decision, FinalProposal):
        answer = decision.answer
        return len(answer.text) + sum(len(c) for c in answer.citations)
    if isinstance(decision, AbstainProposal):
        return 1
    calls: tuple[ToolProposal, ...]
    if isinstance(decision, ToolBatch):
        calls = decision.calls
    elif isinstance(decision, ToolProposal):
        calls = (decision,)
    else:
        return 0
    size = 0
    stack: list[Any] = []
    for proposal in calls:
        size += len(proposal.tool_name)
        stack.append(proposal.arguments)
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item)
        elif isinstance(item, dict):
            size += sum(len(k) if isinstance(k, str) else 1 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            size += 1
            stack.extend(item)
        else:
            size += 1
    return size


def usage_report(
    input_tokens: Any, output_tokens: Any, *, estimate: int, reply_chars: int = 0
) -> UsageReport:
    """Judge a provider's usage report for one step reserved at ``estimate`` tokens, whose reply
    was ``reply_chars`` characters long (:func:`reply_size`).

    A report is trusted only when both counts it gives are plausible integers and the output
    covers the reply's length. No report is charged the estimate; one that cannot be right is
    charged the estimate, or the least the reply's length can have cost when that is more.

    >>> usage_report(-5, 10, estimate=100).charged
    100
    """
    floor = -(-max(0, reply_chars) // MOST_CHARACTERS_PER_TOKEN)
    counts = (_count(input_tokens), _count(output_tokens))
    if any(c is False for c in counts) or sum(c or 0 for c in counts) > MAX_PLAUSIBLE_TOKENS:
        return UsageReport(kind=UsageKind.IMPLAUSIBLE, charged=max(estimate, floor))
    if all(c is None for c in counts):
        return UsageReport(kind=UsageKind.UNREPORTED, charged=estimate)
    tokens_in = counts[0] if isinstance(counts[0], int) else None
    tokens_out = counts[1] if isinstance(counts[1], int) else None
    if (tokens_out or 0) < floor:
        return UsageReport(kind=UsageKind.IMPLAUSIBLE, charged=max(estimate, floor))
    return UsageReport(
        kind=UsageKind.REPORTED,
        charged=(tokens_in or 0) + (tokens_out or 0),
        input_tokens=tokens_in,
        output_tokens=tokens_out,
    )


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
# Per axis: its ledger name, the view's two field names, and whether it counts whole units.
_VIEW_FIELDS = tuple(
    (axis.value, f"{axis.value}_used", f"{axis.value}_remaining", axis in _INTEGER_AXES)
    for axis in BudgetAxis
)
_ALWAYS_LIMITED = ("steps_remaining", "tool_calls_remaining")


def budget_view(limits: dict[str, float], held: dict[str, float]) -> RuntimeBudget:
    """The run's :class:`RuntimeBudget` as its ledger account holds it: limit and use per axis.

    State carries this view for the trace and the report; limits are checked by the ledger.
    """
    remaining: dict[str, Any] = {}
    spent: dict[str, Any] = {}
    for name, used_field, remaining_field, whole in _VIEW_FIELDS:
        used = held.get(name, 0.0)
        limit = limits.get(name)
        left = None if limit is None else max(0.0, limit - used)
        if whole:
            spent[used_field] = round(used)
            remaining[remaining_field] = None if left is None else round(left)
        else:
            spent[used_field] = used
            remaining[remaining_field] = left
    for required in _ALWAYS_LIMITED:
        if remaining[required] is None:
            remaining[required] = 0
    # In the order the fields are declared, as validation would have made them.
    fields = remaining | spent
    return assemble(RuntimeBudget, fields)
