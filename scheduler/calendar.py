"""When a trigger fires in a real time zone: `next_fire`, `preview` and `zone`.

Theory of operation. A trigger names wall-clock times (`Daily(9, 0)`, a cron
expression); `tz="Europe/Berlin"` says whose wall clock. This module turns
those wall-clock times into instants (ms since the epoch, UTC) with the zone's
rules from the IANA database, through `zoneinfo`. It reads the zone data and
nothing else: no clock (every time is passed in), no environment.

`agent_core.cron.CronSpec.next_local` finds the matching wall-clock minutes
(`Daily` and `Weekly` are read as the cron expressions they are); each minute
L fires at the first instant the zone's clock reads L or later. That one rule
gives the behaviour on the days the clock jumps:

- A wall-clock time skipped by a spring-forward transition fires once, at the
  transition: the first valid instant after it. Europe/Berlin 2027-03-28
  02:30 fires at 03:00 local, 01:00 UTC.
- A wall-clock time repeated by a fall-back transition fires once, at its
  first occurrence (fold=0), never at the second.
- Several matching minutes inside one skipped stretch (cron `*/15` across
  02:00-03:00 in Berlin) all come at the same instant, so they fire once:
  `next_fire` returns the first firing strictly after its input.

Firings are therefore never earlier than the wall-clock time they stand for,
and strictly increase. `Every(m)` stays zone-free: `m` minutes after the last
run. A trigger without a zone keeps the schedule's fixed UTC offset, exactly
as `Trigger.next_after` computes it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_core.cron import SEARCH_DAYS, CronSpec, parse_cron
from agent_core.errors import DefinitionError
from agent_core.triggers import (
    MAX_UTC_OFFSET_MINUTES,
    Cron,
    Daily,
    Every,
    Trigger,
    Weekly,
    check_zone_name,
)
from scheduler.errors import SchedulerError

__all__ = ["MAX_PREVIEW", "next_fire", "preview", "zone"]

MAX_PREVIEW = 1_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
REPEATED_MINUTES = 2 * 24 * 60
"""A bound on the matching minutes a fall-back can make the clock read again: a
fall-back repeats an hour or so, and a whole day would be extreme; this allows two."""


def zone(name: str) -> ZoneInfo:
    """Return the IANA time zone called `name` (e.g. "Europe/Berlin").

    Raises:
        SchedulerError: the name is not one the zone data knows
            ("unknown time zone 'Europe/Berlinn'").
    """
    try:
        check_zone_name(name)
        # ZoneInfo caches zones by name, so this reads the data once per process.
        return ZoneInfo(name)
    # A directory ("America"), a file that is not zone data, a missing name.
    except (DefinitionError, ZoneInfoNotFoundError, ValueError, OSError):
        raise SchedulerError(f"unknown time zone {name!r}") from None


def next_fire(trigger: Trigger, after_ms: int, *, utc_offset_minutes: int = 0) -> int:
    """Return the first firing of `trigger` strictly after `after_ms` (UTC ms since the epoch).

    The trigger's `tz` wins over `utc_offset_minutes`, which serves triggers without one.

    Raises:
        SchedulerError: the trigger's zone is unknown.
        DefinitionError: `after_ms` is not a non-negative int, the offset is not
            an int from -840 to 840, or the trigger does not fire within the
            search window (about 8 years) or before the year 10000.
    """
    if isinstance(trigger, Every) or trigger.tz is None:
        return trigger.next_after(after_ms, utc_offset_minutes)
    _check_arguments(after_ms, utc_offset_minutes)
    try:
        return _next_in_zone(_local_pattern(trigger), zone(trigger.tz), after_ms)
    except OverflowError:
        raise DefinitionError(f"{trigger.describe()} does not fire before the year 10000") from None


def preview(
    trigger: Trigger, after_ms: int, count: int, *, utc_offset_minutes: int = 0
) -> list[int]:
    """Return the next `count` firings strictly after `after_ms`, in order.

    Raises:
        DefinitionError: `count` is not from 1 to 1000, or as `next_fire`.
        SchedulerError: as `next_fire`.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PREVIEW:
        raise DefinitionError(f"a preview shows 1 to {MAX_PREVIEW} times, not {count!r}")
    firings: list[int] = []
    for _ in range(count):
        after_ms = next_fire(trigger, after_ms, utc_offset_minutes=utc_offset_minutes)
        firings.append(after_ms)
    return firings


def _check_arguments(after_ms: object, utc_offset_minutes: object) -> None:
    # The same checks `next_after` makes, for the path that does not call it; the
    # offset is unused there, but a bad one is still a bug upstream.
    for value, what, low, high in (
        (after_ms, "after_ms (ms since the epoch)", 0, None),
        (utc_offset_minutes, "utc_offset_minutes", -MAX_UTC_OFFSET_MINUTES, MAX_UTC_OFFSET_MINUTES),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DefinitionError(f"{what} must be a whole number, got {value!r}")
        if value < low or (high is not None and value > high):
            raise DefinitionError(f"{what} is out of range, got {value}")


def _local_pattern(trigger: Daily | Weekly | Cron) -> CronSpec:
    """Return the wall-clock minutes a Daily, Weekly or Cron trigger fires at."""
    if isinstance(trigger, Daily):
        return parse_cron(f"{trigger.minute} {trigger.hour} * * *")
    if isinstance(trigger, Weekly):
        # Weekly counts 0 = Monday; cron counts 0 = Sunday.
        return parse_cron(f"{trigger.minute} {trigger.hour} * * {(trigger.day + 1) % 7}")
    return trigger.spec


def _next_in_zone(pattern: CronSpec, tzinfo: ZoneInfo, after_ms: int) -> int:
    """Return the first firing strictly after `after_ms` of the wall-clock minutes
    `pattern` matches, each at the first instant `tzinfo`'s clock reads it or later.

    Raises:
        DefinitionError: no matching minute within the search window.
        SchedulerError: zone data whose clock repeats more than REPEATED_MINUTES.
    """
    # A minute at or before the clock's reading at `after_ms` has already fired
    # (its first instant lies at or before `after_ms`), so the walk starts there.
    # Minutes after it may still have fired: after a fall-back, the clock reads
    # again times it passed an hour ago; those are skipped by the test below.
    # Each step moves forward one matching minute, and once past what the clock
    # reads again, the next firing comes: the walk ends within REPEATED_MINUTES.
    wall = _wall(after_ms, tzinfo)
    for _ in range(REPEATED_MINUTES):
        found = pattern.next_local(wall)
        if found is None:
            raise DefinitionError(
                f"the trigger does not fire within {SEARCH_DAYS} days after {wall:%Y-%m-%d %H:%M}"
                f" ({tzinfo.key})"
            )
        fire = _first_instant(found, tzinfo)
        if fire > after_ms:
            return fire
        wall = found
    raise SchedulerError(f"{tzinfo.key}: the clock reads {wall:%Y-%m-%d %H:%M} again for too long")


def _first_instant(wall: datetime, tzinfo: ZoneInfo) -> int:
    """Return the first instant (UTC ms) at which `tzinfo`'s clock reads naive `wall` or later."""
    early = _utc_ms(wall.replace(tzinfo=tzinfo, fold=0))
    late = _utc_ms(wall.replace(tzinfo=tzinfo, fold=1))
    real = [instant for instant in (early, late) if _wall(instant, tzinfo) == wall]
    if real:
        # Read twice during a fall-back: the first reading.
        return min(real)
    return _transition(wall, tzinfo, min(early, late), max(early, late))


def _transition(wall: datetime, tzinfo: ZoneInfo, low: int, high: int) -> int:
    """Return the first instant in (low, high] whose clock reads `wall` or later, for a
    `wall` the clock skips: the spring-forward instant itself.

    Raises:
        SchedulerError: the zone's clock does not run from before `wall` at `low`
            to after it at `high` (zone data this module cannot read).
    """
    # In a gap, fold=1 reads `wall` with the offset after the jump (an instant before
    # it) and fold=0 with the offset before (an instant after it).
    if not _wall(low, tzinfo) < wall < _wall(high, tzinfo):
        raise SchedulerError(f"{tzinfo.key}: cannot place {wall:%Y-%m-%d %H:%M} in its zone data")
    # The clock only moves forward across a gap: bisect for where it passes `wall`.
    while high - low > 1:
        middle = (low + high) // 2
        if _wall(middle, tzinfo) >= wall:
            high = middle
        else:
            low = middle
    return high


def _wall(instant_ms: int, tzinfo: ZoneInfo) -> datetime:
    """Return the naive wall-clock time `tzinfo` reads at `instant_ms`."""
    return (EPOCH + instant_ms * ONE_MS).astimezone(tzinfo).replace(tzinfo=None)


def _utc_ms(moment: datetime) -> int:
    return (moment - EPOCH) // ONE_MS
