"""Usage known only after a call (model tokens): checked, then settled against its estimate.

A step holds an estimate before the model is called (``reservations.step_hold``: the input it
sends, counted, plus the model's output cap); what the model then reports is a typed
:class:`UsageReport`, never an exception. A plausible report is charged as given. A missing
report, or one that is not a number, negative, absurdly large or smaller than the reply's
length allows, is charged a count of the text actually sent and received (:func:`text_tokens`
of :func:`input_text` and :func:`reply_text`, or a tokenizer's count of the same text), never
the hold: a hold is an upper bound, not usage.
Whatever is charged is charged in full, past the limit too (``Ledger.charge``): concurrent runs
sharing a limit can overshoot it by at most each in-flight step's reply beyond its estimate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, Strict

from fencepost.policy.budget import BudgetAxis
from fencepost.policy.contract import Frozen
from fencepost.policy.decision import AbstainProposal, FinalProposal, ToolBatch, ToolProposal
from fencepost.policy.decision_model import DecisionInput

MAX_PLAUSIBLE_TOKENS = 10_000_000
"""More tokens than any model call can use: a report above it is a provider bug, not usage."""

MOST_CHARACTERS_PER_TOKEN = 256
"""More characters than any tokenizer packs into one token: a reply of ``n`` characters cost at
least ``n / 256`` output tokens, so a report of fewer (0 tokens for a megabyte) is not usage."""


CHARACTERS_PER_TOKEN = 4
"""The ratio text is counted at when no tokenizer is installed: four characters a token, the
usual figure for English text with OpenAI's and Anthropic's tokenizers (code and JSON run
nearer three, so a count is a fair estimate, not a bound)."""


def text_tokens(chars: int) -> int:
    """Tokens ``chars`` characters of text count for, at :data:`CHARACTERS_PER_TOKEN` (rounded
    up: any text is at least a token).

    >>> text_tokens(0), text_tokens(1), text_tokens(4_001)
    (0, 1, 1001)
    """
    return -(-max(0, chars) // CHARACTERS_PER_TOKEN)


def _strings(value: Any) -> Iterator[str]:
    """The text in ``value``: each string, each key of a mapping, and any other scalar as JSON."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, inner in item.items():
                yield str(key)
                stack.append(inner)
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
        elif item is not None:
            yield json.dumps(item, default=str)


def input_text(inp: DecisionInput) -> str:
    """The text a decision model is given for ``inp``: the question, each observation (tool,
    result or error code), each proposal's tool and arguments, the tool catalog, repair notes
    and pending tasks. What a step's hold counts its input from, and what an unreported step is
    charged for sending; a renderer adds its own framing (a system prompt), which it may count
    into the model's output cap."""
    parts: list[str] = [inp.question]
    for obs in inp.observations:
        parts.append(obs.tool_name)
        parts.extend(_strings(obs.result if obs.error_code is None else obs.error_code.value))
    for proposal in inp.proposals:
        parts.append(proposal.tool_name)
        parts.extend(_strings(proposal.arguments))
    parts.extend(_strings(list(inp.catalog)))
    parts.extend(inp.repair)
    parts.extend(inp.pending_tasks)
    return "\n".join(parts)


def reply_text(decision: object) -> str:
    """The text a model wrote to give ``decision``: its answer and citations, its abstention's
    reason, or each call's tool name and arguments."""
    if isinstance(decision, FinalProposal):
        return "\n".join([decision.answer.text, *decision.answer.citations])
    if isinstance(decision, AbstainProposal):
        return decision.reason
    calls: tuple[ToolProposal, ...]
    if isinstance(decision, ToolBatch):
        calls = decision.calls
    elif isinstance(decision, ToolProposal):
        calls = (decision,)
    else:
        return ""
    return "\n".join(part for p in calls for part in (p.tool_name, *_strings(p.arguments)))


class UsageKind(StrEnum):
    """Whether a step's usage report was trusted: ``reported`` (charged as given), else why not."""

    REPORTED = "reported"
    UNREPORTED = "unreported"
    IMPLAUSIBLE = "implausible"


class UsageReport(Frozen):
    """A step's token usage as checked, and what it is charged."""

    kind: Annotated[UsageKind, Strict(False)]
    charged: Annotated[int, Field(ge=0)]
    """Tokens the step is charged: the report when it is plausible, else the count of the text
    sent and received (the hold, for a call that failed: what it cost is unknown)."""
    input_tokens: int | None = None
    """The provider's input count, when plausible (kept for the trace)."""
    output_tokens: int | None = None
    """The provider's output count, when plausible (kept for the trace)."""
    cached_input_tokens: int | None = None
    """Of the input count, what the provider read from its cache, when plausible (at most the
    input count): priced at the model's cached price."""


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
    input_tokens: Any,
    output_tokens: Any,
    *,
    counted: int,
    reply_chars: int = 0,
    cached_input_tokens: Any = None,
) -> UsageReport:
    """Check a provider's usage report for one step whose text sent and received counts
    ``counted`` tokens (:func:`input_text` and :func:`reply_text`, counted), and whose reply was
    ``reply_chars`` characters long (:func:`reply_size`).

    A report is trusted only when both counts it gives are plausible integers and the output
    covers the reply's length. No report, or one that cannot be right, is charged ``counted``
    (at least what the reply's length must have cost): never the step's hold.

    >>> usage_report(-5, 10, counted=30).charged
    30
    """
    floor = -(-max(0, reply_chars) // MOST_CHARACTERS_PER_TOKEN)
    counts = (_count(input_tokens), _count(output_tokens))
    if any(c is False for c in counts) or sum(c or 0 for c in counts) > MAX_PLAUSIBLE_TOKENS:
        return UsageReport(kind=UsageKind.IMPLAUSIBLE, charged=max(0, counted, floor))
    if all(c is None for c in counts):
        return UsageReport(kind=UsageKind.UNREPORTED, charged=max(0, counted))
    counted = max(0, counted, floor)
    tokens_in = counts[0] if isinstance(counts[0], int) else None
    tokens_out = counts[1] if isinstance(counts[1], int) else None
    if (tokens_out or 0) < floor:
        return UsageReport(kind=UsageKind.IMPLAUSIBLE, charged=counted)
    cached = _count(cached_input_tokens)
    return UsageReport(
        kind=UsageKind.REPORTED,
        charged=(tokens_in or 0) + (tokens_out or 0),
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        # A cache count above the input count cannot be right: the input is priced in full.
        cached_input_tokens=cached
        if isinstance(cached, int) and cached <= (tokens_in or 0)
        else None,
    )


def step_settlement(
    report: UsageReport, estimate: int, *, money: tuple[int, int] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """``(actual, overage)`` for settling a step reserved at ``estimate`` tokens (and, given
    ``money``, ``(held, charged)`` micro-units of money: :mod:`fencepost.policy.pricing`).

    ``actual`` settles the step's reservation (the unused estimate is refunded); ``overage`` is
    usage beyond the estimate, charged on its own: spent already, it crosses a limit if it must.
    """
    charged = float(report.charged)
    actual: dict[str, float] = {BudgetAxis.STEPS.value: 1.0}
    overages: dict[str, float] = {}
    if estimate > 0:
        actual[BudgetAxis.TOKENS.value] = min(charged, float(estimate))
    overage = charged - float(estimate)
    if overage > 0:
        overages[BudgetAxis.TOKENS.value] = overage
    if money is not None:
        held, cost = money
        actual[BudgetAxis.MONEY.value] = float(min(held, cost))
        if cost > held:
            overages[BudgetAxis.MONEY.value] = float(cost - held)
    return actual, overages
