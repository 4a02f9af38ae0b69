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
    relay schedule rm standup
    relay schedule notifications

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
from pathlib import Path
from typing import Literal

import click
from pydantic import ValidationError

from agent_core import Cron, Daily, Every, Recipe, Trigger, Weekly
from agent_core.errors import AgentError
from agent_core.triggers import DAY_NAMES, MAX_UTC_OFFSET_MINUTES
from scheduler import Schedule, SchedulerError, calendar
from scheduler.schedules import local_iso
from workers.cli.budget import budget_from, budget_options
from workers.cli.terminal import json_text, one_line
from workers.errors import RelayError
from workers.relay import Relay

__all__ = ["parse_offset", "schedule"]

_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})")
_OFFSET = re.compile(r"([+-])([0-9]{1,2})(?::?([0-9]{2}))?")
_TASK_SHOWN = 60


def _one_line(error: BaseException) -> str:
    if isinstance(error, ValidationError):
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        text = f"{where}: {first['msg']}" if where else first["msg"]
    else:
        text = str(error)
    return one_line(text)


@contextmanager
def _errors() -> Iterator[None]:
    """Turn what a user can get wrong (and an unreachable Redis) into one line and exit 1."""
    try:
        yield
    except (AgentError, RelayError, SchedulerError, ValidationError, OSError) as error:
        raise click.ClickException(_one_line(error)) from None


def _relay() -> Relay:
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
    """Recurring recipes: a task with blanks, filled and fired on a trigger by the beat."""


@schedule.command("add")
@click.argument("name")
@click.option(
    "--recipe-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A recipe as JSON (as Recipe.model_dump_json writes it).",
)
@click.option("--template", help="The task with {blanks}; the recipe is named after the schedule.")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME[=HELP]",
    help="Declare a blank (with --template; default: every blank the template uses).",
)
@click.option("--value", "-v", "values", multiple=True, metavar="NAME=TEXT", help="Fill a blank.")
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
) -> None:
    """Add a schedule, or replace the one named NAME."""
    offset = _offset(utc_offset, tz)
    with _errors():
        trigger = _trigger(every, daily, weekly, cron, tz)
        recipe = _recipe(name, recipe_file, template, params, tools)
        filled = _pairs(values, "--value", need_value=True)
        relay = _relay()
        existed = any(s.name == name for s in relay.schedules())
        budget = budget_from(budget_tokens, budget_usd, budget_calls, deadline)
        mode: Literal["run", "notify"] = "notify" if notify else "run"
        made = relay.schedule(name, recipe, filled, trigger, offset, mode=mode, budget=budget)
    verb = "replaced" if existed else "scheduled"
    click.echo(one_line(f"{verb} {made.name}: {made.describe()}, next at {_next(made)}"))


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_(*, as_json: bool) -> None:
    """List the schedules with their next due times."""
    with _errors():
        found = _relay().schedules()
    if as_json:
        click.echo(json_text(json.dumps([s.model_dump(mode="json") for s in found], indent=2)))
        return
    if not found:
        click.echo("no schedules")
        return
    rows: list[tuple[str, ...]] = [("NAME", "WHEN", "MODE", "NEXT", "TASK")]
    rows += [
        (one_line(s.name), one_line(s.describe()), s.mode, _next(s), _cut(s.task())) for s in found
    ]
    click.echo(_table(rows))


@schedule.command("rm")
@click.argument("name")
def rm(name: str) -> None:
    """Remove a schedule (and the notes its runs kept)."""
    with _errors():
        removed = _relay().unschedule(name)
    if not removed:
        raise click.ClickException(f"no schedule named {name!r}")
    click.echo(f"removed {one_line(name)}")


@schedule.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the stored schedule as JSON.")
def show(name: str, *, as_json: bool) -> None:
    """Show one schedule: its trigger, zone or offset, next firing and task."""
    found = _find(name)
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
        ("next", f"{_next(found)}  ({_utc(found.next_due_ms)})"),
        ("last run", _utc(found.last_run_ms)),
        ("tools", "all" if found.tools is None else ", ".join(found.tools) or "none"),
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
    found = _find(name)
    with _errors():
        slots = found.upcoming(count)
    if as_json:
        firings = [{"ms": s, "local": found.local_time(s), "utc": _utc(s)} for s in slots]
        shown = {"schedule": found.name, "time_zone": found.time_zone, "firings": firings}
        click.echo(json_text(json.dumps(shown, indent=2)))
        return
    for slot in slots:
        click.echo(f"{found.local_time(slot)}  {_utc(slot)}")


@schedule.command("notifications")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of text.")
def notifications(*, limit: int, as_json: bool) -> None:
    """Show what notify-only schedules recorded (and runs that could not start), newest first."""
    with _errors():
        found = _relay().notifications(limit)
    for notice in found:
        if as_json:
            click.echo(json_text(notice.model_dump_json()))
            continue
        what = f"could not start: {notice.problem}" if notice.problem else notice.task
        click.echo(f"{local_iso(notice.slot_ms, 0)}  {one_line(notice.schedule)}  {_cut(what)}")
    if not found and not as_json:
        click.echo("no notifications")


# --- output ----------------------------------------------------------------------------------


def _find(name: str) -> Schedule:
    with _errors():
        found = next((s for s in _relay().schedules() if s.name == name), None)
    if found is None:
        raise click.ClickException(f"no schedule named {name!r}")
    return found


def _next(found: Schedule) -> str:
    return found.local_time(found.next_due_ms)


def _utc(ms: int) -> str:
    return local_iso(ms, 0).removesuffix("+00:00") + "Z"


def _cut(text: str) -> str:
    return one_line(text, _TASK_SHOWN)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
