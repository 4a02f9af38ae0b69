"""The fleet-wide indexes' shards: which exist, and reads that go over all of them.

On a single Redis there is one shard (the keys `runs`, `outbox`, ... of the map in
`workers.layout`). On Redis Cluster each hash slot has its own, in that slot, so a
run's SAVE updates its run and its index entries in one script (one slot); the
readers (the tick, listings) go over the shards of the slots in use.

Which slots are in use is the set `index-slots`: a root's slot is added to it
before the CREATE that writes the root's first index entries (every run of a tree
is in its root's slot), so the set always holds every slot with entries. That
write is a second command, on another slot: safe because it comes first and adding
a slot twice changes nothing; a crash between the two leaves a slot listed whose
shards are empty, which costs a tick one empty read per index. Slots are never
taken out (a slot emptied now may be written again by the next CREATE): the set
holds at most 16384 numbers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from workers.codec import as_text, notes_key
from workers.effects import KeptNotes
from workers.layout import NOTES_MAX, IndexKeys

if TYPE_CHECKING:
    from workers.store import RunStore

__all__ = ["Shards"]


class Shards:
    """The index shards of a RunStore's Redis."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self._listed: set[int] = set()
        """Slots this process already saw in `index-slots`: listed once, they stay."""
        self._lock = threading.Lock()

    def all(self) -> list[IndexKeys]:
        """Every shard that may hold entries (the one on a single Redis)."""
        keys = self._store.keys
        if not keys.cluster:
            return [keys.index("")]
        with self._store.errors():
            slots = self._store.redis.smembers(keys.index_slots)
        return [keys.shard(int(slot)) for slot in sorted(int(s) for s in slots)]

    def enlist(self, run_id: str) -> None:
        """List the slot of the run's tree before its first index entry is written."""
        keys = self._store.keys
        if not keys.cluster:
            return
        slot = keys.slot(run_id)
        with self._lock:
            if slot in self._listed:
                return
        with self._store.errors():
            self._store.redis.sadd(keys.index_slots, slot)
        with self._lock:
            self._listed.add(slot)

    def by_shard(self, runs: Iterable[tuple[str, str]]) -> Iterator[tuple[IndexKeys, list[str]]]:
        """Group (run id, member) pairs by the shard of each run."""
        keys, groups = self._store.keys, dict[IndexKeys, list[str]]()
        for run_id, member in runs:
            groups.setdefault(keys.index(run_id), []).append(member)
        yield from groups.items()

    def newest_runs(self, limit: int) -> list[str]:
        """The newest `limit` run ids of every shard, newest first."""
        shards = self.all()
        with self._store.errors():
            pipe = self._store.redis.pipeline(transaction=False)
            for shard in shards:
                pipe.zrevrange(shard.runs, 0, limit - 1, withscores=True)
            found = [entry for entries in pipe.execute() for entry in entries]
        found.sort(key=lambda entry: -entry[1])
        return [as_text(run_id) for run_id, _ in found[:limit]]

    def in_range(self, index: str, low: float, high: float, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` (member, score) of each shard's `index` ("outbox", "pending",
        "deadlines") scored from `low` to `high`, lowest first."""
        shards = self.all()
        with self._store.errors():
            pipe = self._store.redis.pipeline(transaction=False)
            for shard in shards:
                key = getattr(shard, index)
                pipe.zrangebyscore(key, low, high, start=0, num=limit, withscores=True)
            found = [(as_text(m), float(s)) for entries in pipe.execute() for m, s in entries]
        found.sort(key=lambda entry: entry[1])
        return found[:limit]

    def keep_notes(self, notes: KeptNotes) -> None:
        """Keep a finished run's notes on a cluster, after the SAVE that finished it (they
        are in another slot). Their loss in a crash between the two is the cost: the
        next run starts without them; the run itself is saved either way."""
        key = notes_key(self._store.keys, notes)
        with self._store.errors():
            pipe = self._store.redis.pipeline(transaction=False)
            pipe.rpush(key, *notes.notes)
            pipe.ltrim(key, -NOTES_MAX, -1)
            pipe.execute()
