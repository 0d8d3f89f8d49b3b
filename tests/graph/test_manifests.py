"""Step manifests stream on the custom stream mode and stay in state, one per step and phase."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, get_args

from hypothesis import given
from hypothesis import strategies as st

import fencepost as fp
from fencepost.graph.trace import recorded
from fencepost.graph.writes import step_writes
from fencepost.policy import AgentState, Phase, StepManifest, VerdictCode
from fencepost.policy.budget import default_budget
from fencepost.policy.decision import DecisionKind
from fencepost.policy.effect import Effect
from fencepost.policy.manifest import Outcome
from tests.graph.kit import budget, call, context, final_citing_all, harness, thread


def test_manifests_stream_on_custom_mode_and_stay_in_state() -> None:
    h = harness([call(), fp.AbstainProposal(reason="insufficient_evidence")])
    config = thread()
    streamed = [
        chunk
        for chunk in h.graph.stream(
            fp.start("q", budget()), config, context=context(), stream_mode="custom"
        )
        if chunk.get("fencepost") == "manifest"
    ]
    state = fp.run_output(h.graph.get_state(config).values)
    assert [{k: v for k, v in c.items() if k != "fencepost"} for c in streamed] == [
        m.model_dump(mode="json") for m in state.manifests
    ]
    assert [m.phase for m in state.manifests] == [
        fp.policy.Phase.VALIDATE,
        fp.policy.Phase.EXECUTE,
        fp.policy.Phase.DECIDE,
        fp.policy.Phase.TERMINAL,
    ]


_texts = st.none() | st.text(max_size=6)
_counts = st.integers(0, 2**31)


@given(
    step=_counts,
    phase=st.sampled_from(list(Phase)),
    decision_kind=st.sampled_from([None, *get_args(DecisionKind)]),
    tool_name=_texts,
    effect=st.sampled_from([None, *Effect]),
    verdict=st.sampled_from([None, *VerdictCode]),
    remaining=st.tuples(_counts, _counts),
    tokens_used=_counts,
    deadline_remaining_ms=st.none() | _counts,
    outcome=st.sampled_from(get_args(Outcome)),
    code=_texts,
    approval=st.sampled_from([None, "approver", "human"]),
    provenance=st.none() | st.dictionaries(st.text(max_size=4), st.lists(st.text(max_size=4))),
)
def test_a_streamed_manifest_is_its_json_dump_and_its_write_its_plain_form(
    step: int,
    phase: Phase,
    decision_kind: Any,
    tool_name: str | None,
    effect: Effect | None,
    verdict: VerdictCode | None,
    remaining: tuple[int, int],
    tokens_used: int,
    deadline_remaining_ms: int | None,
    outcome: Any,
    code: str | None,
    approval: Any,
    provenance: dict[str, list[str]] | None,
) -> None:
    manifest = StepManifest.model_validate(
        {
            "run_id": "run-1",
            "step": step,
            "phase": phase,
            "decision_kind": decision_kind,
            "tool_name": tool_name,
            "effect": effect,
            "verdict": verdict,
            "steps_remaining": remaining[0],
            "tool_calls_remaining": remaining[1],
            "tokens_used": tokens_used,
            "deadline_remaining_ms": deadline_remaining_ms,
            "outcome": outcome,
            "code": code,
            "approval": approval,
            "provenance": provenance,
        },
        strict=False,
    )
    streamed: list[Any] = []
    runtime = SimpleNamespace(stream_writer=streamed.append)
    state = AgentState(run_id="run-1", question="q", budget=default_budget())
    after = recorded(state, runtime, [manifest])  # type: ignore[arg-type]
    # Streamed once, the manifest is dumped once: the step's write takes that plain form.
    (chunk,) = streamed
    assert list(chunk.items()) == [
        ("fencepost", "manifest"),
        *manifest.model_dump(mode="json").items(),
    ]
    (written,) = step_writes(state, after)["run"]["manifests"]
    assert written == manifest.model_dump(mode="json", exclude_defaults=True)


@given(
    provenance=st.dictionaries(
        st.text(max_size=4), st.lists(st.text(max_size=4)), min_size=1, max_size=3
    ),
)
def test_a_streamed_manifest_edited_in_place_by_its_consumer_never_changes_the_steps_write(
    provenance: dict[str, list[str]],
) -> None:
    # A stream consumer owns its chunk: a manifest dumped once for its chunk and its write
    # shares no container with the write (a checkpoint, the next node's state).
    manifest = StepManifest.model_validate(
        {
            "run_id": "run-1",
            "step": 1,
            "phase": "validate",
            "steps_remaining": 1,
            "tool_calls_remaining": 1,
            "outcome": "allowed",
            "provenance": provenance,
        },
        strict=False,
    )
    streamed: list[Any] = []
    runtime = SimpleNamespace(stream_writer=streamed.append)
    state = AgentState(run_id="run-1", question="q", budget=default_budget())
    after = recorded(state, runtime, [manifest])  # type: ignore[arg-type]
    (chunk,) = streamed
    # Every other field of a chunk is a scalar: nothing there to edit in place.
    assert all(
        type(value) in (str, int, bool, type(None))
        for name, value in chunk.items()
        if name != "provenance"
    )
    for labels in chunk["provenance"].values():
        labels.append("forged")
    chunk["provenance"]["forged"] = ["forged"]
    (written,) = step_writes(state, after)["run"]["manifests"]
    assert written == manifest.model_dump(mode="json", exclude_defaults=True)


def test_runs_of_many_tenants_on_threads_at_once_each_write_only_their_own_manifests() -> None:
    # A manifest's dump is kept process-wide between its stream chunk and its write: runs of
    # different tenants streaming at once on threads, each write still carries its own run's
    # manifests, as many as it streamed.
    start = threading.Barrier(6)
    seen: dict[str, tuple[list[Any], list[Any]]] = {}

    def one(n: int) -> None:
        h = harness([call(n=1), call(n=2), final_citing_all])
        config = thread()
        start.wait()
        streamed = [
            chunk
            for chunk in h.graph.stream(
                fp.start("q", budget()),
                config,
                context=context(tenant=f"tenant-{n}"),
                stream_mode="custom",
            )
            if isinstance(chunk, dict) and chunk.get("fencepost") == "manifest"
        ]
        written = h.graph.get_state(config).values["run"]["manifests"]
        seen[f"tenant-{n}"] = (streamed, written)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 6
    for streamed, written in seen.values():
        (run_id,) = {m["run_id"] for m in written}
        assert {m["run_id"] for m in streamed} == {run_id}
        shown = [{k: v for k, v in m.items() if k != "fencepost"} for m in streamed]
        assert shown == [StepManifest.model_validate(m).model_dump(mode="json") for m in written]
