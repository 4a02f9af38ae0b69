"""Cron expressions: five fields parsed once, then the next matching local minute.

Theory of operation. `parse_cron("*/15 9-17 * * MON-FRI")` reads a standard
five-field expression (minute, hour, day of month, month, day of week) into a
`CronSpec` of plain sets, or raises `DefinitionError` naming the field at fault.
`CronSpec.next_local(wall)` then answers one question on naive wall-clock
times: which is the first whole minute strictly after `wall` that matches?
It knows nothing of offsets or zones; `Cron.next_after` (a fixed offset) and
`scheduler.calendar` (an IANA zone) turn its answer into an instant.

The rules, as in Vixie cron:

- Each field is `*`, a number, a name (JAN-DEC, SUN-SAT; any case), a range
  `a-b`, a step over `*` or a range (`*/15`, `10-50/10`), or a list of these
  (`1,5,10-12`). Day of week runs 0-7, 0 and 7 both Sunday.
- A day field is *restricted* unless its text starts with `*` (so `*/2` counts
  as unrestricted, as in Vixie's source). When both day fields are restricted,
  a day matches if either does (`0 0 1 * MON`: the 1st and every Monday);
  otherwise both must.
- `@hourly @daily @midnight @weekly @monthly @yearly @annually` stand for
  their usual five fields.
- An expression that can never fire (`0 0 31 2 *`) is refused when parsed.

The search walks days, never minutes, and skips whole months that do not
match; it gives up after `SEARCH_DAYS` days and returns None.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from agent_core.errors import DefinitionError

__all__ = ["MAX_EXPRESSION_CHARS", "SEARCH_DAYS", "CronSpec", "normalize", "parse_cron"]

MAX_EXPRESSION_CHARS = 200
SEARCH_DAYS = 3_000
"""How far ahead `next_local` looks: a little over 8 years, because 29 February can be
8 years from the next (2096 to 2104). Only a day-of-month-and-day-of-week expression
(the Vixie AND case, e.g. `0 0 1 1 */7`) may wait longer, and finds nothing."""

MONTHS = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
WEEKDAYS = {name: n for n, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
# The longest each month can be (a leap February): a day that fits no month never comes.
MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int]
    what_names: str


FIELDS = (
    _Field("minute", 0, 59, {}, ""),
    _Field("hour", 0, 23, {}, ""),
    _Field("day-of-month", 1, 31, {}, ""),
    _Field("month", 1, 12, MONTHS, " or a month name (JAN-DEC)"),
    _Field("day-of-week", 0, 7, WEEKDAYS, " or a day name (SUN-SAT)"),
)


@dataclass(frozen=True)
class CronSpec:
    """A parsed expression: the values each field allows (weekdays 0 = Sunday … 6)."""

    minutes: tuple[int, ...]
    """Sorted, like `hours`: the search walks them in order."""
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    def day_matches(self, day: date) -> bool:
        """Return whether `day` is one the expression fires on (at some minute)."""
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_date or by_weekday
        return by_date and by_weekday

    def next_local(self, wall: datetime) -> datetime | None:
        """Return the first whole minute strictly after naive `wall` that matches.

        Returns None when none comes within `SEARCH_DAYS` days or before year 9999 ends.
        """
        try:
            start = wall.replace(second=0, microsecond=0) + timedelta(minutes=1)
        except OverflowError:
            return None
        day = start.date()
        window = timedelta(days=SEARCH_DAYS)
        last_day = date.max if date.max - day < window else day + window
        earliest = (start.hour, start.minute)
        while day <= last_day:
            if day.month not in self.months:
                # A month that never matches is skipped whole: a yearly
                # expression costs a dozen steps a year, not 365.
                if day.year == date.max.year and day.month == 12:
                    return None
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
            elif self.day_matches(day) and (clock := self._first_time(earliest)) is not None:
                return datetime.combine(day, clock)
            elif day == date.max:
                return None
            else:
                day += timedelta(days=1)
            earliest = (0, 0)
        return None

    def _first_time(self, earliest: tuple[int, int]) -> time | None:
        """Return the first matching hour:minute at or after `earliest` in a day, if any."""
        for hour in self.hours[bisect.bisect_left(self.hours, earliest[0]) :]:
            first_minute = earliest[1] if hour == earliest[0] else 0
            index = bisect.bisect_left(self.minutes, first_minute)
            if index < len(self.minutes):
                return time(hour, self.minutes[index])
        return None


def normalize(expression: str) -> str:
    """Return `expression` with its whitespace collapsed to single spaces, as it is stored."""
    return " ".join(expression.split())


def parse_cron(expression: str) -> CronSpec:
    """Return the parsed form of a five-field cron expression or an @alias.

    Raises:
        DefinitionError: not text, too long, an unknown alias, not five fields,
            a field that cannot be read (the message names it: "cron: the hour
            field '25' is out of range 0-23"), or an expression that never fires.
    """
    if not isinstance(expression, str):
        raise DefinitionError(f"cron: the expression must be text, got {expression!r}")
    return _parse(normalize(expression))


# Triggers are loaded and asked for their next slot often; parsing is the costly part.
@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> CronSpec:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise DefinitionError(f"cron: the expression is longer than {MAX_EXPRESSION_CHARS}")
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            known = " ".join(ALIASES)
            raise DefinitionError(f"cron: unknown alias {text!r}; the aliases are {known}")
        text = ALIASES[text.lower()]
    fields = text.split(" ") if text else []
    if len(fields) != len(FIELDS):
        raise DefinitionError(f"cron: expected 5 fields, got {len(fields)}")
    minutes, hours, days, months, weekdays = (
        _parse_field(field, text) for field, text in zip(FIELDS, fields, strict=True)
    )
    spec = CronSpec(
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=months,
        weekdays=frozenset(day % 7 for day in weekdays),
        days_restricted=not fields[2].startswith("*"),
        weekdays_restricted=not fields[4].startswith("*"),
    )
    _check_can_fire(spec, fields)
    return spec


def _check_can_fire(spec: CronSpec, fields: list[str]) -> None:
    # Every weekday comes in every month, and every date on every weekday some
    # year; so only a day of the month that no chosen month has can never come.
    if spec.days_restricted and spec.weekdays_restricted:
        return
    if not any(day <= MONTH_DAYS[month] for month in spec.months for day in spec.days):
        raise DefinitionError(
            f"cron: {' '.join(fields)!r} can never fire: no month in the month field "
            f"'{fields[3]}' has a day in the day-of-month field '{fields[2]}'"
        )


def _parse_field(field: _Field, text: str) -> frozenset[int]:
    """Return the values one field's text allows.

    Raises:
        DefinitionError: a part is empty, not a number or name, out of range,
            a backwards range, a zero step, or a step after a single value.
    """
    values: set[int] = set()
    for part in text.split(","):
        values |= _parse_part(field, text, part)
    return frozenset(values)


def _parse_part(field: _Field, text: str, part: str) -> set[int]:
    """Return the values one comma-separated part of a field allows."""

    def fail(problem: str, at: str = part) -> DefinitionError:
        where = "" if at == text else f" (at '{at}')"
        return DefinitionError(f"cron: the {field.name} field '{text}'{where} {problem}")

    if not part:
        raise fail("has an empty item", at=text)
    body, slash, step_text = part.partition("/")
    step = _number(field, step_text, fail, names=False) if slash else 1
    if step < 1:
        raise fail("has a step of 0; a step is at least 1")
    if body == "*":
        first, last = field.low, field.high
    elif "-" in body:
        first_text, _, last_text = body.partition("-")
        first, last = _number(field, first_text, fail), _number(field, last_text, fail)
        if first > last:
            raise fail("has a range that runs backwards")
    elif slash:
        raise fail(f"has a step after a single value; write '{body}-{field.high}/{step}'")
    else:
        first = last = _number(field, body, fail)
    for value in (first, last):
        if not field.low <= value <= field.high:
            raise fail(f"is out of range {field.low}-{field.high}", at=str(value))
    return set(range(first, last + 1, step))


def _number(
    field: _Field, text: str, fail: Callable[..., DefinitionError], *, names: bool = True
) -> int:
    """Return the number or name `text` stands for (names only where the field has them)."""
    if text.isascii() and text.isdigit():
        return int(text)
    if names and text.upper() in field.names:
        return field.names[text.upper()]
    raise fail("is not a number" + (field.what_names if names else ""), at=text)
