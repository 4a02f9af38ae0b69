"""A schedule: a recipe, the values that fill it, a trigger, and when it last ran.

    schedule = Schedule.create(
        "monthly-spend", recipe, {"month": "last month", "limit": "50,000"},
        Daily(hour=9), utc_offset_minutes=420, now_ms=now,
    )
    schedule.next_due_ms           # the next slot, UTC ms
    schedule.task()                # the filled recipe

Plain, frozen data that round-trips through JSON (`model_dump_json` /
`model_validate_json`; the computed `next_due_ms` is written out for readers
and ignored when read back). A schedule's first `last_run_ms` is when it was
made, so a daily 09:00 made at 10:00 first fires tomorrow.

After a slot fires, `fired(slot, now)` is the schedule to store: its
`last_run_ms` is the slot itself while the slot after it is still ahead (so
`Every(m)` keeps its rhythm however late a tick comes), and `now` when even the
slot after it has passed (everything was down: the missed slots fire once, not
once per slot).

A `Daily`, `Weekly` or `Cron` trigger may name an IANA zone (`tz`); then the
zone's rules, not `utc_offset_minutes`, say when it fires (`scheduler.calendar`
does every computation of a firing here, with or without a zone), and the zone
must be one the zone data knows, both when the schedule is made and when it is
read back: a stored schedule with an unknown zone, or one that cannot say when
it fires next, does not load (the store logs it and never fires it).

What a schedule holds is bounded when it is made (`create`): its template (at most
MAX_TEMPLATE_CHARS), each value (MAX_VALUE_CHARS), the task they fill (MAX_TASK_CHARS,
the most a run takes, so no firing fails for its size) and its stored text
(MAX_STORED_CHARS: the recipe's params and help, and every value, together). A schedule
stored before these bounds still loads, so it can be shown and removed; a firing it
cannot start is recorded as failed, with its reason.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    computed_field,
    model_validator,
)

from agent_core.errors import DefinitionError
from agent_core.recipes import Recipe
from agent_core.tools import Policy, Risk, check_name
from agent_core.triggers import MAX_UTC_OFFSET_MINUTES, Cron, Daily, Every, Trigger, Weekly
from scheduler import calendar
from scheduler.errors import SchedulerError

__all__ = [
    "MAX_STORED_CHARS",
    "MAX_TASK_CHARS",
    "MAX_TEMPLATE_CHARS",
    "MAX_VALUE_CHARS",
    "MODES",
    "NEVER_MS",
    "ON_WAITS",
    "OVERLAPS",
    "Mode",
    "OnWait",
    "Overlap",
    "Schedule",
    "format_offset",
    "local_iso",
]

Mode = Literal["run", "notify"]
MODES: tuple[Mode, ...] = ("run", "notify")
Overlap = Literal["skip", "buffer_one", "allow_all", "cancel_previous"]
OnWait = Literal["wait", "notify", "skip"]
ON_WAITS: tuple[OnWait, ...] = ("wait", "notify", "skip")
OVERLAPS: tuple[Overlap, ...] = ("skip", "buffer_one", "allow_all", "cancel_previous")
NEVER_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z: where a paused or ended schedule sits in the due index."""
MAX_WINDOW_MS = 366 * 24 * 60 * 60 * 1000
"""The longest catch-up window and jitter: a leap year."""
RISK_NAMES = frozenset(risk.value for risk in Risk)
MAX_TEMPLATE_CHARS = 50_000
"""The longest template a schedule takes (characters)."""
MAX_VALUE_CHARS = 10_000
"""The longest value of one blank (characters)."""
MAX_TASK_CHARS = 100_000
"""The longest filled task: the most a run's task may be (workers.client.start says the
same; a test holds them equal), so a schedule never fires a task no run can take."""
MAX_STORED_CHARS = 250_000
"""The longest a schedule is as stored (its JSON): the tick reads every due one."""


class Schedule(BaseModel):
    """A recurring recipe; build one with `Schedule.create` for clear errors.

    `tools` is None for every registered tool, or the names the runs may use:
    the recipe's `only_tools` list, or fewer, never more. `mode` "run" starts a
    run at each slot; "notify" only records a notification.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    recipe: Recipe
    values: dict[str, str]
    trigger: Trigger
    utc_offset_minutes: int = Field(
        default=0, strict=True, ge=-MAX_UTC_OFFSET_MINUTES, le=MAX_UTC_OFFSET_MINUTES
    )
    tools: tuple[str, ...] | None = None
    mode: Mode = "run"
    budget: dict[str, int | float] | None = None
    """What each run may spend (the fields of `workers.Budget`), as plain data."""
    created_ms: int = Field(strict=True, ge=0)
    last_run_ms: int = Field(strict=True, ge=0)
    overlap: Overlap = "skip"
    """What a firing does while a run this schedule started is still running or waiting."""
    approve_plan: bool = False
    """Its runs' plans are approved by the schedule, not a person (calls still ask)."""
    on_wait: OnWait = "wait"
    """When a run would wait for a person: wait; wait and record a notification; or skip
    (a call is declined, a question answered that nobody is there, a plan declined).
    A MONEY call always waits."""
    ask: tuple[str, ...] | None = None
    """The risks whose calls ask a person (a Policy's `ask`); None: the app's policy.
    MONEY always asks, whatever this says."""
    catch_up_ms: int | None = Field(default=None, strict=True, ge=60_000, le=MAX_WINDOW_MS)
    """A firing later than this after its time is recorded as missed, not started."""
    jitter_ms: int = Field(default=0, strict=True, ge=0, le=MAX_WINDOW_MS)
    """Each firing comes this much later at most: a fixed delay of the schedule's own."""
    end_ms: int | None = Field(default=None, strict=True, ge=0)
    """No firing after this time."""
    paused: bool = False
    pause_note: str = Field(default="", max_length=500)

    @classmethod
    def create(
        cls,
        name: str,
        recipe: Recipe,
        values: Mapping[str, str],
        trigger: Trigger,
        utc_offset_minutes: int = 0,
        *,
        mode: Mode = "run",
        budget: Mapping[str, int | float] | None = None,
        now_ms: int,
        **options: Any,
    ) -> Schedule:
        """Return a new schedule made at `now_ms` (its first `last_run_ms`).

        Raises:
            DefinitionError: the name is not a usable identifier (letters,
                digits, `_`, `-`; at most 64), the recipe or trigger is not one,
                it is over a size bound (MAX_TEMPLATE_CHARS and the others, named),
                the trigger's zone is unknown ("unknown time zone ..."), the
                offset is not a whole number of minutes from -840 to 840 (or is
                given with a zone), `now_ms` is not a time, or the mode is not
                "run" or "notify".
            RecipeError: `values` name a blank the recipe lacks, miss one it
                has, or hold something other than text.

        `options` are the other fields (`overlap`, `approve_plan`, `ask`,
        `catch_up_ms`, `jitter_ms`, `end_ms`); a bad one is a DefinitionError
        naming it.
        """
        check_name(name, "schedule")
        if not isinstance(recipe, Recipe):
            raise DefinitionError(f"schedule {name!r} needs an agent_core.Recipe")
        if not isinstance(trigger, Every | Daily | Weekly | Cron):
            raise DefinitionError(
                f"schedule {name!r} needs a trigger: Every, Daily, Weekly or Cron"
            )
        if mode not in MODES:
            raise DefinitionError(f"schedule {name!r}: mode is 'run' or 'notify', not {mode!r}")
        _check_sizes(name, recipe, values)  # before filling: a blank used 10,000 times is big
        recipe.fill(values)
        _check_firing(name, trigger, now_ms, utc_offset_minutes)
        try:
            made = cls(
                name=name,
                recipe=recipe,
                values=dict(values),
                trigger=trigger,
                utc_offset_minutes=utc_offset_minutes,
                tools=recipe.tool_names,
                mode=mode,
                budget=None if budget is None else dict(budget),
                created_ms=now_ms,
                last_run_ms=now_ms,
                **options,
            )
        except ValidationError as error:
            raise DefinitionError(f"schedule {name!r}: {first_error(error)}") from None
        _check_stored(made)
        return made

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        # `next_due_ms` is written out for readers; it is always recomputed.
        if isinstance(data, dict) and "next_due_ms" in data:
            return {k: v for k, v in data.items() if k != "next_due_ms"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Schedule:
        # Raised here, these become pydantic's ValidationError: this guards data
        # read back from Redis; `create` has already given the clear errors. The size
        # bounds are not checked here: a schedule stored before them still loads, so a
        # person can see it and remove it, and its firings say why they fail.
        check_name(self.name, "schedule")
        self.recipe.fill(self.values)
        # A zone someone wrote into Redis by hand may not exist: refuse it here, so the
        # store logs the schedule as unreadable and looks again later, instead of the
        # tick failing on it. (A cron with no firing left has ended: see next_due_ms.)
        _check_zone(self.name, self.trigger, self.utc_offset_minutes)
        if self.ask is not None and not set(self.ask) <= RISK_NAMES:
            raise DefinitionError(
                f"schedule {self.name!r}: ask names risks from {sorted(RISK_NAMES)}"
            )
        allowed = self.recipe.tool_names
        if self.tools is not None and allowed is not None and not set(self.tools) <= set(allowed):
            raise DefinitionError(f"schedule {self.name!r} lists tools its recipe does not allow")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def next_due_ms(self) -> int:
        """When the next slot comes, in UTC ms: it fires at the first tick at or after it.
        NEVER_MS when there is none within the search window (a cron such as
        `0 0 1 1 0` can wait 11 years after a firing): the schedule has ended."""
        return _next_or_never(self.trigger, self.last_run_ms, self.utc_offset_minutes)

    @property
    def jitter_offset_ms(self) -> int:
        """How much later than its time each firing comes: fixed per schedule name, below
        `jitter_ms`, so a thousand 09:00 schedules spread over the window the same way
        every day (and every beat agrees)."""
        if self.jitter_ms == 0:
            return 0
        digest = hashlib.sha256(self.name.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.jitter_ms

    @property
    def fire_at_ms(self) -> int:
        """When the next firing happens: the slot plus the jitter, or NEVER_MS while
        paused or once the next slot lies past `end_ms`."""
        slot = self.next_due_ms
        ended = slot == NEVER_MS or (self.end_ms is not None and slot > self.end_ms)
        if self.paused or ended:
            return NEVER_MS
        return slot + self.jitter_offset_ms

    @property
    def policy(self) -> Policy | None:
        """The policy its runs decide by, or None for the app's own."""
        return None if self.ask is None else Policy(ask=frozenset(Risk(r) for r in self.ask))

    @property
    def tz(self) -> str | None:
        """The IANA zone the trigger names, or None: the fixed `utc_offset_minutes` applies."""
        return None if isinstance(self.trigger, Every) else self.trigger.tz

    @property
    def time_zone(self) -> str:
        """Whose clock the trigger reads: the zone's name, or the offset as `UTC+05:45`."""
        return self.tz or f"UTC{format_offset(self.utc_offset_minutes)}"

    def task(self) -> str:
        """Return the recipe filled with the schedule's values: the task of each run."""
        return self.recipe.fill(self.values)

    def due(self, now_ms: int) -> bool:
        """Return whether a firing has come by `now_ms` (a missed slot counts; never
        while paused or past the end)."""
        return now_ms >= self.fire_at_ms

    def fired(self, slot_ms: int, now_ms: int) -> Schedule:
        """Return this schedule as it is once `slot_ms` fired at `now_ms`."""
        following = _next_or_never(self.trigger, slot_ms, self.utc_offset_minutes)
        last = slot_ms if following > now_ms else now_ms
        return self.model_copy(update={"last_run_ms": max(last, self.last_run_ms)})

    def upcoming(self, count: int) -> list[int]:
        """Return the next `count` slots (UTC ms) if every one fires on time.

        Raises:
            DefinitionError: `count` is not from 1 to 1000.
        """
        # The first firing after the last run is `next_due_ms`; the rest follow it.
        return calendar.preview(
            self.trigger, self.last_run_ms, count, utc_offset_minutes=self.utc_offset_minutes
        )

    def describe(self) -> str:
        """Return a short phrase such as "daily at 09:00 (UTC+07:00)" or
        "daily at 09:00 (Europe/Berlin)"."""
        if isinstance(self.trigger, Every) or self.tz is not None:
            # `Every` reads no clock; a zoned trigger names its zone itself.
            return self.trigger.describe()
        return f"{self.trigger.describe()} (UTC{format_offset(self.utc_offset_minutes)})"

    def next_text(self) -> str:
        """When it fires next on its own clock (jitter included), or "paused" / "ended"."""
        if self.paused:
            return "paused"
        at = self.fire_at_ms
        return "ended" if at == NEVER_MS else self.local_time(at)

    def local_time(self, ms: int) -> str:
        """Return UTC ms as ISO 8601 on the schedule's own clock (its zone, else its offset)."""
        return local_iso(ms, self.utc_offset_minutes, self.tz)


def _next_or_never(trigger: Trigger, after_ms: int, utc_offset_minutes: int) -> int:
    try:
        return calendar.next_fire(trigger, after_ms, utc_offset_minutes=utc_offset_minutes)
    except DefinitionError:  # no firing within the search window, or before the year 10000
        return NEVER_MS


def _check_sizes(name: str, recipe: Recipe, values: Mapping[str, str]) -> None:
    """Check the template, each value and the task they fill against their bounds.

    Raises:
        DefinitionError: one is over its bound; the message names the bound.
    """
    template = recipe.template
    if len(template) > MAX_TEMPLATE_CHARS:
        raise DefinitionError(
            f"schedule {name!r}: its template is {len(template):,} characters;"
            f" a template is at most {MAX_TEMPLATE_CHARS:,}"
        )
    if not isinstance(values, Mapping):
        return  # `fill` says so
    for blank, value in values.items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            raise DefinitionError(
                f"schedule {name!r}: the value of {str(blank)[:64]!r} is {len(value):,}"
                f" characters; a value is at most {MAX_VALUE_CHARS:,}"
            )
    filled = _filled_chars(template, values)
    if filled > MAX_TASK_CHARS:
        raise DefinitionError(
            f"schedule {name!r}: its template filled with its values is {filled:,}"
            f" characters; a run's task is at most {MAX_TASK_CHARS:,}"
        )


def _check_stored(made: Schedule) -> None:
    """Check the schedule as stored against MAX_STORED_CHARS (the tick reads each due one).

    Raises:
        DefinitionError: it is over; the message names the bound.
    """
    stored = len(made.model_dump_json())
    if stored > MAX_STORED_CHARS:
        raise DefinitionError(
            f"schedule {made.name!r} is {stored:,} characters as stored (its recipe's params"
            f" and help, and its values); a schedule is at most {MAX_STORED_CHARS:,}"
        )


def _filled_chars(template: str, values: Mapping[str, str]) -> int:
    """How long the filled task is, counted without building it.

    A recipe's template is Python's format syntax restricted to `{name}` blanks and
    doubled braces (agent_core.recipes), so `string.Formatter` splits it the same way.
    A blank without a text value counts nothing: `fill` refuses it by name.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:  # a template no Recipe allows; `fill` says what is wrong
        return 0
    total = 0
    for literal, blank, _, _ in parts:
        total += len(literal)
        value = values.get(blank) if blank is not None else None
        total += len(value) if isinstance(value, str) else 0
    return total


def _check_zone(name: str, trigger: Trigger, utc_offset_minutes: int) -> None:
    """Check that the trigger's zone is one the zone data knows, and comes without an offset.

    Raises:
        DefinitionError: it is not, or it does not.
    """
    tz = None if isinstance(trigger, Every) else trigger.tz
    if tz is None:
        return
    try:
        calendar.zone(tz)
    except SchedulerError as error:
        raise DefinitionError(f"schedule {name!r}: {error}") from None
    if utc_offset_minutes != 0:
        # The zone would silently win; an offset given with it is a mistake.
        raise DefinitionError(
            f"schedule {name!r}: a trigger in a time zone ({tz}) takes no utc_offset_minutes"
        )


def _check_firing(name: str, trigger: Trigger, after_ms: int, utc_offset_minutes: int) -> None:
    """Check that `trigger` can say when it next fires after `after_ms` in its zone
    (or at the offset).

    Raises:
        DefinitionError: the zone is unknown, an offset is given with a zone, or as
            `calendar.next_fire` (a bad offset or time, with the trigger's own messages).
    """
    try:
        calendar.next_fire(trigger, after_ms, utc_offset_minutes=utc_offset_minutes)
    except SchedulerError as error:
        # Making a schedule reports DefinitionError, whatever part of it is wrong.
        raise DefinitionError(f"schedule {name!r}: {error}") from None
    _check_zone(name, trigger, utc_offset_minutes)


def first_error(error: ValidationError) -> str:
    """One line naming what is wrong: pydantic's own text runs over several lines with a URL."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def format_offset(minutes: int) -> str:
    """Return a UTC offset in minutes as `+05:45` / `-07:00` / `+00:00`."""
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{rest:02d}"


def local_iso(ms: int, utc_offset_minutes: int, tz: str | None = None) -> str:
    """Return UTC ms as ISO 8601 local time with its offset, e.g. `2025-03-01T09:00:00+05:45`:
    in zone `tz` (with the offset it has at that instant) if given, else at the fixed offset.

    Raises:
        SchedulerError: `tz` is not a zone the zone data knows.
    """
    where: tzinfo = (
        timezone(timedelta(minutes=utc_offset_minutes)) if tz is None else calendar.zone(tz)
    )
    return datetime.fromtimestamp(ms / 1000, tz=where).isoformat(timespec="seconds")
