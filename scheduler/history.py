"""What happened at each firing of a schedule, kept per schedule, newest first.

A `Firing` is written in the same script step that claims the slot (or takes a
queued firing, or pauses the schedule), so the history never says a slot fired
that did not, nor misses one that did. The runs' outcomes are not kept here:
the client reads them from the runs when it shows the history.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["HISTORY_MAX", "Firing", "FiringKind", "Source"]

HISTORY_MAX = 200
"""Entries kept per schedule, the newest."""

FiringKind = Literal["fired", "notified", "skipped", "buffered", "missed", "paused", "resumed"]
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
    """The run it started (`fired`), or would start (`buffered`)."""
    why: str = Field(default="", max_length=2_000)
