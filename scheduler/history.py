"""What happened at each firing of a schedule, kept per schedule, newest first.

A `Firing` is written in the same script step that claims the slot (or takes a
queued firing, or pauses the schedule), so the history never says a slot fired
that did not, nor misses one that did. The runs' outcomes are not kept here:
the client reads them from the runs when it shows the history.

A firing whose run then cannot start (a tool unregistered since, a task no run takes)
has its `fired` entry replaced by a `failed` one (`ScheduleStore.failed`): no run, and
why, cut to WHY_MAX characters; never the task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["HISTORY_MAX", "WHY_MAX", "Firing", "FiringKind", "Source"]

HISTORY_MAX = 200
"""Entries kept per schedule, the newest."""
WHY_MAX = 2_000
"""The longest `why` an entry keeps (characters)."""

FiringKind = Literal[
    "fired", "failed", "notified", "skipped", "buffered", "missed", "paused", "resumed"
]
Source = Literal["schedule", "run now", "backfill", "buffer", "person"]
"""Who asked for the firing: the schedule's own time, `relay schedule run`, a backfill,
or a firing buffered by `buffer_one` until the run before it ended; a person pauses
and resumes."""


class Firing(BaseModel):
    """One entry of a schedule's history."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: FiringKind
    slot_ms: int
    """The firing's own time (when `paused`/`resumed`: when that happened)."""
    at_ms: int
    """When the tick (or the person) did it."""
    source: Source = "schedule"
    run_id: str | None = None
    """The run it started (`fired`), or would start (`buffered`); None when `failed`."""
    why: str = Field(default="", max_length=WHY_MAX)
