"""`relay schedule add` with the unattended options, and `pause|resume|run|backfill|history`,
through click's runner, on a real Relay (its real tick) and a private Redis."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from scheduler.store import fire_id
from tests.support.schedule_cli import relay, run
from workers import Relay
from workers.cli.runs import show
from workers.cli.schedule import parse_duration, parse_policy
from workers.errors import RelayError
from workers.settings import now_ms

MINUTE = 60_000
HOUR = 60 * MINUTE

__all__ = ["relay"]  # the fixture, used here


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def fails(result: Result, message: str) -> None:
    assert result.exit_code != 0, result.output
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def add(relay: Relay, name: str, *args: str) -> str:
    return ok(run(relay, "add", name, "--template", "Copy {src}", "-v", "src=a.txt", *args))


def test_add_an_unattended_schedule_and_show_how_it_decides(relay: Relay) -> None:
    add(
        relay, "backup", "--every", "60", "--overlap", "buffer_one", "--approve", "plan",
        "--policy", "trusting", "--catch-up", "30m", "--jitter", "5m",
        "--end", "2099-01-01T00:00",
    )  # fmt: skip
    [made] = relay.schedules()
    assert (made.overlap, made.approve_plan, made.ask) == ("buffer_one", True, ("money", "outside"))
    assert (made.catch_up_ms, made.jitter_ms) == (30 * MINUTE, 5 * MINUTE)
    assert made.end_ms == 4_070_908_800_000
    shown = ok(run(relay, "show", "backup"))
    assert "overlap:   buffer_one" in shown
    assert "plan approved by the schedule; asks for money, outside (money always asks)" in shown
    assert "catch-up:  30m" in shown
    assert "jitter:    5m (this schedule: +" in shown
    assert "end:       2099-01-01T00:00:00+00:00" in shown


def test_a_schedule_without_options_skips_and_asks_as_the_app_does(relay: Relay) -> None:
    add(relay, "plain", "--every", "5")
    [made] = relay.schedules()
    assert (made.overlap, made.approve_plan, made.ask) == ("skip", False, None)
    assert "plan asks a person; the app's policy" in ok(run(relay, "show", "plain"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "write,bogus"], "--policy is trusting, cautious or risks from"),
        (["--catch-up", "5 minutes"], "--catch-up takes a duration such as 30m"),
        (["--jitter", "-1m"], "--jitter takes a duration"),
        (["--catch-up", "10s"], "catch_up_ms: Input should be greater than or equal to 60000"),
        (["--end", "tomorrow"], "--end takes a time such as 2026-12-24T18:00"),
    ],
)
def test_bad_options_are_one_line(relay: Relay, args: list[str], message: str) -> None:
    fails(run(relay, "add", "s", "--template", "Go", "--every", "5", *args), message)
    assert relay.schedules() == []


def test_pause_resume_and_the_history_says_so(relay: Relay) -> None:
    add(relay, "nightly", "--every", "1")
    assert ok(run(relay, "pause", "nightly", "--note", "office closed")) == "paused nightly\n"
    assert "paused:    office closed" in ok(run(relay, "show", "nightly"))
    listed = ok(run(relay, "list"))
    assert "paused" in listed.splitlines()[1]
    assert relay.tick(now_ms() + 10 * MINUTE) == []  # nothing fires while paused
    resumed = ok(run(relay, "resume", "nightly"))
    assert resumed.startswith("resumed nightly, next at ")
    history = ok(run(relay, "history", "nightly"))
    lines = history.splitlines()
    assert lines[0].split() == ["TIME", "WHAT", "BY", "RUN", "OUTCOME", "WHY"]
    assert "resumed" in lines[1]
    assert "paused" in lines[2]
    assert "office closed" in lines[2]


def test_run_now_fires_once_at_the_next_tick_and_is_in_the_history(relay: Relay) -> None:
    add(relay, "adhoc", "--daily", "03:00")
    out = ok(run(relay, "run", "adhoc"))
    assert out.startswith("queued a firing of adhoc at ")
    started = relay.tick(now_ms() + 1_000)
    assert len(started) == 1
    assert relay.tick(now_ms() + 2_000) == []  # once
    [line] = [
        json.loads(text) for text in ok(run(relay, "history", "adhoc", "--json")).splitlines()
    ]
    assert line["firing"]["kind"] == "fired"
    assert line["firing"]["source"] == "run now"
    assert line["firing"]["run_id"] == started[0]
    assert line["state"] == "running"  # no worker here: it never moves on
    assert relay.status(started[0]).schedule == "adhoc"


def test_backfill_queues_the_range_and_refuses_a_huge_one_unless_forced(relay: Relay) -> None:
    add(relay, "hourly", "--every", "60", "--overlap", "allow_all")
    out = ok(
        run(relay, "backfill", "hourly", "--from", "2026-11-01T00:00", "--to", "2026-11-01T23:59")
    )
    assert out.startswith("queued 24 firings of hourly, ")
    started = relay.tick(now_ms())
    assert len(started) == 24
    assert relay.tick(now_ms() + 1_000) == []
    fails(
        run(relay, "backfill", "hourly", "--from", "2026-01-01T00:00", "--to", "2026-12-31T00:00"),
        "the range holds more than 1,000 firings of 'hourly' (--force allows up to 1,000,000)",
    )
    forced = run(
        relay, "backfill", "hourly", "--from", "2026-01-01T00:00", "--to", "2026-12-31T00:00",
        "--force",
    )  # fmt: skip
    assert ok(forced).startswith("queued 8,737 firings of hourly")
    fails(
        run(relay, "backfill", "hourly", "--from", "2026-02-01", "--to", "2026-01-01"),
        "comes before",
    )


def test_unknown_schedules_are_one_line(relay: Relay) -> None:
    for verb in ("pause", "resume", "run", "history"):
        fails(run(relay, verb, "ghost"), "no schedule named 'ghost'")
    fails(
        run(relay, "backfill", "ghost", "--from", "2026-01-01", "--to", "2026-01-02"),
        "no schedule named",
    )


def test_a_removed_schedule_takes_its_queue_and_history_with_it(relay: Relay) -> None:
    add(relay, "gone", "--every", "60")
    ok(run(relay, "backfill", "gone", "--from", "2026-11-01T00:00", "--to", "2026-11-01T05:00"))
    ok(run(relay, "rm", "gone"))
    assert relay.tick(now_ms()) == []
    add(relay, "gone", "--every", "60")
    assert ok(run(relay, "history", "gone")) == "no firings of gone yet\n"


def test_durations_and_policies_as_people_type_them() -> None:
    assert parse_duration("90s", "--x") == 90_000
    assert parse_duration("2h", "--x") == 2 * HOUR
    assert parse_duration("1d", "--x") == 24 * HOUR
    assert parse_policy("trusting") == ["money", "outside"]
    assert parse_policy("cautious") == ["money", "outside", "write"]
    assert parse_policy("create, write") == ["create", "write"]
    with pytest.raises(RelayError):
        parse_duration("1w", "--x")
    assert fire_id("a", 1) != fire_id("a", 1, "backfill") != fire_id("a", 1, "run now")


def test_relay_show_says_which_schedule_and_firing_started_a_run(relay: Relay) -> None:
    add(relay, "berlin", "--daily", "09:00", "--tz", "Europe/Berlin")
    ok(run(relay, "run", "berlin"))
    [run_id] = relay.tick(now_ms() + 1_000)
    fired = relay.status(run_id).fired_ms
    assert fired is not None
    shown = CliRunner().invoke(show, [run_id], obj=SimpleNamespace(relay=relay))
    [line] = [line for line in ok(shown).splitlines() if line.startswith("started by")]
    [found] = relay.schedules()
    assert line.split(None, 2)[2] == f"schedule berlin, firing at {found.local_time(fired)}"
