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


_MONEY = BudgetAxis.MONEY.value


def budget_view(limits: dict[str, float], held: dict[str, float]) -> RuntimeBudget:
    """The run's :class:`RuntimeBudget` as its ledger account holds it: limit and use per axis.

    State carries this view for the trace and the report; limits are checked by the ledger.
    """
    # Written out axis by axis, in the order the fields are declared, as validation would have
    # made them: the view is made at every reservation and settlement, and a loop over the
    # axes with a merge of two dicts costs twice this.
    steps, calls = held.get("steps", 0.0), held.get("tool_calls", 0.0)
    tokens, cost = held.get("tokens", 0.0), held.get("cost", 0.0)
    mutations_used, money_used = held.get("mutations", 0.0), held.get(_MONEY, 0.0)
    get = limits.get
    steps_limit, calls_limit = get("steps"), get("tool_calls")
    tokens_limit, cost_limit, mutations_limit = get("tokens"), get("cost"), get("mutations")
    money_limit = get(_MONEY)
    fields: dict[str, Any] = {
        "steps_remaining": 0 if steps_limit is None else round(_left(steps_limit, steps)),
        "tool_calls_remaining": 0 if calls_limit is None else round(_left(calls_limit, calls)),
        "tokens_remaining": None if tokens_limit is None else round(_left(tokens_limit, tokens)),
        "cost_remaining": None if cost_limit is None else _left(cost_limit, cost),
        "mutations_remaining": (
            None if mutations_limit is None else round(_left(mutations_limit, mutations_used))
        ),
        "money_remaining": (
            None if money_limit is None else from_micros(_left(money_limit, money_used))
        ),
        "steps_used": round(steps),
        "tool_calls_used": round(calls),
        "tokens_used": round(tokens),
        "cost_used": cost,
        "mutations_used": round(mutations_used),
        "money_used": from_micros(money_used) if money_used else _NO_MONEY,
    }
    return assemble(RuntimeBudget, fields)


def _left(limit: float, used: float) -> float:
    return limit - used if limit > used else 0.0


_NO_MONEY = Decimal(0)
"""``from_micros(0)``: a Decimal is immutable, so every view that spent none shares it."""


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
