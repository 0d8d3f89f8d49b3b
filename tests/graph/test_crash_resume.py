"""Reservation is durable before the call: SIGKILL a real process mid-call, resume in a new one.

Each scenario runs ``crash_worker.py`` twice, each time in a fresh process forked from the suite's
fork server (``tests.conftest.worker_processes``). The first process starts the run on a durable
checkpointer + ledger (a SQLite file each, or Postgres) and hangs at one point — a tool body or
the decision model — after writing a durable log line; the test SIGKILLs it there. A second,
fresh process resumes the thread with ``graph.invoke(None, config, context=<same RunContext>)``.

Approvals: the graph runs with ``approval="interrupt"``, and the crash process approves the write
(``Command(resume="approve")``) before the tool starts, so the crash always hits an *approved*
call and the resume needs no second approval. Both processes invoke with ``durability="sync"``,
so the checkpoint before the hang is on disk when the kill comes (see the worker).

What must hold afterwards (DESIGN invariants 3 and 9):
- the tool ran no more times than the tool budget allowed;
- every attempt was charged exactly once: ``steps_used`` = model calls started, ``tool_calls_used``
  = tool bodies started, and the ledger's run account (``fencepost.policy.keys.run_account``) holds exactly that;
- nothing was refunded: every reservation key is still held (the crashed one never settled, never
  released), and the state's remaining budget is the limit minus every attempt;
- an idempotent write is retried with the same idempotency key (its call id) and ``attempt=2``;
- a non-idempotent write is not retried: its observation says ``execution_uncertain`` and its
  receipt is ``uncertain``;
- a crash while the model decides charges that step, and the retry decides as the next step;
- the run ends with a typed termination reason, not an exception.
"""

from __future__ import annotations

import json
import os
import select
import signal
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

import fencepost as fp
from fencepost.adapters import PostgresLedger, SqliteLedger
from fencepost.policy.keys import call_key, run_account, step_key
from fencepost.policy.ledger import Balance, Reservation, ReservationStatus
from tests.conftest import worker_processes
from tests.graph.crash_worker import (
    FIRST_CALL_ID,
    IDEMPOTENT_WRITE_TOOL,
    NON_IDEMPOTENT_WRITE_TOOL,
    READ_TOOL,
    run_phase,
)

CHILD_HANG_GUARD_SECONDS = 600.0
"""Only a guard against a child that hangs for good (a bug: the test fails instead of hanging
the suite); nothing waits for it on a healthy machine, however loaded."""


@dataclass(frozen=True)
class Backend:
    """Where the checkpoints and the ledger live."""

    name: str
    checkpoint: str
    ledger: str

    def open_ledger(self) -> SqliteLedger | PostgresLedger:
        if self.name == "sqlite":
            return SqliteLedger(self.ledger)
        return PostgresLedger(self.ledger)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A SqliteSaver + SqliteLedger on files, and a PostgresSaver + PostgresLedger on a schema."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_schema")
        return Backend("postgres", dsn, dsn)
    return Backend("sqlite", str(tmp_path / "checkpoints.db"), str(tmp_path / "ledger.db"))


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Backend:
    return Backend("sqlite", str(tmp_path / "checkpoints.db"), str(tmp_path / "ledger.db"))


@dataclass(frozen=True)
class Outcome:
    """Everything one crash-and-resume scenario left behind."""

    run_id: str
    state: fp.AgentState
    tool_starts: list[dict[str, Any]]
    """Every tool body start, from the durable log (crashed attempts included)."""
    model_calls: list[dict[str, Any]]
    """Every model call, from the durable log (the crashed one included)."""
    balance: Balance
    steps: dict[int, Reservation | None]
    """Ledger reservations under ``{run_id}:step:{n}``."""
    calls: dict[int, Reservation | None]
    """Ledger reservations under ``{run_id}:call:call-0001:{attempt}``."""
    spec: dict[str, Any]


def _start_child(
    spec: dict[str, Any], workdir: Path, handshake: Connection | None = None
) -> tuple[BaseProcess, Path, Path]:
    """Start one worker phase in a fresh process forked from the suite's fork server (see
    ``tests.conftest.worker_processes``: nothing shared with this process, no interpreter start
    or fencepost import paid per phase). Its stdout and stderr go to files in ``workdir``."""
    name = f"{spec['phase']}-{uuid.uuid4().hex[:8]}"
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    # The test's environment as it is now (FENCEPOST_TEST_SPANS among it), which the fork server
    # may not have: it keeps the environment it started with.
    args = (json.dumps(spec), str(out), str(err), dict(os.environ), handshake)
    proc = worker_processes().Process(target=run_phase, args=args, daemon=True)
    proc.start()
    return proc, out, err


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _run_child(
    spec: dict[str, Any], workdir: Path, *, timeout: float = CHILD_HANG_GUARD_SECONDS
) -> dict[str, Any]:
    """Run one worker phase to completion; its last stdout line is its JSON report."""
    proc, out, err = _start_child(spec, workdir)
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
    assert proc.exitcode == 0, f"{spec['phase']} failed ({proc.exitcode}):\n{_tail(err)}"
    report: dict[str, Any] = json.loads(out.read_text().strip().splitlines()[-1])
    return report


def _crash_child(spec: dict[str, Any], workdir: Path) -> None:
    """Start the crash phase, wait until it says it hangs at its point, and SIGKILL it there.

    A handshake, not a clock: the child writes one byte to a pipe at its hang point, and the
    pipe reads empty only once the child has exited (every write end closed: the fork server
    closes its copy once the child is forked, and this process its own below). However slowly
    a loaded machine starts it, the wait ends the moment one of the two happens."""
    heard, told = worker_processes().Pipe(duplex=False)
    try:
        proc, out, err = _start_child(spec, workdir, told)
    finally:
        told.close()  # the child's copy is the only write end left
    try:
        ready, _, _ = select.select([heard], [], [], CHILD_HANG_GUARD_SECONDS)
        if not ready:
            pytest.fail(f"the crash process hung before its point:\n{_tail(err)}")
        if os.read(heard.fileno(), 1) != b"!":
            proc.join(CHILD_HANG_GUARD_SECONDS)
            pytest.fail(
                f"the crash process exited ({proc.exitcode}) before it hung:\n"
                f"{_tail(out)}\n{_tail(err)}"
            )
    finally:
        heard.close()
        if proc.exitcode is None:
            proc.kill()
        proc.join(CHILD_HANG_GUARD_SECONDS)
    assert proc.exitcode == -signal.SIGKILL, "the child must die by SIGKILL, mid-call"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def crash_and_resume(
    backend: Backend,
    workdir: Path,
    *,
    tool: str,
    hang: str,
    hang_step: int = 1,
    steps: int = 4,
    tool_calls: int = 2,
) -> Outcome:
    """Run one scenario: crash a process at the hang point, resume in a new one, collect."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    spec: dict[str, Any] = {
        "backend": backend.name,
        "checkpoint": backend.checkpoint,
        "ledger": backend.ledger,
        "workdir": str(workdir),
        "thread_id": f"t-{uuid.uuid4().hex[:10]}",
        "run_id": run_id,
        # One absolute instant for both processes: the resume passes the same RunContext.
        "deadline": (datetime.now(UTC) + timedelta(minutes=5)).isoformat(),
        "tool": tool,
        "hang": hang,
        "hang_step": hang_step,
        "steps": steps,
        "tool_calls": tool_calls,
    }
    _crash_child({**spec, "phase": "crash"}, workdir)
    report = _run_child({**spec, "phase": "resume"}, workdir)
    assert report["interrupted"] is False, "the resumed run must not stop for a second approval"
    state = fp.AgentState.model_validate(report["state"])
    ledger = backend.open_ledger()
    try:
        account = run_account(spec["thread_id"], run_id)
        balance = ledger.balance(account)
        step_keys = {n: ledger.get(step_key(account, n)) for n in range(1, steps + 2)}
        call_keys = {
            a: ledger.get(call_key(account, FIRST_CALL_ID, a)) for a in range(1, tool_calls + 2)
        }
    finally:
        ledger.close()
    return Outcome(
        run_id=run_id,
        state=state,
        tool_starts=_read_jsonl(workdir / "tools.jsonl"),
        model_calls=_read_jsonl(workdir / "model.jsonl"),
        balance=balance,
        steps=step_keys,
        calls=call_keys,
        spec=spec,
    )


def assert_every_attempt_charged_once(o: Outcome, *, mutation: bool) -> None:
    """State, durable logs and ledger agree; nothing was refunded; the budget was not exceeded."""
    budget = o.state.budget
    steps, tool_calls = o.spec["steps"], o.spec["tool_calls"]
    # The tool ran no more times than the tool budget allowed, and each start was charged once.
    assert len(o.tool_starts) <= tool_calls
    assert budget.tool_calls_used == len(o.tool_starts)
    assert budget.steps_used == len(o.model_calls)
    assert budget.mutations_used == (len(o.tool_starts) if mutation else 0)
    # Nothing refunded in state: what is left is the limit minus every attempt.
    assert budget.steps_remaining == steps - budget.steps_used
    assert budget.tool_calls_remaining == tool_calls - budget.tool_calls_used
    # The ledger charged the run's account exactly the same, and never more than its limits.
    assert o.balance.limits == {"steps": steps, "tool_calls": tool_calls}
    held = {axis: amount for axis, amount in o.balance.held.items() if amount}
    expected = {"steps": budget.steps_used, "tool_calls": budget.tool_calls_used}
    if mutation:
        expected["mutations"] = budget.mutations_used
    assert held == expected
    # One reservation per attempt, none released (a release is a refund), none beyond them.
    call_amounts = {"tool_calls": 1.0, **({"mutations": 1.0} if mutation else {})}
    for n, reservation in o.steps.items():
        if n <= budget.steps_used:
            assert reservation is not None, f"step {n} was charged in state but not in the ledger"
            assert reservation.status is not ReservationStatus.RELEASED
            assert reservation.amounts == {"steps": 1.0}
        else:
            assert reservation is None
    for attempt, reservation in o.calls.items():
        if attempt <= budget.tool_calls_used:
            assert reservation is not None, f"attempt {attempt} was charged but not reserved"
            assert reservation.status is not ReservationStatus.RELEASED
            assert reservation.amounts == call_amounts
        else:
            assert reservation is None
    # A crashed tool attempt's reservation stays held: its outcome is unknown, never refunded.
    if o.spec["hang"] == "tool":
        crashed = o.calls[1]
        assert crashed is not None and crashed.status is ReservationStatus.RESERVED


def _only_receipt(o: Outcome) -> fp.Receipt:
    (receipt,) = o.state.receipts
    assert receipt.call_id == FIRST_CALL_ID
    return receipt


def _only_observation(o: Outcome) -> fp.policy.Observation:
    (observation,) = o.state.observations
    assert observation.call_id == FIRST_CALL_ID
    return observation


# -- (a) a read tool call in flight ------------------------------------------------------------


def test_read_call_crashed_in_flight_is_retried_once_as_attempt_two_and_charged_twice(
    backend: Backend, tmp_path: Path
) -> None:
    o = crash_and_resume(backend, tmp_path / "a", tool=READ_TOOL, hang="tool", tool_calls=2)

    assert o.state.termination is fp.TerminationReason.COMPLETED
    assert [(t["tool"], t["key"], t["attempt"]) for t in o.tool_starts] == [
        (READ_TOOL, FIRST_CALL_ID, 1),
        (READ_TOOL, FIRST_CALL_ID, 2),
    ]
    assert len({t["pid"] for t in o.tool_starts}) == 2, "attempt 2 ran in the new process"
    receipt = _only_receipt(o)
    assert receipt.status is fp.ReceiptStatus.COMPLETED
    assert receipt.attempts == 2
    assert_every_attempt_charged_once(o, mutation=False)


def test_read_call_crashed_with_no_tool_budget_left_is_not_run_again_and_is_uncertain(
    sqlite_backend: Backend, tmp_path: Path
) -> None:
    # With one tool call allowed, the crashed attempt spent it: exactly one start, not N+1.
    o = crash_and_resume(sqlite_backend, tmp_path / "a1", tool=READ_TOOL, hang="tool", tool_calls=1)

    assert [(t["tool"], t["attempt"]) for t in o.tool_starts] == [(READ_TOOL, 1)]
    observation = _only_observation(o)
    assert observation.kind == "tool_error"
    assert observation.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    assert _only_receipt(o).status is fp.ReceiptStatus.UNCERTAIN
    assert o.state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert_every_attempt_charged_once(o, mutation=False)


# -- (b) an idempotent write in flight ---------------------------------------------------------


def test_idempotent_write_crashed_in_flight_is_retried_with_the_same_idempotency_key(
    backend: Backend, tmp_path: Path
) -> None:
    o = crash_and_resume(
        backend, tmp_path / "b", tool=IDEMPOTENT_WRITE_TOOL, hang="tool", tool_calls=2
    )

    assert o.state.termination is fp.TerminationReason.COMPLETED
    # The call id is the idempotency key on both attempts; the retry says it is attempt 2.
    assert [(t["tool"], t["key"], t["attempt"]) for t in o.tool_starts] == [
        (IDEMPOTENT_WRITE_TOOL, FIRST_CALL_ID, 1),
        (IDEMPOTENT_WRITE_TOOL, FIRST_CALL_ID, 2),
    ]
    receipt = _only_receipt(o)
    assert receipt.status is fp.ReceiptStatus.COMPLETED
    assert receipt.attempts == 2
    assert _only_observation(o).result == {"recorded": FIRST_CALL_ID}
    assert_every_attempt_charged_once(o, mutation=True)


# -- (c) a non-idempotent write in flight -------------------------------------------------------


def test_non_idempotent_write_crashed_in_flight_is_never_retried_and_is_uncertain(
    backend: Backend, tmp_path: Path
) -> None:
    o = crash_and_resume(
        backend, tmp_path / "c", tool=NON_IDEMPOTENT_WRITE_TOOL, hang="tool", tool_calls=2
    )

    # Budget was left for a retry, yet the write ran once: the graph cannot know if it happened.
    assert [(t["tool"], t["key"], t["attempt"]) for t in o.tool_starts] == [
        (NON_IDEMPOTENT_WRITE_TOOL, FIRST_CALL_ID, 1)
    ]
    observation = _only_observation(o)
    assert observation.kind == "tool_error"
    assert observation.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    receipt = _only_receipt(o)
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN
    assert receipt.error_code is fp.ErrorCode.EXECUTION_UNCERTAIN
    # The model saw the uncertainty as data and abstained: a typed end, no exception.
    assert o.state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert_every_attempt_charged_once(o, mutation=True)


def test_uncertain_receipt_counts_the_attempt_that_crashed(
    sqlite_backend: Backend, tmp_path: Path
) -> None:
    # Receipt.attempts is "how many times the call was started (each one reserved and charged)":
    # the crashed write was started and charged once, so its uncertain receipt must say 1.
    o = crash_and_resume(
        sqlite_backend, tmp_path / "c1", tool=NON_IDEMPOTENT_WRITE_TOOL, hang="tool"
    )

    receipt = _only_receipt(o)
    assert receipt.status is fp.ReceiptStatus.UNCERTAIN
    assert receipt.attempts == len(o.tool_starts) == o.state.budget.tool_calls_used == 1


# -- (d) the model deciding ---------------------------------------------------------------------


def test_model_crashed_mid_decision_is_charged_a_step_and_the_retry_is_the_next_step(
    backend: Backend, tmp_path: Path
) -> None:
    # Step 1 calls the read tool; the decision at step 2 is killed; the resume decides at step 3.
    o = crash_and_resume(
        backend, tmp_path / "d", tool=READ_TOOL, hang="model", hang_step=2, steps=4
    )

    assert [c["step"] for c in o.model_calls] == [1, 2, 3]
    crashed_pid = o.model_calls[1]["pid"]
    assert o.model_calls[0]["pid"] == crashed_pid != o.model_calls[2]["pid"]
    assert o.state.termination is fp.TerminationReason.COMPLETED
    assert o.state.step == 3
    assert o.state.budget.steps_used == 3
    # The crashed decision's step stays charged and held in the ledger (never settled/refunded).
    crashed = o.steps[2]
    assert crashed is not None and crashed.status is ReservationStatus.RESERVED
    assert [(t["tool"], t["attempt"]) for t in o.tool_starts] == [(READ_TOOL, 1)]
    assert _only_receipt(o).attempts == 1
    assert_every_attempt_charged_once(o, mutation=False)


def test_model_crashed_in_the_first_decision_resumes_as_step_two(
    sqlite_backend: Backend, tmp_path: Path
) -> None:
    # Killed before any step finished: the thread holds only the start request, the ledger holds
    # the run's account and step 1. The resume reopens the same account and decides as step 2.
    o = crash_and_resume(
        sqlite_backend, tmp_path / "d1", tool=READ_TOOL, hang="model", hang_step=1, steps=4
    )

    assert [c["step"] for c in o.model_calls] == [1, 2, 3]
    assert o.state.termination is fp.TerminationReason.COMPLETED
    assert o.state.budget.steps_used == 3
    assert_every_attempt_charged_once(o, mutation=False)


# -- a finished run read back under strict msgpack ------------------------------------------------


@pytest.fixture(scope="module")
def finished_sqlite_run(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """One finished run on SQLite files, shared by the read-back tests (a run costs two processes).

    The richest state: an approval, a crash, an uncertain receipt, an error observation.
    """
    root = tmp_path_factory.mktemp("finished")
    backend = Backend("sqlite", str(root / "checkpoints.db"), str(root / "ledger.db"))
    return crash_and_resume(backend, root / "run", tool=NON_IDEMPOTENT_WRITE_TOOL, hang="tool")


def _read_back(o: Outcome, serde: str) -> dict[str, Any]:
    return _run_child({**o.spec, "phase": "read", "serde": serde}, Path(o.spec["workdir"]))


def test_finished_run_read_back_in_a_new_process_validates_into_agent_state(
    finished_sqlite_run: Outcome,
) -> None:
    report = _read_back(finished_sqlite_run, "plain")

    assert report["strict"] == "true"
    assert report["error"] is None
    # Stored as plain data, read back as plain data, straight from the saver.
    for name, type_name in report["types"].items():
        assert type_name.startswith("builtins."), f"{name} came back as {type_name}"
    state = fp.AgentState.model_validate(report["state"])
    assert state == finished_sqlite_run.state
    assert state.termination is fp.TerminationReason.INSUFFICIENT_EVIDENCE
    assert state.receipts[0].status is fp.ReceiptStatus.UNCERTAIN


def test_finished_run_read_back_under_strict_msgpack_logs_no_deserialization_warning(
    finished_sqlite_run: Outcome,
) -> None:
    report = _read_back(finished_sqlite_run, "plain")

    assert report["strict"] == "true"
    assert report["logged"] == []
    assert not [w for w in report["warnings"] if "eserializ" in w]
