"""Progress is judged by evidence, not only by arguments (seed 002).

Same tool, same arguments and the same result (or the same error code): no progress. The same
arguments with a new result (a status that changed): progress. A polling tool declares its
interval: polling sooner is no progress, on time is fine. Results are kept as hashes only.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

import fencepost as fp
from fencepost.policy import FakeClock
from tests.graph.kit import ABSTAIN, context, harness, thread


class TaskArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    task_id: str


def _status_tool(
    results: Iterator[Any],
    *,
    poll: float | None = None,
    clock: FakeClock | None = None,
    advance: float = 0.0,
) -> fp.ToolRegistry:
    def status(args: TaskArgs, ctx: fp.ToolContext) -> Any:
        if clock is not None:
            clock.advance(advance)
        value = next(results)
        if isinstance(value, BaseException):
            raise value
        return value

    return fp.ToolRegistry(
        [
            fp.ToolSpec(
                name="task_status",
                description="The status of a durable task.",
                args_model=TaskArgs,
                effect=fp.Effect.READ,
                capability="tasks:read",
                timeout_seconds=5,
                execute=status,
                poll_interval_seconds=poll,
            )
        ]
    )


def _polls(n: int) -> list[fp.ToolProposal]:
    return [
        fp.ToolProposal(
            call_id=f"call-{i:04d}", tool_name="task_status", arguments={"task_id": "task-17"}
        )
        for i in range(1, n + 1)
    ]


def _run(registry: fp.ToolRegistry, script: list[Any], **kw: Any) -> tuple[fp.AgentState, int]:
    ran = 0
    h = harness(script, registry=registry, **kw)
    out = h.graph.invoke(
        fp.start(
            "Is the task done?", fp.RuntimeBudget(steps_remaining=12, tool_calls_remaining=10)
        ),
        thread(),
        context=context(caps=frozenset({"tasks:read"}), seconds=None),
    )
    state = fp.run_output(out)
    ran = sum(1 for o in state.observations)
    return state, ran


def test_the_same_call_with_the_same_result_is_no_progress() -> None:
    same = iter([{"state": "running"}] * 10)
    state, ran = _run(_status_tool(same), [*_polls(5), ABSTAIN])
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert ran == 2


def test_the_same_call_with_the_same_error_code_is_no_progress() -> None:
    errors = iter([fp.ToolError(fp.ErrorCode.UNAVAILABLE)] * 10)
    state, ran = _run(_status_tool(errors), [*_polls(5), ABSTAIN])
    assert state.termination is fp.TerminationReason.NO_PROGRESS
    assert ran == 2


def test_the_same_call_with_a_changed_result_is_progress() -> None:
    changing = iter(
        [
            {"state": "queued"},
            {"state": "running"},
            {"state": "running 50%"},
            {"state": "running 90%"},
            {"state": "done"},
        ]
    )
    state, ran = _run(_status_tool(changing), [*_polls(5), ABSTAIN])
    assert ran == 5
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


def test_polling_on_time_is_progress_even_when_the_status_has_not_changed() -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    same = iter([{"state": "running"}] * 10)
    registry = _status_tool(same, poll=60, clock=clock, advance=61)
    state, ran = _run(registry, [*_polls(5), ABSTAIN], clock=clock)
    assert ran == 5
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE


def test_polling_sooner_than_the_declared_interval_is_no_progress() -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    changing = iter([{"state": f"step {i}"} for i in range(10)])
    registry = _status_tool(changing, poll=300, clock=clock, advance=5)
    state, ran = _run(registry, [*_polls(5), ABSTAIN], clock=clock)
    assert ran == 1
    assert state.termination is fp.TerminationReason.NO_PROGRESS


def test_results_are_remembered_as_hashes_never_as_text() -> None:
    secret = "tenant-secret-status-text"
    same = iter([{"state": secret}] * 10)
    state, _ = _run(_status_tool(same), [*_polls(3), ABSTAIN])
    assert state.evidence
    assert all(secret not in value for value in state.evidence.values())
