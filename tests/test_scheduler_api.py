"""The schedule API of a real Relay (`tests.apps.notes`) on a private Redis; runs are started
by `relay.tick(now)` with an injected clock (no worker is needed to see them recorded)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_core import Cron, Daily, Every, Recipe, Weekly
from agent_core.errors import DefinitionError, RecipeError
from scheduler.store import fire_id
from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import Budget, Relay, Settings, StoreUnavailable
from workers.cli import cli
from workers.settings import now_ms

MINUTE = 60_000
DAY = 24 * 60 * MINUTE

RECIPE = (
    Recipe("look", "Read {note} and say what it holds.")
    .param("note", "the note's file name")
    .only_tools(["read_note"])
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as running:
        yield running


@pytest.fixture
def relay(server: RedisServer) -> Relay:
    return build(Settings.from_env({"RELAY_REDIS_URL": server.url, "RELAY_PREFIX": "api"}))


def test_schedule_stores_a_schedule_listed_with_its_next_due_time(relay: Relay) -> None:
    made_at = now_ms()
    made = relay.schedule("look-daily", RECIPE, {"note": "a.txt"}, Daily(9, 0), 345)
    assert made.tools == ("read_note",)
    assert made_at <= made.created_ms == made.last_run_ms <= now_ms()
    [listed] = relay.schedules()
    assert listed == made
    assert listed.next_due_ms == Daily(9, 0).next_after(made.created_ms, 345)
    assert listed.next_due_ms > made.created_ms


def test_the_same_name_replaces_the_schedule_and_keeps_its_notes(relay: Relay) -> None:
    relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5), now_ms=1_000)
    relay.store.redis.rpush(relay.store.keys.schedule_notes("look"), "an earlier note")
    replaced = relay.schedule("look", RECIPE, {"note": "b.txt"}, Weekly(4, 8, 30), now_ms=2_000)
    assert relay.schedules() == [replaced]
    assert replaced.task() == "Read b.txt and say what it holds."
    assert replaced.created_ms == 2_000
    assert relay.schedule_notes("look") == ["an earlier note"]


def test_unschedule_removes_it_and_its_notes(relay: Relay) -> None:
    relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5))
    relay.store.redis.rpush(relay.store.keys.schedule_notes("look"), "a note")
    assert relay.unschedule("look") is True
    assert relay.schedules() == []
    assert relay.schedule_notes("look") == []
    assert relay.unschedule("look") is False


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"note": "a.txt", "folder": "x"}, RecipeError, "no blank named 'folder'"),
        ({}, RecipeError, "needs a value for 'note'"),
    ],
)
def test_bad_values_are_refused_and_nothing_is_stored(
    relay: Relay, values: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        relay.schedule("look", RECIPE, values, Every(5))
    assert relay.schedules() == []


def test_a_trigger_with_hour_25_is_refused_before_anything_is_scheduled(relay: Relay) -> None:
    with pytest.raises(DefinitionError, match="Daily hour must be from 0 to 23, got 25"):
        relay.schedule("look", RECIPE, {"note": "a.txt"}, Daily(hour=25, minute=0))
    assert relay.schedules() == []


@pytest.mark.parametrize("offset", [841, -841, 24 * 60])
def test_an_impossible_offset_is_refused(relay: Relay, offset: int) -> None:
    with pytest.raises(DefinitionError, match="utc_offset_minutes must be from -840 to 840"):
        relay.schedule("look", RECIPE, {"note": "a.txt"}, Daily(9), offset)
    assert relay.schedules() == []


def test_a_recipe_with_a_tool_that_is_not_registered_is_refused(relay: Relay) -> None:
    recipe = RECIPE.only_tools(["read_note", "launch_rockets"])
    with pytest.raises(DefinitionError, match="launch_rockets"):
        relay.schedule("look", recipe, {"note": "a.txt"}, Every(5))
    assert relay.schedules() == []


def test_an_oversize_template_or_value_is_refused_naming_the_bound_and_nothing_changes(
    relay: Relay,
) -> None:
    """Made or replaced: a 10 MB template (every firing of which would fail) and a value
    over its bound are refused, and a schedule being replaced stays as it was."""
    kept = relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5), now_ms=1_000)
    huge = Recipe("look", "Read {note}. " + "x" * 10 * 2**20).param("note")
    for name in ("look", "other"):
        with pytest.raises(DefinitionError, match="a template is at most 50,000"):
            relay.schedule(name, huge, {"note": "a.txt"}, Every(5))
        with pytest.raises(DefinitionError, match="the value of 'note' is 10,001 characters"):
            relay.schedule(name, RECIPE, {"note": "n" * 10_001}, Every(5))
    assert relay.schedules() == [kept]


def test_a_tick_starts_the_run_with_the_filled_task_and_the_schedule_names(relay: Relay) -> None:
    relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5), now_ms=1_000_000)
    assert relay.tick(1_000_000 + 5 * MINUTE - 1) == []
    [run_id] = relay.tick(1_000_000 + 5 * MINUTE)
    status = relay.status(run_id)
    assert status.task == "Read a.txt and say what it holds."
    assert (status.schedule, status.recipe) == ("look", "look")
    record = relay.store.read(run_id)
    assert record is not None
    assert record[0].tools == ("read_note",)
    assert relay.tick(1_000_000 + 5 * MINUTE + 10) == []


def test_a_schedule_removed_while_due_starts_nothing(relay: Relay) -> None:
    relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5), now_ms=1_000_000)
    relay.unschedule("look")
    assert relay.tick(1_000_000 + DAY) == []
    assert relay.runs() == []


def test_a_notify_only_schedule_records_a_notification_and_starts_no_run(relay: Relay) -> None:
    relay.schedule("remind", RECIPE, {"note": "a.txt"}, Every(5), mode="notify", now_ms=0)
    assert relay.tick(5 * MINUTE) == []
    assert relay.tick(5 * MINUTE + 1) == []
    assert relay.runs() == []
    [notice] = relay.notifications()
    assert notice.schedule == "remind"
    assert notice.task == "Read a.txt and say what it holds."
    assert notice.slot_ms == 5 * MINUTE


def test_the_tick_still_heals(relay: Relay) -> None:
    # A run whose wake-up message was never dealt with is re-sent by the tick.
    run_id = relay.start("Just a task")
    due = relay.store.redis.zscore(relay.store.keys.index(run_id).outbox, f"a|{run_id}")
    assert due is not None
    relay.tick(int(due) + 1)
    assert relay.store.redis.zscore(relay.store.keys.index(run_id).outbox, f"a|{run_id}") > due


def test_an_unreachable_redis_is_reported_as_store_unavailable(
    relay: Relay, server: RedisServer
) -> None:
    server.stop()
    with pytest.raises(StoreUnavailable, match="unreachable"):
        relay.schedules()
    with pytest.raises(StoreUnavailable):
        relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5))


def test_a_scheduled_runs_budget_is_kept_and_given_to_each_run(relay: Relay) -> None:
    budget = Budget(usd=0.25, model_calls=8, seconds=600)
    made = relay.schedule("look", RECIPE, {"note": "a.txt"}, Every(5), budget=budget, now_ms=0)
    assert made.budget == {"usd": 0.25, "model_calls": 8, "seconds": 600}
    [run_id] = relay.tick(5 * MINUTE)
    status = relay.status(run_id)
    assert status.budget == budget
    assert relay.store.upkeep.deadlines_due(10**15) == [run_id]


def test_schedule_add_takes_a_budget_on_the_command_line(relay: Relay, server: RedisServer) -> None:
    env = {"RELAY_REDIS_URL": server.url, "RELAY_PREFIX": "api"}
    args = ["schedule", "add", "cli-look", "--template", "Read {note}.", "-v", "note=a.txt"]
    args += ["--every", "5", "--budget-usd", "0.1", "--budget-tokens", "5000"]
    result = CliRunner(env=env).invoke(cli, args)
    assert result.exit_code == 0, result.output
    [made] = relay.schedules()
    assert made.budget == {"tokens": 5000, "usd": 0.1}


# --- time zones and cron, fired by ticks with an injected clock ---------------------------


def utc(month: int, day: int, hour: int, minute: int = 0) -> int:
    """Return the ms of a UTC time in 2027 (Europe/Berlin springs forward on 28 March and
    falls back on 31 October, each at 01:00 UTC)."""
    return int(datetime(2027, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


def tick_through(relay: Relay, nows: Iterable[int]) -> dict[int, list[str]]:
    """Tick at each time, and again 30 s later; return the ticks that started runs."""
    fired = {}
    for now in nows:
        for at in (now, now + MINUTE // 2):
            started = relay.tick(at)
            if started:
                fired[at] = started
    return fired


def every(start: int, end: int, step: int) -> range:
    return range(start, end + 1, step)


@pytest.mark.parametrize(
    ("made", "slots"),
    [
        # Spring forward: 02:30 never comes on the 28th; it fires at the jump, 03:00 CEST.
        (utc(3, 27, 12), [utc(3, 28, 1), utc(3, 29, 0, 30)]),
        # Fall back: 02:30 comes twice on the 31st (00:30 and 01:30 UTC); it fires at the first.
        (utc(10, 30, 12), [utc(10, 31, 0, 30), utc(11, 1, 1, 30)]),
    ],
)
def test_a_berlin_daily_fires_once_a_day_across_the_clock_changes(
    relay: Relay, made: int, slots: list[int]
) -> None:
    relay.schedule(
        "digest",
        RECIPE,
        {"note": "a.txt"},
        Daily(2, 30, tz="Europe/Berlin"),
        now_ms=made,
        overlap="allow_all",  # no worker here: every run stays running
    )
    fired = tick_through(relay, every(made, made + 2 * DAY, 15 * MINUTE))
    assert fired == {slot: [fire_id("digest", slot)] for slot in slots}
    assert {relay.status(run_id).schedule for [run_id] in fired.values()} == {"digest"}


def test_a_cron_schedule_fires_on_its_matching_minutes_only_once_each(relay: Relay) -> None:
    # Weekdays at 09:00, 09:20 and 09:40 Berlin time: CET (UTC+1) on Friday the 26th,
    # CEST (UTC+2) on Monday the 29th; nothing on the weekend between.
    trigger = Cron("*/20 9 * * 1-5", tz="Europe/Berlin")
    made = utc(3, 26, 7)  # no worker here: every run stays running, so allow them all
    relay.schedule("standup", RECIPE, {"note": "a.txt"}, trigger, now_ms=made, overlap="allow_all")
    nows = [
        *every(utc(3, 26, 7, 50), utc(3, 26, 8, 50), MINUTE),
        *every(utc(3, 26, 9), utc(3, 29, 6), 60 * MINUTE),
        *every(utc(3, 29, 6, 50), utc(3, 29, 7, 50), MINUTE),
    ]
    fired = tick_through(relay, nows)
    slots = [utc(3, 26, 8, m) for m in (0, 20, 40)] + [utc(3, 29, 7, m) for m in (0, 20, 40)]
    assert fired == {slot: [fire_id("standup", slot)] for slot in slots}


def test_a_zone_the_data_does_not_know_is_refused(relay: Relay) -> None:
    with pytest.raises(DefinitionError, match="unknown time zone 'Europe/Berlinn'"):
        relay.schedule("look", RECIPE, {"note": "a.txt"}, Daily(9, tz="Europe/Berlinn"))
    assert relay.schedules() == []


def test_a_stored_schedule_with_an_unknown_zone_is_logged_and_the_others_fire(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    relay.schedule("good", RECIPE, {"note": "a.txt"}, Every(5), now_ms=0)
    bad = relay.schedule("bad", RECIPE, {"note": "a.txt"}, Daily(2, tz="Europe/Berlin"), now_ms=0)
    edited = json.loads(bad.model_dump_json())
    edited["trigger"]["tz"] = "Mars/Base"  # someone edited Redis by hand
    store = relay.schedule_store
    store.redis.hset(store.shards.of("bad").schedules, "bad", json.dumps(edited))
    with caplog.at_level(logging.WARNING, logger="scheduler.store"):
        started = relay.tick(DAY)
    assert started == [fire_id("good", 5 * MINUTE)]
    [line] = [r.getMessage() for r in caplog.records if "'bad'" in r.getMessage()]
    assert "cannot be read, so it never fires" in line
    assert "unknown time zone 'Mars/Base'" in line
    assert "\n" not in line
    assert [s.name for s in relay.schedules()] == ["good"]
    assert relay.tick(DAY + MINUTE) == []  # looked at again later, not failing every tick
