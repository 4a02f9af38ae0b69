"""How Relay's values are written to Redis and read back: the store's one serialiser.

Stored JSON leaves out what equals its default (a parked run costs less
memory). What comes back is validated: a record that cannot be read becomes a
`Loaded` with a problem (its run fails alone), an inbox entry that cannot be
read becomes None (skipped, with a trace line).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from workers.effects import Advanced, ChildRun, Delivery, KeptNotes, OwnOutcome
from workers.layout import (
    NOTES_MAX,
    STREAM_IDLE_S,
    STREAM_KEEP_S,
    STREAM_MAX,
    STREAM_PARKED_S,
    TRACE_MAX,
    Keys,
    OutboxMember,
    pending_member,
)
from workers.records import InboxEvent, Pending, RunRecord, TraceEntry, Usage, inbox_event

__all__ = [
    "Loaded",
    "as_int",
    "as_text",
    "corrupt",
    "loaded",
    "notes_key",
    "pending_json",
    "record_json",
    "save_arguments",
    "trace_line",
    "usage_of",
]

NEVER_MS = 2**52
"""The expiry score of a pending entry that never expires."""


@dataclass(frozen=True)
class Loaded:
    """A run as read for advancing: record, snapshot, version and unapplied inbox."""

    version: str
    record: RunRecord | None
    """None when the stored record could not be read (`problem` says why)."""
    snapshot: str
    inbox: list[tuple[str, InboxEvent | None]]
    """Unapplied events in order; None where an entry could not be read."""
    problem: str = ""


def record_json(record: RunRecord) -> str:
    return record.model_dump_json(exclude_defaults=True)


def pending_json(pending: Pending) -> str:
    return pending.model_dump_json(exclude_defaults=True)


def trace_line(entry: TraceEntry) -> str:
    return entry.model_dump_json(exclude_defaults=True)


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def as_int(value: bytes | str | None) -> int:
    return int(value) if value else 0


def loaded(version: Any, meta: Any, snap: Any, entries: list[Any]) -> Loaded | None:
    """Return a run read back from Redis, or None if there is none."""
    if version is None:
        return None
    inbox = [(as_text(entry_id), _event(_fields(data))) for entry_id, data in entries]
    try:
        record = RunRecord.model_validate_json(meta or b"")
    except ValidationError as error:
        return Loaded(as_text(version), None, as_text(snap or b""), inbox, corrupt(error))
    return Loaded(as_text(version), record, as_text(snap or b""), inbox)


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


def save_arguments(
    keys: Keys, advanced: Advanced, version: str, own: OwnOutcome | None
) -> tuple[list[str], list[Any]]:
    """Return the SAVE script's KEYS and ARGV for a step (see workers/lua/save.lua)."""
    record = advanced.record
    effects = _effects(keys, advanced)
    if own is not None:
        effects["own"] = {
            "call": own.call,
            "attempt": str(own.attempt),
            "lease": keys.lease(own.run_id, own.call),
            "token": own.token,
            "member": own.member,
        }
    index = keys.index(record.id)
    script_keys = [
        keys.run(record.id),
        keys.inbox(record.id),
        keys.trace(record.id),
        index.outbox,
        index.pending,
        index.pending_data,
        index.runs,
    ]
    args = [version, record_json(record), advanced.snapshot, json.dumps(effects)]
    return script_keys, args


def _effects(keys: Keys, advanced: Advanced) -> dict[str, Any]:
    """The effects of a step as SAVE reads them (`fx.<name>` in the script)."""
    record, fx = advanced.record, advanced.effects
    return {
        "applied": fx.applied,
        "trace": [trace_line(t) for t in fx.trace],
        "trace_max": TRACE_MAX,
        "activity": keys.index(record.id).activity,
        "run": record.id,
        "send": [[s.member, s.due_ms] for s in fx.send],
        "unsend": fx.unsend,
        "pending_add": [_pending_entry(p) for p in fx.pending_add],
        "pending_del": fx.pending_del,
        "usage": [[keys.run(u.run_id), *_counts(u.usage)] for u in fx.usage],
        "settle": [[keys.run(root), field] for root, field in fx.settle],
        "create": [_child(keys, c) for c in fx.create],
        "deliver": [_delivery(keys, d) for d in fx.deliver],
        "advance": OutboxMember.advance(record.id),
        "retention": fx.retention_s,
        "forget": fx.forget,
        "running": fx.running,
        # On a cluster the notes are in another slot: kept after the save (notes_key).
        "notes_key": notes_key(keys, fx.notes) if fx.notes and not keys.cluster else "",
        "notes": fx.notes.notes if fx.notes else [],
        "notes_max": NOTES_MAX,
        "live": keys.live(record.id),
        "live_max": STREAM_MAX,
        "live_ttl": _live_ttl(advanced),
        "parks": record.state == "waiting",
        "done": [] if fx.done is None else [fx.done],
        "revive": fx.revive,
    }


def _live_ttl(advanced: Advanced) -> int:
    """Seconds the tree's live stream is kept after this save (see workers.layout)."""
    record, fx = advanced.record, advanced.effects
    if fx.done is None:
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
    """A run's totals read back in the order of RunFields.USAGE."""
    prompt, completion, total, cached, cost, calls, unpriced = (as_int(v) for v in values)
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
    return [
        keys.run(record.id),
        record.id,
        record_json(record),
        child.snapshot,
        record.created_ms,
        OutboxMember.advance(record.id),
        child.due_ms,
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
