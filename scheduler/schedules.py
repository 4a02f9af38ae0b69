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
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
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
from agent_core.tools import check_name
from agent_core.triggers import MAX_UTC_OFFSET_MINUTES, Daily, Every, Trigger, Weekly

__all__ = ["MODES", "Mode", "Schedule", "format_offset", "local_iso"]

Mode = Literal["run", "notify"]
MODES: tuple[Mode, ...] = ("run", "notify")
MAX_PREVIEW = 1_000


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
    ) -> Schedule:
        """Return a new schedule made at `now_ms` (its first `last_run_ms`).

        Raises:
            DefinitionError: the name is not a usable identifier (letters,
                digits, `_`, `-`; at most 64), the recipe or trigger is not one,
                the offset is not a whole number of minutes from -840 to 840,
                `now_ms` is not a time, or the mode is not "run" or "notify".
            RecipeError: `values` name a blank the recipe lacks, miss one it
                has, or hold something other than text.
        """
        check_name(name, "schedule")
        if not isinstance(recipe, Recipe):
            raise DefinitionError(f"schedule {name!r} needs an agent_core.Recipe")
        if not isinstance(trigger, Every | Daily | Weekly):
            raise DefinitionError(f"schedule {name!r} needs a trigger: Every, Daily or Weekly")
        if mode not in MODES:
            raise DefinitionError(f"schedule {name!r}: mode is 'run' or 'notify', not {mode!r}")
        recipe.fill(values)
        # Checks the offset and the clock value with the trigger's own messages.
        trigger.next_after(now_ms, utc_offset_minutes)
        try:
            return cls(
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
            )
        except ValidationError as error:  # pragma: no cover - everything was checked above
            raise DefinitionError(f"schedule {name!r} cannot be made: {error}") from None

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
        # read back from Redis; `create` has already given the clear errors.
        check_name(self.name, "schedule")
        self.recipe.fill(self.values)
        allowed = self.recipe.tool_names
        if self.tools is not None and allowed is not None and not set(self.tools) <= set(allowed):
            raise DefinitionError(f"schedule {self.name!r} lists tools its recipe does not allow")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def next_due_ms(self) -> int:
        """When the next slot comes, in UTC ms: it fires at the first tick at or after it."""
        return self.trigger.next_after(self.last_run_ms, self.utc_offset_minutes)

    def task(self) -> str:
        """Return the recipe filled with the schedule's values: the task of each run."""
        return self.recipe.fill(self.values)

    def due(self, now_ms: int) -> bool:
        """Return whether a slot has come by `now_ms` (a missed slot counts)."""
        return now_ms >= self.next_due_ms

    def fired(self, slot_ms: int, now_ms: int) -> Schedule:
        """Return this schedule as it is once `slot_ms` fired at `now_ms`."""
        following = self.trigger.next_after(slot_ms, self.utc_offset_minutes)
        last = slot_ms if following > now_ms else now_ms
        return self.model_copy(update={"last_run_ms": max(last, self.last_run_ms)})

    def upcoming(self, count: int) -> list[int]:
        """Return the next `count` slots (UTC ms) if every one fires on time.

        Raises:
            DefinitionError: `count` is not from 1 to 1000.
        """
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PREVIEW:
            raise DefinitionError(f"a preview shows 1 to {MAX_PREVIEW} times, not {count!r}")
        slots = [self.next_due_ms]
        while len(slots) < count:
            slots.append(self.trigger.next_after(slots[-1], self.utc_offset_minutes))
        return slots

    def describe(self) -> str:
        """Return a short phrase such as "daily at 09:00 (UTC+07:00)"."""
        if isinstance(self.trigger, Every):
            return self.trigger.describe()
        return f"{self.trigger.describe()} (UTC{format_offset(self.utc_offset_minutes)})"


def format_offset(minutes: int) -> str:
    """Return a UTC offset in minutes as `+05:45` / `-07:00` / `+00:00`."""
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{rest:02d}"


def local_iso(ms: int, utc_offset_minutes: int) -> str:
    """Return UTC ms as ISO 8601 local time with its offset, e.g. `2025-03-01T09:00:00+05:45`."""
    zone = timezone(timedelta(minutes=utc_offset_minutes))
    return datetime.fromtimestamp(ms / 1000, tz=zone).isoformat(timespec="seconds")
