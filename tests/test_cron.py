"""Cron expressions and zones on triggers: parsing, refusals, JSON, and a fixed-offset oracle.

The zone-aware arithmetic is tested in tests/test_calendar.py; here `Cron` runs on
a fixed UTC offset, checked against a day-by-day walk written from the generated
field values themselves (not from the parser's output).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest
from croniter import croniter
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agent_core.cron import SEARCH_DAYS, CronSpec, parse_cron
from agent_core.errors import DefinitionError
from agent_core.triggers import Cron, Daily, Every, Trigger, Weekly, trigger_from_json

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
ALL_MINUTES = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_DAYS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, offset: int = 0) -> int:
    """Return the UTC ms of a wall-clock time `offset` minutes east of UTC."""
    zone = timezone(timedelta(minutes=offset))
    return (datetime(year, month, day, hour, minute, tzinfo=zone) - EPOCH) // ONE_MS


def sets(spec: CronSpec) -> tuple[frozenset[int], ...]:
    return (
        frozenset(spec.minutes),
        frozenset(spec.hours),
        spec.days,
        spec.months,
        spec.weekdays,
    )


# --- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("* * * * *", (ALL_MINUTES, ALL_HOURS, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("0 9 * * *", ({0}, {9}, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("1,5 1-5 * * *", ({1, 5}, {1, 2, 3, 4, 5}, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("*/15 * * * *", ({0, 15, 30, 45}, ALL_HOURS, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("10-50/10 * * * *", ({10, 20, 30, 40, 50}, ALL_HOURS, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("0 */7 */10 */5 */3", ({0}, {0, 7, 14, 21}, {1, 11, 21, 31}, {1, 6, 11}, {0, 3, 6})),
        ("59 23 31 12 6", ({59}, {23}, {31}, {12}, {6})),
        (
            "0 0 1-7,15,20-22 * *",
            ({0}, {0}, {1, 2, 3, 4, 5, 6, 7, 15, 20, 21, 22}, ALL_MONTHS, ALL_WEEKDAYS),
        ),
        ("*/25 0-10/5 * * *", ({0, 25, 50}, {0, 5, 10}, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("0 0 * JAN,jul,Dec *", ({0}, {0}, ALL_DAYS, {1, 7, 12}, ALL_WEEKDAYS)),
        ("0 0 * feb-APR/2 *", ({0}, {0}, ALL_DAYS, {2, 4}, ALL_WEEKDAYS)),
        ("0 0 * * MON-fri", ({0}, {0}, ALL_DAYS, ALL_MONTHS, {1, 2, 3, 4, 5})),
        ("0 0 * * sun,Sat", ({0}, {0}, ALL_DAYS, ALL_MONTHS, {0, 6})),
        ("0 0 * * 7", ({0}, {0}, ALL_DAYS, ALL_MONTHS, {0})),
        ("0 0 * * 0", ({0}, {0}, ALL_DAYS, ALL_MONTHS, {0})),
        ("0 0 * * 5-7", ({0}, {0}, ALL_DAYS, ALL_MONTHS, {5, 6, 0})),
        ("0 0 * * 0-7", ({0}, {0}, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
        ("  0\t9  *   * *\n", ({0}, {9}, ALL_DAYS, ALL_MONTHS, ALL_WEEKDAYS)),
    ],
)
def test_fields_parse_to_these_values(expression: str, expected: tuple[set[int], ...]) -> None:
    assert sets(parse_cron(expression)) == tuple(frozenset(values) for values in expected)


@pytest.mark.parametrize(
    ("alias", "expression"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@DAILY", "0 0 * * *"),
        (" @Weekly ", "0 0 * * 0"),
    ],
)
def test_aliases_stand_for_their_five_fields(alias: str, expression: str) -> None:
    assert parse_cron(alias) == parse_cron(expression)
    # Different text, so different triggers; the same firings.
    assert Cron(alias).next_after(at(2026, 5, 9, 10, 7), 0) == Cron(expression).next_after(
        at(2026, 5, 9, 10, 7), 0
    )


def test_names_are_their_numbers_in_any_case() -> None:
    assert parse_cron("0 0 * jan-Mar * ") == parse_cron("0 0 * 1-3 *")
    assert parse_cron("0 0 * * tue,THU,Sat") == parse_cron("0 0 * * 2,4,6")


def test_a_day_field_is_restricted_unless_it_starts_with_a_star() -> None:
    restricted = [
        (spec.days_restricted, spec.weekdays_restricted)
        for spec in map(parse_cron, ["0 0 * * *", "0 0 1 * MON", "0 0 */2 * 1-5", "0 0 1-31 * */1"])
    ]
    assert restricted == [(False, False), (True, True), (False, True), (True, False)]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 25 * * *", "cron: the hour field '25' is out of range 0-23"),
        ("1 2 3 4", "cron: expected 5 fields, got 4"),
        ("1 2 3 4 5 6", "cron: expected 5 fields, got 6"),
        ("", "cron: expected 5 fields, got 0"),
        ("0 1,25 * * *", "cron: the hour field '1,25' (at '25') is out of range 0-23"),
        (
            "0 0 * * MON-SUN",
            "cron: the day-of-week field 'MON-SUN' has a range that runs backwards",
        ),
        ("*/0 * * * *", "cron: the minute field '*/0' has a step of 0; a step is at least 1"),
        (
            "5/15 * * * *",
            "cron: the minute field '5/15' has a step after a single value; write '5-59/15'",
        ),
        ("0 0 * JANX *", "cron: the month field 'JANX' is not a number or a month name (JAN-DEC)"),
        (
            "0 0 31 2 *",
            "cron: '0 0 31 2 *' can never fire: no month in the month field '2'"
            " has a day in the day-of-month field '31'",
        ),
    ],
)
def test_refusals_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(DefinitionError) as refused:
        parse_cron(expression)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("60 * * * *", "minute"),
        ("-1 * * * *", "minute"),
        ("x * * * *", "minute"),
        ("1,,2 * * * *", "minute"),
        ("1, * * * *", "minute"),
        ("*/x * * * *", "minute"),
        ("*/ * * * *", "minute"),
        ("1.5 * * * *", "minute"),
        ("0 24 * * *", "hour"),
        ("0 5-2 * * *", "hour"),
        ("0 */0 * * *", "hour"),
        ("0 ? * * *", "hour"),
        ("0 0 0 * *", "day-of-month"),
        ("0 0 32 * *", "day-of-month"),
        ("0 0 L * *", "day-of-month"),
        ("0 0 15W * *", "day-of-month"),
        ("0 0 MON * *", "day-of-month"),
        ("0 0 1-40 * *", "day-of-month"),
        ("0 0 * 0 *", "month"),
        ("0 0 * 13 *", "month"),
        ("0 0 * JANUARY *", "month"),
        ("0 0 * MON *", "month"),
        ("0 0 * DEC-JAN *", "month"),
        ("0 0 * * 8", "day-of-week"),
        ("0 0 * * 5L", "day-of-week"),
        ("0 0 * * 1#2", "day-of-week"),
        ("0 0 * * JAN", "day-of-week"),
        ("0 0 * * MONDAY", "day-of-week"),
        ("0 0 * * 3/2", "day-of-week"),
        ("0 0 * * -", "day-of-week"),
    ],
)
def test_every_field_refusal_names_its_field(expression: str, field: str) -> None:
    with pytest.raises(DefinitionError, match=f"^cron: the {field} field '") as refused:
        parse_cron(expression)
    assert f"'{expression.split()[FIELD_INDEX[field]]}'" in str(refused.value)


FIELD_INDEX = {"minute": 0, "hour": 1, "day-of-month": 2, "month": 3, "day-of-week": 4}


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 31 2 *",
        "0 0 30,31 2 *",
        "0 0 31 4,6,9,11 *",
        "0 0 30-31 FEB *",
        "0 0 31 2 */1",  # `*/1` counts as a star: the date alone decides, and never comes
        "@reboot",
        "@every 5m",
        "@",
        5,
        None,
        ["0", "0", "*", "*", "*"],
        "0 0 * * * " * 40,
    ],
)
def test_expressions_that_cannot_be_used_are_refused(expression: Any) -> None:
    with pytest.raises(DefinitionError, match=r"^cron: "):
        parse_cron(expression)
    with pytest.raises(DefinitionError, match=r"^cron: "):
        Cron(expression)


@pytest.mark.parametrize(
    "expression",
    ["0 0 29 2 *", "0 0 31 2 MON", "0 0 30,31 2,3 *", "0 0 31 * *", "0 0 31 2 1-5"],
)
def test_expressions_that_fire_somewhere_are_accepted(expression: str) -> None:
    trigger = Cron(expression)
    assert trigger.next_after(at(2026, 1, 1), 0) > at(2026, 1, 1)


# --- the Vixie rule ----------------------------------------------------------------------


def firing_days(expression: str, start: tuple[int, int, int], count: int) -> list[date]:
    last, days = at(*start), []
    for _ in range(count):
        last = Cron(expression).next_after(last, 0)
        days.append((EPOCH + last * ONE_MS).date())
    return days


def test_both_day_fields_restricted_fire_on_either() -> None:
    # June 2026: Monday the 1st, Friday the 5th, Saturday the 13th.
    assert firing_days("0 0 13 * FRI", (2026, 6, 1), 4) == [
        date(2026, 6, 5),
        date(2026, 6, 12),
        date(2026, 6, 13),
        date(2026, 6, 19),
    ]
    assert firing_days("0 0 1 * MON", (2026, 6, 20), 3) == [
        date(2026, 6, 22),
        date(2026, 6, 29),
        date(2026, 7, 1),
    ]


def test_one_day_field_restricted_decides_alone() -> None:
    assert firing_days("0 0 13 * *", (2026, 6, 1), 2) == [date(2026, 6, 13), date(2026, 7, 13)]
    assert firing_days("0 0 * * FRI", (2026, 6, 1), 2) == [date(2026, 6, 5), date(2026, 6, 12)]


def test_a_starred_step_is_not_a_restriction_so_both_must_match() -> None:
    # Odd days of the month that are Mondays (Vixie's `*`-prefix rule), June 2026.
    assert firing_days("0 0 */2 * MON", (2026, 5, 31), 3) == [
        date(2026, 6, 1),
        date(2026, 6, 15),
        date(2026, 6, 29),
    ]


def test_the_search_is_bounded_and_refuses_past_it() -> None:
    # 29 February on a Sunday: 2032, then 2060, more than SEARCH_DAYS later.
    trigger = Cron("0 0 29 2 */7")
    assert trigger.next_after(at(2030, 1, 1), 0) == at(2032, 2, 29)
    with pytest.raises(DefinitionError, match="does not fire within"):
        trigger.next_after(at(2032, 3, 1), 0)


def test_the_last_days_of_the_calendar_still_fire() -> None:
    assert Cron("59 23 31 12 *").next_after(at(9999, 1, 1), 0) == at(9999, 12, 31, 23, 59)


def test_a_time_past_the_year_9999_is_refused_not_overflowed() -> None:
    with pytest.raises(DefinitionError, match="year 10000"):
        Cron("0 0 1 1 *").next_after(at(9999, 6, 1), 0)
    with pytest.raises(DefinitionError, match="year 10000"):
        Cron("0 0 1 1 *").next_after(10**18, 0)


# --- the trigger: construction, zones, JSON -------------------------------------------------


def test_cron_stores_its_expression_with_whitespace_collapsed() -> None:
    trigger = Cron("  */15\t9-17 * *   MON-FRI ")
    assert trigger.expression == "*/15 9-17 * * MON-FRI"
    assert trigger == Cron("*/15 9-17 * * MON-FRI")
    assert trigger.model_dump_json() == '{"kind":"cron","expression":"*/15 9-17 * * MON-FRI"}'


@pytest.mark.parametrize(
    ("trigger", "text"),
    [
        (Daily(9, 0), '{"kind":"daily","hour":9,"minute":0}'),
        (Daily(9, 0, tz=None), '{"kind":"daily","hour":9,"minute":0}'),
        (Weekly(6, 23, 59), '{"kind":"weekly","day":6,"hour":23,"minute":59}'),
        (
            Daily(9, 0, tz="Europe/Berlin"),
            '{"kind":"daily","hour":9,"minute":0,"tz":"Europe/Berlin"}',
        ),
        (
            Weekly(0, 9, 30, tz="America/Argentina/Buenos_Aires"),
            '{"kind":"weekly","day":0,"hour":9,"minute":30,"tz":"America/Argentina/Buenos_Aires"}',
        ),
        (Cron("@daily", tz="Etc/GMT+5"), '{"kind":"cron","expression":"@daily","tz":"Etc/GMT+5"}'),
        (Every(15), '{"kind":"every","minutes":15}'),
    ],
)
def test_a_zone_is_written_only_when_set(trigger: Trigger, text: str) -> None:
    assert trigger.model_dump_json() == text
    assert trigger_from_json(text) == trigger
    assert ("tz" in trigger.model_dump()) is (getattr(trigger, "tz", None) is not None)


def test_a_stored_null_zone_loads_as_no_zone() -> None:
    loaded = trigger_from_json('{"kind":"daily","hour":9,"minute":0,"tz":null}')
    assert loaded == Daily(9, 0)
    assert loaded.model_dump_json() == '{"kind":"daily","hour":9,"minute":0}'


class Holder(BaseModel):
    """A stand-in for the scheduler's record, which embeds a trigger."""

    trigger: Trigger


def test_a_cron_embedded_in_a_model_loads_back_by_kind() -> None:
    holder = Holder(trigger=Cron("0 9 * * 1-5", tz="Asia/Kolkata"))
    text = holder.model_dump_json()
    assert text == '{"trigger":{"kind":"cron","expression":"0 9 * * 1-5","tz":"Asia/Kolkata"}}'
    assert Holder.model_validate_json(text) == holder


@pytest.mark.parametrize(
    "text",
    [
        '{"kind":"cron","expression":"0 25 * * *"}',
        '{"kind":"cron","expression":"0 0 31 2 *"}',
        '{"kind":"cron","expression":5}',
        '{"kind":"cron"}',
        '{"kind":"cron","expression":"0 9 * * *","tz":"../../etc/passwd"}',
        '{"kind":"cron","expression":"0 9 * * *","tz":5}',
        '{"kind":"cron","expression":"0 9 * * *","minutes":5}',
        '{"kind":"daily","hour":9,"minute":0,"tz":""}',
        '{"kind":"daily","hour":9,"minute":0,"tz":"Europe/Berlin "}',
        '{"kind":"weekly","day":0,"hour":9,"tz":["Europe/Berlin"]}',
        '{"kind":"every","minutes":15,"tz":"Europe/Berlin"}',
    ],
)
def test_bad_stored_crons_and_zones_are_refused(text: str) -> None:
    with pytest.raises(DefinitionError):
        trigger_from_json(text)
    with pytest.raises(ValidationError):
        Holder.model_validate_json(f'{{"trigger":{text}}}')


@pytest.mark.parametrize(
    "tz",
    ["UTC", "Europe/Berlin", "Etc/GMT-14", "America/Argentina/Buenos_Aires", "EST5EDT", "a" * 64],
)
def test_zone_shaped_names_are_accepted(tz: str) -> None:
    assert Daily(9, 0, tz=tz).tz == tz
    assert Cron("@hourly", tz=tz).tz == tz


@pytest.mark.parametrize(
    "tz",
    [
        "",
        "a" * 65,
        "/etc/passwd",
        "Europe/../etc",
        "..",
        "Europe/Berlin/",
        "Europe//Berlin",
        "Europe/Berlin ",
        "zone.tab",
        "-Europe",
        "Europe\\Berlin",
        "Europe/Ber lin",
        "Érope/Berlin",
        5,
        True,
        b"UTC",
    ],
)
def test_names_that_are_no_zone_are_refused(tz: Any) -> None:
    for build in (
        lambda: Daily(9, 0, tz=tz),
        lambda: Weekly(0, 9, 0, tz=tz),
        lambda: Cron("@daily", tz=tz),
    ):
        with pytest.raises(DefinitionError, match="IANA"):
            build()


def test_a_zone_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Daily(9, 0, "Europe/Berlin")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "trigger",
    [Daily(9, 0, tz="Europe/Berlin"), Weekly(0, 9, 0, tz="UTC"), Cron("@daily", tz="Asia/Kolkata")],
)
def test_next_after_refuses_a_trigger_with_a_zone(trigger: Trigger) -> None:
    with pytest.raises(DefinitionError, match=r"scheduler\.calendar\.next_fire"):
        trigger.next_after(0, 0)
    with pytest.raises(DefinitionError, match=r"scheduler\.calendar\.next_fire"):
        trigger.due(0, 10**12, 0)


@pytest.mark.parametrize(
    ("trigger", "text"),
    [
        (Cron("*/15 * * * *"), "cron '*/15 * * * *'"),
        (Cron("@daily", tz="Europe/Berlin"), "cron '@daily' (Europe/Berlin)"),
        (Daily(9, 0, tz="Europe/Berlin"), "daily at 09:00 (Europe/Berlin)"),
        (Weekly(6, 18, 30, tz="UTC"), "weekly on Sunday at 18:30 (UTC)"),
        (Daily(9, 0), "daily at 09:00"),
    ],
)
def test_describe_names_the_zone(trigger: Trigger, text: str) -> None:
    assert trigger.describe() == text


@pytest.mark.parametrize(
    "build",
    [
        Cron,
        lambda: Cron("@daily", kind="daily"),
        lambda: Cron("@daily", minutes=5),
        lambda: Cron(expression="@daily", tz="UTC", extra=1),
    ],
)
def test_cron_construction_refusals(build: Callable[[], Any]) -> None:
    with pytest.raises(DefinitionError):
        build()


@pytest.mark.parametrize(("last_ms", "offset"), [(-1, 0), (1.5, 0), (True, 0), (0, 841), (0, "0")])
def test_cron_refuses_bad_times_and_offsets(last_ms: Any, offset: Any) -> None:
    with pytest.raises(DefinitionError):
        Cron("@hourly").next_after(last_ms, offset)


# --- the oracle: fixed offsets ------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One generated field: its text and the values it stands for, written independently."""

    text: str
    values: frozenset[int]
    star: bool


def field(low: int, high: int) -> st.SearchStrategy[Field]:
    star = st.just(Field("*", frozenset(range(low, high + 1)), star=True))
    step = st.integers(2, max(2, (high - low) // 2)).map(
        lambda n: Field(f"*/{n}", frozenset(range(low, high + 1, n)), star=True)
    )
    chosen = st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True).map(
        lambda values: Field(",".join(map(str, values)), frozenset(values), star=False)
    )
    ranged = st.tuples(st.integers(low, high), st.integers(0, 6), st.integers(1, 3)).map(
        lambda t: Field(
            f"{t[0]}-{min(high, t[0] + t[1])}/{t[2]}",
            frozenset(range(t[0], min(high, t[0] + t[1]) + 1, t[2])),
            star=False,
        )
    )
    return st.one_of(star, step, chosen, ranged)


expressions = st.tuples(field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 7))


def oracle(fields: tuple[Field, ...], wall: datetime) -> datetime | None:
    """Walk every day from `wall` (SEARCH_DAYS of them) and every minute of a matching day."""
    minutes, hours, days, months, weekdays = fields
    start = wall.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for offset in range(SEARCH_DAYS + 1):
        day = start.date() + timedelta(days=offset)
        by_date = day.day in days.values
        # isoweekday: Monday 1 … Sunday 7; cron: Monday 1 … Saturday 6, Sunday 0 or 7.
        numbers = {0, 7} if day.isoweekday() == 7 else {day.isoweekday()}
        by_weekday = bool(numbers & weekdays.values)
        either = not days.star and not weekdays.star
        if day.month not in months.values or not (
            (by_date or by_weekday) if either else (by_date and by_weekday)
        ):
            continue
        for hour in range(24):
            for minute in range(60):
                moment = datetime.combine(day, time(hour, minute))
                if moment >= start and hour in hours.values and minute in minutes.values:
                    return moment
    return None


def can_fire(fields: tuple[Field, ...]) -> bool:
    days, months, weekdays = fields[2], fields[3], fields[4]
    if not days.star and not weekdays.star:
        return True
    longest = {2: 29, 4: 30, 6: 30, 9: 30, 11: 30}
    return any(day <= longest.get(month, 31) for month in months.values for day in days.values)


@settings(max_examples=150, deadline=None)
@given(
    expressions,
    st.integers(0, at(2100, 1, 1)),
    st.sampled_from([0, 60, 345, -720, 840, -840, 330, -210]),
)
def test_cron_next_after_agrees_with_a_day_by_day_walk(
    fields: tuple[Field, ...], last_ms: int, offset: int
) -> None:
    expression = " ".join(f.text for f in fields)
    if not can_fire(fields):
        event("never fires")
        with pytest.raises(DefinitionError, match="can never fire"):
            Cron(expression)
        return
    trigger = Cron(expression)
    zone = timezone(timedelta(minutes=offset))
    wall = (EPOCH + last_ms * ONE_MS).astimezone(zone).replace(tzinfo=None)
    expected = oracle(fields, wall)
    if expected is None:
        event("nothing within the window")
        with pytest.raises(DefinitionError, match="does not fire within"):
            trigger.next_after(last_ms, offset)
        return
    expected_ms = (expected.replace(tzinfo=zone) - EPOCH) // ONE_MS
    event("fires")
    assert trigger.next_after(last_ms, offset) == expected_ms
    assert expected_ms > last_ms
    assert not trigger.due(last_ms, expected_ms - 1, offset)
    assert trigger.due(last_ms, expected_ms, offset)


@pytest.mark.parametrize("offset", [0, 345, -720, 840])
@pytest.mark.parametrize(
    ("daily", "cron"),
    [
        (Daily(9, 0), Cron("0 9 * * *")),
        (Weekly(0, 9, 30), Cron("30 9 * * MON")),
        (Weekly(6, 23, 59), Cron("59 23 * * 7")),
    ],
)
def test_daily_and_weekly_agree_with_their_cron(daily: Trigger, cron: Cron, offset: int) -> None:
    last = at(2024, 3, 4, 10, 0, offset=offset)
    for step in range(20):
        slot = daily.next_after(last, offset)
        assert cron.next_after(last, offset) == slot
        last = slot + 1 if step % 2 else slot


# --- against croniter, an independent reference (tests only) -------------------------------


def _field(low: int, high: int, *, starred_steps: bool) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    # Distinct ends: croniter reads a one-value day-of-week range such as 0-0 as any day.
    ranges = st.lists(number, min_size=2, max_size=2, unique=True).map(sorted)
    shapes = [
        st.just("*"),
        number.map(str),
        ranges.map(lambda r: f"{r[0]}-{r[1]}"),
        st.lists(number, min_size=2, max_size=3, unique=True).map(lambda v: ",".join(map(str, v))),
        st.tuples(ranges, st.integers(1, 5)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}"),
    ]
    if starred_steps:  # a day field starting with "*" is no restriction here, but is in croniter
        shapes.append(st.integers(1, max(1, (high - low) // 2)).map(lambda k: f"*/{k}"))
    return st.one_of(*shapes)


CRON_EXPRESSIONS = st.tuples(
    _field(0, 59, starred_steps=True),
    _field(0, 23, starred_steps=True),
    _field(1, 28, starred_steps=False),  # days every month has: no search past the window
    _field(1, 12, starred_steps=True),
    _field(0, 6, starred_steps=False),
).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(
    expression=CRON_EXPRESSIONS,
    after=st.integers(at(2020, 1, 1), at(2035, 12, 31)),
)
def test_cron_next_after_agrees_with_croniter(expression: str, after: int) -> None:
    start = datetime.fromtimestamp(after / 1000, UTC)
    expected = croniter(expression, start).get_next(datetime)
    assert Cron(expression).next_after(after, 0) == int(expected.timestamp() * 1000), expression
