"""The contract types' fast copy and assembly make exactly what pydantic's own would."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import fencepost as fp
from fencepost.policy.budget import BudgetAxis, budget_view
from fencepost.policy.contract import assemble
from fencepost.policy.ledger import Balance, Reservation, ReservationStatus
from tests.records import assert_same_record

amounts = st.dictionaries(
    st.sampled_from([a.value for a in BudgetAxis]),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
    max_size=5,
)


@given(steps=st.integers(0, 100), tools=st.integers(0, 100), used=st.integers(0, 100))
def test_a_copy_of_a_contract_type_is_pydantics_copy(steps: int, tools: int, used: int) -> None:
    budget = fp.RuntimeBudget(steps_remaining=steps, tool_calls_remaining=tools)
    update = {"steps_used": used}
    assert_same_record(
        budget.model_copy(update=update), BaseModel.model_copy(budget, update=update)
    )
    assert_same_record(budget.model_copy(), BaseModel.model_copy(budget))
    assert_same_record(budget.model_copy(deep=True), BaseModel.model_copy(budget, deep=True))


def test_a_copy_stays_frozen_and_leaves_the_original_alone() -> None:
    budget = fp.RuntimeBudget(steps_remaining=3, tool_calls_remaining=2)
    copy = budget.model_copy(update={"steps_remaining": 1})
    assert budget.steps_remaining == 3
    with pytest.raises(ValidationError):
        copy.steps_remaining = 5  # type: ignore[misc]


@given(limits=amounts, held=amounts)
def test_the_budget_view_is_what_validation_makes(
    limits: dict[str, float], held: dict[str, float]
) -> None:
    view = budget_view(limits, held)
    assert_same_record(view, fp.RuntimeBudget.model_validate(view.model_dump()))


@given(limits=amounts, held=amounts)
def test_an_assembled_ledger_record_is_what_validation_makes(
    limits: dict[str, float], held: dict[str, float]
) -> None:
    values = {
        "account": "acct",
        "parent": None,
        "limits": limits,
        "held": held,
        "owner": {"tenant": "t"},
        "closed": None,
        "windows": (),
    }
    balance = assemble(Balance, dict(values))
    assert_same_record(balance, Balance.model_validate(values))
    record = {
        "account": "acct",
        "key": "k",
        "amounts": held,
        "status": ReservationStatus.RESERVED,
        "existing": False,
        "balance": balance,
        "exceeded": None,
    }
    assert_same_record(assemble(Reservation, dict(record)), Reservation.model_validate(record))


def test_copies_sharing_a_field_set_never_change_each_other() -> None:
    values = {
        "account": "a",
        "parent": None,
        "limits": {},
        "held": {},
        "owner": {},
        "windows": (),
    }
    first = assemble(Balance, {**values, "closed": None})
    second = assemble(Balance, {**values, "closed": None})
    pydantic_copy = BaseModel.model_copy(first, update={"closed": "done"})
    ours = first.model_copy(update={"closed": "done"})
    assert pydantic_copy == ours and pydantic_copy.closed == "done"
    assert first.model_fields_set == second.model_fields_set == set(Balance.model_fields)
    budget = fp.RuntimeBudget(steps_remaining=1, tool_calls_remaining=1)
    widened = budget.model_copy(update={"steps_used": 1})
    assert "steps_used" in widened.model_fields_set
    assert "steps_used" not in budget.model_fields_set


def test_no_contract_type_makes_its_instances_its_own_way() -> None:
    # Assembled records are made with object's own __new__: a contract type with a __new__ of
    # its own would be skipped by it.
    import fencepost.policy  # noqa: F401  (every contract type defined)
    from fencepost.policy.contract import Frozen

    def subclasses(cls: type) -> list[type]:
        return [s for sub in cls.__subclasses__() for s in (sub, *subclasses(sub))]

    assert subclasses(Frozen)
    assert all(cls.__new__ is object.__new__ for cls in subclasses(Frozen))
