"""`relay schedule add|list|rm|preview|notifications` through click's runner, on a real Relay
and a private Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import Result

from agent_core import Cron, Daily, Every, Recipe
from scheduler.store import fire_id
from tests.support.cli import clean_env
from tests.support.cli import relay as cli_relay
from tests.support.redis_server import RedisServer
from tests.support.schedule_cli import relay, run
from workers import Relay
from workers.cli.schedule import parse_offset

__all__ = ["relay"]  # the fixture, used here

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC


def fails(result: Result, message: str) -> None:
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_add_list_preview_and_rm(relay: Relay) -> None:
    added = run(
        relay, "add", "standup", "--template", "Summarise {team}'s notes", "-v", "team=core",
        "--daily", "09:00", "--utc-offset", "+05:45",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("scheduled standup: daily at 09:00 (UTC+05:45), next at ")
    [made] = relay.schedules()
    assert made.task() == "Summarise core's notes"
    assert made.utc_offset_minutes == 345

    listed = run(relay, "list")
    assert listed.exit_code == 0
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "WHEN", "MODE", "NEXT", "TASK"]
    assert row.startswith("standup")
    assert "Summarise core's notes" in row

    as_json = json.loads(run(relay, "list", "--json").stdout)
    assert as_json[0]["name"] == "standup"
    assert as_json[0]["next_due_ms"] == made.next_due_ms

    shown = run(relay, "preview", "standup", "-n", "3").stdout.splitlines()
    assert len(shown) == 3
    times = [datetime.fromisoformat(line.split()[0]) for line in shown]
    assert all(t.strftime("%H:%M %z") == "09:00 +0545" for t in times)
    assert [(b - a).days for a, b in pairwise(times)] == [1, 1]
    assert int(times[0].timestamp() * 1000) == made.next_due_ms

    removed = run(relay, "rm", "standup")
    assert (removed.exit_code, removed.stdout) == (0, "removed standup\n")
    assert relay.schedules() == []
    fails(run(relay, "rm", "standup"), "no schedule named 'standup'")
    fails(run(relay, "preview", "standup"), "no schedule named 'standup'")


def test_add_from_a_recipe_file_with_a_weekly_trigger(relay: Relay, tmp_path: Path) -> None:
    recipe = Recipe("look", "Read {note}.").param("note").only_tools(["read_note"])
    path = tmp_path / "look.json"
    path.write_text(recipe.model_dump_json())
    added = run(
        relay, "add", "weekly-look", "--recipe-file", str(path), "--value", "note=a.txt",
        "--weekly", "fri", "08:30", "--utc-offset", "-07:00",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    [made] = relay.schedules()
    assert made.recipe == recipe
    assert made.tools == ("read_note",)
    shown = run(relay, "preview", "weekly-look", "-n", "2").stdout.splitlines()
    days = [datetime.fromisoformat(line.split()[0]) for line in shown]
    assert [d.strftime("%A %H:%M %z") for d in days] == ["Friday 08:30 -0700"] * 2


def test_adding_a_name_again_replaces_it(relay: Relay) -> None:
    run(relay, "add", "tick", "--template", "Note {x}", "-v", "x=1", "--every", "5")
    again = run(relay, "add", "tick", "--template", "Note {x}", "-v", "x=2", "--every", "10")
    assert again.stdout.startswith("replaced tick: every 10 minutes")
    [only] = relay.schedules()
    assert only.task() == "Note 2"


def test_notify_only_schedules_and_their_notifications(relay: Relay) -> None:
    added = run(relay, "add", "remind", "--template", "Water the {plant}", "-v", "plant=fern",
                "--every", "60", "--notify")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert run(relay, "notifications").stdout == "no notifications\n"
    [made] = relay.schedules()
    assert relay.tick(made.next_due_ms) == []
    shown = run(relay, "notifications").stdout
    assert "remind" in shown
    assert "Water the fern" in shown
    [line] = run(relay, "notifications", "--json").stdout.splitlines()
    assert json.loads(line)["slot_ms"] == made.next_due_ms


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--daily", "25:00"], "Daily hour must be from 0 to 23, got 25"),
        (["--daily", "9am"], "--daily takes a time as HH:MM"),
        (["--weekly", "someday", "09:00"], "--weekly takes a day"),
        (["--every", "5", "--daily", "09:00"], "give exactly one of --every"),
        (["--cron", "0 9 * * *", "--daily", "09:00"], "give exactly one of --every"),
        (
            ["--daily", "09:00", "--tz", "Europe/Berlinn"],
            "--tz: unknown time zone 'Europe/Berlinn'",
        ),
        (["--cron", "0 9 * * *", "--tz", "../etc/passwd"], "--tz: unknown time zone"),
        (["--cron", "0 25 * * *"], "the hour field '25' is out of range 0-23"),
        (["--cron", "0 9 * * 1-8", "--tz", "UTC"], "the day-of-week field '1-8'"),
        (["--cron", "0 9 *"], "expected 5 fields, got 3"),
        (["--daily", "09:00", "--tz", "UTC", "--utc-offset", "+01:00"], "not both"),
        (["--every", "5", "--tz", "Europe/Berlin"], "--tz goes with --daily, --weekly or --cron"),
        ([], "give exactly one of --every"),
        (["--every", "5", "-v", "colour=red"], "no blank named 'colour'"),
        (["--every", "5", "-v", "team"], "--value takes NAME=TEXT"),
        (["--daily", "09:00", "--utc-offset", "+15:00"], "offsets run from -14:00 to +14:00"),
        (["--daily", "09:00", "--utc-offset", "noon"], "expected an offset like +05:45"),
    ],
)
def test_bad_input_is_one_line_on_stderr(relay: Relay, args: list[str], message: str) -> None:
    fails(run(relay, "add", "standup", "--template", "Summarise {team}", *args), message)
    assert relay.schedules() == []


def test_a_missing_value_and_a_bad_recipe_file_are_one_line(relay: Relay, tmp_path: Path) -> None:
    fails(
        run(relay, "add", "s", "--template", "Do {a} and {b}", "-v", "a=1", "--every", "5"),
        "needs a value for 'b'",
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "template": "Do {a"}')
    fails(run(relay, "add", "s", "--recipe-file", str(bad), "--every", "5"), "template")
    fails(
        run(relay, "add", "s", "--recipe-file", str(tmp_path / "none.json"), "--every", "5"),
        "No such file",
    )
    fails(run(relay, "add", "s", "--every", "5"), "give exactly one of --recipe-file")


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("+05:45", 345), ("-07:00", -420), ("+0530", 330), ("+9", 540), ("Z", 0), ("0", 0)],
)
def test_offsets_as_people_type_them(text: str, minutes: int) -> None:
    assert parse_offset(text) == minutes


def utc(month: int, day: int, hour: int, minute: int = 0) -> int:
    return int(datetime(2027, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


def test_add_in_a_zone_and_with_cron_then_list_and_show(relay: Relay) -> None:
    added = run(relay, "add", "digest", "--template", "Digest {team}", "-v", "team=core",
                "--daily", "02:30", "--tz", "Europe/Berlin")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("scheduled digest: daily at 02:30 (Europe/Berlin), next at ")
    next_at = datetime.fromisoformat(added.stdout.rstrip().rsplit(" ", 1)[1])
    assert next_at.strftime("%H:%M") in ("02:30", "03:00")  # 03:00 only on a spring-forward day
    added = run(relay, "add", "plan", "--template", "Plan the day",
                "--cron", "0  9 * * 1-5", "--tz", "America/New_York")  # fmt: skip
    assert added.exit_code == 0, added.output
    plan = next(s for s in relay.schedules() if s.name == "plan")
    assert plan.trigger == Cron("0 9 * * 1-5", tz="America/New_York")
    assert plan.utc_offset_minutes == 0

    rows = run(relay, "list").stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["digest", "plan"]
    assert "daily at 02:30 (Europe/Berlin)" in rows[0]
    assert "cron '0 9 * * 1-5' (America/New_York)" in rows[1]
    stored = json.loads(run(relay, "list", "--json").stdout)
    assert stored[1]["trigger"] == {
        "kind": "cron",
        "expression": "0 9 * * 1-5",
        "tz": "America/New_York",
    }

    shown = run(relay, "show", "plan")
    assert shown.exit_code == 0, shown.output
    lines = dict(line.split(":", 1) for line in shown.stdout.splitlines())
    assert lines["cron"].strip() == "0 9 * * 1-5"
    assert lines["time zone"].strip() == "America/New_York"
    assert lines["task"].strip() == "Plan the day"
    assert json.loads(run(relay, "show", "plan", "--json").stdout)["name"] == "plan"
    fails(run(relay, "show", "nothing"), "no schedule named 'nothing'")


def test_preview_shows_the_firings_in_the_zone_across_summer_time(relay: Relay) -> None:
    trigger = Daily(2, 30, tz="Europe/Berlin")
    relay.schedule("digest", Recipe("digest", "Digest"), {}, trigger, now_ms=utc(3, 26, 12))
    shown = run(relay, "preview", "digest", "--count", "4")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == [
        "2027-03-27T02:30:00+01:00  2027-03-27T01:30:00Z",
        "2027-03-28T03:00:00+02:00  2027-03-28T01:00:00Z",  # 02:30 is skipped that day
        "2027-03-29T02:30:00+02:00  2027-03-29T00:30:00Z",
        "2027-03-30T02:30:00+02:00  2027-03-30T00:30:00Z",
    ]
    as_json = json.loads(run(relay, "preview", "digest", "-n", "2", "--json").stdout)
    assert as_json == {
        "schedule": "digest",
        "time_zone": "Europe/Berlin",
        "firings": [
            {"ms": utc(3, 27, 1, 30), "local": "2027-03-27T02:30:00+01:00",
             "utc": "2027-03-27T01:30:00Z"},
            {"ms": utc(3, 28, 1), "local": "2027-03-28T03:00:00+02:00",
             "utc": "2027-03-28T01:00:00Z"},
        ],
    }  # fmt: skip


# --- bounds, and what `show` says ran --------------------------------------------------------


def test_an_oversize_template_or_value_is_refused_at_add_naming_the_bound(
    relay: Relay, tmp_path: Path
) -> None:
    huge = tmp_path / "huge.json"
    huge.write_text(
        Recipe("huge", "Read {note}. " + "x" * 10 * 2**20).param("note").model_dump_json()
    )
    fails(
        run(relay, "add", "big", "--recipe-file", str(huge), "-v", "note=a", "--every", "5"),
        "schedule 'big': its template is 10,485,773 characters; a template is at most 50,000",
    )
    fails(
        run(relay, "add", "big", "--template", "t" * 50_001, "--every", "5"),
        "a template is at most 50,000",
    )
    fails(
        run(relay, "add", "big", "--template", "Do {x}", "-v", "x=" + "v" * 10_001, "--every", "5"),
        "the value of 'x' is 10,001 characters; a value is at most 10,000",
    )
    assert relay.schedules() == []
    # Replacing one with an oversize template leaves it as it was.
    run(relay, "add", "big", "--template", "Do {x}", "-v", "x=small", "--every", "5")
    fails(run(relay, "add", "big", "--template", "t" * 50_001, "--every", "5"), "at most 50,000")
    assert [s.task() for s in relay.schedules()] == ["Do small"]


def test_the_real_command_refuses_a_10_mb_template_in_one_line(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    huge.write_text(Recipe("huge", "x" * 10 * 2**20).model_dump_json())
    with RedisServer(tmp_path) as server:
        env = clean_env(RELAY_REDIS_URL=server.url)
        added = cli_relay("schedule", "add", "big", "--recipe-file", str(huge), "--every", "5",
                          env=env)  # fmt: skip
        assert added.returncode == 1, added.stdout
        assert added.stderr == (
            "relay: schedule 'big': its template is 10,485,760 characters;"
            " a template is at most 50,000\n"
        )
        assert cli_relay("schedule", "list", env=env).stdout == "no schedules\n"


def test_show_says_never_until_a_run_starts(relay: Relay) -> None:
    made_at = T0 - 30 * 60_000
    relay.schedule("watch", Recipe("watch", "Watch"), {}, Every(60), now_ms=made_at)
    relay.schedule("ping", Recipe("ping", "Ping"), {}, Every(60), now_ms=made_at, mode="notify")

    def row(name: str, label: str) -> str:
        shown = run(relay, "show", name)
        assert shown.exit_code == 0, shown.output
        [found] = [line for line in shown.stdout.splitlines() if line.startswith(f"{label}:")]
        return found

    assert row("watch", "last run") == "last run:  never"
    assert row("ping", "notified") == "notified:  never"

    relay.scheduling.pause("watch")
    relay.scheduling.resume("watch", now_ms=T0)  # moves its last_run_ms on; runs nothing
    assert row("watch", "last run") == "last run:  never"

    slot = T0 + 60 * 60_000
    [run_id] = relay.tick(slot)
    assert run_id == fire_id("watch", slot)
    assert row("watch", "last run") == (
        f"last run:  2023-11-14T23:13:20+00:00 (2023-11-14T23:13:20Z), run {run_id}"
    )
    assert row("ping", "notified").startswith("notified:  2023-11-14T22:43:20+00:00")


def test_the_help_says_what_fires_a_schedule_in_a_users_words(relay: Relay) -> None:
    shown = run(relay, "--help")
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.stdout.split())
    assert "started as a run each time its trigger comes (the fleet's tick does it" in words
    assert "beat" not in words
