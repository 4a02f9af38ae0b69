"""Where schedules live on Redis Cluster: one shard per hash slot (`scheduler.ScheduleShards`).

A schedule's keys (its text, its place in the due index, its slots' claims, its
firing slots, its notifications) are in the shard of the slot its name hashes to,
tagged like the index shards (`Keys.schedule_shard`), so its claim is one script on
one slot and no node holds every schedule. `schedule-slots{fleet}` lists the slots
written: a slot is added before a schedule's first write there, never removed (as
`index-slots`, workers.shards). The tick reads the due and firing indexes of every
listed shard with one SWEEP per node.

Before shards, a cluster kept every schedule in the one slot `{schedules}`. The first
read of a process moves what is left there into the shards (`adopt_one_slot`), each
step safe to repeat, so workers upgraded together lose no schedule.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pydantic import ValidationError

from scheduler import Notification, ScheduleKeys
from scheduler.store import Index
from workers.codec import as_text
from workers.sharding import key_slot
from workers.shards import SlotSet

if TYPE_CHECKING:
    from workers.store import RunStore

__all__ = ["ClusterSchedules"]

log = logging.getLogger(__name__)


class ClusterSchedules:
    """The schedule shards of a RunStore on Redis Cluster."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self._slots = SlotSet(store, store.keys.schedule_slots)
        self._adopted = False
        """Whether this process moved the one-slot layout's schedules (a failed move is
        tried again at the next read)."""

    def of(self, name: str) -> ScheduleKeys:
        return self._store.keys.schedules(name)

    def all(self) -> list[ScheduleKeys]:
        return [self._store.keys.schedule_shard(slot) for slot in self._listed()]

    def enlist(self, name: str) -> None:
        self._slots.add(key_slot(name.encode()))

    def lowest(self, index: Index, high: int, limit: int) -> list[tuple[str, float]]:
        keys = self._store.keys
        pairs = [(slot, getattr(keys.schedule_shard(slot), index)) for slot in self._listed()]
        found = self._store.shards.read(pairs, "due", (float("-inf"), high, limit))
        found.sort(key=lambda entry: entry[1])
        return found[:limit]

    def _listed(self) -> list[int]:
        """The slots of the shards written, in order (after adopting the one-slot layout,
        once)."""
        if not self._adopted:  # two threads may both adopt: each step is safe to repeat
            with self._store.errors():
                self.adopt_one_slot(ScheduleKeys.under(self._store.keys.prefix + "{schedules}"))
            self._adopted = True
        return self._slots.all()

    def adopt_one_slot(self, old: ScheduleKeys) -> int:
        """Move the schedules, firing slots and notifications of the one-slot layout `old`
        into their shards; return how many schedules moved.

        Each entry is copied (never over a newer one) before it is deleted, so a crash,
        or a second process doing the same, loses and doubles nothing; a notification
        popped by a process that dies before pushing it is the one thing lost.
        """
        redis, moved = self._store.redis, 0
        if not redis.exists(old.schedules, old.firing, old.notifications):
            return 0
        due = dict(redis.zrange(old.due, 0, -1, withscores=True))
        for raw, text in redis.hgetall(old.schedules).items():
            name = as_text(raw)
            new = self.of(name)
            self.enlist(name)
            if redis.hsetnx(new.schedules, name, text):
                redis.zadd(new.due, {name: due.get(raw, 0)}, nx=True)
                moved += 1
            redis.hdel(old.schedules, name)
            redis.zrem(old.due, name)
        for raw, when in redis.zrange(old.firing, 0, -1, withscores=True):
            name = as_text(raw).rpartition("|")[0]
            self.enlist(name)
            redis.zadd(self.of(name).firing, {raw: when}, nx=True)
            redis.zrem(old.firing, raw)
        while (notice := redis.rpop(old.notifications)) is not None:  # the oldest first
            try:
                name = Notification.model_validate_json(notice).schedule
            except ValidationError:
                continue  # unreadable: the listing would skip it anyway
            self.enlist(name)
            redis.lpush(self.of(name).notifications, notice)
        if moved:
            log.warning("moved %d schedules from the one-slot layout into their shards", moved)
        return moved
