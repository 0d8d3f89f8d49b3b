"""Usage known only after a call (model tokens): checked, then settled against its estimate.

A step holds an estimate before the model is called (``reservations.step_hold``); what the
model then reports is a typed :class:`UsageReport`, never an exception. A missing report is
charged the estimate; one that is not a number, negative, absurdly large or smaller than the
reply's length allows is charged the estimate, or what the reply's length must have cost if
more: usage is never trusted blindly.
Whatever is charged is charged in full, past the limit too (``Ledger.charge``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, Strict

from fencepost.policy.budget import BudgetAxis
from fencepost.policy.contract import Frozen
from fencepost.policy.decision import AbstainProposal, FinalProposal, ToolBatch, ToolProposal

MAX_PLAUSIBLE_TOKENS = 10_000_000
"""More tokens than any model call can use: a report above it is a provider bug, not usage."""

MOST_CHARACTERS_PER_TOKEN = 256
"""More characters than any tokenizer packs into one token: a reply of ``n`` characters cost at
least ``n / 256`` output tokens, so a report of fewer (0 tokens for a megabyte) is not usage."""


class UsageKind(StrEnum):
    """Whether a step's usage report was trusted: ``reported`` (charged as given), else why not."""

    REPORTED = "reported"
    UNREPORTED = "unreported"
    IMPLAUSIBLE = "implausible"


class UsageReport(Frozen):
    """A step's token usage as checked, and what it is charged."""

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
    """Check a provider's usage report for one step reserved at ``estimate`` tokens, whose reply
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
