"""Gating a batch: repeats count within the batch, the run's counts are never changed, a batch's
dependencies form no cycle, and each call reserves its axes under their plain names."""

from __future__ import annotations

from datetime import UTC

import pytest

import fencepost as fp
from fencepost.policy import Effect, ToolRegistry, VerdictCode
from fencepost.policy.fingerprint import proposal_fingerprint
from fencepost.policy.gating import (
    duplicate_call_ids,
    gate_batch,
    invalid_dependencies,
)
from tests.policy.factories import make_proposal, make_spec, make_state, reader

REGISTRY = ToolRegistry((make_spec(),))
ARGS = {"query": "checkout 500"}
KEY = proposal_fingerprint("search_logs", ARGS)


def _gate(counts: dict[str, int], *call_ids: str, args: dict[str, str] = ARGS) -> list[str]:
    state = make_state(fingerprints=counts)
    calls = [make_proposal(args, call_id=c) for c in call_ids]
    gated = gate_batch(REGISTRY, calls, state, reader(), repeat_limit=2, approval="terminate")
    assert state.fingerprints == counts  # the run's own counts are left alone
    return [e.verdict.code.value for e in gated.batch] + [str(gated.fingerprints.get(KEY))]


def test_the_same_call_twice_in_one_batch_is_seen_twice() -> None:
    assert _gate({KEY: 1}, "call-0001", "call-0002") == ["allowed", "no_progress", "2"]
    assert _gate({}, "call-0001", "call-0002", "call-0003") == [
        "allowed",
        "allowed",
        "no_progress",
        "2",
    ]


def test_a_lone_call_counts_on_the_runs_own_count() -> None:
    assert _gate({KEY: 1}, "call-0001") == ["allowed", "2"]
    assert _gate({KEY: 2}, "call-0001") == ["no_progress", "2"]
    assert _gate({}, "call-0001") == ["allowed", "1"]


def test_a_denied_call_raises_no_count_for_the_calls_after_it() -> None:
    other = {"query": "*"}  # empty-like: a semantic denial, counted nowhere
    state = make_state(fingerprints={KEY: 1})
    calls = [make_proposal(other, call_id="call-0001"), make_proposal(ARGS, call_id="call-0002")]
    gated = gate_batch(REGISTRY, calls, state, reader(), repeat_limit=2, approval="terminate")
    codes = [e.verdict.code for e in gated.batch]
    assert codes == [VerdictCode.SEMANTIC_VIOLATION, VerdictCode.ALLOWED]
    assert gated.fingerprints == {KEY: 2}


def test_a_batch_reusing_a_call_id_is_a_duplicate_whatever_its_size() -> None:
    one = [make_proposal(call_id="call-0001")]
    assert duplicate_call_ids(one, {"call-0001": 1})
    assert not duplicate_call_ids(one, {"call-0002": 1})
    two = [make_proposal(call_id="call-0001"), make_proposal(call_id="call-0001")]
    assert duplicate_call_ids(two, {})
    assert not duplicate_call_ids([], {})


def test_a_polling_call_is_counted_under_its_repeat_key_not_its_time_key() -> None:
    # The repeat check of a polling tool keys by time; the batch counts the call under the
    # key every later step reads (repeat_key), as for any other tool.
    from datetime import datetime, timedelta

    from fencepost.policy.progress import repeat_key

    registry = ToolRegistry((make_spec(poll_interval_seconds=5),))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    evidence = {KEY: f"1:abc@{(now - timedelta(seconds=60)).isoformat()}"}
    state = make_state(evidence=evidence, fingerprints={})
    calls = [make_proposal(ARGS, call_id="call-0001")]
    gated = gate_batch(
        registry, calls, state, reader(), repeat_limit=2, approval="terminate", now=now
    )
    assert [e.verdict.code for e in gated.batch] == [VerdictCode.ALLOWED]
    assert gated.fingerprints == {repeat_key(KEY, state): 1}
    assert repeat_key(KEY, state) != KEY  # the epoch moved on: not the bare fingerprint


def test_a_batch_reusing_a_call_id_or_naming_an_impossible_dependency_is_refused_whole() -> None:
    from fencepost.policy.gating import refused_batch

    one = make_proposal({"query": "a"}, call_id="call-0001")
    twin = make_proposal({"query": "b"}, call_id="call-0001")
    assert refused_batch([one, twin], set(), set()).error_code == "duplicate_call_id"  # type: ignore[union-attr]
    assert refused_batch([one], {"call-0001"}, set()).error_code == "duplicate_call_id"  # type: ignore[union-attr]
    dependent = make_proposal({"query": "c"}, call_id="call-0002").model_copy(
        update={"depends_on": ("call-0009",)}
    )
    assert refused_batch([dependent], set(), set()).error_code == "invalid_dependency"  # type: ignore[union-attr]
    # An earlier call the ledger marks as having produced a result may be depended on.
    assert refused_batch([dependent], set(), {"call-0009"}) is None
    assert refused_batch([one], set(), set()) is None


@pytest.mark.parametrize("effect", list(Effect))
@pytest.mark.parametrize("cost", [0, 0.5, 3])
def test_a_tool_calls_amounts_name_the_axes_as_plain_strings(effect: Effect, cost: float) -> None:
    from fencepost.policy.reservations import call_amounts

    amounts = call_amounts(make_spec(effect=effect, cost=cost))
    expected = {"tool_calls": 1.0}
    if effect is not Effect.READ:
        expected["mutations"] = 1.0
    if cost:
        expected["cost"] = float(cost)
    assert amounts == expected
    assert all(type(k) is str for k in amounts)  # a durable ledger's JSON keys


def test_a_large_acyclic_batch_of_dependencies_is_accepted() -> None:
    # 1,200 calls each naming up to 64 earlier ones: accepted (the check is linear in calls and
    # edges; a quadratic walk made this take seconds).
    n = 1200
    calls = [
        fp.ToolProposal(
            call_id=f"call-{i:06d}",
            tool_name="search_logs",
            arguments={"query": "x"},
            depends_on=tuple(f"call-{j:06d}" for j in range(max(0, i - 64), i)),
        )
        for i in range(n)
    ]
    assert not invalid_dependencies(calls, set())
    looped = [*calls[:-1], calls[-1].model_copy(update={"depends_on": ("call-001199",)})]
    assert invalid_dependencies(looped, set())
