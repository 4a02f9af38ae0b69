"""When a recurring recipe fires: `Every(minutes)`, `Daily(hour, minute)`, `Weekly(day, ...)`,
`Cron(expression)`.

Theory of operation. Time is an integer count of milliseconds since the Unix
epoch (UTC); a schedule's wall clock is UTC plus a fixed offset in minutes, so no
time zone database and no clock are needed: the caller passes `now` in.

- `Every(m)` fires `m` minutes after the last run, whatever the clock says.
- `Daily` and `Weekly` fire at the start of the first local minute that matches
  and lies strictly after the last run. A slot exactly at `last_run` has
  already been served, so it is skipped.
- `Cron(expression)` fires at the start of every local minute a five-field cron
  expression matches (`agent_core.cron` reads it, and says its rules).
- `due(last, now, offset)` is exactly `now >= next_after(last, offset)`: a slot
  missed while everything was down is still due, once.

`Daily`, `Weekly` and `Cron` may name an IANA time zone (`tz="Europe/Berlin"`)
instead of relying on the fixed offset. The core checks only that the name looks
like one: the zone's rules are data on disk, so `scheduler.calendar.next_fire`
does that arithmetic, and `next_after` refuses a trigger with a zone.

All arithmetic is on whole minutes (`ms // 60_000`), so every slot of `Daily`
and `Weekly` lies on a minute boundary in UTC as well as in local time (every
allowed offset is a whole number of minutes).

Triggers are frozen pydantic values tagged by `kind`, stored as JSON and loaded
back through one discriminated union, `TriggerAdapter`.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent_core.cron import SEARCH_DAYS, CronSpec, normalize, parse_cron
from agent_core.errors import DefinitionError

__all__ = [
    "MAX_EVERY_MINUTES",
    "MAX_UTC_OFFSET_MINUTES",
    "MAX_ZONE_NAME_CHARS",
    "Cron",
    "Daily",
    "Every",
    "Trigger",
    "TriggerAdapter",
    "Weekly",
    "check_zone_name",
    "trigger_from_json",
]

MINUTE_MS = 60_000
DAY_MINUTES = 24 * 60
WEEK_MINUTES = 7 * DAY_MINUTES
MAX_EVERY_MINUTES = 366 * DAY_MINUTES
"""The longest `Every` interval: a leap year."""
MAX_UTC_OFFSET_MINUTES = 14 * 60
"""Real offsets run from -12:00 to +14:00; anything past ±14:00 is a mistake."""

# 1970-01-01, day 0 of the epoch, was a Thursday: three days after a Monday.
EPOCH_WEEKDAY = 3
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# A naive datetime at the epoch: local wall-clock arithmetic for `Cron` without a zone.
EPOCH_WALL = datetime(1970, 1, 1)
ONE_MS = timedelta(milliseconds=1)

MAX_ZONE_NAME_CHARS = 64
# The shape of IANA names ("UTC", "America/Argentina/Buenos_Aires", "Etc/GMT+5"): no
# dot, so no ".." and no file name such as "zone.tab"; no leading "/" either.
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*")


# Loading JSON calls a custom `__init__` with the stored fields as keywords, so a
# missing field must reach our check (and become a validation error) instead of
# escaping as a TypeError; hence a default that means "not given".
_REQUIRED: Any = object()


def _check_int(value: object, what: str, low: int, high: int | None) -> int:
    """Return `value` if it is a plain int in [low, high] (no upper bound when `high` is None).

    Raises:
        DefinitionError: `value` is not an int (bools, floats and text are refused)
            or lies outside the range.
    """
    if value is _REQUIRED:
        raise DefinitionError(f"{what} is required")
    # bool is a subclass of int, but `Daily(True, 0)` is a mistake, not one o'clock.
    if not isinstance(value, int) or isinstance(value, bool):
        raise DefinitionError(f"{what} must be a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"from {low} to {high}"
        raise DefinitionError(f"{what} must be {bounds}, got {value}")
    return value


def _check_ms(value: object, what: str) -> int:
    return _check_int(value, f"{what} (ms since the epoch)", 0, None)


def _check_offset(value: object) -> int:
    limit = MAX_UTC_OFFSET_MINUTES
    return _check_int(value, "utc_offset_minutes", -limit, limit)


def check_zone_name(value: object) -> str | None:
    """Return `value` if it is None or looks like an IANA zone name (whether the zone
    exists is for whoever holds the zone data to say).

    Raises:
        DefinitionError: `value` is not text, is longer than 64 characters, or holds
            a character other than letters, digits and `_+-/` in a name's shape.
    """
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) > MAX_ZONE_NAME_CHARS
        or ".." in value
        or not _ZONE_NAME.fullmatch(value)
    ):
        raise DefinitionError(
            f"tz must be an IANA time zone name like 'Europe/Berlin', got {value!r}"
        )
    return value


def _unset(value: object) -> bool:
    # A zone is written out only when set, so triggers stored before zones
    # existed dump exactly as they did.
    return value is None


def _in_zone(text: str, tz: str | None) -> str:
    return text if tz is None else f"{text} ({tz})"


def _first_slot(last_run_ms: int, utc_offset_minutes: int, target: int, period: int) -> int:
    """Return the UTC ms of the first minute strictly after `last_run_ms` whose local
    minute index is congruent to `target` modulo `period` (both in minutes)."""
    # The first whole minute that starts strictly after last_run, as a local minute index.
    first_local = last_run_ms // MINUTE_MS + 1 + utc_offset_minutes
    local = first_local + (target - first_local) % period
    return (local - utc_offset_minutes) * MINUTE_MS


class _TriggerBase(BaseModel):
    """What every trigger shares: frozen, strict on stored fields, and `due`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def _build(self, **fields: Any) -> None:
        # Values are checked by hand first (clear messages); this catches the rest
        # (an unknown keyword, a wrong `kind`) and keeps the error in our tree.
        try:
            super().__init__(**fields)
        except ValidationError as error:
            raise DefinitionError(f"bad {type(self).__name__}: {error}") from None

    def next_after(self, last_run_ms: int, utc_offset_minutes: int) -> int:
        """Return when this trigger next fires after `last_run_ms`, in UTC ms since the epoch.

        Raises:
            DefinitionError: `last_run_ms` is not a non-negative int, the offset
                is not an int from -840 to 840, or the trigger names a time zone
                (`scheduler.calendar.next_fire` serves those).
        """
        raise NotImplementedError  # pragma: no cover - every trigger overrides it

    def _fixed_offset_only(self) -> None:
        # Answering with the offset would be wrong for half the year, so refuse.
        tz = getattr(self, "tz", None)
        if tz is not None:
            raise DefinitionError(
                f"{self.describe()}: a trigger with a time zone needs the zone's rules;"
                " use scheduler.calendar.next_fire, not next_after"
            )

    def due(self, last_run_ms: int, now_ms: int, utc_offset_minutes: int) -> bool:
        """Return whether a slot after `last_run_ms` has come by `now_ms` (missed slots count).

        Raises:
            DefinitionError: a time is not a non-negative int, or the offset is
                not an int from -840 to 840.
        """
        now = _check_ms(now_ms, "now_ms")
        return now >= self.next_after(last_run_ms, utc_offset_minutes)

    def describe(self) -> str:
        """Return a short human phrase such as "daily at 09:00"."""
        raise NotImplementedError  # pragma: no cover - every trigger overrides it


class Every(_TriggerBase):
    """Fires `minutes` after the last run, on no clock grid; the UTC offset plays no part."""

    kind: Literal["every"] = "every"
    minutes: int = Field(strict=True, ge=1, le=MAX_EVERY_MINUTES)

    def __init__(self, minutes: int = _REQUIRED, **fields: Any) -> None:
        _check_int(minutes, "Every minutes", 1, MAX_EVERY_MINUTES)
        self._build(minutes=minutes, **fields)

    def next_after(self, last_run_ms: int, utc_offset_minutes: int) -> int:
        last = _check_ms(last_run_ms, "last_run_ms")
        _check_offset(utc_offset_minutes)  # ignored, but a bad one is still a bug upstream
        return last + self.minutes * MINUTE_MS

    def describe(self) -> str:
        if self.minutes % DAY_MINUTES == 0:
            count, unit = self.minutes // DAY_MINUTES, "day"
        elif self.minutes % 60 == 0:
            count, unit = self.minutes // 60, "hour"
        else:
            count, unit = self.minutes, "minute"
        return f"every {unit}" if count == 1 else f"every {count} {unit}s"


class Daily(_TriggerBase):
    """Fires once a day at `hour:minute` local time."""

    kind: Literal["daily"] = "daily"
    hour: int = Field(strict=True, ge=0, le=23)
    minute: int = Field(default=0, strict=True, ge=0, le=59)
    tz: str | None = Field(default=None, strict=True, exclude_if=_unset)
    """An IANA zone name; None keeps the schedule's fixed UTC offset."""

    def __init__(
        self, hour: int = _REQUIRED, minute: int = 0, *, tz: str | None = None, **fields: Any
    ) -> None:
        _check_int(hour, "Daily hour", 0, 23)
        _check_int(minute, "Daily minute", 0, 59)
        self._build(hour=hour, minute=minute, tz=check_zone_name(tz), **fields)

    def next_after(self, last_run_ms: int, utc_offset_minutes: int) -> int:
        self._fixed_offset_only()
        last = _check_ms(last_run_ms, "last_run_ms")
        offset = _check_offset(utc_offset_minutes)
        return _first_slot(last, offset, self.hour * 60 + self.minute, DAY_MINUTES)

    def describe(self) -> str:
        return _in_zone(f"daily at {self.hour:02d}:{self.minute:02d}", self.tz)


class Weekly(_TriggerBase):
    """Fires once a week on `day` (0 = Monday … 6 = Sunday) at `hour:minute` local time."""

    kind: Literal["weekly"] = "weekly"
    day: int = Field(strict=True, ge=0, le=6)
    hour: int = Field(strict=True, ge=0, le=23)
    minute: int = Field(default=0, strict=True, ge=0, le=59)
    tz: str | None = Field(default=None, strict=True, exclude_if=_unset)
    """An IANA zone name; None keeps the schedule's fixed UTC offset."""

    def __init__(
        self,
        day: int = _REQUIRED,
        hour: int = _REQUIRED,
        minute: int = 0,
        *,
        tz: str | None = None,
        **fields: Any,
    ) -> None:
        _check_int(day, "Weekly day (0 = Monday … 6 = Sunday)", 0, 6)
        _check_int(hour, "Weekly hour", 0, 23)
        _check_int(minute, "Weekly minute", 0, 59)
        self._build(day=day, hour=hour, minute=minute, tz=check_zone_name(tz), **fields)

    def next_after(self, last_run_ms: int, utc_offset_minutes: int) -> int:
        self._fixed_offset_only()
        last = _check_ms(last_run_ms, "last_run_ms")
        offset = _check_offset(utc_offset_minutes)
        # Minutes into the week, counted from the epoch's Monday (day -3) at 00:00.
        target = (self.day - EPOCH_WEEKDAY) * DAY_MINUTES + self.hour * 60 + self.minute
        return _first_slot(last, offset, target, WEEK_MINUTES)

    def describe(self) -> str:
        text = f"weekly on {DAY_NAMES[self.day]} at {self.hour:02d}:{self.minute:02d}"
        return _in_zone(text, self.tz)


class Cron(_TriggerBase):
    """Fires at the start of every local minute `expression` matches (five fields or an
    @alias; `agent_core.cron` gives the rules). The expression is stored with its
    whitespace collapsed."""

    kind: Literal["cron"] = "cron"
    expression: str = Field(strict=True)
    tz: str | None = Field(default=None, strict=True, exclude_if=_unset)
    """An IANA zone name; None keeps the schedule's fixed UTC offset."""

    def __init__(
        self, expression: str = _REQUIRED, *, tz: str | None = None, **fields: Any
    ) -> None:
        if expression is _REQUIRED:
            raise DefinitionError("Cron expression is required")
        parse_cron(expression)
        self._build(expression=normalize(expression), tz=check_zone_name(tz), **fields)

    @property
    def spec(self) -> CronSpec:
        """The parsed expression (parsed once per process, then cached)."""
        return parse_cron(self.expression)

    def next_after(self, last_run_ms: int, utc_offset_minutes: int) -> int:
        self._fixed_offset_only()
        last = _check_ms(last_run_ms, "last_run_ms")
        offset = _check_offset(utc_offset_minutes)
        try:
            found = self.spec.next_local(EPOCH_WALL + (last + offset * MINUTE_MS) * ONE_MS)
        except OverflowError:  # past the year 9999
            found = None
        if found is None:
            raise DefinitionError(
                f"{self.describe()} does not fire within {SEARCH_DAYS} days of {last} ms"
                " (or before the year 10000)"
            )
        return (found - EPOCH_WALL) // ONE_MS - offset * MINUTE_MS

    def describe(self) -> str:
        return _in_zone(f"cron '{self.expression}'", self.tz)


Trigger = Annotated[Every | Daily | Weekly | Cron, Field(discriminator="kind")]
"""Any trigger; embed it in a pydantic model and it loads back by its `kind`."""

TriggerAdapter: TypeAdapter[Trigger] = TypeAdapter(Trigger)
"""Dumps and loads a lone trigger; bad stored values raise pydantic's `ValidationError`."""


def trigger_from_json(text: str | bytes) -> Trigger:
    """Return the trigger stored as JSON `text` (as written by `model_dump_json`).

    Raises:
        DefinitionError: the text is not JSON, has an unknown `kind`, an unknown
            field, or values no trigger can have (e.g. hour 25).
    """
    try:
        return TriggerAdapter.validate_json(text)
    except ValidationError as error:
        raise DefinitionError(f"stored trigger cannot be used: {error}") from None
