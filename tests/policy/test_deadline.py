"""Deadlines are absolute, timezone-aware instants; stages get the smaller of two deadlines."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from fencepost.policy import (
    Clock,
    Deadline,
    DeadlineExceeded,
    FakeClock,
    SystemClock,
    stage_deadline,
)

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_deadline_requires_a_timezone_aware_instant() -> None:
    with pytest.raises(ValidationError, match="timezone-aware"):
        Deadline(at=datetime(2026, 1, 1, 12, 0))
    with pytest.raises(ValidationError, match="timezone-aware"):
        Deadline.model_validate({"at": "2026-01-01T12:00:00"})


def test_deadline_is_stored_in_utc() -> None:
    seoul = timezone(timedelta(hours=9))
    deadline = Deadline(at=datetime(2026, 1, 1, 21, 0, tzinfo=seoul))
    assert deadline.at.utcoffset() == timedelta(0)
    assert deadline == Deadline(at=START)


def test_deadline_survives_a_json_round_trip() -> None:
    deadline = Deadline(at=START + timedelta(microseconds=123_456))
    assert Deadline.model_validate_json(deadline.model_dump_json()) == deadline
    dumped = deadline.model_dump(mode="json")
    assert json.loads(json.dumps(dumped)) == dumped
    assert Deadline.model_validate(dumped) == deadline


def test_fake_clock_moves_only_when_advanced() -> None:
    clock = FakeClock(START)
    assert clock.now() == clock.now() == START
    clock.advance(2.5)
    assert clock.now() == START + timedelta(seconds=2.5)
    assert isinstance(clock, Clock)
    assert isinstance(SystemClock(), Clock)
    assert SystemClock().now().tzinfo is not None


def test_deadline_after_counts_from_the_clock() -> None:
    clock = FakeClock(START)
    deadline = Deadline.after(30, clock=clock)
    assert deadline.at == START + timedelta(seconds=30)
    assert deadline.remaining_seconds(clock=clock) == 30
    assert deadline.remaining_ms(clock=clock) == 30_000


def test_require_remaining_raises_once_the_deadline_is_reached() -> None:
    clock = FakeClock(START)
    deadline = Deadline.after(10, clock=clock)
    clock.advance(9.999)
    deadline.require_remaining(clock=clock)
    assert not deadline.expired(clock=clock)
    clock.advance(0.001)
    assert deadline.expired(clock=clock)
    with pytest.raises(DeadlineExceeded):
        deadline.require_remaining(clock=clock)
    assert DeadlineExceeded.code == "deadline_exceeded"


def test_remaining_ms_never_goes_below_zero() -> None:
    clock = FakeClock(START)
    deadline = Deadline.after(1, clock=clock)
    clock.advance(60)
    assert deadline.remaining_seconds(clock=clock) == -59
    assert deadline.remaining_ms(clock=clock) == 0


def test_stage_deadline_is_the_stage_limit_when_that_comes_first() -> None:
    clock = FakeClock(START)
    run = Deadline.after(60, clock=clock)
    stage = stage_deadline(run, max_stage_seconds=5, clock=clock)
    assert stage.at == START + timedelta(seconds=5)


def test_stage_deadline_is_the_run_deadline_when_that_comes_first() -> None:
    clock = FakeClock(START)
    run = Deadline.after(60, clock=clock)
    clock.advance(58)
    stage = stage_deadline(run, max_stage_seconds=5, clock=clock)
    assert stage == run


def test_a_deadline_from_a_clock_is_what_validation_makes_and_a_naive_clock_is_refused() -> None:
    from datetime import datetime, timedelta

    import pytest
    from pydantic import ValidationError

    from fencepost.policy.deadline import Deadline, FakeClock

    clock = FakeClock()
    made = Deadline.after(5, clock=clock)
    assert made == Deadline(at=clock.now() + timedelta(seconds=5))
    assert made.model_fields_set == {"at"}

    class Naive:
        def now(self) -> datetime:
            return datetime(2026, 1, 1)

    with pytest.raises(ValidationError):
        Deadline.after(5, clock=Naive())
