"""`Schedule`: plain data, checked up front, with the arithmetic of when it fires next."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_core import Daily, Every, Recipe, Trigger, Weekly
from agent_core.errors import DefinitionError, RecipeError
from scheduler import Schedule
from scheduler.schedules import format_offset, local_iso

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


@given(trigger=triggers, offset=offsets, made=times, mode=st.sampled_from(["run", "notify"]))
def test_a_schedule_survives_json_unchanged(
    trigger: Trigger, offset: int, made: int, mode: str
) -> None:
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


@given(trigger=triggers, offset=offsets, made=times, late=st.integers(0, 400 * DAY))
def test_after_firing_the_next_slot_lies_ahead(
    trigger: Trigger, offset: int, made: int, late: int
) -> None:
    schedule = make(trigger=trigger, utc_offset_minutes=offset, now_ms=made)
    slot = schedule.next_due_ms
    now = slot + late
    after = schedule.fired(slot, now)
    assert after.next_due_ms > now  # never due again at the same moment: fires once
    following = trigger.next_after(slot, offset)
    if following > now:  # on time (or late by less than a period): keeps its rhythm
        assert after.last_run_ms == slot
        assert after.next_due_ms == following
    else:  # everything was down: the missed slots collapse into this one
        assert after.last_run_ms == now


@given(trigger=triggers, offset=offsets, made=times, count=st.integers(1, 20))
def test_upcoming_slots_start_at_the_next_due_and_rise(
    trigger: Trigger, offset: int, made: int, count: int
) -> None:
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
