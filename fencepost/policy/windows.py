"""Spend windows: limits an account applies per day, per month or over a rolling duration.

A window limits one axis over a span of time. A calendar window (``"day"``, ``"month"``) starts
at local midnight (of the month's first day) in the time zone the window names; a rolling window
covers the last ``period`` (a ``timedelta``). The ledger keeps what each window holds in
*buckets*: a calendar window's bucket is the instant its period started, a rolling window's the
start of one of :data:`ROLLING_STEPS` equal steps of its duration. A reservation is counted in
the bucket of the instant it was made, and so is what settling it (or a charge against it) adds
or gives back. What a window holds now is the sum of its buckets from :meth:`Window.since`:
a rolling window counts the whole step its oldest instant falls in, so usage leaves it up to one
step late, never early (the window can never be exceeded by the rounding).

Every backend computes buckets with the same rules (Postgres in SQL, with its own copy of the
IANA time zone database; a zone both know gives the same instants).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, Strict, field_validator

from fencepost.policy.contract import Frozen

ROLLING_STEPS = 64
"""How many buckets a rolling window's duration is counted in: usage leaves a rolling window
at most ``period / ROLLING_STEPS`` after it has aged out."""

CALENDAR_PERIODS = ("day", "month")


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"tz {name!r} is not a known IANA time zone") from exc


class Window(Frozen):
    """A limit on one axis of an account over a day, a month (calendar, in ``tz``) or a rolling
    duration. ``Window(axis="tokens", limit=1_000_000, period="day", tz="Europe/Berlin")``."""

    axis: Annotated[str, Field(min_length=1, max_length=512)]
    """The axis limited (``"tokens"``, ``"cost"``, ``"steps"``, ``"tool_calls"``, ...)."""
    limit: Annotated[float, Strict(False), Field(ge=0, allow_inf_nan=False)]
    """What the account and its descendants may hold on ``axis`` within one window."""
    period: Literal["day", "month"] | Annotated[timedelta, Strict(False)]
    """``"day"`` or ``"month"`` (calendar, in ``tz``), or a duration (a rolling window)."""
    tz: str = "UTC"
    """The IANA time zone a calendar window's days start in (ignored by a rolling window)."""

    @field_validator("period")
    @classmethod
    def _positive(cls, value: str | timedelta) -> str | timedelta:
        if isinstance(value, timedelta) and value.total_seconds() <= 0:
            raise ValueError("period must be 'day', 'month' or a positive duration")
        return value

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        _zone(value)
        return value

    @property
    def kind(self) -> str:
        """``"day"``, ``"month"`` or ``"rolling"``: how the window is stored."""
        return self.period if isinstance(self.period, str) else "rolling"

    @property
    def seconds(self) -> float:
        """A rolling window's duration in seconds (``0`` for a calendar window)."""
        return self.period.total_seconds() if isinstance(self.period, timedelta) else 0.0

    @property
    def label(self) -> str:
        """How a report names it: ``"tokens per day (Europe/Berlin)"``, ``"cost per rolling 1:00:00"``."""
        if isinstance(self.period, timedelta):
            return f"{self.axis} per rolling {self.period}"
        return f"{self.axis} per {self.period} ({self.tz})"

    def bucket(self, at: float) -> float:
        """The bucket (epoch seconds) usage made at ``at`` (epoch seconds) is counted in."""
        if isinstance(self.period, timedelta):
            step = self.seconds / ROLLING_STEPS
            return math.floor(at / step) * step
        local = datetime.fromtimestamp(at, _zone(self.tz))
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.period == "month":
            start = start.replace(day=1)
        # The wall time read again in the zone (as Postgres reads ``timestamp AT TIME ZONE``).
        return start.replace(tzinfo=None).replace(tzinfo=_zone(self.tz)).timestamp()

    def since(self, now: float) -> float:
        """The oldest bucket that counts at ``now``: what the window holds is every bucket from it."""
        if isinstance(self.period, timedelta):
            return self.bucket(now - self.seconds)
        return self.bucket(now)

    def resets_at(self, now: float) -> datetime:
        """The next instant after ``now`` at which the window frees usage, in UTC: a calendar
        window's next period (it frees everything then); a rolling window's next step boundary,
        when its oldest step ages out (it frees what was made in that step, if anything: usage
        made at ``t`` is freed by ``t + period + period / ROLLING_STEPS``)."""
        if isinstance(self.period, timedelta):
            step = self.seconds / ROLLING_STEPS
            return datetime.fromtimestamp(self.since(now) + step + self.seconds, UTC)
        zone = _zone(self.tz)
        start = datetime.fromtimestamp(self.bucket(now), zone).replace(tzinfo=None)
        if self.period == "day":
            nxt = start + timedelta(days=1)
        else:
            nxt = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
        return nxt.replace(tzinfo=zone).astimezone(UTC)


def window_terms(windows: Iterable[Window] | None) -> tuple[Window, ...]:
    """``windows`` as a tuple of :class:`Window` (``None`` for none); ``TypeError`` otherwise."""
    if windows is None:
        return ()
    if isinstance(windows, Window):
        raise TypeError("windows must be a sequence of Window, not one Window")
    out = tuple(windows)
    for window in out:
        if not isinstance(window, Window):
            raise TypeError("windows must be Window instances")
    return out


@lru_cache(maxsize=1024)
def stored_window(axis: str, limit: float, kind: str, seconds: float, tz: str) -> Window:
    """The window a backend stored as ``(axis, limit, kind, seconds, tz)`` (see
    :meth:`Window.kind`, :meth:`Window.seconds`); a pure value, cached as rows repeat."""
    period: str | timedelta = timedelta(seconds=seconds) if kind == "rolling" else kind
    return Window.model_validate({"axis": axis, "limit": limit, "period": period, "tz": tz})


def stored_terms(window: Window) -> tuple[str, float, str, float, str]:
    """What a backend stores of ``window`` (read back by :func:`stored_window`)."""
    return (window.axis, window.limit, window.kind, window.seconds, window.tz)


def epoch(at: datetime) -> float:
    """``at`` (timezone-aware) as epoch seconds."""
    return at.timestamp()


class WindowUse(Frozen):
    """One window of an account at an instant: its terms, what it holds and when it frees."""

    window: Window
    held: Annotated[float, Strict(False)]
    """What the account and its descendants hold in the window now (reserved or spent)."""
    resets_at: Annotated[datetime, Strict(False)]
    """The next instant the window frees what it holds (see :meth:`Window.resets_at`)."""

    @property
    def remaining(self) -> float:
        """What is left in the window."""
        return self.window.limit - self.held
