"""An agent's snapshot as Relay stores it: a small head, its start and its history apart.

The snapshot `agent_core` writes is one JSON document whose state holds the
history the model sees. Stored whole, every step would rewrite the whole history
(bytes per step growing with it). So a run keeps the head (the snapshot without
`state.history`) in its hash and the entries in a list (`hist:<id>`, see
`workers.store.layout`): a step appends the entries it added and drops those the core
trimmed from the front; anything else (rare) rewrites the list.

What the start set (the task, its context and attachments: `Agent.snapshot_start`)
never changes after, and a task can be long: it is stored once (`start` in the run's
hash) and the head a step writes leaves it out. A head from before (or one `split`
kept whole) still holds it, and its own fields win. The agent's loop counters (up
to 64 digests, most of a long turn's head) change only when a step counts a call:
they are kept apart too (`lp`), written by the steps that change them, and a head
that holds them (written before, or whole) has the last word likewise.

`join` puts a head, its start and its entries back into the snapshot text
`Agent.restore` reads (and validates); `split` takes any snapshot text apart
(creating a run, or a save that only has the text); `write` works out what a step
changes, from the entries as stored and the advanced agent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel

from agent_core import Agent
from agent_core.state import FORMAT, START_FIELDS, Loops
from workers.engine.effects import SnapshotWrite

__all__ = ["join", "split", "stored_start", "write"]

_HISTORY = ',"history":['
_STATE = '"state":{'


def join(
    head: str, entries: Sequence[str], start: str = "", loops: str = "", task: str | None = None
) -> str:
    """Return the snapshot text of a head, its `start` and its `loops` (JSON objects of
    state fields; '' for a head that holds them) and its history entries (not validated
    here: `Agent.restore` does). A head with none of them is the snapshot as it is.

    `task` is the run record's task, for a head without its start: the agent's, unless
    `start` says otherwise (a start is stored without the task when the two are the
    same, see `split`, and not at all when nothing else is left: '')."""
    if head.startswith(_UNTAGGED):  # (a head as `untagged` stores it)
        head = _TAGGED + head[1:]
    task_field = "" if task is None else f'"task":{_compact(task)}'
    fields = ",".join(p for p in (task_field, start[1:-1], loops[1:-1]) if len(p) > 0)
    at = head.find(_STATE) + len(_STATE) if fields else -1
    if at >= len(_STATE):
        # The start's fields go in first: a head that holds them too (written before
        # they were apart) has the last word, as the JSON reader keeps the last.
        rest = head[at:]
        head = f"{head[:at]}{fields}{'' if rest.startswith('}') else ','}{rest}"
    if not entries:
        return head
    # The head ends with the state's closing brace and the snapshot's: the history
    # goes in as the state's last field (pydantic reads fields in any order).
    return f"{head[:-2]}{_HISTORY}{','.join(entries)}]}}}}"


def split(
    snapshot: str, *, start_apart: bool = False, task: str | None = None
) -> tuple[str, list[str], str]:
    """Return (head, history entries, start) of a snapshot text: with `start_apart`, the
    start's fields are taken out of the head into `start` (else it is ''). Text that is
    not a snapshot is all head (the restore that reads it says what is wrong).

    The start leaves out its fields at their default, and the task when it is `task`
    (the run record's, which `join` is given back): a parked run is mostly its hash,
    and the task was in it twice."""
    try:
        document = json.loads(snapshot)
        state = document["state"]
        history = state.pop("history", [])
    except (ValueError, TypeError, KeyError, AttributeError):
        return snapshot, [], ""
    if not isinstance(history, list):
        return snapshot, [], ""
    entries = [_compact(entry) for entry in history]
    if not start_apart:
        return untagged(_compact(document)), entries, ""
    start = {name: state.pop(name) for name in START_FIELDS if name in state}
    return untagged(_compact(document)), entries, stored_start(start, task)


_TAGGED = f'{{"format":{json.dumps(FORMAT)},'
_UNTAGGED = '{"version":'


def untagged(head: str) -> str:
    """A head as stored: without its format tag, the same ~25 bytes in every head a step
    writes (a parked run is mostly its hash); `join` puts it back, and `Agent.restore`
    checks it as ever. Text that does not begin with the tag is kept as it is."""
    return "{" + head[len(_TAGGED) :] if head.startswith(_TAGGED + '"version":') else head


def stored_start(start: dict[str, object], task: str | None) -> str:
    """The start as stored (see `split`): JSON of its fields, without those at their
    default, and without the task when it is `task` (but with it when it is not, even
    empty, so `join` does not put the record's in its place)."""
    kept = {k: v for k, v in start.items() if k != "task" and v not in ("", [])}
    if start.get("task", "") != task:
        kept = {"task": start.get("task", ""), **kept}
    return _compact(kept)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def write(
    stored: tuple[BaseModel, ...] | None, agent: Agent, loops: Loops | None = None
) -> SnapshotWrite:
    """Return what saving `agent` changes, given the entries the store holds (the
    agent's history as it was loaded; None for a run still stored whole: the list is
    written from scratch, and the whole snapshot dropped) and its loop counters as
    stored (None when they are not stored apart yet: they are written).

    Entries are matched by identity: the core keeps an entry it does not drop as
    the same object, and only appends new ones or drops the oldest. So are the loop
    counters: written only when the step counted something (once a turn or so).
    """
    head = untagged(agent.snapshot_head(without_start=True, without_loops=True))
    counted = "" if loops is agent.loops() else agent.snapshot_loops()
    now, kept = agent.history(), agent.copy()
    if stored is None:
        return SnapshotWrite(head, _texts(now), rewrite=True, agent=kept, loops=counted)
    drop = _dropped(stored, now)
    if drop is None:
        return SnapshotWrite(head, _texts(now), rewrite=True, agent=kept, loops=counted)
    append = _texts(now[len(stored) - drop :])
    return SnapshotWrite(head, append, drop=drop, agent=kept, loops=counted)


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
