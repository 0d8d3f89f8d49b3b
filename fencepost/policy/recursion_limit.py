"""The recursion limit's stop: a run ends as data before LangGraph's recursion limit is reached.

LangGraph raises ``GraphRecursionError`` when a run takes more supersteps than its
``recursion_limit``; a fencepost run never does (DESIGN invariant 1). A node that has too few
supersteps left for what must still follow it asks for this stop instead:
``step_budget_exhausted`` with the code ``recursion_limit``.
"""

from __future__ import annotations

from fencepost.policy.phase import TerminationReason
from fencepost.policy.state import StopRequest, stop

# Supersteps a node needs, itself included, before LangGraph's recursion limit: decide needs
# room for execute and the terminal node after it; execute needs room for the terminal node
# (and, to hand back to decide, for decide to stop).
NEEDS_DECIDE = 3
"""Supersteps ``decide`` needs, itself included: itself, ``execute`` and the terminal node."""
NEEDS_EXECUTE = 2
"""Supersteps ``execute`` needs, itself included: itself and the terminal node."""
NEEDS_ANOTHER_DECIDE = 3
"""Supersteps ``execute`` needs to hand back to ``decide``: itself, ``decide`` (to stop) and the
terminal node."""

RECURSION_LIMIT = "recursion_limit"
"""The code of a run stopped by the recursion limit."""


def out_of_supersteps(remaining: object, needs: int) -> bool:
    """True when fewer than ``needs`` supersteps remain before the graph's recursion limit.

    ``remaining`` is LangGraph's ``remaining_steps`` managed value as the node read it; anything
    but an int (a graph without it) is never out."""
    return isinstance(remaining, int) and remaining < needs


def recursion_stop(remaining_steps: object, needs: int) -> StopRequest | None:
    """The stop a node asks for when the recursion limit leaves fewer supersteps than ``needs``
    (one of the ``NEEDS_*`` above): ``step_budget_exhausted`` (``recursion_limit``), as data,
    never a ``GraphRecursionError``; ``None`` while there is room."""
    if out_of_supersteps(remaining_steps, needs):
        return stop(TerminationReason.STEP_BUDGET_EXHAUSTED, RECURSION_LIMIT)
    return None
