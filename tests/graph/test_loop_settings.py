"""The loop's settings are one typed, frozen object (``fp.LoopSettings``) that ``create_agent``,
``build_agent_graph`` and ``FencepostMiddleware`` take as ``settings=``; keyword arguments of the
same names build it, and a keyword given with ``settings=`` wins over that field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import fencepost as fp
from fencepost.graph.settings import LoopOptions, LoopSettings, settings_of
from tests.graph.kit import Calls, make_registry
from tests.middleware.kit import Ran, lc_tools, specs

KEY = b"k" * 32


def _built(**given: Any) -> Any:
    cfg = settings_of(
        fp.build_agent_graph(make_registry(Calls()), fp.ScriptedDecisionModel([]), **given)
    )
    assert cfg is not None
    return cfg


def _agent_settings(**given: Any) -> Any:
    cfg = settings_of(
        fp.create_agent(fp.ScriptedDecisionModel([]), make_registry(Calls()), **given)
    )
    assert cfg is not None
    return cfg


def _settings_fields(cfg: Any) -> dict[str, Any]:
    names = ("approval", "repeat_limit", "denial", "verdict_key", "repair_attempts", "four_eyes")
    return {name: getattr(cfg, name) for name in names}


CHOSEN: dict[str, Any] = {
    "approval": "interrupt",
    "repeat_limit": 5,
    "denial": "observe",
    "verdict_key": KEY,
    "repair_attempts": 0,
    "four_eyes": True,
}


def test_a_settings_object_builds_the_loop_its_keywords_build() -> None:
    by_object = _built(settings=fp.LoopSettings(**CHOSEN))
    by_keywords = _built(**CHOSEN)
    assert _settings_fields(by_object) == _settings_fields(by_keywords) == CHOSEN
    assert _settings_fields(_agent_settings(settings=fp.LoopSettings(**CHOSEN))) == CHOSEN


def test_a_keyword_wins_over_the_same_field_of_the_settings_object() -> None:
    base = fp.LoopSettings(approval="interrupt", repeat_limit=3)
    for cfg in (
        _built(settings=base, repeat_limit=7),
        _agent_settings(settings=base, repeat_limit=7),
    ):
        assert cfg.repeat_limit == 7
        assert cfg.approval == "interrupt"  # the fields not given as keywords are the object's
    assert base.repeat_limit == 3  # the shared object itself is never changed


def test_a_keyword_that_overrides_is_checked_like_any_other() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        _built(settings=fp.LoopSettings(), repeat_limit=0)
    assert raised.value.field == "repeat_limit"


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("approval", "sometimes"),
        ("repeat_limit", 0),
        ("repeat_limit", True),
        ("ledger", object()),
        ("model_timeout_seconds", float("inf")),
        ("model_timeout_seconds", "60"),
        ("model_retries", -1),
        ("max_concurrent_tools", 0),
        ("verdict_key", b"short"),
        ("tokens_per_step", -1),
        ("answer_margin", -1),
        ("repair_attempts", 1.5),
        ("denial", "shrug"),
        ("approver", "yes"),
        ("needs_approval", 3),
        ("approval_right", ""),
        ("four_eyes", "yes"),
        ("price", "no-such-model"),
        ("price", 0.5),
        ("prices", {}),
    ],
)
def test_the_settings_object_refuses_a_bad_value_naming_its_field(field: str, bad: Any) -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.LoopSettings(**{field: bad})
    assert raised.value.field == field


def test_settings_must_be_a_loop_settings() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        _built(settings={"approval": "interrupt"})
    assert raised.value.field == "settings"


def test_the_settings_object_is_frozen() -> None:
    settings = fp.LoopSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.repeat_limit = 9  # type: ignore[misc]


def test_every_setting_is_a_keyword_of_the_bindings() -> None:
    names = {f.name for f in dataclasses.fields(LoopSettings)}
    assert set(LoopOptions.__optional_keys__) == names
    assert not LoopOptions.__required_keys__


def test_the_middleware_takes_the_settings_object() -> None:
    middleware = fp.FencepostMiddleware(
        specs(lc_tools(Ran())), settings=fp.LoopSettings(denial="observe", repeat_limit=4)
    )
    assert middleware.cfg.denial == "observe"
    assert middleware.cfg.repeat_limit == 4
    # What LangChain's agent does itself is never held by the binding.
    assert (middleware.cfg.answer_margin, middleware.cfg.repair_attempts) == (0, 0)


@pytest.mark.parametrize("setting", [{"four_eyes": True}, {"require_citations": True}])
def test_the_middleware_refuses_a_setting_it_does_not_take_from_the_settings_object(
    setting: dict[str, Any],
) -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.FencepostMiddleware(specs(lc_tools(Ran())), settings=fp.LoopSettings(**setting))
    assert raised.value.field == next(iter(setting))
