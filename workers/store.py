"""The run store: every read and write of run state in Redis, one method each.

Writes that touch more than one key go through the Lua scripts of
`workers.scripts`, so each is atomic. Redis errors are translated to
`StoreUnavailable` in one place (`_redis_errors`), with the URL's password
hidden. Nothing here knows about agents beyond opaque snapshot text.

Messages to send (the outbox) live in one sorted set, scored by when they are
due to be sent again if nobody dealt with them: a call's member is re-scored
to its lease deadline while it runs and removed when its result is recorded;
a run's advance member is removed when its inbox is empty after a save.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis
from pydantic import ValidationError

from workers import scripts
from workers.decisions import pending_key
from workers.durability import Durability, probe, wait_durable
from workers.errors import RunCorrupt, StoreUnavailable
from workers.records import InboxEvent, Pending, RunRecord, TraceEntry, inbox_event
from workers.settings import redact_url

__all__ = [
    "Claim",
    "ClaimStatus",
    "Decided",
    "Keys",
    "Loaded",
    "Recorded",
    "RunStore",
    "SaveEffects",
    "Saved",
]

TRACE_MAX = 2_000
"""Lines a run's trace keeps (the newest); each line is cut, so a trace stays bounded."""
NOTES_MAX = 100


class Keys:
    """Key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.runs = f"{prefix}runs"
        self.outbox = f"{prefix}outbox"
        self.pending = f"{prefix}pending"
        self.pending_data = f"{prefix}pending:data"
        self.activity = f"{prefix}activity"
        """A stream naming each run whose trace grew: what followers block on."""
        self.prune_cursor = f"{prefix}prune-cursor"
        """The creation time (score in `runs`) the tick's sweep of expired runs got to."""
        self.tick_lock = f"{prefix}tick-lock"
        """Held by the process ticking now; it lapses after one tick interval."""
        self.tick_stats = f"{prefix}tick-stats"
        """`n` ticks so far, `last_ms` when the last began, `by` which process ran it."""

    def run(self, run_id: str) -> str:
        return f"{self.prefix}run:{run_id}"

    def inbox(self, run_id: str) -> str:
        return f"{self.prefix}inbox:{run_id}"

    def trace(self, run_id: str) -> str:
        """A run's trace: a list of its newest lines (the run hash counts them all in `tn`)."""
        return f"{self.prefix}trace:{run_id}"

    def lease(self, run_id: str, what: str) -> str:
        return f"{self.prefix}lease:{run_id}:{what}"

    def schedule_notes(self, schedule: str) -> str:
        """The notes a schedule's runs remembered, oldest first (a list)."""
        return f"{self.prefix}schedule-notes:{schedule}"


def advance_member(run_id: str) -> str:
    return f"a|{run_id}"


def model_member(run_id: str, seq: int) -> str:
    return f"m|{run_id}|{seq}"


def tool_member(run_id: str, call_id: str) -> str:
    return f"t|{run_id}|{call_id}"


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


class ClaimStatus(StrEnum):
    """What a claim found (the CLAIM script's answer)."""

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
    """What a compare-and-set save did (the SAVE script's answer)."""

    SAVED = "saved"
    STALE = "stale"
    """Someone saved first: reload and try again."""
    DUPLICATE = "duplicate"
    """The call saving its own outcome finds it recorded already."""
    FENCED = "fenced"
    """The call saving its own outcome lost it to a later attempt."""


class Recorded(StrEnum):
    """What recording a call's outcome did (the RECORD script's answer)."""

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
    """What a decision did (the DECIDE script's answer)."""

    APPLIED = "applied"
    EXPIRED = "expired"
    """Too late: the entry's time ran out, and the expiry was applied instead."""
    DECIDED = "decided"
    """Decided already."""
    NOT_PENDING = "not_pending"
    GONE = "gone"


@dataclass(frozen=True)
class Claim:
    """The answer to a claim, with the attempt number when claimed.

    A claimed call also gets the run as it stands (`loaded`), so the call and the
    save after it need no other read.
    """

    status: ClaimStatus
    attempts: int
    root_tokens: int
    root_budget: int | None
    loaded: Loaded | None = None


@dataclass(frozen=True)
class OwnOutcome:
    """A call saving its own outcome with the run: refused if it was recorded already,
    or if a later attempt took the call over (`attempt` is no longer the last claim)."""

    call: str
    attempt: int
    lease: str
    token: str
    member: str


@dataclass
class SaveEffects:
    """What goes with one save, applied atomically with it."""

    applied: list[str] = field(default_factory=list)
    trace: list[TraceEntry] = field(default_factory=list)
    send: list[tuple[str, int]] = field(default_factory=list)
    unsend: list[str] = field(default_factory=list)
    pending_add: list[Pending] = field(default_factory=list)
    pending_del: list[str] = field(default_factory=list)
    usage: list[tuple[str, int, int, int]] = field(default_factory=list)
    """(run id, prompt, completion, total) to add to that run's totals."""
    create: list[tuple[RunRecord, str, int]] = field(default_factory=list)
    """(record, snapshot, due) of child runs to create if absent."""
    deliver: list[tuple[str, InboxEvent, int, bool]] = field(default_factory=list)
    """(run id, event, due, set cancel flag) for other runs' inboxes."""
    retention: int = 0
    """Seconds to keep the run: set once it finished."""
    forget: list[str] = field(default_factory=list)
    """Hash fields of calls whose outcome was applied (their markers are no longer needed)."""
    running: list[str] = field(default_factory=list)
    """Calls of the batch still running: those not yet recorded are counted as `out`."""
    own: OwnOutcome | None = None
    notes: tuple[str, list[str]] | None = None
    """(schedule name, notes) a finished scheduled run remembered, for the schedule's next run."""


def pending_member(pending: Pending) -> str:
    what = pending.call_id if pending.call_id is not None else str(pending.seq)
    return pending_key(pending.run_id, pending.kind, what)


@contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Translate redis-py's errors into `StoreUnavailable` naming the URL without its password."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailable(f"Redis at {redact_url(url)} is unreachable: {error}") from None
    except redis.RedisError as error:
        raise StoreUnavailable(f"Redis at {redact_url(url)} failed: {error}") from None


class RunStore:
    """Run state in Redis. One per process; safe to share between threads."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.keys = Keys(prefix)
        # Typed Any: redis-py annotates every reply as a union over its sync and
        # async clients, which says nothing useful here.
        self.redis: Any = redis.Redis.from_url(
            url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30
        )
        self._create: Any = self.redis.register_script(scripts.CREATE)
        self._claim: Any = self.redis.register_script(scripts.CLAIM)
        self._renew: Any = self.redis.register_script(scripts.RENEW)
        self._record: Any = self.redis.register_script(scripts.RECORD)
        self._decide: Any = self.redis.register_script(scripts.DECIDE)
        self._save: Any = self.redis.register_script(scripts.SAVE)
        self._trace: Any = self.redis.register_script(scripts.TRACE)
        self._read_trace: Any = self.redis.register_script(scripts.READ_TRACE)
        self._tick_lock: Any = self.redis.register_script(scripts.TICK_LOCK)
        self._unclaim: Any = self.redis.register_script(scripts.UNCLAIM)
        self._durability: Durability | None = None

    def errors(self) -> Any:
        """Return a context manager that translates Redis errors for this store."""
        return _redis_errors(self.url)

    def ping(self) -> None:
        with self.errors():
            self.redis.ping()

    # --- creating and reading --------------------------------------------------------

    def create(self, record: RunRecord, snapshot: str, due_ms: int, budget: int | None) -> bool:
        """Create a run; False if one with that id exists."""
        k = self.keys
        args = [record.id, _json(record), snapshot, record.created_ms]
        args += [advance_member(record.id), due_ms, "" if budget is None else budget]
        with self.errors():
            created = self._create(keys=[k.run(record.id), k.runs, k.outbox], args=args)
        return bool(created)

    def load(self, run_id: str) -> Loaded | None:
        """Return the run with its unapplied inbox, or None if there is no such run."""
        with self.errors():
            pipe = self.redis.pipeline(transaction=False)
            pipe.hmget(self.keys.run(run_id), ["v", "meta", "snap"])
            pipe.xrange(self.keys.inbox(run_id), "-", "+", count=1_000)
            (version, meta, snap), entries = pipe.execute()
        return _loaded(version, meta, snap, entries)

    def read(self, run_id: str) -> tuple[RunRecord, tuple[int, int, int]] | None:
        """Return the run's record and token totals (no snapshot), or None if there is no run.

        Raises:
            RunCorrupt: the stored record cannot be read.
        """
        with self.errors():
            meta, *totals = self.redis.hmget(self.keys.run(run_id), ["meta", "tp", "tc", "tt"])
        if meta is None:
            return None
        try:
            record = RunRecord.model_validate_json(meta)
        except ValidationError as error:
            raise RunCorrupt(f"run {run_id}: {_first(error)}") from None
        return record, (_int(totals[0]), _int(totals[1]), _int(totals[2]))

    def snapshot(self, run_id: str) -> str | None:
        with self.errors():
            snap = self.redis.hget(self.keys.run(run_id), "snap")
        return None if snap is None else _text(snap)

    def cancelled(self, run_id: str) -> bool:
        with self.errors():
            return bool(self.redis.hexists(self.keys.run(run_id), "cancel"))

    # --- calls: claim, renew, record ---------------------------------------------------

    def claim(
        self,
        run_id: str,
        what: str,
        *,
        seq: int | None,
        member: str,
        token: str,
        lease_ms: int,
        now_ms: int,
        root: str,
    ) -> Claim:
        """Claim call `what` of the run (a tool call, or with `seq` the model call `m<seq>`).

        Only a call the run's record says is due can be claimed (see scripts.CLAIM).
        """
        k = self.keys
        keys = [k.run(run_id), k.lease(run_id, what), k.outbox, k.run(root), k.inbox(run_id)]
        kind = "tool" if seq is None else "model"
        args = [what, kind, seq or 0, token, lease_ms, member, now_ms + lease_ms]
        with self.errors():
            answer = self._claim(keys=keys, args=args)
        status, attempts, tokens, budget, version, meta, snap, entries = answer
        budget = int(budget)
        claimed = ClaimStatus(_text(status))
        loaded = (
            _loaded(version or None, meta, snap, entries)
            if claimed is ClaimStatus.CLAIMED
            else None
        )
        return Claim(claimed, int(attempts), int(tokens), None if budget < 0 else budget, loaded)

    def renew(
        self,
        run_id: str,
        what: str,
        *,
        attempt: int,
        member: str,
        token: str,
        lease_ms: int,
        now_ms: int,
    ) -> bool:
        """Keep (or take back, if nobody took it over) the lease of call `what`."""
        k = self.keys
        keys = [k.lease(run_id, what), k.outbox, k.run(run_id)]
        args = [token, lease_ms, member, now_ms + lease_ms, what, attempt]
        with self.errors():
            return bool(self._renew(keys=keys, args=args))

    def durability(self) -> Durability:
        """Return how this Redis makes a claim durable (asked once per process).

        Raises:
            SettingsError: it cannot (RELAY_DURABLE_CLAIMS needs a Redis setting changed).
            StoreUnavailable: Redis cannot be reached.
        """
        if self._durability is None:
            with self.errors():
                self._durability = probe(self.redis)
        return self._durability

    def make_durable(self, run_id: str, what: str, timeout_ms: int) -> bool:
        """Wait until the claim of call `what` is durable; False if Redis did not confirm
        it within `timeout_ms`."""
        mode = self.durability()
        with self.errors():
            return wait_durable(self.redis, mode, self.keys.run(run_id), f"a:{what}", timeout_ms)

    def unclaim(
        self, run_id: str, what: str, *, attempt: int, token: str, member: str, due_ms: int
    ) -> bool:
        """Give back a claim whose call never started; False if it was not ours any more."""
        k = self.keys
        keys = [k.run(run_id), k.lease(run_id, what), k.outbox]
        with self.errors():
            return bool(self._unclaim(keys=keys, args=[what, attempt, token, member, due_ms]))

    def record(
        self,
        run_id: str,
        what: str,
        event: InboxEvent,
        *,
        attempt: int,
        member: str,
        token: str,
        due_ms: int,
        counted: bool,
    ) -> tuple[Recorded, Loaded | None]:
        """Record a call's outcome once, as an inbox event, if `attempt` is still its last claim.

        A `counted` outcome (a tool's) counts down the calls of its batch still out.
        Returns what happened, and the run loaded when it should advance now.
        """
        k = self.keys
        keys = [k.run(run_id), k.inbox(run_id), k.outbox, k.lease(run_id, what)]
        args = [what, event.model_dump_json(), member, advance_member(run_id), due_ms, token]
        args += ["1" if counted else "0", attempt]
        with self.errors():
            recorded = Recorded(_text(self._record(keys=keys, args=args)))
        return recorded, self.load(run_id) if recorded is Recorded.ADVANCE else None

    def forget_message(self, member: str) -> None:
        with self.errors():
            self.redis.zrem(self.keys.outbox, member)

    # --- people ---------------------------------------------------------------------------

    def decide(
        self,
        run_id: str,
        member: str,
        field_name: str,
        event: InboxEvent,
        *,
        expired: InboxEvent,
        now_ms: int,
        due_ms: int,
    ) -> Decided:
        """Apply a decision for pending `member`, unless it came after the entry's expiry:
        then `expired` (the event for "no decision in time") is applied instead."""
        k = self.keys
        keys = [k.run(run_id), k.inbox(run_id), k.outbox, k.pending, k.pending_data]
        args = [member, field_name, event.model_dump_json(), advance_member(run_id), due_ms]
        args += [now_ms, expired.model_dump_json()]
        with self.errors():
            return Decided(_text(self._decide(keys=keys, args=args)))

    def pending(self, limit: int = 1_000) -> list[Pending]:
        """Return what waits on a person, oldest expiry first."""
        with self.errors():
            members = self.redis.zrange(self.keys.pending, 0, limit - 1)
            values = self.redis.hmget(self.keys.pending_data, members) if members else []
        found: list[Pending] = []
        for value in values:
            if value is None:
                continue
            try:
                found.append(Pending.model_validate_json(value))
            except ValidationError:
                continue
        return found

    def pending_of(self, members: Sequence[str]) -> list[Pending]:
        if not members:
            return []
        with self.errors():
            values = self.redis.hmget(self.keys.pending_data, list(members))
        return [Pending.model_validate_json(v) for v in values if v is not None]

    def pending_members_of(self, run_id: str) -> list[str]:
        """Return the pending entries a run holds, found by their names (for a lost record)."""
        with self.errors():
            found = self.redis.hscan_iter(self.keys.pending_data, match=f"{run_id}|*", count=1_000)
            return [_text(member) for member, _ in found]

    def expired_pending(self, now_ms: int, limit: int = 500) -> list[Pending]:
        with self.errors():
            members = self.redis.zrangebyscore(self.keys.pending, 0, now_ms, start=0, num=limit)
            values = self.redis.hmget(self.keys.pending_data, members) if members else []
        return [Pending.model_validate_json(v) for v in values if v is not None]

    def append(
        self, run_id: str, event: InboxEvent, due_ms: int, *, cancel_flag: bool = False
    ) -> bool:
        """Append `event` to a live run's inbox and schedule its advance; False if no such run."""
        k = self.keys
        with self.errors():
            if not self.redis.hexists(k.run(run_id), "v"):
                return False
            pipe = self.redis.pipeline(transaction=True)
            if cancel_flag:
                pipe.hset(k.run(run_id), "cancel", 1)
            pipe.xadd(k.inbox(run_id), {"e": event.model_dump_json()})
            pipe.zadd(k.outbox, {advance_member(run_id): due_ms})
            pipe.execute()
        return True

    # --- saving ------------------------------------------------------------------------------

    def save(self, record: RunRecord, version: str, snapshot: str, fx: SaveEffects) -> Saved:
        """Save if the run is still at `version`, with all of `fx`; say what happened."""
        k = self.keys
        effects = {
            "applied": fx.applied,
            "trace": [_line(t) for t in fx.trace],
            "trace_max": TRACE_MAX,
            "activity": k.activity,
            "run": record.id,
            "send": [[m, due] for m, due in fx.send],
            "unsend": fx.unsend,
            "pending_add": [
                [pending_member(p), p.expires_ms or 2**52, p.model_dump_json()]
                for p in fx.pending_add
            ],
            "pending_del": fx.pending_del,
            "usage": [[k.run(r), p, c, t] for r, p, c, t in fx.usage],
            "create": [
                [
                    k.run(c.id),
                    c.id,
                    c.model_dump_json(),
                    snap,
                    c.created_ms,
                    advance_member(c.id),
                    due,
                ]
                for c, snap, due in fx.create
            ],
            "deliver": [
                [
                    k.run(r),
                    k.inbox(r),
                    e.model_dump_json(),
                    advance_member(r),
                    due,
                    1 if flag else 0,
                ]
                for r, e, due, flag in fx.deliver
            ],
            "advance": advance_member(record.id),
            "retention": fx.retention,
            "forget": fx.forget,
            "running": fx.running,
            "notes_key": k.schedule_notes(fx.notes[0]) if fx.notes else "",
            "notes": fx.notes[1] if fx.notes else [],
            "notes_max": NOTES_MAX,
        }
        keys = [
            k.run(record.id),
            k.inbox(record.id),
            k.trace(record.id),
            k.outbox,
            k.pending,
            k.pending_data,
            k.runs,
        ]
        if fx.own is not None:
            own = fx.own
            effects["own"] = {
                "call": own.call,
                "attempt": str(own.attempt),
                "lease": own.lease,
                "token": own.token,
                "member": own.member,
            }
        args = [version, _json(record), snapshot, json.dumps(effects)]
        with self.errors():
            return Saved(_text(self._save(keys=keys, args=args)))

    # --- the tick ------------------------------------------------------------------------------

    def elect_ticker(self, holder: str, interval_ms: int, now_ms: int) -> int:
        """Return 0 if `holder` ticks now (it holds the lock for one interval), else the
        milliseconds until the lock lapses and the next tick is due."""
        k = self.keys
        with self.errors():
            return int(
                self._tick_lock(
                    keys=[k.tick_lock, k.tick_stats], args=[holder, interval_ms, now_ms]
                )
            )

    def tick_stats(self) -> tuple[int, int | None, str | None]:
        """Return (ticks so far, when the last began in ms, which process ran it)."""
        with self.errors():
            count, last, by = self.redis.hmget(self.keys.tick_stats, ["n", "last_ms", "by"])
        return _int(count), None if last is None else int(last), None if by is None else _text(by)

    # --- traces, listings, the outbox ----------------------------------------------------------

    def trace(self, run_id: str, start: int = 0) -> tuple[int, list[TraceEntry]]:
        """Return (position after the last line, the run's lines from position `start` on).

        Positions count every line the run ever wrote; the oldest of a long run's
        lines may have been dropped (TRACE_MAX), and are skipped.
        """
        keys = [self.keys.run(run_id), self.keys.trace(run_id)]
        with self.errors():
            end, lines = self._read_trace(keys=keys, args=[max(0, start)])
        return int(end), [TraceEntry.model_validate_json(line) for line in lines]

    def activity_cursor(self) -> str:
        """Return the newest entry id of the activity stream (where a follower begins)."""
        with self.errors():
            newest = self.redis.xrevrange(self.keys.activity, "+", "-", count=1)
        return _text(newest[0][0]) if newest else "0-0"

    def wait_activity(self, cursor: str, block_ms: int) -> tuple[str, set[str]]:
        """Wait up to `block_ms` for runs whose trace grew after `cursor`; return (cursor, runs)."""
        with self.errors():
            answer = self.redis.xread({self.keys.activity: cursor}, block=block_ms, count=10_000)
        runs: set[str] = set()
        for _, entries in answer or []:
            for entry_id, data in entries:
                cursor = _text(entry_id)
                runs.add(_text(data[b"r"]))
        return cursor, runs

    def add_trace(self, run_id: str, entry: TraceEntry) -> None:
        k = self.keys
        with self.errors():
            self._trace(
                keys=[k.run(run_id), k.trace(run_id), k.activity],
                args=[run_id, TRACE_MAX, _line(entry)],
            )

    def runs(self, limit: int = 100) -> list[str]:
        """Return the newest run ids first."""
        with self.errors():
            return [_text(r) for r in self.redis.zrevrange(self.keys.runs, 0, limit - 1)]

    def prune_runs(self, older_than_ms: int, limit: int = 500) -> int:
        """Drop expired runs from the runs index (their keys expired on their own).

        Each call looks at the next `limit` entries older than `older_than_ms`,
        after where the previous call stopped (`prune-cursor`), and starts again
        from the oldest once it has been through them all: runs that stay alive
        (parked for weeks) never stop the sweep from reaching the others.
        """
        k = self.keys
        with self.errors():
            cursor = float(self.redis.get(k.prune_cursor) or 0)
            old = self.redis.zrangebyscore(
                k.runs, f"({cursor}", older_than_ms, start=0, num=limit, withscores=True
            )
            if not old:
                self.redis.delete(k.prune_cursor)  # through them all: from the oldest next time
                return 0
            pipe = self.redis.pipeline(transaction=False)
            for run_id, _ in old:
                pipe.exists(k.run(_text(run_id)))
            gone = [
                run_id
                for (run_id, _), exists in zip(old, pipe.execute(), strict=True)
                if not exists
            ]
            pipe = self.redis.pipeline(transaction=False)
            if gone:
                pipe.zrem(k.runs, *gone)
            pipe.set(k.prune_cursor, repr(old[-1][1]))
            pipe.execute()
        return len(gone)

    def due_messages(self, now_ms: int, limit: int = 500) -> list[str]:
        """Return outbox members whose time to be dealt with has passed."""
        with self.errors():
            members = self.redis.zrangebyscore(self.keys.outbox, 0, now_ms, start=0, num=limit)
        return [_text(m) for m in members]

    def postpone(self, members: Sequence[str], due_ms: int) -> None:
        if not members:
            return
        with self.errors():
            self.redis.zadd(self.keys.outbox, dict.fromkeys(members, due_ms), xx=True)


def _json(value: RunRecord | Pending) -> str:
    """Stored JSON leaves out what equals its default: a parked run costs less memory."""
    return value.model_dump_json(exclude_defaults=True)


def _line(entry: TraceEntry) -> str:
    return entry.model_dump_json(exclude_defaults=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: bytes | None) -> int:
    return int(value) if value else 0


def _loaded(version: Any, meta: Any, snap: Any, entries: list[Any]) -> Loaded | None:
    """Return a run read back from Redis, or None if there is none."""
    if version is None:
        return None
    inbox = [(_text(entry_id), _event(_fields(data))) for entry_id, data in entries]
    try:
        record = RunRecord.model_validate_json(meta or b"")
    except ValidationError as error:
        return Loaded(_text(version), None, _text(snap or b""), inbox, _first(error))
    return Loaded(_text(version), record, _text(snap or b""), inbox)


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


def _first(error: ValidationError) -> str:
    details = error.errors()
    where = ".".join(str(p) for p in details[0]["loc"]) if details else ""
    return f"the run's record is corrupt ({where or 'not JSON'})"
