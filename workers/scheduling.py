"""The Relay side of recurring recipes: `schedule`, `schedules`, `unschedule` (see scheduler/)."""

from __future__ import annotations

__all__ = ["Scheduling"]


class Scheduling:
    """Mixed into `workers.Relay`: the schedule methods of the client API."""
