"""The tick: everything the beat does every few seconds, with the clock passed in."""

from __future__ import annotations

from typing import Protocol

__all__ = ["TickHost", "tick"]


class TickHost(Protocol):
    """What the tick needs from a Relay."""

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals."""
        ...


def tick(relay: TickHost, now_ms: int) -> list[str]:
    """Do the tick's duties at `now_ms`; return the ids of runs it started."""
    relay.heal(now_ms)
    return []
