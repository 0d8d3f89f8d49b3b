"""Fingerprints name (tool, canonical args): blind to key order and whitespace, not to values."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost.policy import canonical_json, proposal_fingerprint
from fencepost.policy.fingerprint import fingerprint_of

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=5)


def _reordered(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys inserted in a shuffled order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _reordered(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_reordered(item, rng) for item in value]
    return value


@settings(max_examples=150, deadline=None)
@given(
    args=arguments,
    seed=st.integers(),
    indent=st.none() | st.integers(min_value=0, max_value=4),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,  ", "  :\t")]),
    ensure_ascii=st.booleans(),
)
def test_fingerprint_ignores_key_order_and_json_whitespace(
    args: dict[str, Any],
    seed: int,
    indent: int | None,
    separators: tuple[str, str],
    ensure_ascii: bool,
) -> None:
    text = json.dumps(
        _reordered(args, random.Random(seed)),
        indent=indent,
        separators=separators,
        ensure_ascii=ensure_ascii,
    )
    other = json.loads(text)
    assert proposal_fingerprint("search_logs", other) == proposal_fingerprint("search_logs", args)


@settings(max_examples=150, deadline=None)
@given(args=arguments, data=st.data())
def test_fingerprint_differs_when_an_argument_differs(args: dict[str, Any], data: Any) -> None:
    key = data.draw(st.sampled_from(sorted(args)))
    new = data.draw(json_values.filter(lambda v: canonical_json(v) != canonical_json(args[key])))
    changed = {**args, key: new}
    assert proposal_fingerprint("search_logs", changed) != proposal_fingerprint("search_logs", args)
    extra_key = data.draw(st.text(max_size=6).filter(lambda k: k not in args))
    added = {**args, extra_key: None}
    assert proposal_fingerprint("search_logs", added) != proposal_fingerprint("search_logs", args)


@settings(max_examples=50, deadline=None)
@given(args=arguments)
def test_fingerprint_differs_when_the_tool_differs(args: dict[str, Any]) -> None:
    assert proposal_fingerprint("search_logs", args) != proposal_fingerprint("search_mail", args)


def test_type_differences_are_argument_differences() -> None:
    base = proposal_fingerprint("t_tool", {"n": 1})
    assert proposal_fingerprint("t_tool", {"n": "1"}) != base
    assert proposal_fingerprint("t_tool", {"n": True}) != base
    assert proposal_fingerprint("t_tool", {"n": [1]}) != base


def test_fingerprint_is_a_hash_that_holds_no_argument_text() -> None:
    fingerprint = proposal_fingerprint("search_logs", {"query": "password=hunter2"})
    assert len(fingerprint) == 64
    assert set(fingerprint) <= set("0123456789abcdef")
    assert "hunter2" not in fingerprint


def test_canonical_json_is_sorted_compact_and_keeps_unicode() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": "é"}]}) == (
        '{"a":[1,{"c":"é","d":null}],"b":1}'
    )


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_canonical_json_refuses_non_json_numbers(number: float) -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": number})


def test_only_integers_a_checkpoint_can_store_fit() -> None:
    from fencepost.policy import fits_checkpoint

    assert fits_checkpoint({"a": [2**64 - 1, -(2**63), True, 1.5, "x"]})
    assert not fits_checkpoint({"a": [{"b": 2**64}]})
    assert not fits_checkpoint([-(2**63) - 1])


@settings(max_examples=200, deadline=None)
@given(tool=st.text(max_size=12), args=json_values)
def test_a_fingerprint_from_canonical_arguments_is_the_fingerprint_of_the_call(
    tool: str, args: Any
) -> None:
    # The gate fingerprints from the canonical text it already made for the schema check: that
    # must be the very hash of the whole call, whatever the tool name or arguments hold.
    whole = canonical_json({"tool": tool, "arguments": args})
    expected = hashlib.sha256(whole.encode("utf-8")).hexdigest()
    assert fingerprint_of(tool, canonical_json(args)) == expected
    assert proposal_fingerprint(tool, args) == expected


def _dumps(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


@settings(max_examples=300, deadline=None)
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=10)
        | st.tuples(st.integers()),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=6), children, max_size=4)
            | st.dictionaries(st.integers(), children, max_size=3)
        ),
        max_leaves=25,
    )
)
def test_canonical_json_is_the_text_json_dumps_gives(value: Any) -> None:
    # Fingerprints (and so repeat counts in checkpoints) are hashes of this text: the encoder
    # made once must write what json.dumps writes, and refuse what it refuses.
    try:
        expected: str | type[Exception] = _dumps(value)
    except (ValueError, TypeError) as exc:
        expected = type(exc)
    if isinstance(expected, str):
        assert canonical_json(value) == expected
    else:
        with pytest.raises(expected):
            canonical_json(value)


def test_canonical_json_refuses_what_json_dumps_refuses() -> None:
    circular: list[Any] = []
    circular.append(circular)
    for value in ({"x": object()}, circular, {(1, 2): 1}, float("nan")):
        with pytest.raises((ValueError, TypeError)) as ours:
            canonical_json(value)
        with pytest.raises((ValueError, TypeError)) as theirs:
            _dumps(value)
        assert type(ours.value) is type(theirs.value)
        assert str(ours.value) == str(theirs.value)
    assert canonical_json("é\x00") == _dumps("é\x00")


def test_canonical_json_refuses_a_cycle_and_a_too_deep_value_as_json_dumps_does() -> None:
    # A cycle must be the ValueError json.dumps raises, and a value too deep its
    # RecursionError, whatever markers the encoder keeps.
    cycle: dict[str, Any] = {"a": [1, {"b": None}]}
    cycle["a"][1]["b"] = cycle
    with pytest.raises(ValueError, match="Circular reference detected"):
        canonical_json(cycle)
    deep: list[Any] = []
    inner = deep
    for _ in range(sys.getrecursionlimit() + 100):
        inner.append([])
        inner = inner[0]
    with pytest.raises(RecursionError):
        _dumps(deep)
    with pytest.raises(RecursionError):
        canonical_json(deep)
    assert canonical_json({"x": cycle["a"][0]}) == '{"x":1}'  # the encoder is fine after


# -- values that lie about what they are, cycles, many threads ----------------------------------


def _outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "ok", encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


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


ODD_VALUES: list[Any] = [
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


@pytest.mark.parametrize("value", ODD_VALUES, ids=lambda v: type(v).__name__)
def test_canonical_json_gives_json_dumps_text_and_error_for_subclasses_surrogates_and_cycles(
    value: Any,
) -> None:
    assert _outcome(canonical_json, value) == _outcome(_dumps, value)


def test_canonical_json_refuses_a_cycle_at_the_cost_json_dumps_refused_it() -> None:
    # Without circular markers a cycle is found only at the recursion limit, every level up to
    # it encoded first (its output kept): a wide cyclic dict would cost ~1000x json.dumps's time
    # and memory (about 150 MB here, against well under 1 MB). Markers find it on the way back
    # in. Memory is measured, not time: it does not depend on how busy the machine is.
    wide: dict[str, Any] = {f"k{i:05d}": "v" for i in range(2000)}
    wide["~"] = wide  # sorts last: the whole level is written before the cycle is reached
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="Circular reference"):
            canonical_json(wide)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000


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
