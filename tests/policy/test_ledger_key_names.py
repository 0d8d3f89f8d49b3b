"""Ledger names are stable: a durable ledger of a run in flight holds them across an upgrade."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import keys


def test_names_of_a_run_in_flight_do_not_change_across_releases() -> None:
    # Values written by the release before this one: a resumed run must find its account,
    # reservations and markers under the same names.
    assert keys.run_account("thread-1", "run-1") == "run:57002b0cb41951b4fb938a35812ddb80"
    assert keys.run_account("th\x00é\u2028", "r", "ns|x") == "run:99dbea15653f67341e724f663da5599b"
    assert (
        keys.call_key("run:abc", 'call\x1f"id\\', 2)
        == "run:abc:call:5ea4768ff577a2ae0af48a36645fcace:2"
    )
    assert keys.run_tag("run-é") == "0f6bd098caf6319dc3112c1f6d3db89b"
    assert keys.task_run_id("t", "decide:1") == "run-3af6bf493548367e"


@given(st.lists(st.text(), min_size=1, max_size=4))
def test_a_name_hashes_its_parts_as_their_json_array(parts: list[str]) -> None:
    # Parts are kept apart whatever they hold: ("a\x1fb", "c") never names ("a", "b\x1fc").
    expected = hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode("ascii")).hexdigest()
    assert keys._digest(*parts) == expected[:32]
