"""Ledger names are stable: a durable ledger of a run in flight holds them across an upgrade, and
a name is the digest of the JSON text of its parts, whatever the parts hold or claim to be."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost.policy import keys
from fencepost.policy.keys import _digest, call_key, run_account, task_run_id


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


def test_the_run_account_name_is_injective_in_thread_and_run_id() -> None:
    assert run_account("a\x1fb", "c") != run_account("a", "b\x1fc")


def _json_digest(*parts: str) -> str:
    """The digest as the JSON text of its parts: every key already in a durable ledger was made
    so."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode("ascii")).hexdigest()[:32]


def test_ledger_key_digest_is_the_json_digest_for_every_string_lone_surrogates_included() -> None:
    rnd = random.Random(7)
    pools = [(0, 0x7F), (0x80, 0xD7FF), (0xD800, 0xDFFF), (0xE000, 0x10FFFF)]

    def text() -> str:
        return "".join(chr(rnd.randint(*rnd.choice(pools))) for _ in range(rnd.randint(0, 12)))

    fixed = [
        "",
        '"',
        "\\",
        "\x00",
        "\x1f",
        "\x7f",
        "\ud800",
        "\udfff",
        "\ud83d\ude00",
        "😀",
        "\u2028",
    ]
    samples = [tuple(fixed)] + [
        tuple(text() for _ in range(rnd.randint(0, 4))) for _ in range(20000)
    ]
    for parts in samples:
        assert _digest(*parts) == _json_digest(*parts), parts
    # A str subclass hashes as its text, as json.dumps wrote it.
    weird = type("Weird", (str,), {"__str__": lambda self: "other"})("acme")
    assert _digest(weird) == _json_digest("acme")


def test_the_run_account_cache_names_every_run_as_the_uncached_scheme_does() -> None:
    # The cache is keyed by names callers choose (thread ids, run ids); it is safe to share only
    # while its value is a pure function of them: the same account however it is asked for.
    for thread_id, run_id, namespace in [
        ("t-1", "r-1", ""),
        ("t-1", "r-2", ""),  # a thread names its run: the run id does not move it
        ("t-1", "r-1", "agent:1"),
        ("", "r-1", ""),
        ("", "r-1", "agent:1"),  # no thread: the run id names it, the namespace is not used
    ]:
        expected = (
            f"run:{_json_digest('thread', thread_id, namespace)}"
            if thread_id and namespace
            else f"run:{_json_digest('thread', thread_id)}"
            if thread_id
            else f"run:{_json_digest('run', run_id)}"
        )
        assert run_account(thread_id, run_id, namespace) == expected
        assert run_account(thread_id, run_id, namespace=namespace) == expected


class _LyingText(str):
    """A str whose Python-level views lie; the digest must read its text."""

    def __str__(self) -> str:
        return "other"

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Any:
        return iter("zz")


@pytest.mark.parametrize(
    "part",
    [
        "",
        "\ud800",
        "\udfff\ud800",
        '"\\\x00\x1f\x7f',
        "😀\u2028",
        "a" * 100_000,
        _LyingText("acme"),
    ],
    ids=repr,
)
def test_a_one_part_ledger_key_is_the_json_digest_durable_ledgers_already_hold(part: str) -> None:
    text = str.__str__(part)
    expected = hashlib.sha256(json.dumps((text,), ensure_ascii=True).encode("ascii"))
    assert _digest(part) == expected.hexdigest()[:32]


def test_names_hashed_once_a_run_keep_no_entry_in_the_shared_digest_cache() -> None:
    # A run's account (cached whole by run_account) and a task's run id are hashed once a run:
    # an entry for them in the digest cache would never be read, and is held while the run is.
    thread = f"thread-{uuid.uuid4()}"
    _digest.cache_clear()  # not full: an entry added is counted, not traded for an evicted one
    before = _digest.cache_info().currsize
    run_account(thread, "run-1")
    run_account(thread, "run-1", "child:1", turn=2, branch="b")
    task_run_id(thread, "decide:1")
    assert _digest.cache_info().currsize == before
    # A call id is hashed at every key of the call: kept.
    call_key(run_account(thread, "run-1"), f"call-{uuid.uuid4()}", 1)
    assert _digest.cache_info().currsize == before + 1
