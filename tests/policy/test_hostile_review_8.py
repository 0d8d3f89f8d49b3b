"""Hostile review of bf590b9..d7f8990 (policy half): canonical_json on json's C encoder without
circular markers, the schema gate calling pydantic's validator directly, and InMemoryLedger
skipping the name check for an account it has open.

Each fast path is held to "exactly what the slow path did, for every input": the same text,
the same error, at a cost of the same order, and no value accepted that the slow path refused.
The graph half is tests/graph/test_hostile_review_8.py, the adapter half
tests/adapters/test_hostile_review_8.py.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from fencepost.policy import Effect, InMemoryLedger
from fencepost.policy.fingerprint import canonical_json
from fencepost.policy.gates import ArgumentsValidatorFailed, check_schema
from fencepost.policy.ledger import InvalidLedgerKey
from fencepost.policy.reservations import call_amounts
from tests.policy.factories import make_proposal, make_spec


def _dumps(value: Any) -> str:
    """canonical_json as bf590b9 wrote it: every fingerprint already in a checkpoint is this."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "ok", encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


# === canonical_json ==============================================================================


class _Items(dict[str, Any]):
    """A dict whose items() lies about what it holds."""

    def items(self) -> Any:
        return [("z", 1)]


class _Str(str):
    def __str__(self) -> str:
        return "lie"


class _Float(float):
    def __repr__(self) -> str:
        return "lie"


class _Int(int):
    def __repr__(self) -> str:
        return "lie"


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _self_dict() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["a"] = [loop]
    return loop


def _deep(levels: int) -> list[Any]:
    root: list[Any] = []
    node = root
    for _ in range(levels):
        child: list[Any] = []
        node.append(child)
        node = child
    return root


HOSTILE: list[Any] = [
    -0.0,
    1e308,
    5e-324,
    float("nan"),
    float("-inf"),
    2**200,
    -(2**64),
    True,
    None,
    "\ud800",
    {"\udfff": "\ud83d"},
    '\u2028\x00"\\',
    {1: 2, 2.5: 3, None: 4, False: 5},
    {1: 2, "a": 3},  # mixed keys: sort_keys refuses
    {(1, 2): 3},
    [object()],
    _Items(a=1),
    _Str("x"),
    {_Str("k"): _Str("v")},
    _Float(1.5),
    [_Int(3)],
    (1, [2, (3,)]),
    _cycle(),
    _self_dict(),
    _deep(5000),
    {"a": [1, {"b": float("inf")}]},
]


@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: type(v).__name__)
def test_canonical_json_gives_json_dumps_text_and_error_for_hostile_values(value: Any) -> None:
    assert _outcome(canonical_json, value) == _outcome(_dumps, value)


def test_canonical_json_refuses_a_cycle_at_the_cost_json_dumps_refused_it() -> None:
    # Without circular markers a cycle is found only at the recursion limit: every level up to
    # it is encoded first (its output kept), so a wide cyclic dict cost ~1000x json.dumps's time
    # (20,000 keys: 92 s and 1.5 GB, against 0.07 s). Markers find it on the way back in.
    wide: dict[str, Any] = {f"k{i:05d}": "v" for i in range(2000)}
    wide["~"] = wide  # sorts last: the whole level is written before the cycle is reached
    started = time.perf_counter()
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json(wide)
    assert time.perf_counter() - started < 0.5


def test_canonical_json_is_json_dumps_text_from_many_threads_at_once() -> None:
    values = [
        {"q": f"v{i}", "n": i, "l": [i, {"x": -0.0, "\ud800": [True, None]}]} for i in range(64)
    ]
    shared = {"same": values}  # one object encoded by every thread at once
    wrong: list[Any] = []
    barrier = threading.Barrier(16)

    def work() -> None:
        barrier.wait()
        for _ in range(200):
            for v in (*values, shared):
                if canonical_json(v) != _dumps(v):
                    wrong.append(v)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# === the schema gate =============================================================================


class _StaticHook(BaseModel):
    """A model that replaces model_validate_json with a staticmethod (no ``__func__``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: str

    @staticmethod
    def model_validate_json(json_data: Any, **kwargs: Any) -> _StaticHook:  # type: ignore[override]
        if "forbidden" in json_data:
            raise ValueError("refused by the model's own hook")
        return _StaticHook.__pydantic_validator__.validate_json(json_data, **kwargs)  # type: ignore[no-any-return]


def test_a_schema_whose_model_validate_json_is_a_staticmethod_is_validated_through_it() -> None:
    # d7f8990 read ``model.model_validate_json.__func__``: a staticmethod (or any callable that
    # is not a bound method) raised AttributeError where the gate used to call it.
    spec = make_spec(args_model=_StaticHook)
    args = check_schema(spec, make_proposal({"query": "checkout"}))
    assert isinstance(args, _StaticHook) and args.query == "checkout"
    # What the hook raised is a schema refusal with no text (a broken validator's, pinned in
    # tests/invariants/test_1_every_run_ends_typed.py).
    with pytest.raises(ArgumentsValidatorFailed):
        check_schema(spec, make_proposal({"query": "forbidden"}))


# === InMemoryLedger: an open account's name is not checked again =================================


_INVALID = "run-\x00evil"


class _ClaimsEveryName(str):
    """A str that hashes as ``_INVALID`` and says it equals anything."""

    def __hash__(self) -> int:
        return hash(_INVALID)

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False


def test_an_invalid_account_name_is_refused_even_when_an_open_account_claims_to_equal_it() -> None:
    # The skip trusted ``account in self._parents``: a key that some tenant opened as a str
    # subclass answers that lookup for another text, so a name with a control character (which
    # bf590b9 refused) was booked as a reservation's account.
    ledger = InMemoryLedger()
    ledger.open_account(_ClaimsEveryName("run-1"), {"tool_calls": 5})
    with pytest.raises(InvalidLedgerKey):
        ledger.reserve(_INVALID, "k-1", {"tool_calls": 1})


def test_an_open_accounts_name_still_reserves_and_a_str_subclass_of_it_is_checked() -> None:
    ledger = InMemoryLedger()
    ledger.open_account("run-1", {"tool_calls": 3})
    assert ledger.reserve("run-1", "k-1", {"tool_calls": 1}).account == "run-1"
    assert ledger.reserve(_Str("run-1"), "k-2", {"tool_calls": 1}).account == "run-1"
    assert ledger.balance("run-1").held == {"tool_calls": 2.0}


# === reservation amounts =========================================================================


@pytest.mark.parametrize("effect", list(Effect))
@pytest.mark.parametrize("cost", [0, 0.5, 3])
def test_reservation_amounts_name_the_axes_as_plain_strings(effect: Effect, cost: float) -> None:
    amounts = call_amounts(make_spec(effect=effect, cost=cost))
    expected = {"tool_calls": 1.0}
    if effect is not Effect.READ:
        expected["mutations"] = 1.0
    if cost:
        expected["cost"] = float(cost)
    assert amounts == expected
    assert all(type(k) is str for k in amounts)  # a durable ledger's JSON keys


# === keys: a one-part digest ====================================================================


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
    import hashlib

    from fencepost.policy.keys import _digest

    text = str.__str__(part)
    expected = hashlib.sha256(json.dumps((text,), ensure_ascii=True).encode("ascii"))
    assert _digest(part) == expected.hexdigest()[:32]


def test_reservations_on_open_accounts_from_many_threads_are_each_booked_once() -> None:
    ledger = InMemoryLedger()
    for n in range(4):
        ledger.open_account(f"run-{n}", {"tool_calls": 10_000})
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(500):
            ledger.reserve(f"run-{i % 4}", f"k-{i}", {"tool_calls": 1})  # same keys: idempotent
            ledger.reserve(f"run-{i % 4}", f"t{t}-{i}", {"tool_calls": 1})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    held = sum(ledger.balance(f"run-{n}").held["tool_calls"] for n in range(4))
    assert held == 500 + 8 * 500
