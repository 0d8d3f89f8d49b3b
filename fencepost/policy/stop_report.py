"""The stop report: what a run that ended tells its user, derived from receipts and its reason.

One row of the contract's table per kind of end:

========================  ====================================================================
kind                      what the report says
========================  ====================================================================
``completed``             the verified results and where they are (completed calls, citations)
``failed``                the cause code and the effects already made
``waiting_for_input``     the one condition needed (approval of a call, or a clarification)
``stopped``               what completed, what never started, what is uncertain or pending
========================  ====================================================================

Nothing here reads model text: a report holds codes, call ids and registered tool names only.
Work accepted is not work done: an ``accepted_pending`` call is reported pending, never done;
a call reporting a run that did not complete (a child run) is ``failed``, ``incomplete``.
Stopping is not undoing: effects already made are listed whatever the kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Literal, Protocol

from pydantic import Field, Strict

from fencepost.policy.batch import BatchEntry
from fencepost.policy.budget import BudgetStop
from fencepost.policy.contract import Frozen, assemble
from fencepost.policy.effect import Effect
from fencepost.policy.error_codes import ErrorCode
from fencepost.policy.hints import what_to_do
from fencepost.policy.observation import AnswerPayload
from fencepost.policy.phase import TerminationReason
from fencepost.policy.receipt import Receipt, ReceiptStatus, current_receipts
from fencepost.policy.verdict import VerdictCode


class StopKind(StrEnum):
    """The row of the contract's table a run's end falls in."""

    COMPLETED = "completed"
    """The required end state was reached and verified."""
    FAILED = "failed"
    """Not achievable on the allowed path: refused, invalid, no progress, no evidence, an error."""
    WAITING_FOR_INPUT = "waiting_for_input"
    """A real user decision is needed: an approval or a clarification."""
    STOPPED = "stopped"
    """Cut short by a limit (steps, tool calls, the deadline) or a cancel: a budget stop."""


_KIND: dict[TerminationReason, StopKind] = {
    TerminationReason.COMPLETED: StopKind.COMPLETED,
    TerminationReason.INSUFFICIENT_EVIDENCE: StopKind.FAILED,
    TerminationReason.INVALID_PROPOSAL: StopKind.FAILED,
    TerminationReason.NO_PROGRESS: StopKind.FAILED,
    TerminationReason.POLICY_DENIED: StopKind.FAILED,
    TerminationReason.FAILED: StopKind.FAILED,
    TerminationReason.NEEDS_CLARIFICATION: StopKind.WAITING_FOR_INPUT,
    TerminationReason.APPROVAL_REQUIRED: StopKind.WAITING_FOR_INPUT,
    TerminationReason.STEP_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.TOOL_BUDGET_EXHAUSTED: StopKind.STOPPED,
    TerminationReason.DEADLINE_EXCEEDED: StopKind.STOPPED,
    TerminationReason.CANCELLED: StopKind.STOPPED,
}

SAFE_CODE = r"^[a-z][a-z0-9_]{0,63}$"
_SAFE_CODE = re.compile(SAFE_CODE)
_MARKUP_OPEN = re.compile(r"(\\*)\[")
_MARKUP_TAG = re.compile(r"\[[a-z#/@][^[]*?]")
_TRAILING_BACKSLASHES = re.compile(r"(\\+)$")
_UNREADABLE_CODE = "unreadable_code"
_WAITS_FOR_APPROVAL = frozenset({VerdictCode.APPROVAL_REQUIRED, VerdictCode.APPROVAL_PENDING})
# Effects that may have reached the world: done, possibly done, or accepted and under way.
_EFFECT_STARTED = frozenset(
    {ReceiptStatus.COMPLETED, ReceiptStatus.UNCERTAIN, ReceiptStatus.ACCEPTED_PENDING}
)


def _effect_started(receipt: Receipt) -> bool:
    """Whether the call's write or external effect may have reached the world: a call that ran
    to its report without completing (a child run stopped half-way) may have made some."""
    if receipt.effect in (None, Effect.READ):
        return False
    return receipt.status in _EFFECT_STARTED or receipt.error_code is ErrorCode.INCOMPLETE


def kind_of(reason: TerminationReason) -> StopKind:
    """The table row ``reason`` is reported in (a reason this module does not know is a failure,
    never a success)."""
    return _KIND.get(reason, StopKind.FAILED)


class ReportedCall(Frozen):
    """One call as the report lists it: ids and codes, never arguments or results."""

    call_id: str
    """The call's id: where its result (or error) is in the run's observations and receipts."""
    tool_name: str
    """The tool the call named."""
    error_code: Annotated[ErrorCode | None, Strict(False)] = None
    """The receipt's safe error code, if the call failed or did not run."""
    verdict: Annotated[VerdictCode | None, Strict(False)] = None
    """For a call with no receipt: the gate's verdict it was left with (why it never started)."""
    effect: Annotated[Effect | None, Strict(False)] = None
    """The tool's effect, when the receipt recorded it."""
    missing_capability: str | None = None
    """For a call refused for a capability: the one the principal lacks (the registered tool's,
    from trusted configuration) — what to grant for it to run."""
    approval: Literal["approver", "human"] | None = None
    """Who answered the call's approval: the approver policy or a human (``None``: none)."""
    approved_by: str | None = None
    """With a human's answer: the id of the principal who gave it (the requester, or an
    approver of its tenant)."""


class Waiting(Frozen):
    """The one condition a run that waits for input needs before it can go on."""

    condition: Literal["approval", "clarification"]
    """What is needed: a human's approval of calls, or the user's clarification of the question."""
    calls: Annotated[tuple[str, ...], Strict(False)] = ()
    """With ``approval``: the call ids waiting for it (their tools are in ``never_started``)."""

    def __str__(self) -> str:
        return self.described({})

    def described(self, tools: dict[str, str]) -> str:
        """The condition in words, each call followed by its tool where ``tools`` names it."""
        if self.condition == "clarification":
            return "clarification"
        named = [f"{c} ({tools[c]})" if c in tools else c for c in self.calls]
        return "approval of " + (", ".join(named) or "a call")


class StopReport(Frozen):
    """How a run ended, in the contract's words, derived only from receipts and its reason.

    Each call of the run is in exactly one of ``completed``, ``failed``, ``never_started``,
    ``uncertain`` and ``pending`` (its latest receipt decides; a proposal left without a receipt
    never started). ``effects_made`` and ``cited`` point into those lists by call id.
    """

    kind: Annotated[StopKind, Strict(False)]
    """The row of the contract's table: completed, failed, waiting for input, or stopped."""
    reason: Annotated[TerminationReason | None, Strict(False)] = None
    """The run's terminal reason; ``None`` for a run paused for approval (it has not ended)."""
    error_code: Annotated[str | None, Field(pattern=SAFE_CODE)] = None
    """The stop's safe code: the cause of a failure, the limit that stopped a run."""
    completed: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose result was verified done."""
    failed: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls that ran and failed, with their safe error codes."""
    never_started: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls refused (denied: policy, budget, a human) or proposed and never run."""
    uncertain: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose effect may or may not have happened (a crash mid-call): not guessed."""
    pending: Annotated[tuple[ReportedCall, ...], Strict(False)] = ()
    """Calls whose work was accepted (a task id) but not shown done: accepted is not done."""
    effects_made: Annotated[tuple[str, ...], Strict(False)] = ()
    """Call ids of write or external effects that were made, may have been, or are under way.
    Stopping does not undo them."""
    cited: Annotated[tuple[str, ...], Strict(False)] = ()
    """Call ids of completed calls the final answer cites as its evidence."""
    waiting_for: Waiting | None = None
    """With ``waiting_for_input``: the one condition needed."""
    forked_from: str | None = None
    """The checkpoint the run was forked from (time travel), for a run that is a fork."""
    budget: BudgetStop | None = None
    """For a budget stop the ledger refused: which account, axis and spend window stopped it."""
    answer_repeats_untrusted: bool = False
    """Whether the final answer repeats text that came only from untrusted tool output: a run
    of :data:`~fencepost.policy.provenance.ANSWER_SPAN_WORDS` words, or an identifier (URL,
    host, email, account id), found in an untrusted output and in none of the request, the app
    data and the trusted outputs. An application may hold such an answer back."""
    answer_untrusted_calls: Annotated[tuple[str, ...], Strict(False)] = ()
    """With ``answer_repeats_untrusted``: the call ids of the untrusted outputs it repeats."""

    @property
    def what_to_do(self) -> str | None:
        """One sentence on what to do about this stop's code, where it has one: for a capability
        denial, which capability to grant."""
        if self.error_code == VerdictCode.CAPABILITY_DENIED.value:
            return capability_hint(self) or what_to_do(self.error_code)
        if self.budget is not None:
            return self.budget.what_to_do() or what_to_do(self.error_code)
        return what_to_do(self.error_code)

    @property
    def missing_capabilities(self) -> tuple[str, ...]:
        """The capabilities calls of this run were refused for, each once, in call order."""
        return tuple(
            dict.fromkeys(
                c.missing_capability for c in self.never_started if c.missing_capability is not None
            )
        )

    def rows(self) -> list[Row]:
        """The report as ``fencepost show`` lays it out: ``(label, ((text, style), ...))`` rows,
        the label empty under the first call of a list. Styles are rich style names."""
        return report_rows(self)

    def __str__(self) -> str:
        return render_text(self)

    def __rich__(self) -> str:
        """The same text for rich (``rich.print(report)``), in rich markup (values escaped)."""
        return render_text(self, markup=True)

    @property
    def calls(self) -> int:
        """How many calls the report accounts for (each in exactly one list)."""
        return (
            len(self.completed)
            + len(self.failed)
            + len(self.never_started)
            + len(self.uncertain)
            + len(self.pending)
        )


class Ended(Protocol):
    """What a report is derived from: a terminal state's receipts, reason, code and citations."""

    @property
    def receipts(self) -> Sequence[Receipt]: ...
    @property
    def termination(self) -> TerminationReason | None: ...
    @property
    def last_error_code(self) -> str | None: ...
    @property
    def final_answer(self) -> AnswerPayload | None: ...


_REPORTED_FROM_RECEIPT = frozenset(
    [
        "call_id",
        "tool_name",
        "error_code",
        "effect",
        "approval",
        "approved_by",
        "missing_capability",
    ]
)


def _reported(receipt: Receipt) -> ReportedCall:
    # A receipt's fields were validated as the same types the report's are: assembled, not
    # validated again (a run's end reports every call it made).
    fields = receipt.__dict__
    values = {name: fields[name] for name in _REPORTED_FROM_RECEIPT}
    values["verdict"] = None
    return assemble(ReportedCall, values, _REPORTED_FROM_RECEIPT)


def _unstarted(entry: BatchEntry) -> ReportedCall:
    """A proposal left without a receipt, with the verdict that held it back."""
    verdict = entry.verdict
    return ReportedCall(
        call_id=entry.call_id,
        tool_name=entry.proposal.tool_name,
        verdict=verdict.code,
        missing_capability=verdict.missing_capability,
    )


def capability_hint(report: StopReport) -> str | None:
    """What to do about calls refused for a capability: the capabilities to grant, by name,
    and where (``None`` when no call of ``report`` was). The names are the registered tools'
    (trusted configuration), never anything the model sent."""
    missing = report.missing_capabilities
    if not missing:
        return None
    named = ", ".join(repr(c) for c in missing)
    noun, pronoun = ("capability", "it") if len(missing) == 1 else ("capabilities", "them")
    return (
        f"the principal lacks the {noun} {named} the refused call needs: grant {pronoun} in the "
        f"context the run is invoked with, fp.Principal(id=..., capabilities={{..., {named}}}), "
        "or leave the tool out of the registry"
    )


def _safe(code: str | None) -> str | None:
    if code is None or _SAFE_CODE.fullmatch(code):
        return code
    return _UNREADABLE_CODE


def stop_report(
    state: Ended,
    *,
    unfinished: Sequence[BatchEntry] = (),
    budget: BudgetStop | None = None,
    answer_untrusted: Sequence[str] = (),
) -> StopReport:
    """The stop report of a run that ended.

    ``unfinished`` is the batch the run was carrying out when it stopped (a terminal state no
    longer holds it): its proposals without a receipt never started, and those waiting for an
    approval are the condition an ``approval_required`` run needs. ``budget`` is what the ledger
    said stopped it (account, axis, window). ``answer_untrusted``: the call ids of the untrusted
    outputs the final answer repeats (:func:`fencepost.policy.run_sources.answer_untrusted`).
    Raises ``ValueError`` for a state with no terminal reason.
    """
    reason = state.termination
    if reason is None:
        raise ValueError("a stop report is made for a run that ended")
    buckets: dict[ReceiptStatus, list[ReportedCall]] = {status: [] for status in ReceiptStatus}
    effects: list[str] = []
    latest = current_receipts(state.receipts)
    for receipt in latest:
        buckets[receipt.status].append(_reported(receipt))
        if _effect_started(receipt):
            effects.append(receipt.call_id)
    receipted = {r.call_id for r in latest}
    left = [e for e in unfinished if e.call_id not in receipted]
    never_started = buckets[ReceiptStatus.DENIED] + [
        _unstarted(e) for e in dict((e.call_id, e) for e in left).values()
    ]
    done = {c.call_id for c in buckets[ReceiptStatus.COMPLETED]}
    answer = state.final_answer
    kind = kind_of(reason)
    return StopReport(
        kind=kind,
        reason=reason,
        error_code=_safe(state.last_error_code),
        completed=tuple(buckets[ReceiptStatus.COMPLETED]),
        failed=tuple(buckets[ReceiptStatus.FAILED]),
        never_started=tuple(never_started),
        uncertain=tuple(buckets[ReceiptStatus.UNCERTAIN]),
        pending=tuple(buckets[ReceiptStatus.ACCEPTED_PENDING]),
        effects_made=tuple(effects),
        cited=tuple(c for c in (answer.citations if answer else ()) if c in done),
        waiting_for=_waiting(reason, left),
        forked_from=getattr(state, "forked_from", None),
        budget=budget,
        answer_repeats_untrusted=bool(answer_untrusted),
        answer_untrusted_calls=tuple(answer_untrusted),
    )


def _waiting(reason: TerminationReason, left: Sequence[BatchEntry]) -> Waiting | None:
    if reason is TerminationReason.NEEDS_CLARIFICATION:
        return Waiting(condition="clarification")
    if reason is TerminationReason.APPROVAL_REQUIRED:
        calls = tuple(
            dict.fromkeys(e.call_id for e in left if e.verdict.code in _WAITS_FOR_APPROVAL)
        )
        return Waiting(condition="approval", calls=calls)
    return None


_ROWS = (
    ("completed", "completed"),
    ("failed", "failed"),
    ("uncertain", "uncertain"),
    ("pending", "pending"),
    ("never_started", "never started"),
)


def _call_code(call: ReportedCall) -> tuple[tuple[str, str], ...]:
    parts: list[tuple[str, str]] = []
    if call.error_code is not None:
        parts.append((call.error_code.value, "red"))
    if call.verdict is not None:
        allowed = call.verdict is VerdictCode.ALLOWED
        parts.append(("allowed, not run", "dim") if allowed else (call.verdict.value, "yellow"))
    if call.effect is not None and call.effect is not Effect.READ:
        parts.append((call.effect.value, "yellow"))
    if call.missing_capability is not None:
        parts.append((f"missing capability {call.missing_capability}", "yellow"))
    return tuple(parts)


def report_head(report: StopReport) -> tuple[tuple[str, str], ...]:
    """The first line: the kind, then the reason and the code where they say more."""
    reason = report.reason.value if report.reason is not None else "not ended"
    head: list[tuple[str, str]] = [("stop report ", "bold"), (report.kind.value, "")]
    head += [(f" · {p}", "dim") for p in dict.fromkeys((reason, report.error_code or "")) if p]
    return tuple(h for h in head if h[0] != f" · {report.kind.value}")


Row = tuple[str, tuple[tuple[str, str], ...]]
"""A row of the report as text: its label and its ``(text, rich style)`` parts."""


def call_rows(report: StopReport) -> list[Row]:
    """Each call in its list (the label only on a list's first call): id, tool, codes."""
    rows: list[Row] = []
    for field, label in _ROWS:
        for n, call in enumerate(getattr(report, field)):
            code = _call_code(call)
            joined = tuple(
                (("· " if i else "") + text, style) for i, (text, style) in enumerate(code)
            )
            if call.approved_by is not None:
                joined += (("· approved by " + call.approved_by, "dim"),)
            rows.append(("" if n else label, ((call.call_id, ""), (call.tool_name, ""), *joined)))
    return rows


def note_rows(report: StopReport) -> list[Row]:
    """What was cited, what the run waits for, the effects made and what to do."""
    rows: list[Row] = []
    if report.cited:
        rows.append(("cited", ((", ".join(report.cited), ""),)))
    if report.waiting_for is not None:
        tools = {c.call_id: c.tool_name for c in report.never_started}
        rows.append(("waiting for", ((report.waiting_for.described(tools), "cyan"),)))
    if report.budget is not None:
        rows.append(("stopped by", _budget_parts(report.budget)))
    if report.answer_repeats_untrusted:
        calls = ", ".join(report.answer_untrusted_calls)
        rows.append(("answer repeats", ((f"untrusted output of {calls}", "yellow"),)))
    if report.kind is not StopKind.COMPLETED or report.effects_made:
        # Stopping is not undoing: say which effects are out there, or that none are.
        rows.append(("effects made", ((", ".join(report.effects_made) or "none", ""),)))
    hint = report.what_to_do
    if hint:
        rows.append(("what to do", ((hint, ""),)))
    return rows


def _budget_parts(budget: BudgetStop) -> tuple[tuple[str, str], ...]:
    own = budget.own or not budget.account
    parts = [("the run's account" if own else f"account {budget.account}", "")]
    if budget.window is not None:
        parts.append((f"· window {budget.window}", "yellow"))
    parts.append((f"· {budget.axis} limit {budget.limit:g}", ""))
    if budget.resets_at is not None:
        parts.append((f"· frees at {budget.resets_at.isoformat()}", "cyan"))
    return tuple(parts)


def report_rows(report: StopReport) -> list[Row]:
    """The rows ``fencepost show`` prints under the head: the calls, then the notes."""
    return call_rows(report) + note_rows(report)


def markup_escaped(text: str) -> str:
    """``text`` as rich markup that renders as exactly ``text``, whatever it holds (a call id is
    the model's: 8 to 128 characters of anything).

    ``rich.markup.escape`` covers a ``[`` that reads as a tag; rich also drops a backslash before
    any other ``[``, and one left at the end would escape the closing tag that follows (the
    text is to be followed by one).
    """

    def bracket(match: re.Match[str]) -> str:
        slashes = match.group(1)
        if _MARKUP_TAG.match(text, match.end(1)):
            return slashes * 2 + "\\["
        return slashes + "\\["

    text = _MARKUP_OPEN.sub(bracket, text)
    return _TRAILING_BACKSLASHES.sub(lambda m: m.group(1) * 2, text)


def render_text(report: StopReport, *, markup: bool = False) -> str:
    """The report as lines of text (with ``markup``: rich markup for the same text)."""

    def span(text: str, style: str) -> str:
        if not markup:
            return text
        # Always inside a tag ("none" is rich's empty style): escaped text ending in backslashes
        # is then always followed by a closing tag, which is what markup_escaped provides for.
        style = style or "none"
        return f"[{style}]{markup_escaped(text)}[/{style}]"

    head = "".join(span(t, s) for t, s in report_head(report))
    rows = report_rows(report)
    width = max((len(label) for label, _ in rows), default=0)
    lines = [head]
    for label, parts in rows:
        cells = "  ".join(span(t, s) for t, s in parts)
        lines.append(f"  {span(label.ljust(width), 'dim')}  {cells}".rstrip())
    return "\n".join(lines)


class Paused(Protocol):
    """What a paused run's report is derived from: its receipts and its current batch."""

    @property
    def receipts(self) -> Sequence[Receipt]: ...
    @property
    def batch(self) -> Sequence[BatchEntry]: ...


def paused_report(state: Paused) -> StopReport | None:
    """The report of a run paused for a human's approval: ``waiting_for_input``, with no reason
    (it has not ended), ``waiting_for`` naming the calls that wait, those calls
    never started, and what the run's receipts already say. ``None`` when nothing in the batch
    waits for approval (a run still going, or one that has ended)."""
    waiting = [e for e in state.batch if e.verdict.code in _WAITS_FOR_APPROVAL]
    if not waiting:
        return None
    unique = list(dict((e.call_id, e) for e in waiting).values())
    buckets: dict[ReceiptStatus, list[ReportedCall]] = {status: [] for status in ReceiptStatus}
    effects: list[str] = []
    for receipt in current_receipts(state.receipts):
        buckets[receipt.status].append(_reported(receipt))
        if receipt.effect not in (None, Effect.READ) and receipt.status in _EFFECT_STARTED:
            effects.append(receipt.call_id)
    receipted = {c.call_id for calls in buckets.values() for c in calls}
    left = [e for e in state.batch if e.call_id not in receipted]
    never_started = buckets[ReceiptStatus.DENIED] + [
        _unstarted(e) for e in dict((e.call_id, e) for e in left).values()
    ]
    return StopReport(
        kind=StopKind.WAITING_FOR_INPUT,
        reason=None,
        error_code=_safe(VerdictCode.APPROVAL_PENDING.value),
        completed=tuple(buckets[ReceiptStatus.COMPLETED]),
        failed=tuple(buckets[ReceiptStatus.FAILED]),
        never_started=tuple(never_started),
        uncertain=tuple(buckets[ReceiptStatus.UNCERTAIN]),
        pending=tuple(buckets[ReceiptStatus.ACCEPTED_PENDING]),
        effects_made=tuple(effects),
        waiting_for=Waiting(condition="approval", calls=tuple(e.call_id for e in unique)),
        forked_from=getattr(state, "forked_from", None),
    )
