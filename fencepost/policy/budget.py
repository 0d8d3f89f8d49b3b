"""Budget axes, the run's budget view, and the exhaustion a refused reservation raises.

The ledger (:mod:`fencepost.policy.ledger`) holds the limits and checks them; what each thing
reserves, and the stop a refusal means, is :mod:`fencepost.policy.reservations`.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, Strict, model_validator

from fencepost.policy.contract import Frozen, assemble, no_unknown_keys
from fencepost.policy.phase import TerminationReason
from fencepost.policy.pricing import from_micros, to_micros


class BudgetAxis(StrEnum):
    """One independently limited resource. Each axis is spent and checked on its own."""

    STEPS = "steps"
    TOOL_CALLS = "tool_calls"
    TOKENS = "tokens"
    COST = "cost"
    MUTATIONS = "mutations"
    MONEY = "money"
    """Model spend in a currency, priced from token usage (:mod:`fencepost.policy.pricing`); the
    ledger holds it in integer micro-units."""


# Model-side axes end a run as a step-budget stop, tool-side axes as a tool-budget stop: the twelve
# termination reasons are fixed, the axis that crossed its limit travels in the error.
_REASON_FOR_AXIS = {
    BudgetAxis.STEPS: TerminationReason.STEP_BUDGET_EXHAUSTED,
    BudgetAxis.TOKENS: TerminationReason.STEP_BUDGET_EXHAUSTED,
    BudgetAxis.TOOL_CALLS: TerminationReason.TOOL_BUDGET_EXHAUSTED,
    BudgetAxis.COST: TerminationReason.TOOL_BUDGET_EXHAUSTED,
    BudgetAxis.MUTATIONS: TerminationReason.TOOL_BUDGET_EXHAUSTED,
    BudgetAxis.MONEY: TerminationReason.STEP_BUDGET_EXHAUSTED,
}


def reason_for_axis(axis: BudgetAxis) -> TerminationReason:
    """The termination reason a run ends with when ``axis`` is exhausted."""
    return _REASON_FOR_AXIS[axis]


class BudgetExhausted(Exception):
    """A reservation would cross a limit. Names the axis, the limit and what was asked for.

    Raised by :meth:`Ledger.reserve <fencepost.policy.ledger.Ledger.reserve>` when an account of
    the chain cannot hold the amounts; ``reservations.stop_for_exhausted`` is the stop it means.
    """

    def __init__(
        self,
        reason: TerminationReason,
        *,
        axis: BudgetAxis | None = None,
        limit: float | None = None,
        requested: float | None = None,
        account: str | None = None,
        busy: bool = False,
        window: str | None = None,
        resets_at: datetime | None = None,
    ) -> None:
        self.reason = reason
        self.axis = axis
        self.limit = limit
        self.requested = requested
        self.account = account
        self.busy = busy
        """Whether the shortfall is only held, not spent: what every account of the chain has
        spent (settled or charged) leaves room for the request, and reservations still in
        flight (reserved, not yet settled or released) take it. Waiting for them may let the
        request through; a refusal that is not busy stands until limits change."""
        self.window = window
        """The spend window that refused (its :attr:`Window.label
        <fencepost.policy.windows.Window.label>`), or ``None`` when a plain limit did."""
        self.resets_at = resets_at
        """When that window next frees what it holds (UTC); ``None`` for a plain limit."""
        where = f" on account {account!r}" if account else ""
        if window is not None:
            where += f" in window {window!r}"
            if resets_at is not None:
                where += f" (frees at {resets_at.isoformat()})"
        detail = (
            f": {axis.value} limit {limit:g} would be exceeded by a request for {requested:g}{where}"
            if axis is not None and limit is not None and requested is not None
            else ""
        )
        super().__init__(f"{reason.value}{detail}")


NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Money = Annotated[Decimal, Strict(False), Field(ge=0, allow_inf_nan=False)]


class RuntimeBudget(Frozen):
    """What a run may still spend, per axis, and what it has spent.

    ``None`` for an optional axis means the axis is not limited. Negative values are rejected at
    construction. ``RuntimeBudget(steps_remaining=6, tool_calls_remaining=3)`` is the seed's shape.

    A start request's budget gives the run's ledger account its limits (:meth:`limits`); from then
    on state carries it as a view of that account, rewritten after each reservation. Limits are
    checked by the ledger, never against this view (``update_state`` can change the view only).
    """

    steps_remaining: NonNegativeInt
    """Model decisions the run may still make."""
    tool_calls_remaining: NonNegativeInt
    """Tool calls the run may still start."""
    tokens_remaining: NonNegativeInt | None = None
    """Model tokens the run may still consume (``None``: not limited)."""
    cost_remaining: Annotated[NonNegativeFloat | None, Strict(False)] = None
    """Cost units the run may still spend (``None``: not limited)."""
    mutations_remaining: NonNegativeInt | None = None
    """Write or external effects the run may still start (``None``: not limited)."""
    money_remaining: Money | None = None
    """Money the run's model steps may still spend, in the graph's price table's currency
    (``Decimal("0.50")``; ``None``: not limited). A graph with no price refuses a run that
    limits it (:mod:`fencepost.policy.pricing`)."""
    steps_used: NonNegativeInt = 0
    """Model decisions reserved so far (attempts, not successes)."""
    tool_calls_used: NonNegativeInt = 0
    """Tool calls reserved so far (attempts, not successes)."""
    tokens_used: NonNegativeInt = 0
    """Model tokens reported so far."""
    cost_used: Annotated[NonNegativeFloat, Strict(False)] = 0.0
    """Cost units spent so far."""
    mutations_used: NonNegativeInt = 0
    """Write or external effects reserved so far."""
    money_used: Money = Decimal(0)
    """Money the run's model steps were charged so far (held, for a step in flight)."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return no_unknown_keys(cls, data)

    @model_validator(mode="after")
    def _no_nan_cost(self) -> RuntimeBudget:
        for value in (self.cost_remaining, self.cost_used):
            if value is not None and value != value:  # NaN never compares equal to itself
                raise ValueError("cost must be a number")
        return self

    def remaining(self, axis: BudgetAxis) -> float | None:
        """What is left on ``axis``; ``None`` when the axis is not limited (money in units of
        its currency, as a float for display: the ledger keeps it exact)."""
        if axis is BudgetAxis.MONEY:
            return None if self.money_remaining is None else float(self.money_remaining)
        return {
            BudgetAxis.STEPS: self.steps_remaining,
            BudgetAxis.TOOL_CALLS: self.tool_calls_remaining,
            BudgetAxis.TOKENS: self.tokens_remaining,
            BudgetAxis.COST: self.cost_remaining,
            BudgetAxis.MUTATIONS: self.mutations_remaining,
        }[axis]

    def used(self, axis: BudgetAxis) -> float:
        """What has been spent on ``axis`` (money as :meth:`remaining` gives it)."""
        if axis is BudgetAxis.MONEY:
            return float(self.money_used)
        return {
            BudgetAxis.STEPS: self.steps_used,
            BudgetAxis.TOOL_CALLS: self.tool_calls_used,
            BudgetAxis.TOKENS: self.tokens_used,
            BudgetAxis.COST: self.cost_used,
            BudgetAxis.MUTATIONS: self.mutations_used,
        }[axis]

    def limits(self) -> dict[str, float]:
        """Each limited axis's total (used + remaining): the shape a :class:`Ledger` account takes."""
        out: dict[str, float] = {}
        if self.money_remaining is not None:
            # Whole micro-units, exact in a float: no drift in a ledger.
            out[BudgetAxis.MONEY.value] = float(to_micros(self.money_used + self.money_remaining))
        for axis in BudgetAxis:
            if axis is BudgetAxis.MONEY:
                continue
            left = self.remaining(axis)
            if left is not None:
                out[axis.value] = self.used(axis) + left
        return out


_INTEGER_AXES = (BudgetAxis.STEPS, BudgetAxis.TOOL_CALLS, BudgetAxis.TOKENS, BudgetAxis.MUTATIONS)
# Per axis: its ledger name, the view's two field names, and whether it counts whole units.
_VIEW_FIELDS = tuple(
    (axis.value, f"{axis.value}_used", f"{axis.value}_remaining", axis in _INTEGER_AXES)
    for axis in BudgetAxis
    if axis is not BudgetAxis.MONEY
)
_MONEY = BudgetAxis.MONEY.value
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
    money_limit = limits.get(_MONEY)
    money_used = held.get(_MONEY, 0.0)
    remaining["money_remaining"] = (
        None if money_limit is None else from_micros(max(0.0, money_limit - money_used))
    )
    spent["money_used"] = from_micros(money_used)
    for required in _ALWAYS_LIMITED:
        if remaining[required] is None:
            remaining[required] = 0
    # In the order the fields are declared, as validation would have made them.
    fields = remaining | spent
    return assemble(RuntimeBudget, fields)


DEFAULT_STEPS = 8
"""Model steps a run may take when its start request names no budget."""
DEFAULT_TOOL_CALLS = 8
"""Tool calls a run may start when its start request names no budget."""


def default_budget() -> RuntimeBudget:
    """The budget of a run whose start request names none: 8 model steps, 8 tool calls."""
    return RuntimeBudget(steps_remaining=DEFAULT_STEPS, tool_calls_remaining=DEFAULT_TOOL_CALLS)


class BudgetStop(Frozen):
    """Which limit stopped a run: the ledger account, the axis and, when a spend window refused,
    which window and when it next frees usage. Carried by the stop and the stop report."""

    account: str | None = None
    """The account of the run's chain that refused (the run's own, or a parent's: a tenant's)."""
    axis: str
    """The axis that ran out (``"tokens"``, ``"steps"``, ...)."""
    limit: Annotated[float, Strict(False)]
    """The limit (of the account, or of the window) the request would have crossed."""
    window: str | None = None
    """The spend window that refused (``"tokens per day (Europe/Berlin)"``); ``None``: a plain
    limit of the account did."""
    resets_at: Annotated[datetime | None, Strict(False)] = None
    """When that window next frees usage (UTC); ``None`` for a plain limit."""
    own: bool = False
    """Whether the account is the run's own (its ``RuntimeBudget``), not a parent's."""

    @classmethod
    def of(cls, exc: BudgetExhausted) -> BudgetStop | None:
        """What ``exc`` says stopped the run; ``None`` when it names no axis or limit."""
        if exc.axis is None or exc.limit is None:
            return None
        return cls(
            account=exc.account,
            axis=exc.axis.value,
            limit=exc.limit,
            window=exc.window,
            resets_at=exc.resets_at,
        )

    def what_to_do(self) -> str | None:
        """What to do about it: wait until the window frees usage, or raise which limit;
        ``None`` for the run's own plain limit (the stop code's hint says it)."""
        where = f"account {self.account!r}" if self.account else "the run's account"
        if self.window is not None:
            wait = (
                f"wait until {self.resets_at.isoformat()} (when it next frees usage), or "
                if self.resets_at is not None
                else ""
            )
            return (
                f"the {self.window} window of {where} is spent (limit {self.limit:g}): "
                f"{wait}raise that window's limit (Window(limit=...) in its open_account)"
            )
        if self.own:
            return None
        return (
            f"{where} ran out of {self.axis} (limit {self.limit:g}): raise that account's "
            f"{self.axis} limit (where it is opened: ledger.open_account)"
        )
