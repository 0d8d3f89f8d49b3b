"""One assertion shared by the tests of records fencepost makes without validating them."""

from __future__ import annotations

from pydantic import BaseModel


def assert_same_record(a: BaseModel, b: BaseModel) -> None:
    """``a`` is what ``b`` is, as far as anything reading a contract record can tell: equal,
    of one type, given the same fields, holding them in the same order, dumping the same."""
    assert a == b
    assert type(a) is type(b)
    assert a.model_fields_set == b.model_fields_set
    assert list(a.__dict__) == list(b.__dict__)
    assert a.model_dump() == b.model_dump()
