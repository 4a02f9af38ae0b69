"""The Lua scripts that make each multi-key change to Redis atomic, and what they answer.

Each script lives in `workers/store/lua/<name>.lua`, headed by its keys, arguments and
answers; `workers.store.runs.RunStore` is their only caller. Their answers are words
(`claimed`, `fenced`, ...), read back here into the enums below, so no 1/0/-1
leaks into the code that acts on them. `workers.store.layout` maps the keys and
fields they touch.
"""

from __future__ import annotations

from enum import StrEnum
from importlib.resources import files

__all__ = ["ClaimStatus", "Decided", "Recorded", "Saved", "lua"]


def lua(name: str) -> str:
    """Return the source of the script `workers/store/lua/<name>.lua`."""
    return files("workers.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


class ClaimStatus(StrEnum):
    """What CLAIM found."""

    CLAIMED = "claimed"
    """The lease is ours: make the call."""
    GONE = "gone"
    """There is no such run."""
    DONE = "done"
    """The call's outcome is recorded already: only the run needs advancing."""
    REFUSED = "refused"
    """The run's record does not call for it: a forged, replayed or early message."""
    BUSY = "busy"
    """Another worker holds the call's lease."""


class Saved(StrEnum):
    """What SAVE did."""

    SAVED = "saved"
    STALE = "stale"
    """Someone saved first: reload and try again."""
    DUPLICATE = "duplicate"
    """The call saving its own outcome finds it recorded already."""
    FENCED = "fenced"
    """The call saving its own outcome lost it to a later attempt."""


class Recorded(StrEnum):
    """What RECORD did."""

    ADVANCE = "advance"
    """Recorded, and the run should advance now."""
    WAITING = "waiting"
    """Recorded; other calls of the batch are still out."""
    DUPLICATE = "duplicate"
    """It was recorded before."""
    FENCED = "fenced"
    """Another attempt took the call over: this outcome is not taken."""
    GONE = "gone"
    """There is no such run."""


class Decided(StrEnum):
    """What DECIDE did."""

    APPLIED = "applied"
    EXPIRED = "expired"
    """Too late: the entry's time ran out, and the expiry was applied instead."""
    DECIDED = "decided"
    """Decided already."""
    NOT_PENDING = "not_pending"
    GONE = "gone"
