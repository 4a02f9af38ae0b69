"""Errors of the scheduler.

    SchedulerError
    └── StoreUnreachable   the store a TickHost keeps its runs in cannot be reached

A schedule that cannot be made is `agent_core.DefinitionError` (a recipe or a
trigger that cannot exist), like every other definition.
"""

from __future__ import annotations

__all__ = ["SchedulerError", "StoreUnreachable"]


class SchedulerError(Exception):
    """Raised for errors of the scheduler; the root of its tree."""


class StoreUnreachable(SchedulerError):
    """Raised by a TickHost when its store cannot be reached: the tick stops, the slot it
    was firing stays firing, and a later tick starts its run."""
