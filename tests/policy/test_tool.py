"""ToolSpec is trusted configuration: a strict args model all the way down, a valid name."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from fencepost.policy import Effect, Principal
from tests.policy.factories import SearchArgs, make_spec


class Loose(BaseModel):
    query: str


class LooseInner(BaseModel):
    model_config = ConfigDict(extra="ignore")
    service: str


class StrictOuter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str
    inner: LooseInner


class StrictOuterList(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[LooseInner]


class StrictOuterOptional(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    inner: LooseInner | None = None


class StrictInner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    service: str


class StrictAllTheWay(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: StrictInner
    many: dict[str, list[StrictInner]] = {}


def test_args_model_that_allows_extra_keys_is_rejected_by_name() -> None:
    with pytest.raises(ValidationError, match=r"args_model must forbid extra keys.*Loose"):
        make_spec(args_model=Loose)


@pytest.mark.parametrize(
    ("model", "path"),
    [
        (StrictOuter, "StrictOuter.inner->LooseInner"),
        (StrictOuterList, "StrictOuterList.items->LooseInner"),
        (StrictOuterOptional, "StrictOuterOptional.inner->LooseInner"),
    ],
)
def test_args_model_whose_nested_model_allows_extra_keys_is_rejected(
    model: type[BaseModel], path: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        make_spec(args_model=model)
    assert path in str(caught.value)


def test_args_model_strict_all_the_way_down_is_accepted() -> None:
    assert make_spec(args_model=StrictAllTheWay).args_model is StrictAllTheWay
    assert make_spec(args_model=SearchArgs).args_model is SearchArgs


@pytest.mark.parametrize("name", ["Search", "x", "1search", "search-logs", "os.system", ""])
def test_tool_name_must_match_the_pattern(name: str) -> None:
    with pytest.raises(ValidationError):
        make_spec(name)


def test_tool_spec_is_frozen() -> None:
    spec = make_spec()
    with pytest.raises(ValidationError):
        spec.effect = Effect.WRITE  # type: ignore[misc]


def test_only_reads_default_to_retry_safe() -> None:
    assert make_spec(effect=Effect.READ).retry_safe is True
    assert make_spec(effect=Effect.WRITE).retry_safe is False
    assert make_spec(effect=Effect.EXTERNAL).retry_safe is False
    assert make_spec(effect=Effect.WRITE, idempotent=True).retry_safe is True


def test_principal_holds_only_its_capabilities() -> None:
    principal = Principal(id="user-1", capabilities=frozenset({"logs:read"}))
    assert principal.has("logs:read")
    assert not principal.has("logs:write")
    assert not principal.has("")
