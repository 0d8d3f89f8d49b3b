"""Money: a model step priced in a currency from its token usage and a price table.

A run's ``RuntimeBudget(money_remaining=Decimal("0.50"))`` limits the ``money`` axis; a graph
built with a price (``create_agent(..., price="gpt-4o-mini")``, or the model's own name found in
the table) charges each model step on it the way tokens are charged: the step's token hold priced
before the call (its input at the input price, its output cap at the output price), settled to
the reported usage priced (cached input tokens at the cached price where the provider reports
them), an unreported step priced from its text count.

The ledger holds money in integer **micro-units** of the table's currency (a millionth of a
dollar): a price per million tokens times a token count *is* micro-units, each step's amount is
rounded up to a whole micro-unit, and integers below 2**53 are exact in the ledgers' number type,
so a ledger never drifts. A view (``RuntimeBudget.money_used``) is a ``Decimal``.

:data:`PRICES` is fencepost's own small table, dated (:attr:`PriceTable.as_of`) and sourced
(:attr:`PriceTable.source`); prices change, so an application passes its own
(``create_agent(..., prices=fp.PriceTable(...))`` or ``price=fp.ModelPrice(...)``). A model the
table does not price is never guessed: naming it is a ``GraphConfigError`` at build time, and a
run with a money limit on a graph with no price ends before its first step
(``policy_denied``, code ``money_unpriced``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from decimal import ROUND_CEILING, Decimal
from typing import Annotated

from pydantic import Field, Strict

from fencepost.policy.contract import Frozen

__all__ = [
    "MICROS",
    "PRICES",
    "ModelPrice",
    "PriceTable",
    "from_micros",
    "price_micros",
    "to_micros",
]

MICROS = 1_000_000
"""Micro-units in one unit of a currency: the ledger's money amounts are whole micro-units."""

TOKENS_PER_PRICE = 1_000_000
"""A :class:`ModelPrice` is per this many tokens (a million, as providers publish them)."""

_Money = Annotated[Decimal, Strict(False), Field(ge=0, allow_inf_nan=False)]


def to_micros(amount: Decimal | int | str) -> int:
    """``amount`` of a currency in whole micro-units, rounded up.

    >>> to_micros(Decimal("0.50")), to_micros("0.0000001")
    (500000, 1)
    """
    return int((Decimal(amount) * MICROS).to_integral_value(rounding=ROUND_CEILING))


def from_micros(micros: float) -> Decimal:
    """``micros`` micro-units (a ledger amount) as a ``Decimal`` of the currency.

    >>> from_micros(1_500_000.0)
    Decimal('1.5')
    """
    return (Decimal(round(micros)) / MICROS).normalize() if micros else Decimal(0)


class ModelPrice(Frozen):
    """What a model charges, per million tokens, in its table's currency."""

    input: _Money
    """Per million input tokens."""
    output: _Money
    """Per million output tokens."""
    cached_input: _Money | None = None
    """Per million input tokens read from the provider's prompt cache (``None``: at
    :attr:`input`)."""


def price_micros(
    price: ModelPrice, input_tokens: int, output_tokens: int, cached_tokens: int = 0
) -> int:
    """What ``input_tokens`` in (of which ``cached_tokens`` read from a cache) and
    ``output_tokens`` out cost at ``price``, in micro-units, rounded up: a price per million
    tokens times a count of tokens is micro-units.

    >>> p = ModelPrice(input=Decimal("0.15"), output=Decimal("0.60"), cached_input=Decimal("0.075"))
    >>> price_micros(p, 1000, 100), price_micros(p, 1000, 100, cached_tokens=1000)
    (210, 135)
    """
    cached = min(max(0, cached_tokens), max(0, input_tokens))
    cached_rate = price.input if price.cached_input is None else price.cached_input
    total = (
        (max(0, input_tokens) - cached) * price.input
        + cached * cached_rate
        + max(0, output_tokens) * price.output
    )
    return int(total.to_integral_value(rounding=ROUND_CEILING))


# A provider's dated snapshot of a model: ``gpt-4o-2024-08-06``, ``claude-3-5-haiku-20241022``.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


class PriceTable(Frozen):
    """Model prices in one currency, with the date they were taken and where from."""

    currency: str = "USD"
    as_of: Annotated[date, Strict(False)]
    """When the prices were taken: prices change, check them against your provider's."""
    source: str
    """Where the prices were taken from."""
    prices: Annotated[Mapping[str, ModelPrice], Strict(False)]
    """Model name -> its price."""

    def price_of(self, model: str) -> ModelPrice | None:
        """``model``'s price: its own row, else (a dated snapshot, ``gpt-4o-2024-08-06``) its
        base model's; ``None`` when the table has neither. Nothing else is matched: a model
        the table does not name is not priced like one it does."""
        found = self.prices.get(model)
        if found is None:
            found = self.prices.get(_SNAPSHOT.sub("", model))
        return found


def _usd(input: str, output: str, cached_input: str) -> ModelPrice:
    return ModelPrice(
        input=Decimal(input), output=Decimal(output), cached_input=Decimal(cached_input)
    )


PRICES = PriceTable(
    currency="USD",
    as_of=date(2025, 6, 1),
    source="OpenAI's and Anthropic's published API price pages (standard tier, per 1M tokens)",
    prices={
        "gpt-4o": _usd("2.50", "10.00", "1.25"),
        "gpt-4o-mini": _usd("0.15", "0.60", "0.075"),
        "gpt-4.1": _usd("2.00", "8.00", "0.50"),
        "gpt-4.1-mini": _usd("0.40", "1.60", "0.10"),
        "gpt-4.1-nano": _usd("0.10", "0.40", "0.025"),
        "claude-3-5-haiku": _usd("0.80", "4.00", "0.08"),
        "claude-3-7-sonnet": _usd("3.00", "15.00", "0.30"),
        "claude-sonnet-4": _usd("3.00", "15.00", "0.30"),
        "claude-opus-4": _usd("15.00", "75.00", "1.50"),
    },
)
"""fencepost's own price table: a few common models, in US dollars per million tokens, dated
:attr:`PriceTable.as_of` and sourced :attr:`PriceTable.source`. Pass your own table or price
when it is out of date or your model is not in it."""
