"""Schedules and notifications in Redis, and the claim that fires a slot exactly once.

Keys, under the Relay's prefix (`ScheduleKeys`; `workers.store.layout` maps the rest). On a
single Redis there is one set of them; on Redis Cluster one per hash slot, each name
ending in the slot's hash tag, and a schedule in the shard of its name's slot
(`ScheduleShards`: the host says where a schedule lives and reads over every shard):

    {prefix}schedules                      hash: name -> Schedule JSON
    {prefix}schedule-due                   sorted set: name scored by its next due ms
    {prefix}schedule-slot:{name}:{slot}    "1" while the slot is claimed (SET NX, expires)
    {prefix}notifications                  list of Notification JSON, newest first, capped
    {prefix}schedule-firing                sorted set: "name|slot|source" of run slots
                                           claimed but whose run is not known to exist yet
    {prefix}schedule-history:{name}        list of Firing JSON, newest first, capped
    {prefix}schedule-queue:{name}          sorted set: "source:slot" of firings asked for
                                           outside the schedule's times (run now,
                                           backfill, buffered), by slot
    {prefix}schedule-queued                sorted set: names with a queue, by its first slot
    {prefix}schedule-runs:{name}           sorted set: the last RECENT_RUNS runs it started,
                                           by when (the overlap policy asks which still go)

Theory of operation. Any number of ticks (two beats, a retried or slow tick,
several worker threads) may look at one due schedule at once. Each reads the
schedule's stored text, works out the slot (`next_due_ms`) and calls `claim`,
one Lua script that in one step
  1. checks the stored text is still exactly what it read (else the schedule was
     replaced, removed or already advanced by another tick: no fire),
  2. takes `schedule-slot:{name}:{slot}` with SET NX (else someone has it: no fire),
  3. stores the schedule with its new `last_run_ms` and next due time, and
  4. for a notify-only schedule, pushes its notification,
  5. for a slot that starts a run, records the slot as firing,
  6. writes what the slot did to the schedule's history (fired, skipped, missed,
     buffered: the tick decides, from the overlap policy and the catch-up window).
A queued firing is taken the same way by `take`: removing it from the queue is
the claim (ZREM answers 1 for one caller), with its firing and history entry in
the same script. A fired slot whose run then cannot start is marked `failed` by
`failed`, one script again: its history entry says so, with why, and the slot is
neither firing nor a run the schedule started any more.
Claim and last-run update cannot be split by a crash, so a slot is never fired
twice and never left claimed with the old last run. A run slot's run gets an id
derived from the schedule and the slot (`fire_id`), and the slot stays in the
firing set until its run exists: if the tick that won the claim dies before it
starts the run, a later tick starts it (`stale_firings`), and starting a run
whose id exists does nothing. So each slot fires exactly once.

Every key one schedule touches is in its shard, so the claim is one script on one
slot; the reads that cover every schedule (the due ones, the firing ones, listings,
notifications) go over the shards.

The redis client is handed in (any redis-py client, bytes or decoded replies);
Redis errors are not translated here (`workers` does that at its edge).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from scheduler.history import HISTORY_MAX, Firing, Source
from scheduler.schedules import Schedule, first_error

__all__ = [
    "Due",
    "Notification",
    "OneShard",
    "Queued",
    "ScheduleKeys",
    "ScheduleShards",
    "ScheduleStore",
    "SlotOutcome",
    "fire_id",
]

log = logging.getLogger(__name__)

SLOT_TTL_MS = 2 * 24 * 60 * 60 * 1000
"""How long a claimed slot key lives: far longer than any tick or clock skew between beats."""
NOTIFICATIONS_MAX = 1_000
"""Notifications kept (per shard, on a cluster), the newest."""
READ_MAX = 1_000
"""Due schedules (and unconfirmed slots) one tick takes at most; the next tick takes the rest."""
RECENT_RUNS = 20
"""Runs a schedule started that are kept to ask which still go (the overlap policy)."""
UNREADABLE_RETRY_MS = 60 * 60 * 1000
"""When a schedule whose stored text cannot be read is looked at (and logged) again."""

_CLAIM, _TAKE, _UPDATE, _FAIL = (
    files("scheduler").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    for name in ("claim", "take", "update", "fail")
)


@dataclass(frozen=True)
class ScheduleKeys:
    """The keys of the schedules of one Relay (one key prefix)."""

    schedules: str
    due: str
    slot_prefix: str
    firing: str
    notifications: str
    history_prefix: str
    queue_prefix: str
    queued: str
    runs_prefix: str

    @classmethod
    def under(cls, prefix: str, tag: str = "") -> ScheduleKeys:
        """The keys under `prefix`, each name ending in `tag` (a cluster's hash tag
        `{...}`, which puts them all in one slot; none on a single Redis)."""
        return cls(
            schedules=f"{prefix}schedules{tag}",
            due=f"{prefix}schedule-due{tag}",
            slot_prefix=f"{prefix}schedule-slot{tag}:",
            firing=f"{prefix}schedule-firing{tag}",
            notifications=f"{prefix}notifications{tag}",
            history_prefix=f"{prefix}schedule-history{tag}:",
            queue_prefix=f"{prefix}schedule-queue{tag}:",
            queued=f"{prefix}schedule-queued{tag}",
            runs_prefix=f"{prefix}schedule-runs{tag}:",
        )

    def runs(self, name: str) -> str:
        return f"{self.runs_prefix}{name}"

    def history(self, name: str) -> str:
        return f"{self.history_prefix}{name}"

    def queue(self, name: str) -> str:
        return f"{self.queue_prefix}{name}"

    def slot(self, name: str, slot_ms: int) -> str:
        return f"{self.slot_prefix}{name}:{slot_ms}"


Index = Literal["due", "firing", "queued"]
"""The sorted sets of a shard the tick reads by score."""


class ScheduleShards(Protocol):
    """Where schedules live: the keys of one schedule, and reads over all of them."""

    def of(self, name: str) -> ScheduleKeys:
        """The shard holding the schedule `name` (and its slots, firing and notifications)."""
        ...

    def all(self) -> list[ScheduleKeys]:
        """Every shard that may hold schedules."""
        ...

    def enlist(self, name: str) -> None:
        """Make `all` list the shard of `name`; called before its first write there."""
        ...

    def lowest(self, index: Index, high: int, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` (member, score) of the shards' sorted set `index`, scored at or
        below `high`, lowest first (with more than `limit`, not necessarily the lowest
        of all shards)."""
        ...


class OneShard:
    """Every schedule in one set of keys: a single Redis."""

    def __init__(self, redis_client: Any, keys: ScheduleKeys) -> None:
        self.redis = redis_client
        self.keys = keys

    def of(self, name: str) -> ScheduleKeys:
        del name  # one shard holds every schedule
        return self.keys

    def all(self) -> list[ScheduleKeys]:
        return [self.keys]

    def enlist(self, name: str) -> None:
        del name  # always listed

    def lowest(self, index: Index, high: int, limit: int) -> list[tuple[str, float]]:
        key = getattr(self.keys, index)
        found = self.redis.zrangebyscore(key, "-inf", high, start=0, num=limit, withscores=True)
        return [(_text(member), float(score)) for member, score in found]


class Notification(BaseModel):
    """What a notify-only schedule records at a slot (or a run that could not start)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schedule: str
    task: str = ""
    """The filled task of a notify-only slot; empty when a run could not start (its
    `problem` says why; the task is the schedule's, and may be long)."""
    slot_ms: int
    at_ms: int
    problem: str = ""
    """Empty for a notify-only slot; why the run did not start otherwise."""
    run_id: str | None = None
    waits: str = ""
    """What the schedule's run `run_id` waits for a person on (its `on_wait` is notify)."""


@dataclass(frozen=True)
class Due:
    """A schedule found due, with its stored text exactly as read (the claim compares it)."""

    schedule: Schedule
    stored: bytes | str

    @property
    def slot_ms(self) -> int:
        return self.schedule.next_due_ms


@dataclass(frozen=True)
class Queued:
    """A firing asked for outside the schedule's times, waiting in its queue."""

    source: Source
    slot_ms: int

    @property
    def member(self) -> str:
        return f"{self.source}:{self.slot_ms}"


@dataclass(frozen=True)
class SlotOutcome:
    """What a claimed slot does: its history entry, and whether it starts a run."""

    firing: Firing
    notification: Notification | None = None
    queue: Queued | None = None
    """A firing `buffer_one` keeps for when the run before it ends."""

    @property
    def starts(self) -> bool:
        return self.firing.kind == "fired"


def firing_member(name: str, slot_ms: int, source: Source = "schedule") -> str:
    if source in ("schedule", "buffer"):
        return f"{name}|{slot_ms}"  # as before there were other sources
    return f"{name}|{slot_ms}|{source}"


def fire_id(name: str, slot_ms: int, source: Source = "schedule") -> str:
    """The id of the run a firing starts: the same for every tick that tries.

    A buffered slot starts the run its time would have; a run-now or backfilled
    firing gets an id of its own, so backfilling a slot that already fired runs it again.
    """
    text = f"{name}\0{slot_ms}"
    if source not in ("schedule", "buffer"):
        text += f"\0{source}"
    return "s" + hashlib.sha256(text.encode()).hexdigest()[:15]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ScheduleStore:
    """Schedules of one Relay (one key prefix) in Redis; safe to share between threads.

    `shards` says where each schedule lives (default: one set of keys under
    `prefix`, as on a single Redis).
    """

    def __init__(
        self, redis_client: Any, prefix: str, shards: ScheduleShards | None = None
    ) -> None:
        self.redis = redis_client
        self.prefix = prefix
        self.shards = shards or OneShard(redis_client, ScheduleKeys.under(prefix))
        self._claim: Any = redis_client.register_script(_CLAIM)
        self._take: Any = redis_client.register_script(_TAKE)
        self._update: Any = redis_client.register_script(_UPDATE)
        self._fail: Any = redis_client.register_script(_FAIL)

    def put(self, schedule: Schedule) -> bool:
        """Store `schedule`, replacing one of the same name; return True if it replaced one.

        A replaced schedule's slot in progress is not fired by a tick that read the
        old one (its claim finds the text changed); the new one fires on its own times.
        """
        keys = self.shards.of(schedule.name)
        self.shards.enlist(schedule.name)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.schedules, schedule.name, schedule.model_dump_json())
        pipe.zadd(keys.due, {schedule.name: schedule.fire_at_ms})
        added, _ = pipe.execute()
        return not added

    def get(self, name: str) -> Schedule | None:
        """Return the schedule of that name, or None (also when its stored text is unusable)."""
        found = self.read(name)
        return None if found is None else found.schedule

    def read(self, name: str) -> Due | None:
        """Return the schedule with its stored text (for `update`), or None."""
        stored = self.redis.hget(self.shards.of(name).schedules, name)
        schedule = None if stored is None else _load(name, stored)
        return None if schedule is None or stored is None else Due(schedule, stored)

    def update(self, read: Due, changed: Schedule, firing: Firing) -> bool:
        """Store `changed` in place of the schedule as `read`, with its history entry;
        False (nothing written) if the schedule changed or went since it was read."""
        keys = self.shards.of(changed.name)
        args = [changed.name, read.stored, changed.model_dump_json(), changed.fire_at_ms]
        args += [firing.model_dump_json(), HISTORY_MAX]
        done = self._update(keys=[keys.schedules, keys.due, keys.history(changed.name)], args=args)
        return bool(done)

    def all(self) -> list[Schedule]:
        """Return every usable schedule, by name."""
        pipe = self.redis.pipeline(transaction=False)
        for keys in self.shards.all():
            pipe.hgetall(keys.schedules)
        stored = {_text(name): text for shard in pipe.execute() for name, text in shard.items()}
        found = [_load(name, stored[name]) for name in sorted(stored)]
        return [schedule for schedule in found if schedule is not None]

    def remove(self, name: str) -> bool:
        """Remove the schedule; False if there was none. A tick that read it fires nothing."""
        keys = self.shards.of(name)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(keys.schedules, name)
        pipe.zrem(keys.due, name)
        pipe.delete(keys.history(name), keys.queue(name), keys.runs(name))
        pipe.zrem(keys.queued, name)
        removed, *_ = pipe.execute()
        return bool(removed)

    def due(self, now_ms: int) -> list[Due]:
        """Return the schedules with a slot at or before `now_ms`, soonest first (at most
        READ_MAX; on a cluster, those of the shards read first: the next tick takes the
        rest).

        The stored schedule, not the index, decides: an index entry that is wrong is
        set right here, so none stays at the front of the index for good: a schedule
        not due yet gets its own next due time, one that cannot be read is looked at
        again in UNREADABLE_RETRY_MS, and an entry with no schedule goes.
        """
        names = [name for name, _ in self.shards.lowest("due", now_ms, READ_MAX)]
        if not names:
            return []
        shards = [self.shards.of(name) for name in names]
        pipe = self.redis.pipeline(transaction=False)
        for name, keys in zip(names, shards, strict=True):
            pipe.hget(keys.schedules, name)
        found, fixes = [], self.redis.pipeline(transaction=False)
        for name, keys, stored in zip(names, shards, pipe.execute(), strict=True):
            index = keys.due
            schedule = None if stored is None else _load(name, stored)
            if stored is None:
                fixes.zrem(index, name)
            elif schedule is None:
                fixes.zadd(index, {name: now_ms + UNREADABLE_RETRY_MS}, xx=True)
            elif not schedule.due(now_ms):  # never early
                fixes.zadd(index, {name: schedule.fire_at_ms}, xx=True)
            else:
                found.append(Due(schedule, stored))
        if len(fixes):
            fixes.execute()
        return found

    def claim(self, due: Due, slot_ms: int, now_ms: int, outcome: SlotOutcome) -> bool:
        """Claim `slot_ms` of `due`'s schedule; True for exactly one caller per (schedule, slot).

        The winner's claim also stored the schedule's new last run, the outcome's
        history entry and, as the outcome says, its notification, its firing (a run
        to start) or its buffered firing. False: another tick claimed it, or the
        schedule was replaced, removed or advanced since it was read.
        """
        schedule = due.schedule
        updated = schedule.fired(slot_ms, now_ms)
        keys = self.shards.of(schedule.name)
        notice, queued = outcome.notification, outcome.queue
        args = [
            schedule.name,
            due.stored,
            updated.model_dump_json(),
            updated.fire_at_ms,
            SLOT_TTL_MS,
            "" if notice is None else notice.model_dump_json(),
            NOTIFICATIONS_MAX,
            firing_member(schedule.name, slot_ms) if outcome.starts else "",
            now_ms,
            outcome.firing.model_dump_json(),
            HISTORY_MAX,
            "" if queued is None else queued.member,
            0 if queued is None else queued.slot_ms,
            outcome.firing.run_id or "",
            RECENT_RUNS,
        ]
        taken = keys.slot(schedule.name, slot_ms)  # the key whose SET NX claims the slot
        name = schedule.name
        named = [keys.history(name), keys.queue(name), keys.queued, keys.runs(name)]
        answer = self._claim(
            keys=[keys.schedules, keys.due, taken, keys.notifications, keys.firing, *named],
            args=args,
        )
        return _text(answer) == "claimed"

    def enqueue(self, name: str, firings: list[Queued]) -> None:
        """Queue firings outside the schedule's times; the tick takes them (`take`)."""
        if not firings:
            return
        keys = self.shards.of(name)
        self.shards.enlist(name)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zadd(keys.queue(name), {f.member: f.slot_ms for f in firings})
        pipe.zadd(keys.queued, {name: min(f.slot_ms for f in firings)}, lt=True)
        pipe.execute()

    def queued_names(self, now_ms: int) -> list[str]:
        """Return the schedules whose queue holds a firing due by `now_ms` (at most READ_MAX)."""
        return [name for name, _ in self.shards.lowest("queued", now_ms, READ_MAX)]

    def queue(self, name: str, limit: int) -> list[Queued]:
        """Return up to `limit` queued firings of the schedule, soonest first."""
        found = self.redis.zrange(self.shards.of(name).queue(name), 0, limit - 1)
        return [q for q in (_queued(_text(member)) for member in found) if q is not None]

    def take(self, name: str, queued: Queued, now_ms: int, firing: Firing) -> bool:
        """Take a queued firing with its history entry (and, if it starts a run, its
        firing); True for exactly one caller."""
        keys = self.shards.of(name)
        starts = firing.kind == "fired"
        args = [
            queued.member,
            name,
            firing_member(name, queued.slot_ms, queued.source) if starts else "",
            now_ms,
            firing.model_dump_json(),
            HISTORY_MAX,
            firing.run_id or "",
            RECENT_RUNS,
        ]
        named = [keys.queue(name), keys.queued, keys.firing, keys.history(name), keys.runs(name)]
        answer = self._take(keys=named, args=args)
        return _text(answer) == "taken"

    def recent_runs(self, name: str) -> list[tuple[str, int]]:
        """Return (run id, when it fired) of the last RECENT_RUNS runs the schedule
        started, newest first."""
        key = self.shards.of(name).runs(name)
        found = self.redis.zrevrange(key, 0, RECENT_RUNS - 1, withscores=True)
        return [(_text(run_id), int(at)) for run_id, at in found]

    def history(self, name: str, limit: int = HISTORY_MAX) -> list[Firing]:
        """Return the schedule's history, newest first (unreadable entries skipped)."""
        found = []
        for stored in self.redis.lrange(self.shards.of(name).history(name), 0, limit - 1):
            try:
                found.append(Firing.model_validate_json(stored))
            except ValidationError:
                log.warning("schedule %r: skipping an unreadable history entry", name)
        return found

    def fired(self, name: str, firing: Queued) -> None:
        """Forget a firing slot: its run exists (or cannot ever start)."""
        member = firing_member(name, firing.slot_ms, firing.source)
        self.redis.zrem(self.shards.of(name).firing, member)

    def failed(self, name: str, firing: Queued, entry: Firing) -> bool:
        """Record that `firing`'s run could not start: its `fired` history entry becomes
        `entry` (a `failed` one), and the slot is forgotten as firing and as a run the
        schedule started. False (no entry written) if its entry had gone."""
        keys = self.shards.of(name)
        run_id = fire_id(name, firing.slot_ms, firing.source)
        member = firing_member(name, firing.slot_ms, firing.source)
        args = [run_id, entry.model_dump_json(), HISTORY_MAX, member]
        done = self._fail(keys=[keys.history(name), keys.runs(name), keys.firing], args=args)
        return bool(done)

    def stale_firings(self, older_than_ms: int) -> list[tuple[str, Queued]]:
        """Return (schedule name, firing) of slots claimed before `older_than_ms` whose
        run was never confirmed: the tick that claimed them stopped midway."""
        found = []
        for member, _ in self.shards.lowest("firing", older_than_ms, READ_MAX):
            name, _, rest = member.partition("|")
            slot, _, source = rest.partition("|")
            queued = _queued(f"{source or 'schedule'}:{slot}")
            if name and queued is not None:
                found.append((name, queued))
            else:  # not written by a claim
                self._drop_firing(member)
        return found

    def forget_firing(self, name: str, firing: Queued) -> None:
        """Forget a firing slot of a schedule that no longer exists, in whichever shard
        holds it (a schedule's own shard, unless someone wrote it elsewhere)."""
        self._drop_firing(firing_member(name, firing.slot_ms, firing.source))

    def _drop_firing(self, member: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for keys in self.shards.all():
            pipe.zrem(keys.firing, member)
        pipe.execute()

    def notify(self, notification: Notification) -> None:
        """Record a notification (the newest `NOTIFICATIONS_MAX` are kept)."""
        key = self.shards.of(notification.schedule).notifications
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(key, notification.model_dump_json())
        pipe.ltrim(key, 0, NOTIFICATIONS_MAX - 1)
        pipe.execute()

    def notifications(self, limit: int = 50) -> list[Notification]:
        """Return up to `limit` notifications, newest first (unreadable ones are skipped)."""
        if limit <= 0:
            return []
        shards = self.shards.all()
        pipe = self.redis.pipeline(transaction=False)
        for keys in shards:
            pipe.lrange(keys.notifications, 0, limit - 1)
        found = []
        for stored in (text for shard in pipe.execute() for text in shard):
            try:
                found.append(Notification.model_validate_json(stored))
            except ValidationError:
                log.warning("skipping an unreadable notification: %.200r", stored)
        if len(shards) > 1:  # each shard is newest first; together, by when they were made
            found.sort(key=lambda notice: -notice.at_ms)
        return found[:limit]


_SOURCES: frozenset[str] = frozenset(("schedule", "run now", "backfill", "buffer"))


def _queued(member: str) -> Queued | None:
    """A queue member ("source:slot") read back, or None if nobody wrote it so."""
    source, _, slot = member.rpartition(":")
    if source not in _SOURCES or not slot.isdigit():
        return None
    return Queued(source, int(slot))  # type: ignore[arg-type]


def _load(name: str, stored: bytes | str) -> Schedule | None:
    try:
        return Schedule.model_validate_json(stored)
    except ValidationError as error:
        problem = first_error(error)  # say an unknown time zone
        log.warning("schedule %r cannot be read, so it never fires: %s", name, problem)
        return None
