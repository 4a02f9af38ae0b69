"""`scheduler.calendar`: firings in IANA zones, across every zone's clock changes.

Three layers: the days the clocks change in six zones, written out by hand;
properties over every zone `zoneinfo` knows (hypothesis picks the zone, a year,
and mostly a moment next to one of that zone's transitions, and a trigger at
the wall-clock times the transition skips or repeats); and a walk of the
zone's clock, minute by minute, that restates the firing rule from scratch
("fire when the clock first reads a matching minute it never read before").
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from agent_core.errors import DefinitionError
from agent_core.triggers import Cron, Daily, Every, Trigger, Weekly
from scheduler.calendar import MAX_PREVIEW, next_fire, preview, zone
from scheduler.errors import SchedulerError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
ZONES = sorted(zoneinfo.available_timezones())


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    """Return the ms of a UTC date and time."""
    return (datetime(year, month, day, hour, minute, tzinfo=UTC) - EPOCH) // ONE_MS


def wall(instant_ms: int, name: str) -> datetime:
    """Return the naive wall-clock time zone `name` reads at `instant_ms`."""
    return (EPOCH + instant_ms * ONE_MS).astimezone(zoneinfo.ZoneInfo(name)).replace(tzinfo=None)


def test_the_zone_data_is_here() -> None:
    assert len(ZONES) > 300
    assert {"Europe/Berlin", "Australia/Lord_Howe", "Pacific/Chatham", "UTC"} <= set(ZONES)


# --- the days the clocks change, by hand (all in 2027) ------------------------------------

SPRING = "spring forward: a skipped time fires once, at the first valid instant"
FALL = "fall back: a repeated time fires once, at its first occurrence"

DST_DAYS = [
    # Europe/Berlin: 02:00 CET -> 03:00 CEST at 01:00 UTC on 28 March; back at 01:00 UTC on 31 Oct.
    (Daily(2, 30, tz="Europe/Berlin"), utc(2027, 3, 27, 12), utc(2027, 3, 28, 1, 0), SPRING),
    (Daily(2, 0, tz="Europe/Berlin"), utc(2027, 3, 27, 12), utc(2027, 3, 28, 1, 0), SPRING),
    (Daily(2, 59, tz="Europe/Berlin"), utc(2027, 3, 27, 12), utc(2027, 3, 28, 1, 0), SPRING),
    (Daily(3, 0, tz="Europe/Berlin"), utc(2027, 3, 27, 12), utc(2027, 3, 28, 1, 0), "exists"),
    (Daily(1, 59, tz="Europe/Berlin"), utc(2027, 3, 27, 12), utc(2027, 3, 28, 0, 59), "exists"),
    (Daily(2, 30, tz="Europe/Berlin"), utc(2027, 3, 28, 1, 0), utc(2027, 3, 29, 0, 30), "next"),
    (Daily(2, 30, tz="Europe/Berlin"), utc(2027, 10, 30, 12), utc(2027, 10, 31, 0, 30), FALL),
    (Daily(2, 0, tz="Europe/Berlin"), utc(2027, 10, 30, 12), utc(2027, 10, 31, 0, 0), FALL),
    (Daily(2, 59, tz="Europe/Berlin"), utc(2027, 10, 30, 12), utc(2027, 10, 31, 0, 59), FALL),
    (Daily(3, 0, tz="Europe/Berlin"), utc(2027, 10, 30, 12), utc(2027, 10, 31, 2, 0), "exists"),
    # Between the two readings of 02:30 (00:30 and 01:30 UTC) it has fired: the next is tomorrow.
    (Daily(2, 30, tz="Europe/Berlin"), utc(2027, 10, 31, 0, 30), utc(2027, 11, 1, 1, 30), FALL),
    (Daily(2, 30, tz="Europe/Berlin"), utc(2027, 10, 31, 1, 0), utc(2027, 11, 1, 1, 30), FALL),
    (Weekly(6, 2, 30, tz="Europe/Berlin"), utc(2027, 3, 22), utc(2027, 3, 28, 1, 0), SPRING),
    (Weekly(6, 2, 30, tz="Europe/Berlin"), utc(2027, 10, 25), utc(2027, 10, 31, 0, 30), FALL),
    # America/New_York: 02:00 EST -> 03:00 EDT on 14 March; 02:00 EDT -> 01:00 EST on 7 Nov.
    (Daily(2, 30, tz="America/New_York"), utc(2027, 3, 13, 12), utc(2027, 3, 14, 7, 0), SPRING),
    (Daily(1, 30, tz="America/New_York"), utc(2027, 11, 6, 12), utc(2027, 11, 7, 5, 30), FALL),
    (Daily(1, 30, tz="America/New_York"), utc(2027, 11, 7, 5, 30), utc(2027, 11, 8, 6, 30), FALL),
    # Australia/Lord_Howe moves by 30 minutes: 02:00 +11 -> 01:30 +10:30 on 4 April (15:00
    # UTC the day before), 02:00 +10:30 -> 02:30 +11 on 3 October (15:30 UTC the day before).
    (Daily(1, 45, tz="Australia/Lord_Howe"), utc(2027, 4, 3), utc(2027, 4, 3, 14, 45), FALL),
    (Daily(1, 29, tz="Australia/Lord_Howe"), utc(2027, 4, 3), utc(2027, 4, 3, 14, 29), "exists"),
    (Daily(2, 15, tz="Australia/Lord_Howe"), utc(2027, 10, 2), utc(2027, 10, 2, 15, 30), SPRING),
    (Daily(2, 30, tz="Australia/Lord_Howe"), utc(2027, 10, 2), utc(2027, 10, 2, 15, 30), "exists"),
    # America/Santiago changes at midnight: 24:00 -03 -> 23:00 -04 on Saturday 3 April;
    # 24:00 -04 -> 01:00 -03 on Sunday 5 September, so midnight itself never comes.
    (Daily(23, 30, tz="America/Santiago"), utc(2027, 4, 3, 12), utc(2027, 4, 4, 2, 30), FALL),
    (Daily(23, 30, tz="America/Santiago"), utc(2027, 4, 4, 2, 30), utc(2027, 4, 5, 3, 30), FALL),
    (Daily(0, 0, tz="America/Santiago"), utc(2027, 9, 4, 12), utc(2027, 9, 5, 4, 0), SPRING),
    (Weekly(6, 0, 15, tz="America/Santiago"), utc(2027, 9, 1), utc(2027, 9, 5, 4, 0), SPRING),
    (Cron("@daily", tz="America/Santiago"), utc(2027, 9, 4, 12), utc(2027, 9, 5, 4, 0), SPRING),
    (Cron("@monthly", tz="America/Santiago"), utc(2027, 8, 2), utc(2027, 9, 1, 4, 0), "exists"),
    # Pacific/Chatham, +12:45/+13:45: 03:45 -> 02:45 on 4 April (14:00 UTC the day before);
    # 02:45 -> 03:45 on 26 September (14:00 UTC the day before).
    (Daily(3, 0, tz="Pacific/Chatham"), utc(2027, 4, 3), utc(2027, 4, 3, 13, 15), FALL),
    (Daily(3, 0, tz="Pacific/Chatham"), utc(2027, 9, 25), utc(2027, 9, 25, 14, 0), SPRING),
    (Daily(3, 45, tz="Pacific/Chatham"), utc(2027, 9, 25), utc(2027, 9, 25, 14, 0), "exists"),
    # Asia/Kolkata, +05:30 all year.
    (Daily(9, 0, tz="Asia/Kolkata"), utc(2027, 3, 28), utc(2027, 3, 28, 3, 30), "exists"),
    (Cron("30 2 * * *", tz="Asia/Kolkata"), utc(2027, 10, 31), utc(2027, 10, 31, 21, 0), "exists"),
]


@pytest.mark.parametrize(("trigger", "after", "expected", "rule"), DST_DAYS)
def test_the_days_the_clocks_change(trigger: Trigger, after: int, expected: int, rule: str) -> None:
    assert next_fire(trigger, after) == expected, rule


@pytest.mark.parametrize(
    ("trigger", "after", "expected"),
    [
        # Berlin, spring: 02:00-02:45 are skipped and fire once, at 03:00 CEST, which is also
        # when 03:00 itself fires; the next firing is 03:15.
        (
            Cron("*/15 * * * *", tz="Europe/Berlin"),
            utc(2027, 3, 28, 0, 30),
            [utc(2027, 3, 28, 0, 45), utc(2027, 3, 28, 1, 0), utc(2027, 3, 28, 1, 15)],
        ),
        (
            Cron("*/15 2 * * *", tz="Europe/Berlin"),
            utc(2027, 3, 27, 12),
            [utc(2027, 3, 28, 1, 0), utc(2027, 3, 29, 0, 0), utc(2027, 3, 29, 0, 15)],
        ),
        # Berlin, autumn: 02:00-02:45 fire in their first hour only.
        (
            Cron("*/15 2 * * *", tz="Europe/Berlin"),
            utc(2027, 10, 30, 12),
            [
                utc(2027, 10, 31, 0, 0),
                utc(2027, 10, 31, 0, 15),
                utc(2027, 10, 31, 0, 30),
                utc(2027, 10, 31, 0, 45),
                utc(2027, 11, 1, 1, 0),
            ],
        ),
        (
            Cron("*/30 * * * *", tz="Europe/Berlin"),
            utc(2027, 10, 31, 0, 15),
            [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 2, 0), utc(2027, 10, 31, 2, 30)],
        ),
        # Lord Howe, spring: 02:00, 02:10, 02:20 (skipped) and 02:30 all come at 15:30 UTC.
        (
            Cron("*/10 2 * * *", tz="Australia/Lord_Howe"),
            utc(2027, 10, 2),
            [utc(2027, 10, 2, 15, 30), utc(2027, 10, 2, 15, 40), utc(2027, 10, 2, 15, 50)],
        ),
        # Chatham, autumn: 02:45-03:44 come twice; each fires in the first pass only.
        (
            Cron("0,30 2-4 * * *", tz="Pacific/Chatham"),
            utc(2027, 4, 3, 12, 0),
            [
                utc(2027, 4, 3, 12, 15),  # 02:00 +13:45
                utc(2027, 4, 3, 12, 45),  # 02:30 +13:45
                utc(2027, 4, 3, 13, 15),  # 03:00 +13:45
                utc(2027, 4, 3, 13, 45),  # 03:30 +13:45; its second reading, 14:45, is skipped
                utc(2027, 4, 3, 15, 15),  # 04:00 +12:45
                utc(2027, 4, 3, 15, 45),
            ],
        ),
    ],
)
def test_cron_minutes_on_the_days_the_clocks_change(
    trigger: Trigger, after: int, expected: list[int]
) -> None:
    assert preview(trigger, after, len(expected)) == expected


def test_a_whole_skipped_day_fires_once_at_the_jump() -> None:
    # Samoa skipped Friday 30 December 2011: 24:00 on the 29th (-10) became 00:00 on the 31st.
    trigger = Daily(9, 0, tz="Pacific/Apia")
    assert preview(trigger, utc(2011, 12, 28), 4) == [
        utc(2011, 12, 28, 19),
        utc(2011, 12, 29, 19),
        utc(2011, 12, 30, 10),  # the 30th's 09:00, at the first instant after it
        utc(2011, 12, 30, 19),  # the 31st's, at +14:00
    ]


# --- without a zone: the fixed offset, exactly as before -------------------------------------


triggers_without_zone = st.one_of(
    st.builds(Every, st.integers(1, 3 * 24 * 60)),
    st.builds(Daily, st.integers(0, 23), st.integers(0, 59)),
    st.builds(Weekly, st.integers(0, 6), st.integers(0, 23), st.integers(0, 59)),
    st.sampled_from(["*/15 * * * *", "0 9 * * MON-FRI", "@monthly", "0 0 29 2 *"]).map(Cron),
)


@settings(max_examples=100, deadline=None)
@given(triggers_without_zone, st.integers(0, utc(2100, 1, 1)), st.integers(-840, 840))
def test_without_a_zone_next_fire_is_next_after(trigger: Trigger, after: int, offset: int) -> None:
    expected = trigger.next_after(after, offset)
    assert next_fire(trigger, after, utc_offset_minutes=offset) == expected
    assert preview(trigger, after, 2, utc_offset_minutes=offset)[0] == expected


def test_every_counts_minutes_from_the_last_run_on_any_day() -> None:
    after = utc(2027, 3, 28, 0, 40) + 17_345
    assert preview(Every(30), after, 3, utc_offset_minutes=120) == [
        after + 30 * MINUTE,
        after + 60 * MINUTE,
        after + 90 * MINUTE,
    ]


def test_a_zone_wins_over_the_offset() -> None:
    trigger = Daily(9, 0, tz="Asia/Kolkata")
    assert next_fire(trigger, utc(2027, 1, 1), utc_offset_minutes=-300) == utc(2027, 1, 1, 3, 30)


# --- zones and refusals ---------------------------------------------------------------------


def test_every_zone_loads() -> None:
    assert all(zone(name).key == name for name in ZONES)


@pytest.mark.parametrize(
    "name", ["Europe/Berlinn", "Mars/Olympus_Mons", "America", "", "../etc/passwd", "zone.tab", 5]
)
def test_an_unknown_zone_is_a_clear_error(name: Any) -> None:
    with pytest.raises(SchedulerError) as refused:
        zone(name)
    assert str(refused.value) == f"unknown time zone {name!r}"


def test_a_trigger_in_an_unknown_zone_cannot_fire() -> None:
    with pytest.raises(SchedulerError, match="unknown time zone 'Europe/Berlinn'"):
        next_fire(Daily(9, 0, tz="Europe/Berlinn"), 0)


@pytest.mark.parametrize(
    ("after", "offset"), [(-1, 0), (1.5, 0), (True, 0), ("0", 0), (0, 841), (0, None)]
)
@pytest.mark.parametrize("trigger", [Daily(9, 0), Daily(9, 0, tz="UTC"), Cron("@daily", tz="UTC")])
def test_bad_times_and_offsets_are_refused(trigger: Trigger, after: Any, offset: Any) -> None:
    with pytest.raises(DefinitionError):
        next_fire(trigger, after, utc_offset_minutes=offset)


@pytest.mark.parametrize("count", [0, -1, MAX_PREVIEW + 1, True, 2.0, "3", None])
def test_a_preview_shows_1_to_1000(count: Any) -> None:
    with pytest.raises(DefinitionError):
        preview(Daily(9, 0, tz="UTC"), 0, count)


def test_the_longest_preview_is_allowed() -> None:
    firings = preview(Cron("* * * * *", tz="Europe/Berlin"), utc(2027, 3, 28), MAX_PREVIEW)
    assert len(firings) == MAX_PREVIEW
    # Every UTC minute fires once: the skipped 02:00-02:59 all come with 03:00 CEST, 01:00 UTC.
    assert firings[-1] == utc(2027, 3, 28) + MAX_PREVIEW * MINUTE


def test_the_search_gives_up_instead_of_looping() -> None:
    # 29 February on a Sunday: 2032, then 2060, further than the search looks.
    trigger = Cron("0 0 29 2 */7", tz="Europe/Berlin")
    assert next_fire(trigger, utc(2031, 1, 1)) == utc(2032, 2, 28, 23, 0)
    with pytest.raises(DefinitionError, match="does not fire within"):
        next_fire(trigger, utc(2032, 3, 1))


@pytest.mark.parametrize("after", [utc(9999, 12, 31, 12), 10**15, 10**18])
def test_the_end_of_the_calendar_is_an_error_not_a_crash(after: int) -> None:
    with pytest.raises(DefinitionError):
        next_fire(Daily(9, 0, tz="Pacific/Kiritimati"), after)


# --- every zone: properties -----------------------------------------------------------------


@functools.cache
def transitions(name: str, year: int) -> tuple[int, ...]:
    """Return the instants in `year` at which zone `name` changes its offset (at most one a day)."""
    tzinfo = zoneinfo.ZoneInfo(name)
    found = []
    start, end = utc(year, 1, 1), utc(year + 1, 1, 1)
    for day_start, day_end in pairwise(range(start, end + 1, DAY)):
        before = (EPOCH + day_start * ONE_MS).astimezone(tzinfo).utcoffset()
        if (EPOCH + day_end * ONE_MS).astimezone(tzinfo).utcoffset() == before:
            continue
        low, high = day_start, day_end
        while high - low > 1:
            middle = (low + high) // 2
            if (EPOCH + middle * ONE_MS).astimezone(tzinfo).utcoffset() == before:
                low = middle
            else:
                high = middle
        found.append(high)
    return tuple(found)


@functools.cache
def summer_time() -> dict[str, tuple[int, ...]]:
    """Return, for each zone with any, the years from 1970 to 2060 whose January and July
    offsets differ."""
    years: dict[str, tuple[int, ...]] = {}
    for name in ZONES:
        tzinfo = zoneinfo.ZoneInfo(name)
        changing = tuple(
            year
            for year in range(1970, 2061)
            if datetime(year, 1, 1, tzinfo=tzinfo).utcoffset()
            != datetime(year, 7, 1, tzinfo=tzinfo).utcoffset()
        )
        if changing:
            years[name] = changing
    return years


Matcher = Callable[[datetime], bool]


def matcher(trigger: Trigger) -> Matcher:
    """Return whether a whole wall-clock minute is one `trigger` names."""
    if isinstance(trigger, Daily):
        return lambda m: (m.hour, m.minute) == (trigger.hour, trigger.minute)
    if isinstance(trigger, Weekly):
        return lambda m: (
            (m.weekday(), m.hour, m.minute)
            == (
                trigger.day,
                trigger.hour,
                trigger.minute,
            )
        )
    assert isinstance(trigger, Cron)
    spec = trigger.spec
    return lambda m: m.minute in spec.minutes and m.hour in spec.hours and spec.day_matches(m)


SPARSE = [
    "@monthly",
    "0 0 29 2 *",
    "30 2 * * SUN",
    "0 9 * * MON-FRI",
    "15 1-3 * 3,4,9-11 0",
    "0 0 1,15 * *",
]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Trigger, int]:
    """Return a trigger in a zone hypothesis picks, and a moment: mostly next to one of the
    zone's transitions, with the trigger naming wall-clock times around it."""
    if draw(st.integers(0, 3)) == 0:
        name = draw(st.sampled_from(ZONES))
        year = draw(st.integers(1970, 2060))
    else:
        # Most zones keep one offset all year: pick one of the years a zone does not.
        name = draw(st.sampled_from(sorted(summer_time())))
        year = draw(st.sampled_from(summer_time()[name]))
    found = transitions(name, year)
    if found:
        pivot = draw(st.sampled_from(found))
        event("next to a transition")
    else:
        pivot = draw(st.integers(utc(year, 1, 1), utc(year + 1, 1, 1)))
    after = pivot + draw(
        st.one_of(
            st.sampled_from([-1, 0, 1, -MINUTE, -HOUR]),
            # The day before the jump, before the repeated stretch: the next firing is at it.
            st.integers(-DAY, -2 * HOUR),
            st.integers(-DAY, -2 * HOUR),
            st.integers(-2 * DAY, DAY),
        )
    )
    # The wall-clock time just before the jump, moved a little: mostly inside the
    # skipped stretch (after it) or the repeated one (before it), else near it.
    before = wall(pivot - 1, name)
    jump = (wall(pivot, name) - before - ONE_MS) // timedelta(minutes=1)
    stretch = st.integers(1, jump) if jump > 0 else st.integers(min(jump + 1, 0), 0)
    shift = draw(st.one_of(stretch, stretch, st.integers(-90, 90)))
    target = before + timedelta(minutes=shift)
    hour, minute = target.hour, target.minute
    kind = draw(st.sampled_from(["daily", "weekly", "cron-dense", "cron-hourly", "cron-sparse"]))
    if kind == "daily":
        trigger: Trigger = Daily(hour, minute, tz=name)
    elif kind == "weekly":
        trigger = Weekly(target.weekday(), hour, minute, tz=name)
    elif kind == "cron-dense":
        step = draw(st.sampled_from([1, 5, 10, 15, 30]))
        trigger = Cron(f"*/{step} {hour},{(hour + 1) % 24} * * *", tz=name)
    elif kind == "cron-hourly":
        trigger = Cron(f"{minute} * * * *", tz=name)
    else:
        trigger = Cron(draw(st.sampled_from(SPARSE)), tz=name)
    return trigger, max(0, after)


def stands_for(trigger: Trigger, firing: int) -> str:
    """Check that `firing` is the first reading of a wall-clock minute the trigger names, or
    the jump over one; return which. Fails the test otherwise."""
    name = getattr(trigger, "tz", None)
    assert isinstance(name, str)
    matches, reading = matcher(trigger), wall(firing, name)
    if reading.second == reading.microsecond == 0 and matches(reading):
        # The first reading: in the day before, the clock never read this minute or later
        # (after a fall-back it does so again, an hour or so later).
        earlier = (wall(firing - k * MINUTE, name) for k in range(1, 25 * 60 + 1))
        assert all(before < reading for before in earlier), (trigger, firing, reading)
        later = (wall(firing + k * MINUTE, name) for k in range(1, 25 * 60 + 1))
        if any(after == reading for after in later):
            return "a repeated minute, at its first reading"
        return "a minute read once"
    # A jump forward: the clock just before read less than the minute it skipped.
    just_before = wall(firing - 1, name)
    assert just_before + ONE_MS < reading, (trigger, firing, reading)
    skipped = just_before.replace(second=0, microsecond=0) + timedelta(minutes=1)
    named = []
    while skipped < reading:
        if matches(skipped):
            named.append(skipped)
        skipped += timedelta(minutes=1)
    # Never earlier than the time it stands for: every skipped minute it serves lies before.
    assert named, (trigger, firing, just_before, reading)
    return "a skipped minute, at the jump"


@settings(max_examples=120, deadline=None)
@given(cases())
def test_every_zone_firings_increase_and_stand_for_their_wall_time(
    case: tuple[Trigger, int],
) -> None:
    trigger, after = case
    try:
        firings = preview(trigger, after, 4)
    except DefinitionError as refused:
        # Only past the year 9999 or beyond the search: neither happens from 1970-2062.
        raise AssertionError(refused) from None
    assert firings[0] > after
    assert all(a < b for a, b in pairwise(firings))
    assert firings[1:] == [next_fire(trigger, firing) for firing in firings[:-1]]
    for firing in firings:
        event(stands_for(trigger, firing))


def clock_walk(trigger: Trigger, after: int, days: int) -> int | None:
    """Return the first whole UTC minute after `after` at which the zone's clock reads a
    minute the trigger names that it has not read before; None if none within `days`.

    Valid for zones whose offsets and transitions are whole minutes.
    """
    name = getattr(trigger, "tz", None)
    assert isinstance(name, str)
    matches = matcher(trigger)
    # Everything the clock read up to `after` (a day back covers any fall-back) is served.
    seen = max(wall(after - k * MINUTE, name) for k in range(0, 26 * 60))
    moment = (after // MINUTE + 1) * MINUTE
    for _ in range(days * 24 * 60):
        reading = wall(moment, name)
        candidate = seen.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while candidate <= reading:
            if matches(candidate):
                return moment
            candidate += timedelta(minutes=1)
        seen = max(seen, reading)
        moment += MINUTE
    return None


@settings(max_examples=60, deadline=None)
@given(cases())
def test_every_zone_agrees_with_a_walk_of_its_clock(case: tuple[Trigger, int]) -> None:
    trigger, after = case
    assume(not (isinstance(trigger, Cron) and trigger.expression in SPARSE))
    name = getattr(trigger, "tz", None)
    assert isinstance(name, str)
    tzinfo = zoneinfo.ZoneInfo(name)
    # The walk steps whole minutes: it needs offsets of whole minutes (LMT had seconds).
    offsets = [
        (EPOCH + moment * ONE_MS).astimezone(tzinfo).utcoffset()
        for moment in (after - 2 * DAY, after, after + 8 * DAY)
    ]
    assume(all(offset is not None and offset.seconds % 60 == 0 for offset in offsets))
    expected = clock_walk(trigger, after, days=8)
    assert expected is not None
    assert next_fire(trigger, after) == expected
