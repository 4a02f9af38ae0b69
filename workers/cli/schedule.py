"""`relay schedule ...`: add, list, show, rm, preview and notifications of recurring recipes.

    relay schedule add standup --template "Summarise {team}'s notes" -v team=core \\
        --daily 09:00 --utc-offset +05:45
    relay schedule add spend --recipe-file spend.json -v month="last month" --weekly mon 08:30
    relay schedule add digest --template "Digest {team}" -v team=core \\
        --daily 02:30 --tz Europe/Berlin
    relay schedule add weekdays --template "Plan the day" --cron "0 9 * * 1-5" --tz Europe/Berlin
    relay schedule list [--json]
    relay schedule show standup [--json]
    relay schedule preview standup --count 3 [--json]
    relay schedule add backup --template "Copy {src} to {dst}" -v src=a -v dst=b --every 60 \
        --approve plan --policy trusting --overlap skip --catch-up 30m --jitter 5m
    relay schedule rm standup
    relay schedule notifications
    relay schedule pause standup --note "holidays"; relay schedule resume standup
    relay schedule run standup
    relay schedule backfill standup --from 2026-11-01T00:00 --to 2026-11-02T00:00 [--force]
    relay schedule history standup [--json]

The Relay comes from the `relay` group's context (`--app` / RELAY_APP). Every
error is one line on stderr and a non-zero exit.

Times are shown on the schedule's own clock: its IANA zone (`--tz`), with the
offset the zone has at that moment, or else its fixed `--utc-offset`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import ValidationError

from agent_core import Cron, Daily, Every, Policy, Recipe, Risk, Trigger, Weekly
from agent_core.errors import AgentError
from agent_core.triggers import DAY_NAMES, MAX_UTC_OFFSET_MINUTES
from scheduler import Schedule, SchedulerError, calendar
from scheduler.history import HISTORY_MAX
from scheduler.schedules import (
    MAX_TASK_CHARS,
    MAX_TEMPLATE_CHARS,
    MAX_VALUE_CHARS,
    ON_WAITS,
    OVERLAPS,
    first_error,
    local_iso,
)
from workers.cli.budget import budget_from, budget_options
from workers.cli.terminal import json_text, one_line
from workers.errors import RelayError
from workers.relay import Relay

__all__ = [
    "current_relay",
    "cut_text",
    "find_schedule",
    "parse_duration",
    "parse_offset",
    "parse_policy",
    "parse_time",
    "schedule",
    "schedule_errors",
    "text_table",
    "utc_text",
]

_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})")
_OFFSET = re.compile(r"([+-])([0-9]{1,2})(?::?([0-9]{2}))?")
_TASK_SHOWN = 60


def _one_line(error: BaseException) -> str:
    return one_line(first_error(error) if isinstance(error, ValidationError) else str(error))


@contextmanager
def schedule_errors() -> Iterator[None]:
    """Turn what a user can get wrong (and an unreachable Redis) into one line and exit 1."""
    try:
        yield
    except (AgentError, RelayError, SchedulerError, ValidationError, OSError) as error:
        raise click.ClickException(_one_line(error)) from None


def current_relay() -> Relay:
    relay: Relay = click.get_current_context().obj.relay
    return relay


# --- parsing what was typed ------------------------------------------------------------------


def parse_offset(text: str) -> int:
    """Return a UTC offset such as `+05:45`, `-0700`, `+9`, `Z` or `0` in minutes.

    Raises:
        click.ClickException: not an offset, or beyond ±14:00.
    """
    cleaned = text.strip()
    if cleaned.upper() in ("Z", "UTC", "0"):
        return 0
    found = _OFFSET.fullmatch(cleaned)
    if found is None:
        raise click.ClickException(
            f"--utc-offset: expected an offset like +05:45 or -07:00, got {text!r}"
        )
    sign, hours, minutes = found.group(1), int(found.group(2)), int(found.group(3) or 0)
    if minutes > 59:
        raise click.ClickException(f"--utc-offset: minutes must be below 60, got {text!r}")
    total = (hours * 60 + minutes) * (-1 if sign == "-" else 1)
    if abs(total) > MAX_UTC_OFFSET_MINUTES:
        raise click.ClickException(f"--utc-offset: offsets run from -14:00 to +14:00, got {text!r}")
    return total


def _clock(text: str, option: str) -> tuple[int, int]:
    found = _CLOCK.fullmatch(text.strip())
    if found is None:
        raise click.ClickException(f"{option} takes a time as HH:MM, got {text!r}")
    return int(found.group(1)), int(found.group(2))


def _day(text: str) -> int:
    word = text.strip().lower()
    if word.isdigit() and int(word) < len(DAY_NAMES):
        return int(word)
    for index, name in enumerate(DAY_NAMES):
        if len(word) >= 3 and name.lower().startswith(word):
            return index
    raise click.ClickException(f"--weekly takes a day such as mon or Monday (or 0-6), got {text!r}")


def _zone(tz: str) -> str:
    """Return `tz` if the zone data knows it (checked here, so the message names --tz)."""
    try:
        calendar.zone(tz)
    except SchedulerError as error:
        raise click.ClickException(f"--tz: {error}") from None
    return tz


def _trigger(
    every: int | None,
    daily: str | None,
    weekly: tuple[str, str] | None,
    cron: str | None,
    tz: str | None,
) -> Trigger:
    named = (("--every", every), ("--daily", daily), ("--weekly", weekly), ("--cron", cron))
    if len([option for option, value in named if value]) != 1:
        raise click.ClickException(
            "give exactly one of --every MINUTES, --daily HH:MM, --weekly DAY HH:MM, --cron EXPR"
        )
    if every is not None:
        if tz is not None:
            raise click.ClickException("--tz goes with --daily, --weekly or --cron, not --every")
        return Every(every)
    zone = None if tz is None else _zone(tz)
    if daily is not None:
        return Daily(*_clock(daily, "--daily"), tz=zone)
    if cron is not None:
        return Cron(cron, tz=zone)
    assert weekly is not None
    return Weekly(_day(weekly[0]), *_clock(weekly[1], "--weekly"), tz=zone)


def _offset(utc_offset: str | None, tz: str | None) -> int:
    if utc_offset is None:
        return 0
    if tz is not None:
        # The zone already says the offset, and when it changes.
        raise click.ClickException("give --tz or --utc-offset, not both")
    return parse_offset(utc_offset)


def _pairs(items: tuple[str, ...], option: str, *, need_value: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if (need_value and not equals) or not key.strip():
            raise click.ClickException(f"{option} takes NAME=TEXT, got {item!r}")
        if key.strip() in found:
            raise click.ClickException(f"{option} names {key.strip()!r} twice")
        found[key.strip()] = value
    return found


def _recipe(
    name: str,
    recipe_file: Path | None,
    template: str | None,
    params: tuple[str, ...],
    tools: tuple[str, ...],
) -> Recipe:
    if (recipe_file is None) == (template is None):
        raise click.ClickException("give exactly one of --recipe-file or --template")
    if recipe_file is not None:
        if params or tools:
            raise click.ClickException("--param and --tool go with --template; the file has them")
        return Recipe.model_validate_json(recipe_file.read_bytes())
    assert template is not None
    recipe = Recipe(name, template)
    declared = _pairs(params, "--param", need_value=False)
    # Without --param, every blank of the template is a param.
    for param in declared or dict.fromkeys(recipe.blanks(), ""):
        recipe = recipe.param(param, declared.get(param, ""))
    return recipe.only_tools(tools) if tools else recipe


# --- the commands ----------------------------------------------------------------------------


@click.group()
def schedule() -> None:
    """Recurring recipes: a task with blanks, filled and started as a run each time its
    trigger comes (the fleet's tick does it: every worker takes part)."""


@schedule.command("add")
@click.argument("name")
@click.option(
    "--recipe-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A recipe as JSON (as Recipe.model_dump_json writes it).",
)
@click.option(
    "--template",
    help="The task with {blanks}; the recipe is named after the schedule."
    f" At most {MAX_TEMPLATE_CHARS:,} characters.",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME[=HELP]",
    help="Declare a blank (with --template; default: every blank the template uses).",
)
@click.option(
    "--value",
    "-v",
    "values",
    multiple=True,
    metavar="NAME=TEXT",
    help=f"Fill a blank (at most {MAX_VALUE_CHARS:,} characters; the filled task at most"
    f" {MAX_TASK_CHARS:,}).",
)
@click.option("--tool", "tools", multiple=True, help="Only this tool (repeat; with --template).")
@click.option("--every", type=click.IntRange(min=1), metavar="MINUTES", help="Every N minutes.")
@click.option("--daily", metavar="HH:MM", help="Every day at this local time.")
@click.option("--weekly", nargs=2, metavar="DAY HH:MM", help="Every week, e.g. mon 09:00.")
@click.option(
    "--cron",
    metavar="EXPR",
    help='At the local minutes a five-field cron expression matches, e.g. "0 9 * * 1-5".',
)
@click.option(
    "--tz",
    metavar="ZONE",
    help="The IANA time zone of --daily, --weekly or --cron, e.g. Europe/Berlin"
    " (summer time included).",
)
@click.option(
    "--utc-offset",
    metavar="OFFSET",
    help="A fixed offset for the local time instead of --tz, e.g. +05:45 (default +00:00).",
)
@click.option("--notify", is_flag=True, help="Only record a notification; start no run.")
@click.option(
    "--overlap",
    type=click.Choice(OVERLAPS),
    default="skip",
    show_default=True,
    help="A firing while a run it started still runs or waits: skip it, buffer one,"
    " allow all, or cancel the previous run.",
)
@click.option(
    "--approve",
    type=click.Choice(["plan"]),
    help="plan: the schedule approves its runs' plans (calls still ask, as --policy says).",
)
@click.option(
    "--on-wait",
    type=click.Choice(ON_WAITS),
    default="wait",
    show_default=True,
    help="When a run would wait for a person: wait; wait and notify (relay schedule"
    " notifications); or skip (decline the call or plan, answer the question). Money waits.",
)
@click.option(
    "--policy",
    metavar="POLICY",
    help="Which calls ask a person: trusting (outside, money), cautious (write, outside,"
    " money) or risks joined by commas (create,write,...); money always asks."
    " Default: the app's.",
)
@click.option(
    "--catch-up",
    metavar="DURATION",
    help="After downtime, firings later than this (e.g. 30m, 2h, 1d) are recorded as missed.",
)
@click.option(
    "--jitter",
    metavar="DURATION",
    help="Spread firings: each comes up to this much later, fixed per schedule name.",
)
@click.option("--end", metavar="TIME", help="No firing after this time (ISO 8601; see --tz).")
@budget_options
def add(
    name: str,
    *,
    recipe_file: Path | None,
    template: str | None,
    params: tuple[str, ...],
    values: tuple[str, ...],
    tools: tuple[str, ...],
    every: int | None,
    daily: str | None,
    weekly: tuple[str, str] | None,
    cron: str | None,
    tz: str | None,
    utc_offset: str | None,
    notify: bool,
    budget_tokens: int | None,
    budget_usd: float | None,
    budget_calls: int | None,
    deadline: float | None,
    **unattended: str | None,
) -> None:
    """Add a schedule, or replace the one named NAME."""
    offset = _offset(utc_offset, tz)
    with schedule_errors():
        trigger = _trigger(every, daily, weekly, cron, tz)
        recipe = _recipe(name, recipe_file, template, params, tools)
        filled = _pairs(values, "--value", need_value=True)
        relay = current_relay()
        existed = any(s.name == name for s in relay.schedules())
        budget = budget_from(budget_tokens, budget_usd, budget_calls, deadline)
        mode: Literal["run", "notify"] = "notify" if notify else "run"
        options = _unattended(tz, offset, **unattended)
        made = relay.schedule(
            name, recipe, filled, trigger, offset, mode=mode, budget=budget, **options
        )
    verb = "replaced" if existed else "scheduled"
    click.echo(one_line(f"{verb} {made.name}: {made.describe()}, next at {made.next_text()}"))


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_(*, as_json: bool) -> None:
    """List the schedules with their next due times."""
    with schedule_errors():
        found = current_relay().schedules()
    if as_json:
        click.echo(json_text(json.dumps([s.model_dump(mode="json") for s in found], indent=2)))
        return
    if not found:
        click.echo("no schedules")
        return
    rows: list[tuple[str, ...]] = [("NAME", "WHEN", "MODE", "NEXT", "TASK")]
    rows += [
        (one_line(s.name), one_line(s.describe()), s.mode, s.next_text(), cut_text(s.task()))
        for s in found
    ]
    click.echo(text_table(rows))


@schedule.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove a schedule (and the notes its runs kept)."""
    with schedule_errors():
        removed = current_relay().unschedule(name)
    if not removed:
        raise click.ClickException(f"no schedule named {name!r}")
    click.echo(f"removed {one_line(name)}")


@schedule.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the stored schedule as JSON.")
def show(name: str, *, as_json: bool) -> None:
    """Show one schedule: its trigger, zone or offset, next firing and task."""
    found = find_schedule(name)
    if as_json:
        click.echo(json_text(json.dumps(found.model_dump(mode="json"), indent=2)))
        return
    trigger = found.trigger
    rows = [
        ("name", found.name),
        ("when", found.describe()),
        *([("cron", trigger.expression)] if isinstance(trigger, Cron) else []),
        ("time zone", found.time_zone),
        ("mode", found.mode),
        ("next", _next_row(found)),
        _last_row(found),
        ("tools", "all" if found.tools is None else ", ".join(found.tools) or "none"),
        *_running_rows(found),
        ("task", found.task()),
    ]
    click.echo("\n".join(f"{label + ':':<11}{one_line(value)}" for label, value in rows))


@schedule.command("preview")
@click.argument("name")
@click.option(
    "-n",
    "--count",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    metavar="N",
    help="How many firings to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def preview(name: str, count: int, *, as_json: bool) -> None:
    """Print the next N firings: the schedule's local time (its zone, with the offset it
    has then, or its fixed offset), then UTC."""
    found = find_schedule(name)
    with schedule_errors():
        slots = found.upcoming(count)
    if as_json:
        firings = [{"ms": s, "local": found.local_time(s), "utc": utc_text(s)} for s in slots]
        shown = {"schedule": found.name, "time_zone": found.time_zone, "firings": firings}
        click.echo(json_text(json.dumps(shown, indent=2)))
        return
    for slot in slots:
        click.echo(f"{found.local_time(slot)}  {utc_text(slot)}")


@schedule.command("notifications")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of text.")
def notifications(*, limit: int, as_json: bool) -> None:
    """Show what notify-only schedules recorded (and runs that could not start), newest first."""
    with schedule_errors():
        found = current_relay().notifications(limit)
    for notice in found:
        if as_json:
            click.echo(json_text(notice.model_dump_json()))
            continue
        what = (
            f"could not start: {notice.problem}"
            if notice.problem
            else f"run {notice.run_id} waits for a person: {notice.waits}"
            if notice.waits
            else notice.task
        )
        click.echo(f"{local_iso(notice.slot_ms, 0)}  {one_line(notice.schedule)}  {cut_text(what)}")
    if not found and not as_json:
        click.echo("no notifications")


# --- output ----------------------------------------------------------------------------------


def find_schedule(name: str) -> Schedule:
    with schedule_errors():
        found = current_relay().scheduling.get(name)
    if found is None:
        raise click.ClickException(f"no schedule named {name!r}")
    return found


def _unattended(
    tz: str | None,
    offset: int,
    *,
    overlap: str | None,
    approve: str | None,
    on_wait: str | None,
    policy: str | None,
    catch_up: str | None,
    jitter: str | None,
    end: str | None,
) -> dict[str, Any]:
    """The schedule's fields from `add`'s options for running unattended.

    Raises:
        RelayError: a policy, duration or time that is not one.
    """
    return {
        "overlap": overlap,
        "approve_plan": approve == "plan",
        "on_wait": on_wait,
        "ask": None if policy is None else parse_policy(policy),
        "catch_up_ms": None if catch_up is None else parse_duration(catch_up, "--catch-up"),
        "jitter_ms": 0 if jitter is None else parse_duration(jitter, "--jitter"),
        "end_ms": None if end is None else parse_time(end, tz, offset, "--end"),
    }


def _next_row(found: Schedule) -> str:
    shown = found.next_text()
    return shown if shown in ("paused", "ended") else f"{shown}  ({utc_text(found.fire_at_ms)})"


def _last_row(found: Schedule) -> tuple[str, str]:
    """When the schedule last started a run (notified, for a notify-only one), from its
    history: `last_run_ms` is where its next slot is counted from (when it was made,
    resumed or last claimed a slot, skipped ones too), not a run."""
    notify = found.mode == "notify"
    label = "notified" if notify else "last run"  # the labels fit the column of `show`
    with schedule_errors():
        entry, looked = current_relay().scheduling.last(
            found.name, "notified" if notify else "fired"
        )
    if entry is None:
        return label, "never" if looked < HISTORY_MAX else f"not in its last {looked} firings"
    when = f"{found.local_time(entry.slot_ms)} ({utc_text(entry.slot_ms)})"
    return label, when if entry.run_id is None else f"{when}, run {entry.run_id}"


def _running_rows(found: Schedule) -> list[tuple[str, str]]:
    """The rows of `show` that say how the schedule runs unattended."""
    rows = [("overlap", found.overlap), ("decides", _decides(found))]
    if found.catch_up_ms:
        rows.append(("catch-up", _duration(found.catch_up_ms)))
    if found.jitter_ms:
        mine = _duration(found.jitter_offset_ms)
        rows.append(("jitter", f"{_duration(found.jitter_ms)} (this schedule: +{mine})"))
    if found.end_ms is not None:
        rows.append(("end", found.local_time(found.end_ms)))
    if found.paused:
        rows.append(("paused", found.pause_note or "yes"))
    return rows


def _decides(found: Schedule) -> str:
    asks = (
        "the app's policy"
        if found.ask is None
        else f"asks for {', '.join(found.ask) or 'money only'}"
    )
    plan = "plan approved by the schedule" if found.approve_plan else "plan asks a person"
    waits = {"wait": "", "notify": "; notifies when a run waits", "skip": "; never waits"}
    return f"{plan}; {asks}{waits[found.on_wait]} (money always asks)"


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms / 1000:g}s"


_DURATION = re.compile(r"([0-9]{1,9})([smhd])")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, option: str) -> int:
    """Return a duration such as `90s`, `30m`, `2h` or `1d` in ms.

    Raises:
        RelayError: it is not one.
    """
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise RelayError(f"{option} takes a duration such as 30m, 2h or 1d, not {text!r}")
    return int(found.group(1)) * _UNIT_MS[found.group(2)]


def parse_policy(text: str) -> list[str]:
    """Return the risks that ask, from `trusting`, `cautious` or risks joined by commas.

    Raises:
        RelayError: a word is neither.
    """
    named = {"trusting": Policy.TRUSTING, "cautious": Policy.CAUTIOUS}
    if text in named:
        return sorted(risk.value for risk in named[text].ask)
    risks = [part.strip() for part in text.split(",") if part.strip()]
    known = {risk.value for risk in Risk}
    unknown = [risk for risk in risks if risk not in known]
    if unknown:
        risks_known = ", ".join(sorted(known))
        raise RelayError(
            f"--policy is trusting, cautious or risks from {risks_known}; not {unknown[0]!r}"
        )
    return risks


def parse_time(text: str, tz: str | None, offset_minutes: int, option: str) -> int:
    """Return an ISO 8601 time as UTC ms: with its own offset if it has one, else on the
    schedule's clock (its zone, else its fixed offset).

    Raises:
        RelayError: it is not a time.
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RelayError(f"{option} takes a time such as 2026-12-24T18:00, not {text!r}") from None
    if when.tzinfo is None:
        where = calendar.zone(tz) if tz else timezone(timedelta(minutes=offset_minutes))
        when = when.replace(tzinfo=where)
    return int(when.timestamp() * 1000)


def utc_text(ms: int) -> str:
    return local_iso(ms, 0).removesuffix("+00:00") + "Z"


def cut_text(text: str) -> str:
    return one_line(text, _TASK_SHOWN)


def text_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
