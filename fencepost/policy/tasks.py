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
    waiting: dict[str, list[Receipt]] = {}
    for pending in pending_tasks(receipts):
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
