"""A conversation budget: one ledger account every run of a thread spends from.

A thread holds a conversation of runs, each with its own account (``keys.run_account``). Opened
under a conversation's account (``RunContext(budget_account=conversation_account(...))``), they
share its limits: a parent of 10,000 tokens funds 10,000 tokens of all the thread's runs together,
and the run that finds it spent ends exhausted while every other thread goes on.

The account is named from the tenant and the thread together (``keys.conversation_account_name``)
and owned by the tenant: another tenant's run naming it is refused (``budget_account_denied``)
before it spends anything, and no tenant can open a name that lands on another's.
"""

from __future__ import annotations

from decimal import Decimal

from fencepost.policy.budget import BudgetAxis
from fencepost.policy.keys import conversation_account_name
from fencepost.policy.ledger import Ledger
from fencepost.policy.pricing import to_micros

__all__ = ["ConversationBudgetDenied", "aconversation_account", "conversation_account"]


class ConversationBudgetDenied(PermissionError):
    """The ``parent`` named for a conversation account funds no conversation of this tenant
    (another tenant's account, or a run's)."""


def _limits(
    *,
    steps: int | None,
    tool_calls: int | None,
    tokens: int | None,
    cost: float | None,
    mutations: int | None,
    money: Decimal | str | None,
) -> dict[str, float]:
    out: dict[str, float] = {}
    for axis, value in (
        (BudgetAxis.STEPS, steps),
        (BudgetAxis.TOOL_CALLS, tool_calls),
        (BudgetAxis.TOKENS, tokens),
        (BudgetAxis.COST, cost),
        (BudgetAxis.MUTATIONS, mutations),
    ):
        if value is not None:
            out[axis.value] = float(value)
    if money is not None:
        out[BudgetAxis.MONEY.value] = float(to_micros(Decimal(money)))
    if not out:
        raise ValueError("a conversation account limits at least one axis")
    return out


def _owner(tenant_id: str) -> dict[str, str]:
    return {"tenant": tenant_id}


def _check_parent(owner: dict[str, str], tenant_id: str) -> None:
    if owner.get("tenant", tenant_id) != tenant_id or "run" in owner:
        raise ConversationBudgetDenied("parent account does not fund this tenant's conversations")


def conversation_account(
    ledger: Ledger,
    tenant_id: str,
    thread_id: str,
    *,
    parent: str | None = None,
    steps: int | None = None,
    tool_calls: int | None = None,
    tokens: int | None = None,
    cost: float | None = None,
    mutations: int | None = None,
    money: Decimal | str | None = None,
) -> str:
    """Open (or find again, with the same terms) the account the runs of ``thread_id`` share,
    and return its name to pass as ``fp.RunContext(budget_account=...)`` for each of them.

    Named from ``tenant_id`` and ``thread_id`` together and owned by the tenant: any principal
    of the tenant may run under it, no other tenant. ``parent`` (say the tenant's pool) funds
    it in turn, and must be the tenant's own or ownerless (``ConversationBudgetDenied``).
    Each limit given caps the sum of the thread's runs on its axis (``money`` in the graph's
    price table's currency, exact to a micro-unit); reopening with other limits raises
    ``LedgerConflict``.

    >>> from fencepost.policy.ledger import InMemoryLedger
    >>> ledger = InMemoryLedger()
    >>> name = conversation_account(ledger, "acme", "t-1", tokens=5_000)
    >>> name == conversation_account(ledger, "acme", "t-1", tokens=5_000), name.startswith("conversation:")
    (True, True)
    """
    limits = _limits(
        steps=steps,
        tool_calls=tool_calls,
        tokens=tokens,
        cost=cost,
        mutations=mutations,
        money=money,
    )
    if parent is not None:
        _check_parent(dict(ledger.balance(parent).owner), tenant_id)
    name = conversation_account_name(tenant_id, thread_id)
    ledger.open_account(name, limits, parent=parent, owner=_owner(tenant_id))
    return name


async def aconversation_account(
    ledger: Ledger,
    tenant_id: str,
    thread_id: str,
    *,
    parent: str | None = None,
    steps: int | None = None,
    tool_calls: int | None = None,
    tokens: int | None = None,
    cost: float | None = None,
    mutations: int | None = None,
    money: Decimal | str | None = None,
) -> str:
    """Async twin of :func:`conversation_account`."""
    limits = _limits(
        steps=steps,
        tool_calls=tool_calls,
        tokens=tokens,
        cost=cost,
        mutations=mutations,
        money=money,
    )
    if parent is not None:
        _check_parent(dict((await ledger.abalance(parent)).owner), tenant_id)
    name = conversation_account_name(tenant_id, thread_id)
    await ledger.aopen_account(name, limits, parent=parent, owner=_owner(tenant_id))
    return name
