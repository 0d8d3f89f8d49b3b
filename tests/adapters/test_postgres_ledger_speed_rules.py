"""Rules the Postgres ledger's faster reserve must keep, each compared with the in-memory reference.

The reserve function probes for room before it looks for what a request exceeds, reads the
balance in one ordered pass instead of calling ``fencepost_ledger_with_balance``, and the client
sends the axes and amounts as array literals it writes itself: these pin what that must not change.
"""

from __future__ import annotations

import contextlib
import math
import random
import struct
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from fencepost.adapters import PostgresLedger
from fencepost.adapters.ledger_postgres import _float_array, _text_array
from fencepost.policy import BudgetExhausted
from fencepost.policy.ledger import (
    MAX_NAME_LENGTH,
    AccountClosed,
    InMemoryLedger,
    InvalidLedgerKey,
    Ledger,
    validate_name,
)


@pytest.fixture
def ledger(postgres_schema: str) -> Iterator[PostgresLedger]:
    with PostgresLedger(postgres_schema) as made:
        yield made


def outcome(call: Callable[[], Any]) -> Any:
    """What a call returned, or the error it raised with the fields that name its cause."""
    try:
        return call()
    except BudgetExhausted as error:
        return ("BudgetExhausted", error.account, error.axis, error.limit, error.requested)
    except AccountClosed as error:
        return ("AccountClosed", error.account, error.reason)
    except (LookupError, ValueError) as error:
        return (type(error).__name__, str(error))


def both(ledger: Ledger, script: Callable[[Ledger], list[Any]]) -> tuple[list[Any], list[Any]]:
    return script(ledger), script(InMemoryLedger())


ODD_AXES = ('a"b', "back\\slash", "comma,{brace}", "NULL", " spaced ", "ünï-键", "'quote'")


def test_odd_axis_names_and_amounts_travel_unchanged(ledger: PostgresLedger) -> None:
    # Every character an array literal treats specially, a name that reads as NULL unquoted,
    # and amounts whose shortest text must read back as the same double.
    amounts = [0.1, 1 / 3, 1e-300, 2.5e-7, 0.0, 123456789.125, 7.0]

    def script(book: Ledger) -> list[Any]:
        limits = {axis: 1e300 for axis in ODD_AXES}
        request = dict(zip(ODD_AXES, amounts, strict=True))
        out = [
            outcome(lambda: book.open_account("tenant", limits)),
            outcome(lambda: book.open_account("run", limits, parent="tenant")),
            outcome(lambda: book.reserve("run", "k1", request)),
            outcome(lambda: book.reserve("run", "k1", request)),
            outcome(lambda: book.settle("k1", {ODD_AXES[0]: 0.05, ODD_AXES[1]: 1 / 7})),
            outcome(lambda: book.reserve("run", "k2", {ODD_AXES[3]: float("inf")})),
        ]
        return [*out, book.balance("run"), book.balance("tenant"), book.get("k1")]

    got, reference = both(ledger, script)
    assert got == reference
    reserved = got[2]
    assert list(reserved.amounts) == list(ODD_AXES)
    assert list(reserved.amounts.values()) == amounts


def test_a_reservation_carries_the_balance_that_balance_reads_in_the_same_order(
    ledger: PostgresLedger,
) -> None:
    ledger.open_account("tenant", {"cost": 100})
    ledger.open_account("run", {"tool_calls": 5, "cost": 10, "tokens": 100}, parent="tenant")
    ledger.reserve("run", "k1", {"tokens": 3, "mutations": 1})  # an axis the run does not limit
    reserved = ledger.reserve("run", "k2", {"cost": 2.5})
    assert reserved.balance is not None
    read = ledger.balance("run")
    assert reserved.balance == read
    assert list(reserved.balance.limits) == ["tool_calls", "cost", "tokens"]  # as opened
    assert list(reserved.balance.held) == list(read.held)
    assert reserved.balance.held == {"cost": 2.5, "mutations": 1.0, "tokens": 3.0}
    marker = ledger.reserve("run", "k3", {})  # a request of nothing charges nothing
    assert marker.balance == read
    assert not marker.existing


def test_exhaustion_names_the_nearest_account_then_the_first_requested_axis(
    ledger: PostgresLedger,
) -> None:
    def script(book: Ledger) -> list[Any]:
        book.open_account("tenant", {"cost": 1, "tool_calls": 1})
        book.open_account("run", {"cost": 1, "tool_calls": 1}, parent="tenant")
        book.open_account("sibling", {"cost": 5, "tool_calls": 5}, parent="tenant")
        return [
            outcome(lambda: book.reserve("run", "k1", {"tool_calls": 1, "cost": 1})),
            # Both accounts, both axes, do not fit: the run is nearer, cost was asked first.
            outcome(lambda: book.reserve("run", "k2", {"cost": 1, "tool_calls": 1})),
            outcome(lambda: book.reserve("run", "k3", {"tool_calls": 1, "cost": 1})),
            outcome(lambda: book.reserve("run", "k4", {"tokens": 9, "cost": 0.5})),
            # Only the shared tenant is full.
            outcome(lambda: book.reserve("sibling", "k5", {"tokens": 1, "tool_calls": 1})),
            outcome(lambda: book.reserve("sibling", "k6", {"tokens": 1})),
            outcome(lambda: book.get("k2")),
            book.balance("run"),
            book.balance("sibling"),
            book.balance("tenant"),
        ]

    got, reference = both(ledger, script)
    assert got == reference
    assert got[1][1:3] == ("run", "cost")
    assert got[2][1:3] == ("run", "tool_calls")
    assert got[4][1:3] == ("tenant", "tool_calls")


def test_closed_unknown_and_held_elsewhere_are_decided_as_before(ledger: PostgresLedger) -> None:
    def script(book: Ledger) -> list[Any]:
        book.open_account("tenant", {"cost": 1})
        book.open_account("run", {"cost": 1}, parent="tenant")
        book.open_account("other", {"cost": 1})
        out = [
            outcome(lambda: book.reserve("run", "k1", {"cost": 1})),
            outcome(lambda: book.reserve("ghost", "k1", {})),  # unknown account, key held
            outcome(lambda: book.reserve("ghost", "k2", {})),
            outcome(lambda: book.reserve("other", "k1", {})),
            outcome(lambda: book.close_account("tenant", "cancelled")),
            outcome(lambda: book.reserve("run", "k3", {"cost": 5})),  # closed before exhausted
            outcome(lambda: book.reserve("run", "k1", {"cost": 1})),  # its own key still returns
        ]
        out.append(outcome(lambda: book.close_account("run", "completed")))
        out.append(outcome(lambda: book.reserve("run", "k4", {})))  # the nearest closed is named
        return out

    got, reference = both(ledger, script)
    assert got == reference
    assert got[8] == ("AccountClosed", "run", "completed")


def _odd_names(count: int) -> list[str]:
    rnd = random.Random(5)
    alphabet = "{}\",\\ 'NULLnul\t[]:=$();"
    names = [
        '"',
        "\\",
        '\\"',
        "{",
        "}",
        ",",
        "{}",
        "{a,b}",
        '"{a,b}"',
        "NULL",
        " NULL ",
        "null",
        " ",
        "  lead and trail  ",
        "\u00a0",
        "\u2028",
        "\ufeff",
        "\u200b",
        "é",
        "😀",
        "\U0010ffff",
        "[1:1]={a}",
        "$$",
        "'",
        "a b",
        "x" * MAX_NAME_LENGTH,
        "😀" * MAX_NAME_LENGTH,
    ]
    while len(names) < count:
        n = rnd.randint(1, 30)
        names.append(
            "".join(
                rnd.choice(alphabet)
                if rnd.random() < 0.5
                else chr(
                    rnd.choice(
                        [
                            rnd.randint(0x20, 0x7E),
                            rnd.randint(0xA0, 0xD7FF),
                            rnd.randint(0xE000, 0x10FFFF),
                        ]
                    )
                )
                for _ in range(n)
            )
        )
    valid = []
    for name in names:
        with contextlib.suppress(InvalidLedgerKey):
            valid.append(validate_name(name, "axis"))
    return list(dict.fromkeys(valid))


def _odd_amounts(count: int) -> list[float]:
    rnd = random.Random(9)
    amounts = [
        0.0,
        -0.0,
        5e-324,
        2.2250738585072014e-308,
        2.225073858507201e-308,
        1e-320,
        1.7976931348623157e308,
        math.inf,
        0.1,
        1 / 3,
        2.0**53 + 2,
        1e16,
        1e22,
        1e23,
    ]
    while len(amounts) < count:
        bits = rnd.getrandbits(63)  # sign bit clear: non-negative, as validate_amounts wants
        value = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if not math.isnan(value):
            amounts.append(value)
    return amounts


def test_every_valid_axis_name_and_amount_reads_back_from_its_array_literal(
    postgres_schema: str,
) -> None:
    names, amounts = _odd_names(3000), _odd_amounts(3000)
    with psycopg.connect(postgres_schema) as conn:
        for i in range(0, len(names), 250):
            chunk = names[i : i + 250]
            row = conn.execute("SELECT %s::text[]", (_text_array(chunk),)).fetchone()
            assert row is not None and row[0] == chunk
        row = conn.execute("SELECT %s::float8[]", (_float_array(amounts),)).fetchone()
        assert row is not None
        for sent, got in zip(amounts, row[0], strict=True):
            assert got == sent and math.copysign(1, got) == math.copysign(1, sent), sent


def test_odd_names_and_amounts_reserve_settle_and_balance_as_the_in_memory_ledger(
    postgres_schema: str,
) -> None:
    names = _odd_names(400)[:120]
    amounts = [a for a in _odd_amounts(400) if a < 1e300][:120]

    def script(book: Ledger) -> list[Any]:
        out: list[Any] = []
        limits = {name: 1e300 for name in names[:60]}  # the rest are unlimited axes
        book.open_account("tenant", limits)
        book.open_account("run", dict(reversed(list(limits.items()))), parent="tenant")
        for k in range(0, 120, 15):
            request = dict(zip(names[k : k + 15], amounts[k : k + 15], strict=True))
            got = book.reserve("run", f"key-{k}", request)
            out.append((got.amounts, got.balance))
            out.append(book.reserve("run", f"key-{k}", request).balance)
            out.append(book.reserve("run", f"marker-{k}", {}).balance)
        out.append(book.settle("key-0", dict.fromkeys(names[:15], 0.0)).amounts)
        out.append((book.balance("tenant"), book.balance("run")))
        return out

    with PostgresLedger(postgres_schema) as ledger:
        assert script(ledger) == script(InMemoryLedger())
