"""Work accepted is not work done: accepted tasks, and the evidence that completes them."""

from __future__ import annotations

from collections.abc import Sequence

from fencepost.policy.outcome import CallOutcome
from fencepost.policy.receipt import Receipt, ReceiptStatus, current_receipts


def pending_tasks(receipts: tuple[Receipt, ...]) -> tuple[Receipt, ...]:
    """The receipts of calls whose accepted work has not been shown done yet."""
    return tuple(
        r for r in current_receipts(receipts) if r.status is ReceiptStatus.ACCEPTED_PENDING
    )


def completions(
    receipts: tuple[Receipt, ...], outcomes: Sequence[CallOutcome]
) -> tuple[Receipt, ...]:
    """New receipts for accepted tasks that ``outcomes`` carry verified completion evidence for:
    the accepting call's receipt, now ``completed``, naming the call that showed it done."""
    if not any(o.completes is not None for o in outcomes):
        return ()
    waiting = {r.task_id: r for r in pending_tasks(receipts) if r.task_id is not None}
    done: list[Receipt] = []
    for outcome in outcomes:
        task = outcome.completes
        receipt = waiting.pop(task, None) if task is not None else None
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
    done = {r.task_id for r in completed}
    added = tuple(o.task_id for o in outcomes if o.task_id is not None)
    return tuple(t for t in (*state_open, *added) if t not in done)
