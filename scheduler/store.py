"""Schedules and notifications in Redis, and the claim that fires a slot exactly once.

Keys, under the Relay's prefix (`ScheduleKeys`; `workers.store.layout` maps the rest). On a
single Redis there is one set of them; on Redis Cluster one per hash slot, each name
ending in the slot's hash tag, and a schedule in the shard of its name's slot
(`ScheduleShards`: the host says where a schedule lives and reads over every shard):

    {prefix}schedules                      hash: name -> Schedule JSON
    {prefix}schedule-due                   sorted set: name scored by its next due ms
    {prefix}schedule-slot:{name}:{slot}    "1" while the slot is claimed (SET NX, expires)
    {prefix}notifications                  list of Notification JSON, newest first, capped
    {prefix}schedule-firing                sorted set: "name|slot" of run slots claimed
                                           but whose run is not known to exist yet

Theory of operation. Any number of ticks (two beats, a retried or slow tick,
several worker threads) may look at one due schedule at once. Each reads the
schedule's stored text, works out the slot (`next_due_ms`) and calls `claim`,
one Lua script that in one step
  1. checks the stored text is still exactly what it read (else the schedule was
     replaced, removed or already advanced by another tick: no fire),
  2. takes `schedule-slot:{name}:{slot}` with SET NX (else someone has it: no fire),
  3. stores the schedule with its new `last_run_ms` and next due time, and
  4. for a notify-only schedule, pushes its notification.
  5. for a run schedule, records the slot as firing.
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

from scheduler.schedules import Schedule

__all__ = [
    "Due",
    "Notification",
    "OneShard",
    "ScheduleKeys",
    "ScheduleShards",
    "ScheduleStore",
    "fire_id",
]

log = logging.getLogger(__name__)

SLOT_TTL_MS = 2 * 24 * 60 * 60 * 1000
"""How long a claimed slot key lives: far longer than any tick or clock skew between beats."""
NOTIFICATIONS_MAX = 1_000
"""Notifications kept (per shard, on a cluster), the newest."""
READ_MAX = 1_000
"""Due schedules (and unconfirmed slots) one tick takes at most; the next tick takes the rest."""
UNREADABLE_RETRY_MS = 60 * 60 * 1000
"""When a schedule whose stored text cannot be read is looked at (and logged) again."""

_CLAIM = files("scheduler").joinpath("claim.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ScheduleKeys:
    """The keys of the schedules of one Relay (one key prefix)."""

    schedules: str
    due: str
    slot_prefix: str
    firing: str
    notifications: str

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
        )

    def slot(self, name: str, slot_ms: int) -> str:
        return f"{self.slot_prefix}{name}:{slot_ms}"


Index = Literal["due", "firing"]
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
    task: str
    slot_ms: int
    at_ms: int
    problem: str = ""
    """Empty for a notify-only slot; why the run did not start otherwise."""


@dataclass(frozen=True)
class Due:
    """A schedule found due, with its stored text exactly as read (the claim compares it)."""

    schedule: Schedule
    stored: bytes | str

    @property
    def slot_ms(self) -> int:
        return self.schedule.next_due_ms


def firing_member(name: str, slot_ms: int) -> str:
    return f"{name}|{slot_ms}"


def fire_id(name: str, slot_ms: int) -> str:
    """The id of the run a schedule's slot starts: the same for every tick that tries."""
    return "s" + hashlib.sha256(f"{name}\0{slot_ms}".encode()).hexdigest()[:15]


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

    def put(self, schedule: Schedule) -> bool:
        """Store `schedule`, replacing one of the same name; return True if it replaced one.

        A replaced schedule's slot in progress is not fired by a tick that read the
        old one (its claim finds the text changed); the new one fires on its own times.
        """
        keys = self.shards.of(schedule.name)
        self.shards.enlist(schedule.name)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.schedules, schedule.name, schedule.model_dump_json())
        pipe.zadd(keys.due, {schedule.name: schedule.next_due_ms})
        added, _ = pipe.execute()
        return not added

    def get(self, name: str) -> Schedule | None:
        """Return the schedule of that name, or None (also when its stored text is unusable)."""
        stored = self.redis.hget(self.shards.of(name).schedules, name)
        return None if stored is None else _load(name, stored)

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
        removed, _ = pipe.execute()
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
                fixes.zadd(index, {name: schedule.next_due_ms}, xx=True)
            else:
                found.append(Due(schedule, stored))
        if len(fixes):
            fixes.execute()
        return found

    def claim(self, due: Due, now_ms: int, notification: Notification | None = None) -> bool:
        """Claim `due`'s slot; True for exactly one caller per (schedule, slot).

        The winner's claim also stored the schedule's new last run and, if given,
        the notification. False: another tick claimed it, or the schedule was
        replaced, removed or advanced since it was read.
        """
        schedule = due.schedule
        updated = schedule.fired(due.slot_ms, now_ms)
        keys = self.shards.of(schedule.name)
        args = [
            schedule.name,
            due.stored,
            updated.model_dump_json(),
            updated.next_due_ms,
            SLOT_TTL_MS,
            "" if notification is None else notification.model_dump_json(),
            NOTIFICATIONS_MAX,
            firing_member(schedule.name, due.slot_ms),
            now_ms,
        ]
        taken = keys.slot(schedule.name, due.slot_ms)  # the key whose SET NX claims the slot
        answer = self._claim(
            keys=[keys.schedules, keys.due, taken, keys.notifications, keys.firing], args=args
        )
        return (answer.decode() if isinstance(answer, bytes) else answer) == "claimed"

    def fired(self, name: str, slot_ms: int) -> None:
        """Forget a firing slot: its run exists (or cannot ever start)."""
        self.redis.zrem(self.shards.of(name).firing, firing_member(name, slot_ms))

    def stale_firings(self, older_than_ms: int) -> list[tuple[str, int]]:
        """Return (schedule name, slot) of slots claimed before `older_than_ms` whose
        run was never confirmed: the tick that claimed them stopped midway."""
        found = []
        for member, _ in self.shards.lowest("firing", older_than_ms, READ_MAX):
            name, _, slot = member.rpartition("|")
            if name and slot.isdigit():
                found.append((name, int(slot)))
            else:  # not written by a claim
                self._drop_firing(member)
        return found

    def forget_firing(self, name: str, slot_ms: int) -> None:
        """Forget a firing slot of a schedule that no longer exists, in whichever shard
        holds it (a schedule's own shard, unless someone wrote it elsewhere)."""
        self._drop_firing(firing_member(name, slot_ms))

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


def _load(name: str, stored: bytes | str) -> Schedule | None:
    try:
        return Schedule.model_validate_json(stored)
    except ValidationError as error:
        # One line naming what is wrong (say an unknown time zone): pydantic's own text
        # runs over several lines with a URL.
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = f"{where}: {first['msg']}" if where else first["msg"]
        log.warning("schedule %r cannot be read, so it never fires: %s", name, problem)
        return None
