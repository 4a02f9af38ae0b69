"""Where schedules live on Redis Cluster: one shard per hash slot (`scheduler.ScheduleShards`).

A schedule's keys (its text, its place in the due index, its slots' claims, its
firing slots, its notifications) are in the shard of the slot its name hashes to,
tagged like the index shards (`Keys.schedule_shard`), so its claim is one script on
one slot and no node holds every schedule. `schedule-slots{fleet}` lists the slots
written: a slot is added before a schedule's first write there, never removed (as
`index-slots`, workers.store.shards). The tick reads the due and firing indexes of every
listed shard with one SWEEP per node.

Before shards, a cluster kept every schedule in the one slot `{schedules}`. Before
a process first touches a schedule it moves what is left there into the shards
(`adopt_one_slot`), one process at a time (a lock in that slot; the others wait
for it), each step safe to repeat after a crash. Older workers must be stopped
first (README: upgrading a fleet): one still writing the old slot is not heard.
"""

from __future__ import annotations

import logging
import secrets
import time

from pydantic import ValidationError

from scheduler import Notification, Schedule, ScheduleKeys
from scheduler.store import NOTIFICATIONS_MAX, Index
from workers.errors import StoreUnavailable
from workers.store.codec import as_text
from workers.store.connection import Connection
from workers.store.shards import Shards, SlotSet

__all__ = ["ClusterSchedules"]

log = logging.getLogger(__name__)

MOVE_LOCK_MS = 30_000
"""How long the move's lock lasts: a process that dies moving is taken over after it."""


class ClusterSchedules:
    """The schedule shards of one Redis Cluster connection."""

    def __init__(self, connection: Connection, shards: Shards) -> None:
        self._connection = connection
        self._shards = shards
        self._slots = SlotSet(connection, connection.keys.schedule_slots)
        self._adopted = False
        """Whether this process saw the one-slot layout empty (a failed move is tried
        again at the next use)."""

    def of(self, name: str) -> ScheduleKeys:
        self._adopt()
        return self._connection.keys.schedules(name)

    def all(self) -> list[ScheduleKeys]:
        return [self._connection.keys.schedule_shard(slot) for slot in self._listed()]

    def enlist(self, name: str) -> None:
        self._slots.add(self._connection.keys.schedule_slot(name))

    def lowest(self, index: Index, high: int, limit: int) -> list[tuple[str, float]]:
        keys = self._connection.keys
        pairs = [(slot, getattr(keys.schedule_shard(slot), index)) for slot in self._listed()]
        return self._shards.lowest(pairs, float("-inf"), high, limit)

    def _listed(self) -> list[int]:
        """The slots of the shards written, in order."""
        self._adopt()
        return self._slots.all()

    def _adopt(self) -> None:
        """Move the one-slot layout's schedules into the shards, once per process, before
        the first use (two threads may both try: every step is safe to repeat)."""
        if self._adopted:
            return
        old = ScheduleKeys.under(self._connection.keys.prefix + "{schedules}")
        lock, token = old.slot_prefix + "moving", secrets.token_hex(8)
        redis, deadline = self._connection.redis, time.monotonic() + MOVE_LOCK_MS / 1000
        with self._connection.errors():
            while redis.exists(old.schedules, old.due, old.firing, old.notifications):
                if redis.set(lock, token, nx=True, px=MOVE_LOCK_MS):
                    try:
                        self.adopt_one_slot(old)
                    finally:
                        if as_text(redis.get(lock) or b"") == token:
                            redis.delete(lock)
                elif time.monotonic() > deadline:
                    raise StoreUnavailable("schedules are being moved into shards: try again")
                else:
                    time.sleep(0.05)  # another process is moving them
        self._adopted = True

    def adopt_one_slot(self, old: ScheduleKeys) -> int:
        """Move the schedules, firing slots and notifications of the one-slot layout `old`
        into their shards; return how many schedules moved.

        Each entry is copied (never over a newer one) before it is deleted, so a crash
        midway loses and doubles nothing; a notification popped by a process that dies
        before pushing it is the one thing lost.
        """
        redis, keys, moved = self._connection.redis, self._connection.keys, 0
        due = dict(redis.zrange(old.due, 0, -1, withscores=True))
        for raw, text in redis.hgetall(old.schedules).items():
            name = as_text(raw)
            new = keys.schedules(name)
            self.enlist(name)
            moved += redis.hsetnx(new.schedules, name, text)
            # Always (NX), so a move cut off after the copy still indexes it.
            redis.zadd(new.due, {name: _next_due(text, due.get(raw, 0))}, nx=True)
            redis.zrem(old.due, raw)
            redis.hdel(old.schedules, raw)
        redis.delete(old.due)  # what is left names no schedule
        for raw, when in redis.zrange(old.firing, 0, -1, withscores=True):
            name = as_text(raw).rpartition("|")[0]
            self.enlist(name)
            redis.zadd(keys.schedules(name).firing, {raw: when}, nx=True)
            redis.zrem(old.firing, raw)
        # The newest first; each goes to the tail of its shard's list, behind any made
        # since the upgrade (all newer than these).
        while (notice := redis.lpop(old.notifications)) is not None:
            try:
                name = Notification.model_validate_json(notice).schedule
            except ValidationError:
                continue  # unreadable: the listing would skip it anyway
            self.enlist(name)
            target = keys.schedules(name).notifications
            redis.rpush(target, notice)
            redis.ltrim(target, 0, NOTIFICATIONS_MAX - 1)
        if moved:
            log.warning("moved %d schedules from the one-slot layout into their shards", moved)
        return moved


def _next_due(text: bytes | str, indexed: float) -> float:
    """When a moved schedule is next due: as its text says (the old index may be stale)."""
    try:
        return Schedule.model_validate_json(text).next_due_ms
    except ValidationError:
        return indexed
