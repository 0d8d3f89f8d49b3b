"""The middleware takes ``fp.create_agent``'s settings, checked by the same function
(``fp.LoopSettings``): a bad value names its field, and a setting it does not take
yet is refused, never silently ignored."""

from __future__ import annotations

from typing import Any

import pytest

import fencepost as fp
from tests.middleware.kit import Ran, lc_tools, specs


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ({"approval": "sometimes"}, "approval"),
        ({"repeat_limit": 0}, "repeat_limit"),
        ({"denial": "shrug"}, "denial"),
        ({"verdict_key": b"short"}, "verdict_key"),
        ({"ledger": object()}, "ledger"),
        ({"approver": lambda request: None}, "approver"),
        ({"needs_approval": lambda question: True}, "needs_approval"),
        ({"approval_right": "approve:notes"}, "approval_right"),
        ({"four_eyes": True}, "four_eyes"),
        ({"budget": {"steps_remaining": 3}}, "budget"),
    ],
)
def test_a_bad_or_untaken_setting_is_refused_naming_its_field(
    setting: dict[str, Any], field: str
) -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.FencepostMiddleware(specs(lc_tools(Ran())), **setting)
    assert raised.value.field == field
    # The graph binding refuses the same bad values with the same field.
    if field in {"approval", "repeat_limit", "denial", "verdict_key", "ledger"}:
        with pytest.raises(fp.GraphConfigError) as graph_raised:
            fp.create_agent(fp.ScriptedDecisionModel([]), specs(lc_tools(Ran())), **setting)
        assert graph_raised.value.field == field


def test_a_langchain_tool_not_wrapped_with_its_effect_is_refused() -> None:
    with pytest.raises(fp.GraphConfigError) as raised:
        fp.FencepostMiddleware(lc_tools(Ran()))
    assert raised.value.field == "tools"
