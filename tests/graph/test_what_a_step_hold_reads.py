"""What a model step's hold reads of its chain: on each axis (tokens, money) the least any
account of the chain has not spent, what other steps hold in flight counted as left, read in one
walk of the chain; an account that cannot be read ends the walk (the reservation checks it)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.graph.account import ChainLeft, chain_left, tokens_left
from fencepost.graph.node_io import SyncIO, drive
from fencepost.policy import BudgetAxis
from tests.graph.kit import context, loop_settings, mid_run_state

AXES = (BudgetAxis.TOKENS, BudgetAxis.MONEY)

limit = st.none() | st.integers(100, 1000)
account = st.fixed_dictionaries({"tokens": limit, "money": limit, "spent": st.integers(0, 9)})


@settings(max_examples=60, deadline=None)
@given(chain=st.lists(account, min_size=1, max_size=3), flying=st.integers(0, 9))
def test_a_step_hold_reads_the_least_left_on_each_axis_of_its_chain(
    chain: list[dict[str, int | None]], flying: int
) -> None:
    cfg = loop_settings()
    io, ledger = SyncIO(cfg), cfg.ledger
    names = [f"pool-{n}" for n in range(len(chain))]
    # Opened from the top: the last of ``chain`` funds the one before it.
    for n in reversed(range(len(chain))):
        limits = {a: float(v) for a in ("tokens", "money") if (v := chain[n][a]) is not None}
        ledger.open_account(names[n], limits, parent=names[n + 1] if n + 1 < len(chain) else None)
        spent = chain[n]["spent"] or 0
        used = {"tokens": float(spent), "money": float(spent)}
        ledger.settle(ledger.reserve(names[n], f"spent-{n}", used).key, used)
    # Another run's step in flight on the nearest account: it comes back when it settles.
    ledger.reserve(names[0], "in-flight", {"tokens": float(flying)})
    ctx = context().model_copy(update={"budget_account": names[0]})
    state = mid_run_state()

    def least(axis: str) -> float | None:
        # What an account spent includes what its descendants spent (a reservation holds on
        # every ancestor); the step in flight holds on them all, and counts as left on each.
        spent = [sum(c["spent"] or 0 for c in chain[: n + 1]) for n in range(len(chain))]
        lefts = [float(c[axis]) - spent[n] for n, c in enumerate(chain) if c[axis] is not None]
        own = state.budget.remaining(BudgetAxis(axis))
        return min([*lefts, *([own] if own is not None else [])], default=None)

    left = drive(chain_left(io, state, ctx, AXES))
    assert left == ChainLeft(tokens=least("tokens"), money=least("money"))
    assert drive(tokens_left(io, state, ctx)) == left.tokens
    assert drive(chain_left(io, state, ctx, (BudgetAxis.MONEY,))).tokens is None


def test_an_account_that_cannot_be_read_ends_the_walk() -> None:
    cfg = loop_settings()
    io = SyncIO(cfg)
    ctx = context().model_copy(update={"budget_account": "never-opened"})
    state = mid_run_state()
    left = drive(chain_left(io, state, ctx, AXES))
    assert left == ChainLeft(tokens=state.budget.remaining(BudgetAxis.TOKENS), money=None)
