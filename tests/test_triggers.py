"""Triggers: plain examples, a minute-by-minute datetime oracle, refusals and JSON."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agent_core.errors import DefinitionError
from agent_core.triggers import (
    MAX_EVERY_MINUTES,
    Daily,
    Every,
    Trigger,
    TriggerAdapter,
    Weekly,
    trigger_from_json,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
ONE_MINUTE = timedelta(minutes=1)
DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
# Nepal, the far west and far east of the date line, India, and the widest allowed.
NOTABLE_OFFSETS = (0, 345, -720, 840, -840, 330, -210, 60)


def at(*wall: int, offset: int = 0, ms: int = 0) -> int:
    """Return the UTC ms of a local wall-clock time at `offset` minutes east of UTC."""
    zone = timezone(timedelta(minutes=offset))
    return (datetime(*wall, tzinfo=zone) - EPOCH) // ONE_MS + ms


# 2024-03-04 is a Monday.
MONDAY = (2024, 3, 4)


# --- plain examples -------------------------------------------------------------------


def test_daily_made_after_its_time_first_fires_tomorrow() -> None:
    assert Daily(9, 0).next_after(at(*MONDAY, 10, 0), 0) == at(2024, 3, 5, 9, 0)


def test_daily_made_before_its_time_fires_today() -> None:
    assert Daily(9, 0).next_after(at(*MONDAY, 8, 0), 0) == at(*MONDAY, 9, 0)


@pytest.mark.parametrize(
    ("last_ms", "expected"),
    [
        (at(*MONDAY, 9, 0), at(2024, 3, 5, 9, 0)),  # a slot exactly at last_run is not returned
        (at(*MONDAY, 8, 59, ms=59_999), at(*MONDAY, 9, 0)),
        (at(*MONDAY, 9, 0, ms=1), at(2024, 3, 5, 9, 0)),
        (at(*MONDAY, 9, 0, ms=59_999), at(2024, 3, 5, 9, 0)),
    ],
)
def test_daily_slot_is_strictly_after_last_run(last_ms: int, expected: int) -> None:
    assert Daily(9, 0).next_after(last_ms, 0) == expected


@pytest.mark.parametrize(
    ("offset", "last_local", "expected_utc"),
    [
        # Nepal, +05:45: tomorrow 09:00 local is 03:15 UTC.
        (345, (*MONDAY, 10, 0), datetime(2024, 3, 5, 3, 15, tzinfo=UTC)),
        (345, (*MONDAY, 8, 0), datetime(2024, 3, 4, 3, 15, tzinfo=UTC)),
        # -12:00: 09:00 local is 21:00 UTC the same day.
        (-720, (*MONDAY, 8, 0), datetime(2024, 3, 4, 21, 0, tzinfo=UTC)),
        (-720, (*MONDAY, 10, 0), datetime(2024, 3, 5, 21, 0, tzinfo=UTC)),
        # +14:00: 09:00 local is 19:00 UTC the day before.
        (840, (*MONDAY, 8, 0), datetime(2024, 3, 3, 19, 0, tzinfo=UTC)),
        (840, (*MONDAY, 10, 0), datetime(2024, 3, 4, 19, 0, tzinfo=UTC)),
    ],
)
def test_daily_with_offsets(
    offset: int, last_local: tuple[int, int, int, int, int], expected_utc: datetime
) -> None:
    last_ms = at(*last_local, offset=offset)
    assert Daily(9, 0).next_after(last_ms, offset) == (expected_utc - EPOCH) // ONE_MS


@pytest.mark.parametrize(
    ("last_local", "expected_local"),
    [
        ((2024, 3, 6, 12, 0), (2024, 3, 11, 9, 0)),  # Wednesday -> next Monday
        ((*MONDAY, 8, 0), (*MONDAY, 9, 0)),  # Monday morning -> the same day
        ((*MONDAY, 9, 0), (2024, 3, 11, 9, 0)),  # exactly at the slot -> a week on
        ((2024, 3, 10, 23, 59), (2024, 3, 11, 9, 0)),  # Sunday night
    ],
)
@pytest.mark.parametrize("offset", [0, 345, -720, 840])
def test_weekly_monday_nine(
    last_local: tuple[int, ...], expected_local: tuple[int, ...], offset: int
) -> None:
    last_ms = at(*last_local, offset=offset)
    assert Weekly(0, 9, 0).next_after(last_ms, offset) == at(*expected_local, offset=offset)


def test_weekly_sunday_late_crosses_into_monday_utc() -> None:
    # Monday 00:00 UTC is still Sunday noon at -12:00; Sunday 23:30 there is Monday 11:30 UTC.
    expected = at(2024, 3, 4, 11, 30)
    assert Weekly(6, 23, 30).next_after(at(*MONDAY, 0, 0), -720) == expected


@pytest.mark.parametrize("offset", [0, 345, -720, 840])
def test_every_adds_minutes_and_ignores_the_offset(offset: int) -> None:
    last_ms = at(*MONDAY, 10, 7, ms=12_345)
    assert Every(15).next_after(last_ms, offset) == last_ms + 15 * 60_000


def test_a_long_missed_slot_is_still_due() -> None:
    last_ms = at(2024, 1, 1, 10, 0)
    now_ms = at(2024, 6, 1, 12, 0)
    assert Daily(9, 0).due(last_ms, now_ms, 0)
    assert Weekly(3, 9, 0).due(last_ms, now_ms, 0)
    assert Every(60).due(last_ms, now_ms, 0)
    # The missed slot is still the next one: it fires once, not once per day missed.
    assert Daily(9, 0).next_after(last_ms, 0) == at(2024, 1, 2, 9, 0)


@pytest.mark.parametrize(
    "trigger", [Every(15), Daily(9, 0), Weekly(0, 9, 0)], ids=["every", "daily", "weekly"]
)
@pytest.mark.parametrize("offset", [0, 345, -720, 840])
def test_due_flips_exactly_at_the_slot(trigger: Trigger, offset: int) -> None:
    last_ms = at(*MONDAY, 10, 0, ms=500)
    slot = trigger.next_after(last_ms, offset)
    assert not trigger.due(last_ms, slot - 1, offset)
    assert trigger.due(last_ms, slot, offset)
    assert trigger.due(last_ms, slot + 1, offset)
    assert not trigger.due(last_ms, last_ms, offset)


def test_the_epoch_itself_works_with_a_negative_offset() -> None:
    # 1970-01-01 00:00 UTC is Wednesday 1969-12-31 12:00 at -12:00.
    assert Daily(13, 0).next_after(0, -720) == 60 * 60_000
    assert Weekly(2, 12, 1).next_after(0, -720) == 60_000


# --- construction and description -----------------------------------------------------


@pytest.mark.parametrize(
    ("by_position", "by_keyword"),
    [
        (Every(15), Every(minutes=15)),
        (Daily(9, 0), Daily(hour=9, minute=0)),
        (Daily(9), Daily(hour=9)),
        (Weekly(0, 9, 0), Weekly(day=0, hour=9, minute=0)),
    ],
)
def test_positional_and_keyword_construction_agree(
    by_position: Trigger, by_keyword: Trigger
) -> None:
    assert by_position == by_keyword


def test_triggers_are_frozen() -> None:
    trigger = Daily(9, 0)
    with pytest.raises(ValidationError):
        trigger.hour = 10  # type: ignore[misc]
    assert trigger.hour == 9


@pytest.mark.parametrize(
    ("trigger", "text"),
    [
        (Every(1), "every minute"),
        (Every(15), "every 15 minutes"),
        (Every(90), "every 90 minutes"),
        (Every(60), "every hour"),
        (Every(180), "every 3 hours"),
        (Every(1440), "every day"),
        (Every(2 * 1440), "every 2 days"),
        (Daily(9, 0), "daily at 09:00"),
        (Daily(23, 5), "daily at 23:05"),
        (Weekly(0, 9, 0), "weekly on Monday at 09:00"),
        (Weekly(6, 18, 30), "weekly on Sunday at 18:30"),
    ],
)
def test_describe(trigger: Trigger, text: str) -> None:
    assert trigger.describe() == text


@pytest.mark.parametrize(
    "build",
    [
        lambda: Daily(24, 0),
        lambda: Daily(25, 0),
        lambda: Daily(-1, 0),
        lambda: Daily(9, 60),
        lambda: Daily(9, -1),
        lambda: Daily(2.5, 0),
        lambda: Daily("9", 0),
        lambda: Daily(True, 0),
        lambda: Daily(9, False),
        lambda: Daily(None, 0),
        lambda: Daily(9.0, 0),
        Daily,
        lambda: Daily(9, minutes=30),
        lambda: Daily(9, 0, kind="weekly"),
        lambda: Every(0),
        lambda: Every(-5),
        lambda: Every(MAX_EVERY_MINUTES + 1),
        lambda: Every(1.5),
        lambda: Every("15"),
        lambda: Every(True),
        Every,
        lambda: Weekly(7, 9, 0),
        lambda: Weekly(-1, 9, 0),
        lambda: Weekly(0, 24, 0),
        lambda: Weekly(0, 9, 60),
        lambda: Weekly(0.0, 9, 0),
        lambda: Weekly("0", 9, 0),
        lambda: Weekly(True, 9, 0),
        lambda: Weekly(hour=9, minute=0),
    ],
)
def test_impossible_triggers_are_refused(build: Callable[[], Any]) -> None:
    with pytest.raises(DefinitionError):
        build()


def test_the_largest_every_is_allowed() -> None:
    assert Every(MAX_EVERY_MINUTES).next_after(0, 0) == MAX_EVERY_MINUTES * 60_000


ALL_KINDS = pytest.mark.parametrize(
    "trigger", [Every(15), Daily(9, 0), Weekly(0, 9, 0)], ids=["every", "daily", "weekly"]
)


@ALL_KINDS
@pytest.mark.parametrize(
    ("last_ms", "offset"),
    [
        (0, 841),
        (0, -841),
        (0, 2.5),
        (0, True),
        (0, "60"),
        (0, None),
        (-1, 0),
        (1.5, 0),
        (True, 0),
        ("0", 0),
        (None, 0),
    ],
)
def test_bad_last_run_or_offset_is_refused(trigger: Trigger, last_ms: Any, offset: Any) -> None:
    with pytest.raises(DefinitionError):
        trigger.next_after(last_ms, offset)
    with pytest.raises(DefinitionError):
        trigger.due(last_ms, 10**12, offset)


@ALL_KINDS
@pytest.mark.parametrize("now_ms", [-1, 1.0, False, "1", None])
def test_bad_now_is_refused(trigger: Trigger, now_ms: Any) -> None:
    with pytest.raises(DefinitionError):
        trigger.due(0, now_ms, 0)


@pytest.mark.parametrize("offset", [-840, 840])
def test_the_widest_offsets_are_allowed(offset: int) -> None:
    assert Daily(0, 0).next_after(0, offset) % 60_000 == 0


# --- JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trigger", [Every(15), Daily(9, 30), Weekly(6, 23, 59)], ids=["every", "daily", "weekly"]
)
def test_json_round_trip_through_the_union(trigger: Trigger) -> None:
    text = trigger.model_dump_json()
    assert f'"kind":"{trigger.kind}"' in text
    loaded = trigger_from_json(text)
    assert loaded == trigger
    assert type(loaded) is type(trigger)
    assert TriggerAdapter.validate_json(TriggerAdapter.dump_json(trigger)) == trigger


class Holder(BaseModel):
    """A stand-in for the scheduler's record, which embeds a trigger."""

    name: str
    trigger: Trigger


def test_a_trigger_embedded_in_a_model_loads_back_by_kind() -> None:
    holder = Holder(name="report", trigger=Weekly(2, 7, 45))
    loaded = Holder.model_validate_json(holder.model_dump_json())
    assert loaded == holder
    assert isinstance(loaded.trigger, Weekly)


BAD_STORED = [
    '{"kind":"daily","hour":25,"minute":0}',
    '{"kind":"daily","hour":24,"minute":0}',
    '{"kind":"daily","hour":9,"minute":60}',
    '{"kind":"daily","hour":9.5,"minute":0}',
    '{"kind":"daily","hour":9.0,"minute":0}',
    '{"kind":"daily","hour":"9","minute":0}',
    '{"kind":"daily","hour":true,"minute":0}',
    '{"kind":"daily","hour":null,"minute":0}',
    '{"kind":"daily","minute":0}',
    '{"kind":"daily","hour":9,"minutes":30}',
    '{"kind":"weekly","day":7,"hour":9,"minute":0}',
    '{"kind":"weekly","hour":9,"minute":0}',
    '{"kind":"every","minutes":0}',
    '{"kind":"every","minutes":-15}',
    '{"kind":"every"}',
    '{"kind":"monthly","day":1}',
    '{"hour":9,"minute":0}',
    "[9, 0]",
    '"daily"',
    "not json",
    "",
]


@pytest.mark.parametrize("text", BAD_STORED)
def test_bad_stored_triggers_are_refused(text: str) -> None:
    with pytest.raises(DefinitionError):
        trigger_from_json(text)
    with pytest.raises(ValidationError):
        TriggerAdapter.validate_json(text)


@pytest.mark.parametrize("text", BAD_STORED[:16])
def test_bad_embedded_triggers_are_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        Holder.model_validate_json(f'{{"name":"x","trigger":{text}}}')


triggers = st.one_of(
    st.builds(Every, st.integers(1, MAX_EVERY_MINUTES)),
    st.builds(Daily, st.integers(0, 23), st.integers(0, 59)),
    st.builds(Weekly, st.integers(0, 6), st.integers(0, 23), st.integers(0, 59)),
)


@given(triggers)
def test_any_trigger_survives_a_json_round_trip(trigger: Trigger) -> None:
    assert trigger_from_json(trigger.model_dump_json()) == trigger


# --- the oracle -----------------------------------------------------------------------


def oracle(trigger: Trigger, last_ms: int, offset: int) -> int:
    """Walk local minutes from last_run with datetime until one matches, strictly after it."""
    last = EPOCH + last_ms * ONE_MS
    if isinstance(trigger, Every):
        return (last + trigger.minutes * ONE_MINUTE - EPOCH) // ONE_MS
    # Naive local wall-clock times: the offset is fixed, so comparing them is
    # comparing instants, and naive arithmetic keeps the walk fast.
    last_local = last.astimezone(timezone(timedelta(minutes=offset))).replace(tzinfo=None)
    local = last_local.replace(second=0, microsecond=0)
    day = trigger.day if isinstance(trigger, Weekly) else None
    while (
        local.minute != trigger.minute
        or local.hour != trigger.hour
        or local <= last_local
        or (day is not None and local.weekday() != day)
    ):
        local += ONE_MINUTE
    return (local.replace(tzinfo=timezone(timedelta(minutes=offset))) - EPOCH) // ONE_MS


YEAR_2100_MS = at(2100, 1, 1)


def random_trigger(rng: random.Random) -> Trigger:
    kind = rng.choice(["every", "daily", "daily", "weekly"])
    if kind == "every":
        return Every(rng.choice([1, 15, 60, 1440, rng.randint(1, MAX_EVERY_MINUTES)]))
    hour, minute = rng.randint(0, 23), rng.choice([0, 30, 59, rng.randint(0, 59)])
    return Daily(hour, minute) if kind == "daily" else Weekly(rng.randint(0, 6), hour, minute)


def random_last_run(rng: random.Random, trigger: Trigger, offset: int) -> int:
    shape = rng.randrange(4)
    if shape == 0:  # anywhere, usually mid-minute
        return rng.randint(0, YEAR_2100_MS)
    if shape == 1:  # on a minute boundary
        return rng.randint(0, YEAR_2100_MS // 60_000) * 60_000
    if shape == 2:  # the first days of the epoch, where local time may be in 1969
        return rng.randint(0, 8 * DAY_MS)
    # At or next to a real slot: the boundary "strictly after" is about.
    slot = oracle(trigger, rng.randint(0, YEAR_2100_MS), offset)
    return slot + rng.choice([-60_000, -1, 0, 0, 1, 59_999, 60_000])


def random_offset(rng: random.Random) -> int:
    return rng.choice([*NOTABLE_OFFSETS, rng.randint(-840, 840), rng.randint(-56, 56) * 15])


@pytest.mark.parametrize("seed", range(4))
def test_next_after_and_due_agree_with_a_minute_by_minute_walk(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(1_000):
        trigger, offset = random_trigger(rng), random_offset(rng)
        last_ms = random_last_run(rng, trigger, offset)
        expected = oracle(trigger, last_ms, offset)
        case = f"{trigger!r} last={last_ms} offset={offset}"
        assert trigger.next_after(last_ms, offset) == expected, case
        assert expected > last_ms, case
        for now_ms in (
            expected - 1,
            expected,
            expected + 1,
            rng.randint(last_ms, expected),
            expected + rng.randint(0, 400 * DAY_MS),  # long missed
            rng.randint(0, last_ms),  # a clock behind last_run
        ):
            assert trigger.due(last_ms, now_ms, offset) is (now_ms >= expected), case


@pytest.mark.parametrize("offset", NOTABLE_OFFSETS)
def test_a_slot_served_now_returns_the_same_slot_a_period_later(offset: int) -> None:
    rng = random.Random(offset)
    for _ in range(50):
        trigger = random_trigger(rng)
        slot = trigger.next_after(rng.randint(0, YEAR_2100_MS), offset)
        period = {"every": trigger.next_after(0, 0), "daily": DAY_MS, "weekly": WEEK_MS}
        assert trigger.next_after(slot, offset) == slot + period[trigger.kind]
