"""Deadlines as absolute UTC instants, so they survive a checkpoint and a process restart."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Annotated, Protocol, runtime_checkable

from pydantic import Strict, field_validator

from fencepost.policy.contract import Frozen, assemble


class DeadlineExceeded(Exception):
    """The run's (or a stage's) deadline has passed."""

    code = "deadline_exceeded"


@runtime_checkable
class Clock(Protocol):
    """Where "now" comes from. Tests and notebooks use :class:`FakeClock`."""

    def now(self) -> datetime:
        """The current instant, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The real wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when told to. ``FakeClock().advance(5)`` moves it five seconds."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = (start or datetime(2026, 1, 1, tzinfo=UTC)).astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        with self._lock:
            self._now += timedelta(seconds=seconds)


class Deadline(Frozen):
    """An absolute instant after which work must stop.

    Example::

        deadline = Deadline.after(30, clock=SystemClock())
        deadline.require_remaining(clock=SystemClock())  # raises DeadlineExceeded once past
    """

    at: Annotated[datetime, Strict(False)]
    """The instant, in UTC. Not strict, so the ISO text of a JSON dump validates back."""

    @field_validator("at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("deadline must be timezone-aware")
        return value.astimezone(UTC)

    @classmethod
    def after(cls, seconds: float, *, clock: Clock | None = None) -> Deadline:
        """The deadline ``seconds`` from now."""
        now = (clock or SystemClock()).now()
        return _deadline_at(now + timedelta(seconds=seconds))

    def remaining_seconds(self, *, clock: Clock) -> float:
        """Seconds left (negative once past)."""
        return (self.at - clock.now()).total_seconds()

    def remaining_ms(self, *, clock: Clock) -> int:
        """Whole milliseconds left, never below zero."""
        return max(0, int(self.remaining_seconds(clock=clock) * 1000))

    def expired(self, *, clock: Clock) -> bool:
        """True once the instant has been reached."""
        return self.remaining_seconds(clock=clock) <= 0

    def require_remaining(self, *, clock: Clock) -> None:
        """Raise :class:`DeadlineExceeded` if the deadline has passed."""
        if self.expired(clock=clock):
            raise DeadlineExceeded(self.at.isoformat())


def stage_deadline(deadline: Deadline, *, max_stage_seconds: float, clock: Clock) -> Deadline:
    """The smaller of what is left of ``deadline`` and a stage's own maximum."""
    stage_end = clock.now() + timedelta(seconds=max_stage_seconds)
    return deadline if deadline.at <= stage_end else _deadline_at(stage_end)


def _deadline_at(instant: datetime) -> Deadline:
    # A step makes two deadlines (the model's, each tool's): an instant already in UTC, as the
    # system clock gives it, is what validation would make of it; any other is validated.
    if instant.tzinfo is UTC:
        return assemble(Deadline, {"at": instant})
    return Deadline(at=instant)
