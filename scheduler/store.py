"""Schedules and notifications in Redis, and the claim that fires a slot exactly once.

Keys, under the Relay's prefix (`ScheduleKeys`; `workers.layout` maps the rest):

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

The redis client is handed in (any redis-py client, bytes or decoded replies);
Redis errors are not translated here (`workers` does that at its edge).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from scheduler.schedules import Schedule

__all__ = ["Due", "Notification", "ScheduleKeys", "ScheduleStore", "fire_id"]

log = logging.getLogger(__name__)

SLOT_TTL_MS = 2 * 24 * 60 * 60 * 1000
"""How long a claimed slot key lives: far longer than any tick or clock skew between beats."""
NOTIFICATIONS_MAX = 1_000

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
    def under(cls, prefix: str) -> ScheduleKeys:
        return cls(
            schedules=f"{prefix}schedules",
            due=f"{prefix}schedule-due",
            slot_prefix=f"{prefix}schedule-slot:",
            firing=f"{prefix}schedule-firing",
            notifications=f"{prefix}notifications",
        )

    def slot(self, name: str, slot_ms: int) -> str:
        return f"{self.slot_prefix}{name}:{slot_ms}"


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
    """Schedules of one Relay (one key prefix) in Redis; safe to share between threads."""

    def __init__(self, redis_client: Any, prefix: str) -> None:
        self.redis = redis_client
        self.prefix = prefix
        self.keys = ScheduleKeys.under(prefix)
        keys = self.keys
        self.schedules_key = keys.schedules
        self.due_key = keys.due
        self.notifications_key = keys.notifications
        self.firing_key = keys.firing
        self._claim: Any = redis_client.register_script(_CLAIM)

    def slot_key(self, name: str, slot_ms: int) -> str:
        return self.keys.slot(name, slot_ms)

    def put(self, schedule: Schedule) -> bool:
        """Store `schedule`, replacing one of the same name; return True if it replaced one.

        A replaced schedule's slot in progress is not fired by a tick that read the
        old one (its claim finds the text changed); the new one fires on its own times.
        """
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.schedules_key, schedule.name, schedule.model_dump_json())
        pipe.zadd(self.due_key, {schedule.name: schedule.next_due_ms})
        added, _ = pipe.execute()
        return not added

    def get(self, name: str) -> Schedule | None:
        """Return the schedule of that name, or None (also when its stored text is unusable)."""
        stored = self.redis.hget(self.schedules_key, name)
        return None if stored is None else _load(name, stored)

    def all(self) -> list[Schedule]:
        """Return every usable schedule, by name."""
        found = []
        for name, stored in sorted(self.redis.hgetall(self.schedules_key).items()):
            schedule = _load(_text(name), stored)
            if schedule is not None:
                found.append(schedule)
        return found

    def remove(self, name: str) -> bool:
        """Remove the schedule; False if there was none. A tick that read it fires nothing."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(self.schedules_key, name)
        pipe.zrem(self.due_key, name)
        removed, _ = pipe.execute()
        return bool(removed)

    def due(self, now_ms: int) -> list[Due]:
        """Return the schedules with a slot at or before `now_ms`, soonest first."""
        names = self.redis.zrangebyscore(self.due_key, "-inf", now_ms)
        if not names:
            return []
        found = []
        for name, stored in zip(names, self.redis.hmget(self.schedules_key, names), strict=True):
            schedule = None if stored is None else _load(_text(name), stored)
            # The stored schedule, not the index, decides: never early.
            if schedule is not None and schedule.due(now_ms):
                found.append(Due(schedule, stored))
        return found

    def claim(self, due: Due, now_ms: int, notification: Notification | None = None) -> bool:
        """Claim `due`'s slot; True for exactly one caller per (schedule, slot).

        The winner's claim also stored the schedule's new last run and, if given,
        the notification. False: another tick claimed it, or the schedule was
        replaced, removed or advanced since it was read.
        """
        schedule = due.schedule
        updated = schedule.fired(due.slot_ms, now_ms)
        keys = [
            self.schedules_key,
            self.due_key,
            self.slot_key(schedule.name, due.slot_ms),
            self.notifications_key,
            self.firing_key,
        ]
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
        answer = self._claim(keys=keys, args=args)
        return (answer.decode() if isinstance(answer, bytes) else answer) == "claimed"

    def fired(self, name: str, slot_ms: int) -> None:
        """Forget a firing slot: its run exists (or cannot ever start)."""
        self.redis.zrem(self.firing_key, firing_member(name, slot_ms))

    def stale_firings(self, older_than_ms: int) -> list[tuple[str, int]]:
        """Return (schedule name, slot) of slots claimed before `older_than_ms` whose
        run was never confirmed: the tick that claimed them stopped midway."""
        found = []
        for member in self.redis.zrangebyscore(self.firing_key, "-inf", older_than_ms):
            name, _, slot = _text(member).rpartition("|")
            if name and slot.isdigit():
                found.append((name, int(slot)))
            else:
                self.redis.zrem(self.firing_key, member)
        return found

    def notify(self, notification: Notification) -> None:
        """Record a notification (the newest `NOTIFICATIONS_MAX` are kept)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(self.notifications_key, notification.model_dump_json())
        pipe.ltrim(self.notifications_key, 0, NOTIFICATIONS_MAX - 1)
        pipe.execute()

    def notifications(self, limit: int = 50) -> list[Notification]:
        """Return up to `limit` notifications, newest first (unreadable ones are skipped)."""
        if limit <= 0:
            return []
        found = []
        for stored in self.redis.lrange(self.notifications_key, 0, limit - 1):
            try:
                found.append(Notification.model_validate_json(stored))
            except ValidationError:
                log.warning("skipping an unreadable notification: %.200r", stored)
        return found


def _load(name: str, stored: bytes | str) -> Schedule | None:
    try:
        return Schedule.model_validate_json(stored)
    except ValidationError as error:
        log.warning("schedule %r cannot be read, so it never fires: %s", name, error)
        return None
