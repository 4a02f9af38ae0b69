"""`relay schedule pause|resume|run|backfill|history`: steering a schedule that exists.

    relay schedule pause standup --note "office closed"
    relay schedule resume standup
    relay schedule run standup                 # fire once now (the next tick starts it)
    relay schedule backfill standup --from 2026-11-01T00:00 --to 2026-11-01T23:59
    relay schedule history standup [--limit 20] [--json]

A run-now or backfilled firing meets the schedule's overlap policy like any other
and lands in its history. Times without an offset are read on the schedule's own
clock (its zone, else its fixed offset); the history shows them so.
"""

from __future__ import annotations

import json

import click

from workers.cli.schedule import (
    current_relay,
    find_schedule,
    parse_time,
    schedule,
    schedule_errors,
    text_table,
    utc_text,
)
from workers.cli.terminal import json_text, one_line
from workers.client.schedules import BACKFILL_MAX

__all__ = ["backfill", "history", "pause", "resume", "run_now"]

_WHY_SHOWN = 160
"""The last column of `history`, so longer than a task's: a failed firing's reason is read here."""


@schedule.command("pause")
@click.argument("name")
@click.option("--note", default="", help="Why, for whoever looks at it (kept in its history).")
def pause(name: str, note: str) -> None:
    """Pause a schedule: none of its times fire until it is resumed."""
    with schedule_errors():
        current_relay().scheduling.pause(name, note)
    click.echo(f"paused {one_line(name)}")


@schedule.command("resume")
@click.argument("name")
@click.option("--note", default="", help="Kept in its history.")
def resume(name: str, note: str) -> None:
    """Resume a paused schedule from now (times missed while paused are not made up)."""
    with schedule_errors():
        resumed = current_relay().scheduling.resume(name, note)
    click.echo(f"resumed {one_line(name)}, next at {resumed.local_time(resumed.fire_at_ms)}")


@schedule.command("run")
@click.argument("name")
def run_now(name: str) -> None:
    """Fire the schedule once now, under its overlap policy; the next tick starts the run."""
    with schedule_errors():
        at = current_relay().scheduling.run_now(name)
    click.echo(f"queued a firing of {one_line(name)} at {utc_text(at)}")


@schedule.command("backfill")
@click.argument("name")
@click.option(
    "--from", "start", required=True, metavar="TIME", help="ISO 8601, e.g. 2026-11-01T00:00."
)
@click.option("--to", "end", required=True, metavar="TIME", help="ISO 8601 (included).")
@click.option(
    "--force",
    is_flag=True,
    help=f"Allow more than {BACKFILL_MAX:,} firings (up to a million).",
)
def backfill(name: str, start: str, end: str, *, force: bool) -> None:
    """Queue the schedule's firings from --from to --to; each starts once, one after the
    other (all at once under --overlap allow_all)."""
    found = find_schedule(name)
    with schedule_errors():
        offset = found.utc_offset_minutes
        start_ms = parse_time(start, found.tz, offset, "--from")
        end_ms = parse_time(end, found.tz, offset, "--to")
        slots = current_relay().scheduling.backfill(name, start_ms, end_ms, force=force)
    if not slots:
        click.echo(f"no firings of {one_line(name)} in that range")
        return
    first, last = found.local_time(slots[0]), found.local_time(slots[-1])
    click.echo(f"queued {len(slots):,} firings of {one_line(name)}, {first} to {last}")


@schedule.command("history")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def history(name: str, *, limit: int, as_json: bool) -> None:
    """What each firing did, newest first: fired (and its run's outcome), failed (its run
    could not start) and why, skipped and why, missed, buffered, paused, resumed. Times on
    the schedule's own clock."""
    found = find_schedule(name)
    with schedule_errors():
        views = current_relay().scheduling.history(name, limit)
    if as_json:
        for view in views:
            click.echo(json_text(json.dumps(view.model_dump(mode="json"))))
        return
    if not views:
        click.echo(f"no firings of {one_line(name)} yet")
        return
    rows: list[tuple[str, ...]] = [("TIME", "WHAT", "BY", "RUN", "OUTCOME", "WHY")]
    for view in views:
        entry = view.firing
        outcome = view.stop or view.state or ("" if entry.run_id is None else "expired")
        rows.append(
            (
                found.local_time(entry.slot_ms),
                entry.kind,
                entry.source,
                entry.run_id or "",
                outcome if entry.kind == "fired" else "",
                one_line(entry.why, _WHY_SHOWN),
            )
        )
    click.echo(text_table(rows))
