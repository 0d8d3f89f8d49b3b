"""Work accepted is not work done: accepted tasks, and the evidence that completes them.

A receipt in state is a caller's ``update_state`` away from forged (receipts only grow, but a
caller can append one saying ``completed``). What decides that accepted work was shown done is a
durable ledger marker (``keys.completed_key``) the execute node writes, before the completion
receipt, only on verified evidence. The functions here are pure: they take the call ids the
ledger marks (``marked``); the graph's nodes do the ledger I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fencepost.policy.outcome import CallOutcome
from fencepost.policy.receipt import Receipt, ReceiptStatus, current_receipts


def pending_tasks(receipts: tuple[Receipt, ...]) -> tuple[Receipt, ...]:
    """The receipts of calls whose accepted work has not been shown done yet."""
    return tuple(
        r for r in current_receipts(receipts) if r.status is ReceiptStatus.ACCEPTED_PENDING
    )


def recorded_done(receipts: tuple[Receipt, ...]) -> tuple[str, ...]:
    """The accepting calls whose current receipt says ``completed``: what the checkpoint claims
    was shown done (to be carried into a non-durable ledger re-opened after a restart)."""
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
    outcomes: Sequence[CallOutcome],
    marked: Collection[str] | None = None,
) -> tuple[Receipt, ...]:
    """New receipts for accepted tasks that ``outcomes`` carry verified completion evidence for:
    the accepting call's receipt, now ``completed``, naming the call that showed it done.

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
    done: list[Receipt] = []
    for outcome in outcomes:
        task = outcome.completes
        # One completion completes one accepted call: the earliest still waiting on the task.
        queue = waiting.get(task) if task is not None else None
        receipt = queue.pop(0) if queue else None
        if receipt is not None:
            done.append(
                receipt.model_copy(
                    update={"status": ReceiptStatus.COMPLETED, "completed_by": outcome.call_id}
                )
            )
    return tuple(done)


def open_tasks_after(
    state_open: tuple[str, ...], outcomes: Sequence[CallOutcome], completed: tuple[Receipt, ...]
) -> tuple[str, ...]:
    """The open task ids once ``outcomes`` are in: new accepted tasks added, completed removed."""
    left = list((*state_open, *(o.task_id for o in outcomes if o.task_id is not None)))
    for receipt in completed:
        if receipt.task_id in left:
            left.remove(receipt.task_id)  # one completion closes one accepted call
    return tuple(left)
