"""What a final answer is judged by, from the receipts: the work accepted and not yet shown
done (work accepted is not work done), the evidence that completes it, and what the answer may
cite.

A receipt in state is a caller's ``update_state`` away from forged (receipts only grow, but a
caller can append one saying ``completed``). What decides that accepted work was shown done is a
durable ledger marker (``keys.completed_key``) the execute node writes, before the completion
receipt, only on verified evidence; what decides that a cited call returned a result is its
``keys.result_key`` marker. The functions here are pure: they take the call ids the ledger marks
(``marked``, ``produced``); the graph's nodes do the ledger I/O."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from fencepost.policy.decision import ToolProposal
from fencepost.policy.observation import Observation
from fencepost.policy.receipt import Receipt, ReceiptStatus, current_receipts


class TaskOutcome(Protocol):
    """What the functions here read of a call's outcome (``outcome.CallOutcome``). A shape,
    not the class: the state asks here what an answer may cite, and the outcome's events
    import the state."""

    @property
    def call_id(self) -> str:
        """The call the outcome answers."""

    @property
    def task_id(self) -> str | None:
        """The task the call's tool accepted, if it accepted one."""

    @property
    def completes(self) -> str | None:
        """The accepted task the call's tool found finished, with its evidence."""

    @property
    def evidence_for(self) -> tuple[str, ...]:
        """The accepting tools whose tasks the call's tool is evidence for."""


def pending_tasks(receipts: tuple[Receipt, ...]) -> tuple[Receipt, ...]:
    """The receipts of calls whose accepted work has not been shown done yet."""
    return tuple(
        r for r in current_receipts(receipts) if r.status is ReceiptStatus.ACCEPTED_PENDING
    )


def evidence_ids(
    receipts: Iterable[Receipt],
    observations: Sequence[Observation],
    produced: Collection[str] | None = None,
) -> frozenset[str]:
    """Ids a final answer may cite: call ids of successful tool results whose work was done
    (a result receipted ``failed``, a child run that did not complete, or ``denied``, one
    that never started, is not evidence). With ``produced`` (the calls the ledger marks as
    having had their tool return a result), only those: an observation in state is a caller's
    ``update_state`` away from forged, the ledger's marker is not."""
    # A call's latest receipt is its current one (``receipt.current_receipts``): its status
    # alone is read here.
    status = {r.call_id: r.status for r in receipts}
    failed = {c for c, s in status.items() if s in (ReceiptStatus.FAILED, ReceiptStatus.DENIED)}
    known = frozenset(
        o.evidence_id for o in observations if o.is_evidence and o.call_id not in failed
    )
    return known if produced is None else known.intersection(produced)


def recorded_done(receipts: tuple[Receipt, ...]) -> tuple[str, ...]:
    """The accepting calls whose current receipt says ``completed``: what the checkpoint claims
    was shown done (each checked against the ledger's completion markers)."""
    accepted = {r.call_id for r in accepting(receipts)}
    return tuple(
        r.call_id
        for r in current_receipts(receipts)
        if r.call_id in accepted and r.status is ReceiptStatus.COMPLETED
    )


def accepting(receipts: tuple[Receipt, ...]) -> tuple[Receipt, ...]:
    """Each accepting call's first ``accepted_pending`` receipt (its attempt is the one whose
    start the ledger marked: ``keys.started_key``)."""
    first: dict[str, Receipt] = {}
    for r in receipts:
        if r.status is ReceiptStatus.ACCEPTED_PENDING:
            first.setdefault(r.call_id, r)
    return tuple(first.values())


def unfinished(
    receipts: tuple[Receipt, ...],
    marked: Collection[str],
    started: Collection[str] | None = None,
) -> tuple[Receipt, ...]:
    """The accepting receipts of calls whose task the ledger does not mark shown done.

    ``marked`` holds the call ids whose ``completed_key`` marker the ledger holds. A receipt
    saying ``completed`` without the marker is a state edit: that task is still pending.
    ``started`` (when given) holds the accepting calls the ledger shows started: an accepting
    receipt for any other call is a state edit too, and holds nothing up.
    """
    return tuple(
        r
        for r in accepting(receipts)
        if r.call_id not in marked and (started is None or r.call_id in started)
    )


def completions(
    receipts: tuple[Receipt, ...],
    outcomes: Sequence[TaskOutcome],
    marked: Collection[str] | None = None,
    *,
    waited: Mapping[str, Collection[str]] | None = None,
) -> tuple[Receipt, ...]:
    """New receipts for accepted tasks that ``outcomes`` carry verified completion evidence for:
    the accepting call's receipt, now ``completed``, naming the call that showed it done.

    A completion counts only from a status tool declared as evidence for the tool that accepted
    the task (``evidence_for``), and only from a check made after the acceptance:
    ``waited`` maps each call of the batch ``outcomes`` come from to the calls of that batch it
    waited for (:func:`waited_for`); a task accepted in this batch is completed only by a call
    that waited for its accepting call (one accepted in an earlier step, by any later call).

    With ``marked`` (the accepting calls the ledger marks done), a call still waits unless it is
    both marked and receipted ``completed``: a forged ``completed`` receipt does not stop the
    genuine completion from being recorded (and marked), and a marker written just before a
    crash gets its receipt. Without it, the current receipts alone say what waits.
    """
    if not any(o.completes is not None for o in outcomes):
        return ()
    if marked is None:
        queued = pending_tasks(receipts)
    else:
        done_now = set(recorded_done(receipts)) & set(marked)
        queued = tuple(r for r in unfinished(receipts, ()) if r.call_id not in done_now)
    waiting: dict[str, list[Receipt]] = {}
    for pending in queued:
        if pending.task_id is not None:
            waiting.setdefault(pending.task_id, []).append(pending)
    order = waited or {}
    done: list[Receipt] = []
    for outcome in outcomes:
        task = outcome.completes
        queue = waiting.get(task) if task is not None else None
        if not queue:
            continue
        before = order.get(outcome.call_id, ())
        # One completion completes one accepted call: the earliest still waiting on the task
        # that this call's tool is evidence for and that was accepted before this call began.
        receipt = next(
            (
                r
                for r in queue
                if r.tool_name in outcome.evidence_for
                and (r.call_id not in order or r.call_id in before)
            ),
            None,
        )
        if receipt is not None:
            queue.remove(receipt)
            done.append(
                receipt.model_copy(
                    update={"status": ReceiptStatus.COMPLETED, "completed_by": outcome.call_id}
                )
            )
    return tuple(done)


def waited_for(calls: Sequence[ToolProposal]) -> dict[str, frozenset[str]]:
    """For each call of a batch, the calls of the same batch it waited for: those it
    ``depends_on``, and the ones they waited for in turn (a call runs only after all of them)."""
    ids = {c.call_id for c in calls}
    direct = {c.call_id: [d for d in c.depends_on if d in ids] for c in calls}
    out: dict[str, frozenset[str]] = {}
    for call_id in direct:
        seen: set[str] = set()
        stack = list(direct[call_id])
        while stack:
            dep = stack.pop()
            if dep not in seen and dep != call_id:
                seen.add(dep)
                stack.extend(direct.get(dep, ()))
        out[call_id] = frozenset(seen)
    return out


def open_tasks_after(
    state_open: tuple[str, ...], outcomes: Sequence[TaskOutcome], completed: tuple[Receipt, ...]
) -> tuple[str, ...]:
    """The open task ids once ``outcomes`` are in: new accepted tasks added, completed removed."""
    left = list((*state_open, *(o.task_id for o in outcomes if o.task_id is not None)))
    for receipt in completed:
        if receipt.task_id in left:
            left.remove(receipt.task_id)  # one completion closes one accepted call
    return tuple(left)
