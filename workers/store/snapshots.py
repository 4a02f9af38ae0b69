"""An agent's snapshot as Relay stores it: a small head plus its history entries apart.

The snapshot `agent_core` writes is one JSON document whose state holds the
history the model sees. Stored whole, every step would rewrite the whole history
(bytes per step growing with it). So a run keeps the head (the snapshot without
`state.history`) in its hash and the entries in a list (`hist:<id>`, see
`workers.store.layout`): a step appends the entries it added and drops those the core
trimmed from the front; anything else (rare) rewrites the list.

`join` puts a head and its entries back into the snapshot text `Agent.restore`
reads (and validates); `split` takes any snapshot text apart (creating a run, or
a save that only has the text); `write` works out what a step changes, from the
entries as stored and the advanced agent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel

from agent_core import Agent
from workers.engine.effects import SnapshotWrite

__all__ = ["join", "split", "write"]

_HISTORY = ',"history":['


def join(head: str, entries: Sequence[str]) -> str:
    """Return the snapshot text of a head and its history entries (not validated here:
    `Agent.restore` does). A head with no entries is the snapshot as it is."""
    if not entries:
        return head
    # The head ends with the state's closing brace and the snapshot's: the history
    # goes in as the state's last field (pydantic reads fields in any order).
    return f"{head[:-2]}{_HISTORY}{','.join(entries)}]}}}}"


def split(snapshot: str) -> tuple[str, list[str]]:
    """Return (head, history entries) of a snapshot text; text that is not a snapshot
    with a history is all head (the restore that reads it says what is wrong)."""
    try:
        document = json.loads(snapshot)
        history = document["state"].pop("history")
    except (ValueError, TypeError, KeyError, AttributeError):
        return snapshot, []
    if not isinstance(history, list) or not history:
        return snapshot, []
    entries = [_compact(entry) for entry in history]
    return _compact(document), entries


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def write(stored: tuple[BaseModel, ...] | None, agent: Agent) -> SnapshotWrite:
    """Return what saving `agent` changes, given the entries the store holds (the
    agent's history as it was loaded; None for a run still stored whole: the list is
    written from scratch, and the whole snapshot dropped).

    Entries are matched by identity: the core keeps an entry it does not drop as
    the same object, and only appends new ones or drops the oldest.
    """
    head, now = agent.snapshot_head(), agent.history()
    kept = agent.copy()
    if stored is None:
        return SnapshotWrite(head, _texts(now), rewrite=True, agent=kept)
    drop = _dropped(stored, now)
    if drop is None:
        return SnapshotWrite(head, _texts(now), rewrite=True, agent=kept)
    return SnapshotWrite(head, _texts(now[len(stored) - drop :]), drop=drop, agent=kept)


def _dropped(stored: tuple[BaseModel, ...], now: tuple[BaseModel, ...]) -> int | None:
    """How many of the oldest stored entries `now` no longer has, if `now` is the rest
    of them plus new entries; None if the history changed otherwise."""
    first = next((i for i, entry in enumerate(stored) if now and entry is now[0]), len(stored))
    rest = stored[first:]
    if len(rest) > len(now) or any(a is not b for a, b in zip(rest, now, strict=False)):
        return None
    return first


def _texts(entries: Sequence[BaseModel]) -> tuple[str, ...]:
    return tuple(entry.model_dump_json() for entry in entries)
