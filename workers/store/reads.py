"""The store's reads and small writes that clients make, as steps (`workers.store.ops`):
written once, driven by `Connection` (the sync client) and `AsyncConnection`.

Each function takes the key map and returns steps: the commands it sends, the
reading of what comes back, and what it finds. `RunStore`, `People` and
`LiveStreams` run them with `Connection.drive`; `AsyncRelay` awaits the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from workers.engine.budget import TreeLimits
from workers.engine.events import InboxEvent
from workers.engine.ids import OutboxMember, pending_parts
from workers.engine.journal import start_text
from workers.engine.records import (
    Pending,
    RunList,
    RunRecord,
    StreamEvent,
    TraceEntry,
    Usage,
)
from workers.errors import RunCorrupt
from workers.store import scripts
from workers.store.codec import (
    as_int,
    as_text,
    corrupt,
    pending_read,
    record_of,
    trace_entry,
    usage_of,
)
from workers.store.layout import IndexKeys, Keys, RunFields
from workers.store.ops import Batch, Command, Steps
from workers.store.snapshots import split

__all__ = [
    "LIVE_READ_MAX",
    "SAME_MS_SLACK",
    "RunCursor",
    "activity_cursor",
    "append",
    "count_runs",
    "create",
    "journal_tail",
    "limits",
    "live_events",
    "memory",
    "newest_first",
    "newest_runs",
    "outcome",
    "pending",
    "pending_in_tree",
    "pending_of",
    "read",
    "readable",
    "shards",
    "trace",
    "wait_activity",
]

LIVE_READ_MAX = 1_000
_KINDS = frozenset({"text", "step", "restarted", "done"})


def _record(run_id: str, meta: bytes, fixed: bytes | None) -> RunRecord:
    try:
        return record_of(meta, fixed)
    except ValidationError as error:
        raise RunCorrupt(f"run {run_id}: {corrupt(error)}") from None


def read(keys: Keys, run_id: str) -> Steps[tuple[RunRecord, Usage] | None]:
    """The run's record and what it and its descendants used (no snapshot); None if
    there is no run. Raises RunCorrupt for a record that cannot be read."""
    fields = (RunFields.RECORD, RunFields.FIXED, RunFields.TOTALS, *RunFields.USAGE)
    meta, fixed, packed, *apart = yield Command(("HMGET", keys.run(run_id), *fields))
    if meta is None:
        return None
    totals = as_text(packed).split() if packed else apart
    try:
        usage = usage_of(totals)
    except ValueError:  # (only a hand's write puts anything else there)
        raise RunCorrupt(f"run {run_id}: its usage totals are not numbers") from None
    return _record(run_id, meta, fixed), usage


def outcome(keys: Keys, run_id: str) -> Steps[tuple[RunRecord, bool] | None]:
    """The run's record and whether a follow-up is on its way to it, read in one command
    (a save that reopens the run lands before or after both); None if there is no run."""
    meta, fixed, follow_up = yield Command(
        ("HMGET", keys.run(run_id), RunFields.RECORD, RunFields.FIXED, RunFields.FOLLOW_UP)
    )
    if meta is None:
        return None
    return _record(run_id, meta, fixed), follow_up is not None


_LIMIT_FIELDS = (
    RunFields.LIMIT_TOKENS,
    RunFields.LIMIT_COST,
    RunFields.LIMIT_CALLS,
    RunFields.DEADLINE,
    RunFields.RESERVED_TOKENS,
    RunFields.RESERVED_COST,
    RunFields.RESERVED_CALLS,
)


def limits(keys: Keys, root: str) -> Steps[TreeLimits | None]:
    """The tree's budget as it stands (extensions included), and what its calls in
    flight reserved; None if the tree has no limits (or no root)."""
    values = yield Command(("HMGET", keys.run(root), *_LIMIT_FIELDS))
    if all(v is None for v in values[:4]):
        return None
    tokens, cost, calls, deadline = (None if v is None else int(v) for v in values[:4])
    reserved = (as_int(values[4]), as_int(values[5]), as_int(values[6]))
    return TreeLimits(tokens, cost, calls, deadline, reserved)


def trace(keys: Keys, run_id: str, start: int = 0) -> Steps[tuple[int, list[TraceEntry]]]:
    """(The position after the last line, the run's lines from position `start` on)."""
    end, lines = yield scripts.read_trace(keys, run_id=run_id, start=start)
    return end, [trace_entry(line, run_id) for line in lines]


def activity_cursor(keys: Keys, run_id: str) -> Steps[str]:
    """The newest entry id of the run's activity stream (where a follower begins)."""
    newest = yield Command(("XREVRANGE", keys.index(run_id).activity, "+", "-", "COUNT", 1))
    return as_text(newest[0][0]) if newest else "0-0"


def wait_activity(
    keys: Keys, run_id: str, cursor: str, block_ms: int
) -> Steps[tuple[str, set[str]]]:
    """Wait up to `block_ms` for runs whose trace grew after `cursor`, in the activity
    stream `run_id` writes to (on a cluster: its slot's); return (cursor, those runs)."""
    activity = keys.index(run_id).activity
    answer = yield Command(
        ("XREAD", "COUNT", 10_000, "BLOCK", block_ms, "STREAMS", activity, cursor)
    )
    runs: set[str] = set()
    for _, entries in answer or []:
        for entry_id, data in entries:
            cursor = as_text(entry_id)
            runs.add(as_text(data[b"r"]))
    return cursor, runs


def live_events(
    keys: Keys, run_id: str, after: str, block_ms: int | None
) -> Steps[list[StreamEvent]]:
    """The events of `run_id`'s tree after id `after` (waiting up to `block_ms` for one;
    None: not at all), oldest first, at most LIVE_READ_MAX."""
    block = () if block_ms is None else ("BLOCK", block_ms)
    answer = yield Command(
        ("XREAD", "COUNT", LIVE_READ_MAX, *block, "STREAMS", keys.live(run_id), after)
    )
    found = []
    for _, entries in answer or []:
        for entry_id, data in entries:
            kind = as_text(data.get(b"k", b""))
            found.append(
                StreamEvent(
                    id=as_text(entry_id),
                    kind=kind if kind in _KINDS else "text",
                    run_id=as_text(data.get(b"r", b"")),
                    text=as_text(data.get(b"t", b"")),
                )
            )
    return found


def append(
    keys: Keys, run_id: str, event: InboxEvent, due_ms: int, *, cancel_flag: bool = False
) -> Steps[bool]:
    """Append `event` to a live run's inbox and schedule its advance; False if no such run."""
    exists = yield Command(("HEXISTS", keys.run(run_id), RunFields.VERSION))
    if not exists:
        return False
    commands = [
        Command(("XADD", keys.inbox(run_id), "*", "e", event.model_dump_json())),
        Command(("ZADD", keys.index(run_id).outbox, due_ms, OutboxMember.advance(run_id))),
    ]
    if cancel_flag:
        commands.insert(0, Command(("HSET", keys.run(run_id), RunFields.CANCEL, 1)))
    yield Batch(tuple(commands), transaction=True)
    return True


def create(
    keys: Keys,
    record: RunRecord,
    snapshot: str,
    due_ms: int,
    *,
    stubs: Mapping[str, str] | None = None,
    start: str | None = None,
    enlist: bool = True,
) -> Steps[bool]:
    """Create a run (see `RunStore.create`); False if one with that id exists. With
    `enlist`, on a cluster, its tree's slot is listed first (a sync store lists it
    through its own cache of the slots it listed, and passes False)."""
    if enlist and keys.cluster:
        yield Command(("SADD", keys.index_slots, keys.slot(record.id)))
    # (as CREATE keeps it)
    head, history, agent_start = split(snapshot, start_apart=True, task=record.task)
    made = yield scripts.create(
        keys,
        record=record,
        head=head,
        history=history,
        agent_start=agent_start,
        due_ms=due_ms,
        start=start or start_text(record, snapshot),
        stubs=stubs,
    )
    created: bool = made
    return created


def memory(keys: Keys, name: str) -> Steps[list[str]]:
    """The notes kept under a memory's name, oldest first."""
    found = yield Command(("LRANGE", keys.memory(name), 0, -1))
    return [as_text(note) for note in found]


PENDING_MAX = 1_000


def pending(keys: Keys, limit: int = PENDING_MAX) -> Steps[list[Pending]]:
    """What waits on a person across the fleet, oldest expiry first: the pending index
    (one shard on a single Redis; each listed slot's on a cluster, read in one round trip
    per node), then the entries it names."""
    ranges = tuple(
        Command(("ZRANGEBYSCORE", s.pending, "-inf", "+inf", "WITHSCORES", "LIMIT", 0, limit))
        for s in (yield from shards(keys))
    )
    found: list[tuple[float, str]] = []
    for entries in (yield Batch(ranges)) if ranges else []:
        # WITHSCORES through execute_command: member, score, member, score, ...
        pairs = zip(entries[0::2], entries[1::2], strict=True)
        found.extend((float(score), as_text(member)) for member, score in pairs)
    found.sort()
    members = [member for _, member in found[:limit]]
    return (yield from pending_of(keys, members))


def pending_of(keys: Keys, members: Sequence[str]) -> Steps[list[Pending]]:
    """The pending entries named (in their order; one gone or unreadable is skipped),
    read from their shards in one round trip."""
    if not members:
        return []
    groups: dict[str, list[str]] = {}
    for member in members:
        groups.setdefault(keys.index(pending_parts(member)[0]).pending_data, []).append(member)
    listed = list(groups.items())
    answers = yield Batch(tuple(Command(("HMGET", key, *group)) for key, group in listed))
    values: dict[str, Any] = {}
    for (_, group), found in zip(listed, answers, strict=True):
        values.update(zip(group, found, strict=True))
    return readable([(member, values[member]) for member in members])


def pending_in_tree(keys: Keys, root: str, kind: str) -> Steps[list[Pending]]:
    """The pending entries of one kind held by the runs of a tree (an HSCAN of its
    shard's entries, page by page)."""
    data, cursor, entries = keys.index(root).pending_data, 0, list[tuple[Any, Any]]()
    while True:
        cursor, page = yield Command(
            ("HSCAN", data, cursor, "MATCH", f"{root}*|{kind}|*", "COUNT", 1_000)
        )
        pairs = page.items() if isinstance(page, dict) else zip(page[0::2], page[1::2], strict=True)
        entries += list(pairs)
        cursor = int(cursor)
        if cursor == 0:
            return [p for p in readable(entries) if p.root_id == root]


def readable(entries: Sequence[tuple[Any, Any]]) -> list[Pending]:
    """The pending entries, (member, value) pairs, that can be read (a missing or broken
    one is skipped)."""
    return [p for p in (pending_read(member, value) for member, value in entries) if p]


def shards(keys: Keys) -> Steps[list[IndexKeys]]:
    """Every shard of the index that may hold entries: the one on a single Redis; on a
    cluster, each slot listed in `index-slots`."""
    if not keys.cluster:
        return [keys.index("")]
    slots = yield Command(("SMEMBERS", keys.index_slots))
    return [keys.shard(int(slot)) for slot in sorted(slots, key=int)]


RunCursor = tuple[int, str]
"""Where a page of runs ended: the last run's (created ms, id)."""
SAME_MS_SLACK = 64
"""Runs read past a page's cursor for those created in its very millisecond: a page
whose cursor shares its millisecond with more runs than this may miss some."""


def newest_runs(
    keys: Keys,
    limit: int,
    lists: Sequence[RunList] = (),
    before: RunCursor | None = None,
    within: Sequence[IndexKeys] | None = None,
) -> Steps[list[tuple[str, int]]]:
    """The newest `limit` runs, newest first, as (run id, created ms): of the lists
    `lists` (all runs if none), created before `before` if given; read from the shards
    `within` (default: every listed shard), each shard's newest in one round trip.

    A client's page is small (at most a thousand): a cluster's shards each send theirs
    and they are merged here. (A scrape of ten thousand reads `Shards.newest_runs`,
    which cuts each node's share to `limit` in a script.)"""
    found_shards = list(within) if within is not None else (yield from shards(keys))
    names = [key for shard in found_shards for key in shard.run_indexes(lists)]
    high = "+inf" if before is None else before[0]
    slack = 0 if before is None else SAME_MS_SLACK
    ranges = tuple(
        Command(("ZREVRANGEBYSCORE", key, high, 0, "WITHSCORES", "LIMIT", 0, limit + slack))
        for key in names
    )
    found: list[tuple[str, float]] = []
    for entries in (yield Batch(ranges)) if ranges else []:
        pairs = zip(entries[0::2], entries[1::2], strict=True)
        found.extend((as_text(member), float(score)) for member, score in pairs)
    return newest_first(found, before, limit)


def newest_first(
    found: Sequence[tuple[str, float]], before: RunCursor | None, limit: int
) -> list[tuple[str, int]]:
    """(run id, created ms) of `found` (member, score pairs read from the shards),
    newest first (by creation, then by id), below `before` if given, cut to `limit`."""
    ordered = sorted(
        (
            (int(score), run_id)
            for run_id, score in found
            if before is None or (int(score), run_id) < before
        ),
        reverse=True,
    )
    return [(run_id, created) for created, run_id in ordered[:limit]]


def count_runs(
    keys: Keys, lists: Sequence[RunList] = (), within: Sequence[IndexKeys] | None = None
) -> Steps[int]:
    """How many runs the lists `lists` (all runs if none) hold in the shards `within`
    (default: every listed shard), those expired but not yet pruned by the tick too."""
    found_shards = list(within) if within is not None else (yield from shards(keys))
    counts = tuple(
        Command(("ZCARD", key)) for shard in found_shards for key in shard.run_indexes(lists)
    )
    return sum(int(n) for n in (yield Batch(counts))) if counts else 0


def journal_tail(keys: Keys, run_id: str, shown: int) -> Steps[tuple[int, list[bytes]]]:
    """(The number of the first entry read, the run's newest `shown` journal steps as
    stored): its start (entry 0) is never among them, and a long journal is not read
    whole."""
    length = int((yield Command(("LLEN", keys.journal(run_id)))))
    first = max(1, length - shown)
    if length <= 1:
        return first, []
    stored = yield Command(("LRANGE", keys.journal(run_id), first, -1))
    return first, list(stored)
