"""How Relay's values are written to Redis and read back: the store's one serialiser.

Stored JSON leaves out what equals its default (a parked run costs less
memory). What comes back is validated: a record that cannot be read becomes a
`Loaded` with a problem (its run fails alone), an inbox entry that cannot be
read becomes None (skipped, with a trace line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import ValidationError

from agent_core import Agent
from workers.engine.effects import (
    Advanced,
    ChildRun,
    Delivery,
    KeptNotes,
    Message,
    OwnOutcome,
    Reservation,
    SnapshotWrite,
)
from workers.engine.events import InboxEvent, inbox_event
from workers.engine.ids import OutboxMember, pending_member, pending_parts
from workers.engine.records import FIXED_FIELDS, Pending, RunRecord, TraceEntry, Usage
from workers.store.layout import (
    NOTES_MAX,
    STREAM_IDLE_S,
    STREAM_KEEP_S,
    STREAM_MAX,
    STREAM_PARKED_S,
    Keys,
    RunFields,
)
from workers.store.snapshots import join, split, stored_start

__all__ = [
    "Loaded",
    "StoredRun",
    "as_int",
    "as_text",
    "claimable",
    "corrupt",
    "fixed_json",
    "inbox_of",
    "loaded",
    "notes_key",
    "pending_json",
    "pending_read",
    "record_json",
    "record_of",
    "record_text",
    "save_effects",
    "trace_entry",
    "trace_line",
    "usage_of",
    "whole",
]

NEVER_MS = 2**52
"""The expiry score of a pending entry that never expires."""


HISTORY_APART = b"2"
"""The `sf` of a run whose snapshot is stored as a head and a history list."""


class StoredRun(NamedTuple):
    """A run as LOAD (and a granted CLAIM) hands it back, raw (`codec.loaded` reads it)."""

    version: Any
    """'' (or nothing) when there is no such run."""
    record: Any
    form: Any
    snapshot: Any
    """The head, or the whole snapshot of a run stored before form 2; None when the
    caller keeps the agent of this version."""
    history: list[Any]
    inbox: list[Any]
    fixed: Any = b""
    """The record's fixed fields (`RunFields.FIXED`); empty for a run saved before they
    were kept apart, and when the caller keeps the agent of this version."""
    start: Any = b""
    """What the agent's start set (`RunFields.START`); empty as `fixed` is."""
    loops: Any = b""
    """The agent's loop counters (`RunFields.LOOPS`); empty as `fixed` is, and for a run
    whose counters are not stored apart yet."""


@dataclass(frozen=True)
class Loaded:
    """A run as read for advancing: record, snapshot, version and unapplied inbox."""

    version: str
    record: RunRecord | None
    """None when the stored record could not be read (`problem` says why)."""
    snapshot: str
    """The agent's snapshot text ('' when `hot` is set: it was not read)."""
    inbox: list[tuple[str, InboxEvent | None]]
    """Unapplied events in order; None where an entry could not be read."""
    problem: str = ""
    apart: bool = False
    """Whether the history is stored apart (False: a run stored whole, before `sf` 2;
    its next save writes it apart)."""
    hot: Agent | None = None
    """The agent in exactly this version's state, kept by this process (`store.hot_agents`)."""
    fixed_stored: bool = False
    """Whether the record's fixed fields and the agent's start are stored apart already
    (a save then leaves them); False for a run saved before they were, or one whose
    record is unreadable."""
    loops_stored: bool = False
    """Whether the agent's loop counters are stored apart already (a save then writes
    them only if its step changed them)."""

    def agent(self, restore: Callable[[RunRecord, str], Agent]) -> Agent:
        """Return the run's agent to advance: a copy of the hot one, else `restore`d
        from the snapshot (raising what `restore` raises). The record must be readable."""
        if self.hot is not None:
            return self.hot.copy()
        assert self.record is not None
        return restore(self.record, self.snapshot)


_FIXED = set(FIXED_FIELDS)  # (pydantic's include and exclude take a set)


def record_json(record: RunRecord) -> str:
    """The record's fields that a step may change (RunFields.RECORD)."""
    return record.model_dump_json(exclude_defaults=True, exclude=_FIXED)


def fixed_json(record: RunRecord) -> str:
    """The record's fields that never change (RunFields.FIXED), written once."""
    return record.model_dump_json(exclude_defaults=True, include=_FIXED)


def record_text(meta: bytes | str, fixed: bytes | str | None) -> bytes:
    """The whole record's JSON from its two stored parts (a run saved before the fixed
    fields were kept apart has them all in `meta`, and no `fixed`)."""
    changing = meta.encode() if isinstance(meta, str) else meta
    if not fixed:
        return changing
    kept = fixed.encode() if isinstance(fixed, str) else fixed
    # Both are JSON objects written by the codec: the fields of one, then the other's.
    # Anything else makes text the record's validation refuses (a corrupt record).
    if changing == b"{}":
        return kept
    return kept[:-1] + b"," + changing[1:]


def record_of(meta: bytes | str, fixed: bytes | str | None) -> RunRecord:
    """The record read from its two stored parts.

    Raises:
        ValidationError: they do not make a record.
    """
    return RunRecord.model_validate_json(record_text(meta, fixed))


def claimable(record: RunRecord) -> str:
    """What a claim may take of the run now (RunFields.DUE, where SAVE puts the version in
    front): "<seq>|<asked bytes>|<running tool calls, space-separated>", the seq empty
    when no model call is due (it is when the record asked for one at its current seq);
    nothing of a finished run."""
    if record.state == "finished":
        return "||"
    model = str(record.seq) if record.asked == record.seq else ""
    tools = " ".join(call for call, track in record.calls.items() if track.status == "running")
    return f"{model}|{record.asked_bytes}|{tools}"


def pending_json(pending: Pending) -> str:
    """A pending entry as `pending:data` keeps it under its member (`<run>|<kind>|<what>`):
    without what the member says (its run, kind, and call when there is one), nor the
    root when it is the run. A waiting run is mostly what it stores, and these were a
    third of this entry. A call-less entry says `"call_id":null`, so `pending_read` does
    not take its `what` (a seq) for a call."""
    left_out = {"kind", "run_id", "call_id"}
    if pending.root_id == pending.run_id:
        left_out.add("root_id")
    text = pending.model_dump_json(exclude_defaults=True, exclude=left_out)
    if pending.call_id is None:
        text = '{"call_id":null' + ("}" if text == "{}" else "," + text[1:])
    return text


def pending_read(member: bytes | str, value: bytes | str | None) -> Pending | None:
    """The pending entry stored under `member` (None if it is gone or cannot be read);
    an entry written before `pending_json` left the member's parts out is read as it is."""
    if value is None:
        return None
    try:
        data = json.loads(value)
        if isinstance(data, dict) and "run_id" not in data:
            run_id, kind, what = pending_parts(as_text(member))
            data |= {"run_id": run_id, "kind": kind}
            data.setdefault("root_id", run_id)
            data.setdefault("call_id", what)
        return Pending.model_validate(data)
    except (ValueError, ValidationError):
        return None


def trace_line(entry: TraceEntry, run_id: str) -> str:
    """A line as `run_id`'s trace keeps it: without the run when it is that one (the
    trace's key names it, and it was ~25 bytes of each line a step writes), and a task
    id that begins with the run's id without it (`tk`: the rest; ~20 bytes of each
    line a call writes)."""
    task = entry.data.get("task")
    if isinstance(task, str) and task.startswith(f"{run_id}:"):
        data = {k: v for k, v in entry.data.items() if k != "task"}
        data[_TASK_IN_RUN] = task[len(run_id) :]
        entry = entry.model_copy(update={"data": data})
    return entry.model_dump_json(
        exclude_defaults=True, exclude=_RUN if entry.run == run_id else None
    )


def trace_entry(line: bytes | str, run_id: str) -> TraceEntry:
    """A line of `run_id`'s trace read back (`trace_line`; older lines name their run
    and their task whole)."""
    data = json.loads(line)
    if isinstance(data, dict):
        data.setdefault("run", run_id)
        inner = data.get("data")
        if isinstance(inner, dict) and isinstance(inner.get(_TASK_IN_RUN), str):
            inner["task"] = run_id + inner.pop(_TASK_IN_RUN)
    return TraceEntry.model_validate(data)


_RUN = {"run"}
_TASK_IN_RUN = "tk"
"""A trace line's task id after its run's id (a field of its own: a task id a stranger
sent, whatever it holds, is never read as one with the run's id taken off)."""


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def as_int(value: bytes | str | None) -> int:
    return int(value) if value else 0


def loaded(stored: StoredRun) -> Loaded | None:
    """Return a run as LOAD (or CLAIM) read it, or None if there is none.

    The snapshot is the head, with the history its entries, when the form says the
    history is stored apart; else the whole snapshot.
    """
    version, meta, form, snap, history, entries, fixed, start, loops = stored
    if not version:
        return None
    apart = form == HISTORY_APART
    text = as_text(snap or b"")
    try:
        record: RunRecord | None = record_of(meta or b"", fixed)
        problem = ""
    except ValidationError as error:
        record, problem = None, corrupt(error)
    # The start is apart when the fixed fields are: stored, or nothing to store (`{}` is
    # not written), unless the head still holds it (written before). Either way the
    # record's task goes in first: a start or a head that holds its own has the last word.
    kept_apart = bool(fixed) and (bool(start) or _TASK not in text)
    if apart:
        task = record.task if record is not None and fixed else None
        history_texts = [as_text(h) for h in history]
        snapshot = join(text, history_texts, as_text(start), as_text(loops), task)
    else:
        snapshot = text
    if record is None:
        return Loaded(as_text(version), None, snapshot, inbox_of(entries), problem, apart)
    inbox = inbox_of(entries)
    return Loaded(
        as_text(version), record, snapshot, inbox, apart=apart, fixed_stored=kept_apart,
        loops_stored=apart and bool(loops) and _LOOPS not in text,
    )  # fmt: skip


_TASK = '"task":'
"""A head that holds its start (written before the start was apart) has this key; one
written without it may too (a delegate's argument), and is then read as one that may
hold it: its next save writes `start` (even `{}`), and from then on it is apart."""
_LOOPS = '"loops":'
"""A head that holds the loop counters (written whole: before they were apart, or by a
run's end) has the last word over `lp`: its next save writes them apart again. (In the
head's JSON this text is only ever the key: inside a string its quotes are escaped.)"""


def inbox_of(entries: list[Any]) -> list[tuple[str, InboxEvent | None]]:
    """The inbox entries read back, each event validated (None where it cannot be read)."""
    return [(as_text(entry_id), _event(_fields(data))) for entry_id, data in entries]


def corrupt(error: ValidationError) -> str:
    """Say where a stored record is broken (never its contents)."""
    details = error.errors()
    where = ".".join(str(p) for p in details[0]["loc"]) if details else ""
    return f"the run's record is corrupt ({where or 'not JSON'})"


def _fields(data: Any) -> dict[bytes, bytes]:
    """A stream entry's fields: a dict from redis-py, a flat list from a Lua script."""
    if isinstance(data, dict):
        return data
    return dict(zip(data[::2], data[1::2], strict=True))


def _event(data: dict[bytes, bytes]) -> InboxEvent | None:
    try:
        return inbox_event(data[b"e"])
    except (KeyError, ValidationError):
        return None


def whole(snapshot: str) -> SnapshotWrite:
    """The write of a snapshot known only as text ('' keeps what is stored)."""
    head, entries, _ = split(snapshot)  # (the head keeps the start: it is read whole)
    return SnapshotWrite(head, tuple(entries), rewrite=True)


def save_effects(keys: Keys, advanced: Advanced, own: OwnOutcome | None) -> str:
    """The effects of a step as SAVE reads them (`fx.<name>` in lua/save.lua), as JSON:
    only those the step has (most steps have a few), so SAVE decodes and walks less."""
    effects = {k: v for k, v in _all_effects(keys, advanced).items() if v}
    if advanced.effects.done_summary is not None:  # (its text may be empty)
        effects["done_summary"] = advanced.effects.done_summary
    if own is not None:
        effects["own"] = _own(keys, own, advanced.record.id)
    if advanced.stored is not None and advanced.stored.loops:
        effects["loops"] = advanced.stored.loops
    if not advanced.fixed_stored:  # a run saved before they were apart, or unreadable
        effects["fixed"] = fixed_json(advanced.record)
        agent = None if advanced.stored is None else advanced.stored.agent
        if agent is not None:  # (its head leaves the start out: `snapshots.write`)
            start = json.loads(agent.snapshot_start())
            effects["start"] = stored_start(start, advanced.record.task)
    return json.dumps(effects, separators=(",", ":"))  # (no spaces: bytes a step writes)


def _all_effects(keys: Keys, advanced: Advanced) -> dict[str, Any]:
    record, fx = advanced.record, advanced.effects
    ends_or_parks = fx.done_summary is not None or record.state == "waiting"
    return {
        "applied": fx.applied,
        # (SAVE spells the activity stream and the own call's lease from KEYS[1], with the
        # run's tree on a cluster; not a cluster's activity shard, named by a slot tag.)
        "activity": keys.index(record.id).activity if fx.trace and keys.cluster else "",
        "tree": keys.tree(record.id) if keys.cluster else "",
        "run": record.id,
        "sends": [[s.member, s.due_ms] for s in fx.sends],
        "unsend": fx.unsend,
        "pending_add": [_pending_entry(p) for p in fx.pending_add],
        "pending_del": fx.pending_del,
        "usage_adds": [
            [_hash(keys, u.run_id, record.id), *_counts(u.usage)] for u in fx.usage_adds
        ],
        "settle": [_reservation(keys, r, record.id) for r in fx.settle],
        "create": [_child(keys, c) for c in fx.create],
        "deliveries": [_delivery(keys, d) for d in fx.deliveries],
        "retention": fx.retention_s,
        "stale": fx.stale_calls,
        "follow_up": fx.follow_up_taken,
        "running": fx.running,
        # On a cluster the notes are in another slot: kept after the save (notes_key).
        "notes_key": notes_key(keys, fx.notes) if fx.notes and not keys.cluster else "",
        "notes": fx.notes.notes if fx.notes else [],
        "notes_max": NOTES_MAX if fx.notes else 0,
        "live": keys.live(record.id) if ends_or_parks else "",
        "live_max": STREAM_MAX if ends_or_parks else 0,
        "live_ttl": _live_ttl(advanced) if ends_or_parks else 0,
        "parks": record.state == "waiting",
        "done_summary": None,
        "reopened": fx.reopened,
        "relist": _relist(keys, advanced),
        "running_list": keys.index(record.id).listed("running") if fx.create else "",
    }


def _own(keys: Keys, own: OwnOutcome, saved: str) -> dict[str, Any]:
    """The call whose outcome is saved with the step, as SAVE reads it (`fx.own`):
    SAVE spells its lease and outbox member from the run's key and the call (about 80
    bytes a step), so the member must be the call's own, as the tick reads it back.
    With `own.route`, what the model route that replied hears (ROUTE_DONE's `ok`):
    [route, key, holder, now, paused until, charged, used ('' unknown), ms per token]."""
    message = Message.of(own.member)
    if message is None or message.called != own.call or {own.run_id, message.run} != {saved}:
        raise ValueError(f"call {own.call} ({own.member}) is not one of run {saved}'s own")
    kind = "m" if message.kind == "call_model" else "t"
    fields: dict[str, Any] = {"call": own.call, "kind": kind}
    fields |= {"attempt": str(own.attempt), "token": own.token}
    ok = own.route
    if ok is not None:
        if keys.cluster:  # (the route's keys are in other slots: ROUTE_DONE tells it)
            raise ValueError("a cluster's save cannot tell a model route: ROUTE_DONE does")
        used = "" if ok.used is None else max(ok.used, 0)
        fields["route"] = [ok.route, ok.key, ok.holder, ok.now_ms, ok.paused_until_ms]
        fields["route"] += [max(ok.charged, 0), used, ok.ms_per_token]
    return fields


def _relist(keys: Keys, advanced: Advanced) -> list[Any]:
    """[the list index the run leaves, the one it joins, its score, its id], or none."""
    record, moved = advanced.record, advanced.effects.relisted
    if moved is None:
        return []
    index = keys.index(record.id)
    return [index.listed(moved[0]), index.listed(moved[1]), record.created_ms, record.id]


def _hash(keys: Keys, run_id: str, saved: str) -> str:
    """A run's hash as SAVE names it: '' for the run it saves (its KEYS[1])."""
    return "" if run_id == saved else keys.run(run_id)


def _reservation(keys: Keys, reservation: Reservation, saved: str) -> list[str]:
    """[the root's hash ('' for the run saved), the reservation's field on it]."""
    field = RunFields.reservation(reservation.run_id, reservation.call)
    return [_hash(keys, reservation.root, saved), field]


def _live_ttl(advanced: Advanced) -> int:
    """Seconds the tree's live stream is kept after this save (see workers.store.layout)."""
    record, fx = advanced.record, advanced.effects
    if fx.done_summary is None:
        return STREAM_PARKED_S
    if record.parent is None:
        return min(STREAM_KEEP_S, fx.retention_s or STREAM_KEEP_S)
    return STREAM_IDLE_S


def notes_key(keys: Keys, notes: KeptNotes) -> str:
    """Where a finished run's notes are kept: its memory's or its schedule's list."""
    return keys.memory(notes.name) if notes.kind == "memory" else keys.schedule_notes(notes.name)


def _counts(usage: Usage) -> list[int]:
    """A call's usage in the order of RunFields.USAGE."""
    return [
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.total_tokens,
        usage.cached_prompt_tokens,
        usage.cost_micro,
        usage.model_calls,
        usage.unpriced_calls,
    ]


def usage_of(values: Sequence[Any]) -> Usage:
    """A run's totals read back in the order of RunFields.USAGE (those of RunFields.TOTALS,
    or the fields each was in before; a missing one is 0)."""
    counts = [*(as_int(v) for v in values[:7]), *[0] * (7 - len(values))]
    prompt, completion, total, cached, cost, calls, unpriced = counts
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_prompt_tokens=cached,
        cost_micro=cost,
        model_calls=calls,
        unpriced_calls=unpriced,
    )


def _child(keys: Keys, child: ChildRun) -> list[Any]:
    record = child.record
    head, entries, start = split(child.snapshot, start_apart=True, task=record.task)
    return [
        keys.run(record.id),
        record.id,
        record_json(record),
        head,
        record.created_ms,
        OutboxMember.advance(record.id),
        child.due_ms,
        keys.history(record.id),
        keys.journal(record.id),
        child.start,
        fixed_json(record),
        start,
        *entries,
    ]


def _delivery(keys: Keys, delivery: Delivery) -> list[Any]:
    return [
        keys.run(delivery.run_id),
        keys.inbox(delivery.run_id),
        delivery.event.model_dump_json(),
        OutboxMember.advance(delivery.run_id),
        delivery.due_ms,
        1 if delivery.cancel_flag else 0,
    ]


def _pending_entry(pending: Pending) -> list[Any]:
    what = pending.call_id if pending.call_id is not None else str(pending.seq)
    member = pending_member(pending.run_id, pending.kind, what)
    return [member, pending.expires_ms or NEVER_MS, pending_json(pending)]
