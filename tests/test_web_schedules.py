"""The web's schedules pages and a scheduled run's page, as `relay web` serves them: when
each schedule fires next on its own clock (or that it is paused), its history, and the run
saying which schedule started it and at which firing."""

from __future__ import annotations

import html
from pathlib import Path

from agent_core import Daily, Every, Recipe
from scheduler import Schedule
from scheduler.store import fire_id
from tests.support.cli import clean_env
from tests.support.cli import relay as relay_cli
from tests.support.fleet import fleet
from tests.support.web import RelayWeb

MINUTE = 60_000
T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z: 09:00 in Berlin (winter time)


def test_the_schedule_pages_tell_the_history_on_the_schedules_clock(tmp_path: Path) -> None:
    recipe = Recipe("check", "WEB-SCHED check {thing}").param("thing", "what")
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        relay = f.relay
        relay.schedule(
            "berlin", recipe, {"thing": "a"}, Daily(9, 0, tz="Europe/Berlin"),
            now_ms=T0 - 60 * MINUTE,
        )  # fmt: skip
        relay.schedule("often", recipe, {"thing": "b"}, Every(1), now_ms=T0 - 30 * MINUTE)
        relay.scheduling.pause("often", "too chatty")
        # Nothing has fired: "last fired" says never (not when each was made).
        before = web.client.get("/schedules").text
        assert before.count('<td class="never">never</td>') == 2, before
        [run_id] = relay.tick(T0 + 1_000)  # berlin's 09:00 fires; often is paused
        assert run_id == fire_id("berlin", T0)
        relay.tick(T0 + 2 * 24 * 60 * MINUTE)  # the next day's: the first run still goes
        relay.scheduling.run_now("often")
        relay.tick(T0 + 2 * 24 * 60 * MINUTE + 1_000)

        listing = web.client.get("/schedules")
        assert listing.status_code == 200
        text = html.unescape(listing.text)
        assert '<td class="next">paused</td>' in text
        assert "2027-01-18T09:00:00+01:00" in text  # berlin's next, in Berlin
        # berlin last started a run at its first 09:00 (the next day's was skipped);
        # often, paused, at the firing a person asked for.
        assert f'<td class="at" data-ms="{T0}"></td>' in text
        assert '<td class="never">' not in text

        page = html.unescape(web.client.get("/schedules/berlin").text)
        assert "2027-01-15T09:00:00+01:00</td><td>fired</td><td>schedule</td>" in page
        assert f'<a href="/runs/{run_id}">{run_id}</a></td><td>running</td>' in page
        assert "2027-01-16T09:00:00+01:00</td><td>skipped</td>" in page
        assert f"run {run_id} is still running" in page

        paused = html.unescape(web.client.get("/schedules/often").text)
        assert "<dt>paused</dt><dd>too chatty</dd>" in paused
        assert "<td>fired</td><td>run now</td>" in paused
        assert "<td>paused</td><td>person</td>" in paused

        run_page = html.unescape(web.client.get(f"/runs/{run_id}").text)
        assert (
            'schedule <a href="/schedules/berlin">berlin</a>, firing at 2027-01-15T09:00:00+01:00'
            in run_page
        )
        assert web.client.get("/schedules/nothing").status_code == 404


def test_a_firing_whose_run_cannot_start_shows_failed_and_why(tmp_path: Path) -> None:
    """A schedule stored before the bounds, whose task no run takes: its page's history
    says failed and why, with no run, and the schedules page lists the notification."""
    recipe = Recipe("long", "LONG " + "x" * 200_000)
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        # As stored before the bounds: `Schedule.create` refuses it now.
        old = Schedule(
            name="long",
            recipe=recipe,
            values={},
            trigger=Every(1),
            created_ms=T0 - 30 * MINUTE,
            last_run_ms=T0 - 30 * MINUTE,
        )
        f.relay.schedule_store.put(old)
        assert f.relay.tick(T0) == []

        reason = "the run could not start: the task is longer than 100000 characters"
        page = html.unescape(web.client.get("/schedules/long").text)
        assert f"<td>failed</td><td>schedule</td><td></td><td></td><td>{reason}</td>" in page, page
        assert "<td>fired</td>" not in page
        listing = html.unescape(web.client.get("/schedules").text)
        assert f"✗ the run did not start: {reason}" in listing


def test_a_firing_older_than_the_history_kept_is_not_called_never(tmp_path: Path) -> None:
    """The schedules list says what `relay schedule show` says of a schedule whose kept
    history no longer reaches its last firing: not "never", which would be untrue."""
    recipe = Recipe("check", "WEB-SCHED-OLD check {thing}").param("thing", "what")
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        relay = f.relay
        relay.schedule("busy", recipe, {"thing": "a"}, Every(1), now_ms=T0 - MINUTE)
        relay.schedule("idle", recipe, {"thing": "b"}, Every(1), now_ms=T0 - MINUTE)
        relay.scheduling.pause("idle")
        [run_id] = relay.tick(T0 + 1_000)
        assert run_id == fire_id("busy", T0)
        for n in range(100):  # 200 entries after its firing: the history kept is full
            relay.scheduling.pause("busy", now_ms=T0 + 2_000 + n)
            relay.scheduling.resume("busy", now_ms=T0 + 2_000 + n)
        text = html.unescape(web.client.get("/schedules").text)
        assert '<td class="never">not in its last 200 firings</td>' in text, text
        assert text.count('<td class="never">never</td>') == 1  # idle never fired
        shown = relay_cli("schedule", "show", "busy", env=clean_env(**f.env))
        assert "not in its last 200 firings" in shown.stdout, shown.stdout + shown.stderr
