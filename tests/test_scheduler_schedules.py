"""`Schedule`: plain data, checked up front, with the arithmetic of when it fires next."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_core import Cron, Daily, Every, Recipe, Trigger, Weekly
from agent_core.errors import DefinitionError, RecipeError
from scheduler import Schedule
from scheduler.calendar import next_fire
from scheduler.schedules import (
    MAX_STORED_CHARS,
    MAX_TASK_CHARS,
    MAX_TEMPLATE_CHARS,
    MAX_VALUE_CHARS,
    _filled_chars,
    format_offset,
    local_iso,
)
from workers.client import start

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC

RECIPE = (
    Recipe("spend", "Total the spend for {month}; flag items over {limit}.")
    .param("month", "which month")
    .param("limit", "the amount that needs a flag")
    .only_tools(["read_note", "pay"])
)
VALUES = {"month": "last month", "limit": "50,000"}


def make(**changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "name": "monthly-spend",
        "recipe": RECIPE,
        "values": VALUES,
        "trigger": Daily(9, 0),
        "utc_offset_minutes": 0,
        "now_ms": T0,
    }
    fields.update(changes)
    return Schedule.create(**fields)


triggers = st.one_of(
    st.builds(Every, st.integers(1, 3 * 24 * 60)),
    st.builds(Daily, st.integers(0, 23), st.integers(0, 59)),
    st.builds(Weekly, st.integers(0, 6), st.integers(0, 23), st.integers(0, 59)),
)
offsets = st.integers(-840, 840)
times = st.integers(0, 4_102_444_800_000)  # up to 2100
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "UTC"]
CRONS = ["*/15 * * * *", "0 9 * * 1-5", "30 2 * * *", "0 0 1 * *", "0 12 29 2 *"]
# (trigger, offset): a trigger in a zone takes no offset; one without keeps any offset.
timings = st.one_of(
    st.tuples(st.one_of(triggers, st.builds(Cron, st.sampled_from(CRONS))), offsets),
    st.tuples(
        st.one_of(
            st.builds(Daily, st.integers(0, 23), st.integers(0, 59), tz=st.sampled_from(ZONES)),
            st.builds(
                Weekly,
                st.integers(0, 6),
                st.integers(0, 23),
                st.integers(0, 59),
                tz=st.sampled_from(ZONES),
            ),
            st.builds(Cron, st.sampled_from(CRONS), tz=st.sampled_from(ZONES)),
        ),
        st.just(0),
    ),
)


def test_a_new_schedule_starts_from_when_it_was_made() -> None:
    schedule = make()
    assert schedule.created_ms == schedule.last_run_ms == T0
    assert schedule.tools == ("read_note", "pay")
    assert schedule.mode == "run"
    assert schedule.task() == "Total the spend for last month; flag items over 50,000."


def test_a_daily_nine_oclock_made_at_ten_first_fires_tomorrow() -> None:
    ten = 1_700_042_400_000  # 2023-11-15 10:00 UTC
    schedule = make(now_ms=ten)
    assert local_iso(schedule.next_due_ms, 0) == "2023-11-16T09:00:00+00:00"


@given(timing=timings, made=times, mode=st.sampled_from(["run", "notify"]))
def test_a_schedule_survives_json_unchanged(
    timing: tuple[Trigger, int], made: int, mode: str
) -> None:
    trigger, offset = timing
    schedule = make(trigger=trigger, utc_offset_minutes=offset, now_ms=made, mode=mode)
    text = schedule.model_dump_json()
    assert json.loads(text)["next_due_ms"] == schedule.next_due_ms
    assert Schedule.model_validate_json(text) == schedule


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**VALUES, "year": "2024"}, "no blank named 'year'"),
        ({"month": "last month"}, "needs a value for 'limit'"),
        ({"month": "May", "limit": 5}, "needs text for 'limit'"),
        ([("month", "May")], "mapping"),
    ],
)
def test_values_are_checked_against_the_recipe_up_front(values: Any, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        make(values=values)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "has space"}, "schedule name may hold only"),
        ({"name": "a:b"}, "schedule name may hold only"),
        ({"name": ""}, "schedule name must be 1 to 64"),
        ({"name": "x" * 65}, "schedule name must be 1 to 64"),
        ({"utc_offset_minutes": 841}, "utc_offset_minutes must be from -840 to 840"),
        ({"utc_offset_minutes": -900}, "utc_offset_minutes must be from -840 to 840"),
        ({"utc_offset_minutes": 1.5}, "utc_offset_minutes must be a whole number"),
        ({"mode": "loud"}, "mode is 'run' or 'notify'"),
        ({"trigger": "daily"}, "needs a trigger"),
        ({"recipe": "Do {x}"}, "needs an agent_core.Recipe"),
        ({"now_ms": -1}, "last_run_ms"),
    ],
)
def test_an_impossible_schedule_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        make(**changes)


@pytest.mark.parametrize(
    "build",
    [lambda: Daily(25, 0), lambda: Daily(9, 60), lambda: Weekly(7, 9, 0), lambda: Every(0)],
)
def test_an_impossible_trigger_is_refused_when_it_is_built(build: Any) -> None:
    with pytest.raises(DefinitionError):
        build()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.update(values={"month": "May"}),
        lambda d: d.update(tools=["read_note", "write_note"]),
        lambda d: d.update(trigger={"kind": "daily", "hour": 25, "minute": 0}),
        lambda d: d.update(utc_offset_minutes=900),
        lambda d: d.update(trigger={"kind": "daily", "hour": 9, "minute": 0, "tz": "Mars/Base"}),
        lambda d: d.update(trigger={"kind": "cron", "expression": "0 25 * * *"}),
        lambda d: d.update(name="no spaces allowed"),
        lambda d: d.update(mode="loud"),
        lambda d: d.update(extra="field"),
    ],
)
def test_stored_text_that_breaks_the_rules_does_not_load(tamper: Any) -> None:
    data = json.loads(make().model_dump_json())
    tamper(data)
    with pytest.raises(ValidationError):
        Schedule.model_validate_json(json.dumps(data))


def test_a_schedule_may_use_fewer_tools_than_its_recipe_allows() -> None:
    data = json.loads(make().model_dump_json())
    data["tools"] = ["read_note"]
    assert Schedule.model_validate_json(json.dumps(data)).tools == ("read_note",)


@given(timing=timings, made=times, late=st.integers(0, 400 * DAY))
def test_after_firing_the_next_slot_lies_ahead(
    timing: tuple[Trigger, int], made: int, late: int
) -> None:
    trigger, offset = timing
    schedule = make(trigger=trigger, utc_offset_minutes=offset, now_ms=made)
    slot = schedule.next_due_ms
    assert slot == next_fire(trigger, made, utc_offset_minutes=offset)
    now = slot + late
    after = schedule.fired(slot, now)
    assert after.next_due_ms > now  # never due again at the same moment: fires once
    following = next_fire(trigger, slot, utc_offset_minutes=offset)
    if following > now:  # on time (or late by less than a period): keeps its rhythm
        assert after.last_run_ms == slot
        assert after.next_due_ms == following
    else:  # everything was down: the missed slots collapse into this one
        assert after.last_run_ms == now


@given(timing=timings, made=times, count=st.integers(1, 20))
def test_upcoming_slots_start_at_the_next_due_and_rise(
    timing: tuple[Trigger, int], made: int, count: int
) -> None:
    trigger, offset = timing
    schedule = make(trigger=trigger, utc_offset_minutes=offset, now_ms=made)
    slots = schedule.upcoming(count)
    assert len(slots) == count
    assert slots[0] == schedule.next_due_ms
    assert all(a < b for a, b in pairwise(slots))


def test_upcoming_daily_slots_are_a_day_apart_in_local_time() -> None:
    schedule = make(trigger=Daily(9, 0), utc_offset_minutes=345)
    shown = [local_iso(slot, 345) for slot in schedule.upcoming(3)]
    assert shown == [
        "2023-11-15T09:00:00+05:45",
        "2023-11-16T09:00:00+05:45",
        "2023-11-17T09:00:00+05:45",
    ]


@pytest.mark.parametrize("count", [0, -1, 1001, True, 2.0])
def test_a_preview_of_a_silly_length_is_refused(count: Any) -> None:
    with pytest.raises(DefinitionError, match="a preview shows 1 to 1000"):
        make().upcoming(count)


@pytest.mark.parametrize(
    ("minutes", "text"), [(0, "+00:00"), (345, "+05:45"), (-420, "-07:00"), (-30, "-00:30")]
)
def test_offsets_read_as_people_write_them(minutes: int, text: str) -> None:
    assert format_offset(minutes) == text
    assert local_iso(0, minutes).endswith(text)


def test_describe_names_the_trigger_and_its_offset() -> None:
    assert make(utc_offset_minutes=-420).describe() == "daily at 09:00 (UTC-07:00)"
    assert make(trigger=Every(90)).describe() == "every 90 minutes"


def test_describe_names_the_zone_instead_of_an_offset() -> None:
    assert make(trigger=Daily(2, 30, tz="Europe/Berlin")).describe() == (
        "daily at 02:30 (Europe/Berlin)"
    )
    cron = make(trigger=Cron("0 9 * * 1-5"), utc_offset_minutes=345)
    assert cron.describe() == "cron '0 9 * * 1-5' (UTC+05:45)"
    assert cron.time_zone == "UTC+05:45"
    assert make(trigger=Cron("@daily", tz="Asia/Tokyo")).time_zone == "Asia/Tokyo"


# --- time zones: Europe/Berlin springs forward on 2027-03-28 and falls back on 2027-10-31,
# each time at 01:00 UTC.


def utc(month: int, day: int, hour: int, minute: int = 0) -> int:
    return int(datetime(2027, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


def test_a_zoned_daily_keeps_its_wall_clock_time_across_spring_forward() -> None:
    schedule = make(trigger=Daily(2, 30, tz="Europe/Berlin"), now_ms=utc(3, 27, 12))
    slots = schedule.upcoming(3)
    # 02:30 does not exist on the 28th: it fires once, at the jump (03:00 CEST).
    assert slots == [utc(3, 28, 1), utc(3, 29, 0, 30), utc(3, 30, 0, 30)]
    assert [schedule.local_time(slot) for slot in slots] == [
        "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:30:00+02:00",
        "2027-03-30T02:30:00+02:00",
    ]


def test_a_zoned_daily_fires_once_on_the_day_the_clock_falls_back() -> None:
    schedule = make(trigger=Daily(2, 30, tz="Europe/Berlin"), now_ms=utc(10, 30, 12))
    first = schedule.next_due_ms
    assert first == utc(10, 31, 0, 30)  # 02:30 CEST, its first occurrence
    # Fired on time, the repeat of 02:30 (01:30 UTC, CET) is not a slot: the next is a day on.
    after = schedule.fired(first, first + 1)
    assert after.next_due_ms == utc(11, 1, 1, 30)
    assert after.local_time(after.next_due_ms) == "2027-11-01T02:30:00+01:00"


def test_a_fixed_offset_keeps_its_offset_across_the_same_days() -> None:
    # No zone: +01:00 all year, as before zones existed.
    schedule = make(trigger=Daily(2, 30), utc_offset_minutes=60, now_ms=utc(3, 27, 12))
    assert schedule.upcoming(2) == [utc(3, 28, 1, 30), utc(3, 29, 1, 30)]
    assert schedule.local_time(utc(3, 29, 1, 30)) == "2027-03-29T02:30:00+01:00"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trigger": Daily(9, 0, tz="Mars/Base")}, "unknown time zone 'Mars/Base'"),
        ({"trigger": Cron("0 9 * * *", tz="America")}, "unknown time zone 'America'"),
        (
            {"trigger": Weekly(0, 9, 0, tz="Europe/Berlin"), "utc_offset_minutes": 60},
            "takes no utc_offset_minutes",
        ),
    ],
)
def test_a_zone_that_cannot_be_used_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DefinitionError, match=f"schedule 'monthly-spend': .*{message}"):
        make(**changes)


def test_local_iso_in_a_zone_uses_the_offset_of_that_moment() -> None:
    assert local_iso(utc(1, 15, 12), 0, "Europe/Berlin") == "2027-01-15T13:00:00+01:00"
    assert local_iso(utc(7, 15, 12), 0, "Europe/Berlin") == "2027-07-15T14:00:00+02:00"


def test_a_schedule_stored_before_zones_existed_loads_and_fires_as_before() -> None:
    # Text as a Relay without zones wrote it: a fixed offset and no `tz` on the trigger.
    stored = json.dumps({
        "name": "old", "recipe": {"name": "r", "template": "Do it.", "params": [],
        "tool_names": None}, "values": {}, "trigger": {"kind": "daily", "hour": 9, "minute": 0},
        "utc_offset_minutes": -420, "tools": None, "mode": "run", "budget": None,
        "created_ms": T0, "last_run_ms": T0, "next_due_ms": 0,
    })  # fmt: skip
    schedule = Schedule.model_validate_json(stored)
    assert schedule.tz is None
    assert schedule.describe() == "daily at 09:00 (UTC-07:00)"
    assert schedule.next_due_ms == Daily(9, 0).next_after(T0, -420)
    assert schedule.local_time(schedule.next_due_ms) == "2023-11-15T09:00:00-07:00"
    assert "tz" not in json.loads(schedule.model_dump_json())["trigger"]


# --- what a schedule may hold: bounded when it is made ---------------------------------------


def blank(name: str = "x") -> Recipe:
    return Recipe("r", f"Do {{{name}}}.").param(name)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (  # the 10 MB template
            {"recipe": Recipe("r", "x" * 10 * 2**20), "values": {}},
            "its template is 10,485,760 characters; a template is at most 50,000",
        ),
        (
            {"recipe": Recipe("r", "x" * (MAX_TEMPLATE_CHARS + 1)), "values": {}},
            "a template is at most 50,000",
        ),
        (
            {"recipe": blank("team"), "values": {"team": "v" * (MAX_VALUE_CHARS + 1)}},
            "the value of 'team' is 10,001 characters; a value is at most 10,000",
        ),
        (  # each part within its bound, the task they fill not: one blank used 20 times
            {"recipe": Recipe("r", "{v}" * 20).param("v"), "values": {"v": "v" * 10_000}},
            "filled with its values is 200,000 characters; a run's task is at most 100,000",
        ),
        (  # the help of many params, and values none of them fills in the task
            {
                "recipe": Recipe("r", "t")
                .param("a", "h" * 100_000)
                .param("b", "h" * 100_000)
                .param("c", "h" * 50_000),
                "values": {"a": "v" * 10_000, "b": "v" * 10_000, "c": ""},
            },
            "as stored (its recipe's params and help, and its values); a schedule is at most"
            " 250,000",
        ),
    ],
)
def test_a_schedule_too_big_is_refused_naming_the_bound(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(DefinitionError, match=re.escape(message)):
        make(**changes)


@pytest.mark.timeout(20)
def test_a_task_filled_huge_is_refused_before_it_is_built() -> None:
    """A 50,000-character template of one blank used 16,666 times, each 10,000 characters,
    would fill 166 MB: it is counted, not built."""
    recipe = Recipe("r", "{v}" * (MAX_TEMPLATE_CHARS // 3)).param("v")
    started = time.monotonic()
    with pytest.raises(DefinitionError, match="a run's task is at most 100,000"):
        make(recipe=recipe, values={"v": "v" * MAX_VALUE_CHARS})
    assert time.monotonic() - started < 5  # building it takes longer, and 166 MB


def test_a_schedule_at_its_bounds_is_made() -> None:
    template = "{a}{b}" + "t" * (MAX_TEMPLATE_CHARS - 6)
    values = {"a": "a" * MAX_VALUE_CHARS, "b": "b" * MAX_VALUE_CHARS}
    made = make(recipe=Recipe("r", template).param("a").param("b"), values=values)
    assert len(made.task()) == MAX_TEMPLATE_CHARS - 6 + 2 * MAX_VALUE_CHARS
    exact = Recipe("r", "{v}" * 10).param("v")
    assert len(make(recipe=exact, values={"v": "v" * 10_000}).task()) == MAX_TASK_CHARS


def test_a_schedules_task_bound_is_what_a_run_takes() -> None:
    assert MAX_TASK_CHARS == start.MAX_TASK_CHARS
    assert MAX_TEMPLATE_CHARS < MAX_TASK_CHARS < MAX_STORED_CHARS


@given(
    st.lists(
        st.one_of(
            st.sampled_from(["{a}", "{bb}", "{{", "}}", "{a}{a}"]),
            st.text(alphabet="xyz é\n", max_size=5),
        ),
        max_size=12,
    ),
    st.text(max_size=6),
    st.text(max_size=6),
)
def test_the_filled_size_is_counted_as_fill_fills(
    pieces: list[str], a_value: str, bb_value: str
) -> None:
    template = "".join(pieces)
    recipe = Recipe("r", template).param("a").param("bb")
    values = {"a": a_value, "bb": bb_value}
    assert _filled_chars(template, values) == len(recipe.fill(values))
