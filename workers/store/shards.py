"""The fleet-wide indexes' shards: which exist, and reads that go over all of them.

On a single Redis there is one shard (the keys `runs`, `outbox`, ... of the map in
`workers.store.layout`). On Redis Cluster each hash slot has its own, in that slot, so a
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
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

from workers.engine.effects import KeptNotes
from workers.engine.records import RunList
from workers.store import reads, scripts
from workers.store.codec import as_text, notes_key
from workers.store.connection import Connection
from workers.store.layout import NOTES_MAX, IndexKeys
from workers.store.reads import SAME_MS_SLACK, RunCursor, newest_first

Mode = Literal["due", "newest"]
__all__ = ["Shards", "SlotSet"]


class SlotSet:
    """A set of hash slots in Redis that only grows (`index-slots`, `schedule-slots`):
    a slot is added before the first write to its shard; sweeps read it.

    This process remembers what it added and what it read: an add of a slot it
    listed is free, and a read whose SCARD is what it was costs one O(1) command,
    not an SMEMBERS of up to 16384 numbers. At least every REFRESH_S it reads the
    set again and adds back what it added itself, so an add that a failover lost
    (replication is asynchronous) is restored while its writer lives. A set found
    smaller than this process last read it was lost (a Redis restarted without its
    data): everything it read and added goes back at once.
    """

    REFRESH_S = 60.0

    def __init__(self, connection: Connection, key: str) -> None:
        self._connection = connection
        self.key = key
        self._lock = threading.Lock()
        self._added: set[int] = set()
        self._read: list[int] = []
        self._read_until = 0.0

    def add(self, slot: int) -> None:
        with self._lock:
            if slot in self._added:
                return
        with self._connection.errors():
            self._connection.redis.sadd(self.key, slot)
        with self._lock:
            self._added.add(slot)

    def all(self) -> list[int]:
        """Every slot in the set, in order."""
        redis = self._connection.redis
        with self._connection.errors():
            count = redis.scard(self.key)
            with self._lock:
                fresh = time.monotonic() < self._read_until
                if count == len(self._read) and fresh:
                    return self._read
                restore = set(self._added) if not fresh else set()
                if count < len(self._read):  # lost
                    restore |= {*self._added, *self._read}
            if restore:
                redis.sadd(self.key, *restore)
            found = sorted(int(slot) for slot in redis.smembers(self.key))
        with self._lock:
            self._read, self._read_until = found, time.monotonic() + self.REFRESH_S
        return found


class Shards:
    """The index shards of one Redis connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.slots = SlotSet(connection, connection.keys.index_slots)
        """The slots whose shards were written (`index-slots`)."""
        self._lock = threading.Lock()
        self._turn = 0
        """Where the next `window` starts."""

    def all(self) -> list[IndexKeys]:
        """Every shard that may hold entries (the one on a single Redis)."""
        keys = self._connection.keys
        if not keys.cluster:
            return [keys.index("")]
        return [keys.shard(slot) for slot in self.slots.all()]

    def window(self, count: int) -> list[IndexKeys]:
        """The next `count` shards of all, in turn (each call starts where the last one
        of this process stopped): for sweeps that may take their time, like pruning."""
        shards = self.all()
        if len(shards) <= count:
            return shards
        with self._lock:
            start = self._turn % len(shards)
            self._turn = start + count
        return (shards + shards)[start : start + count]

    def enlist(self, run_id: str) -> None:
        """List the slot of the run's tree before its first index entry is written."""
        keys = self._connection.keys
        if not keys.cluster:
            return
        self.slots.add(keys.slot(run_id))

    def by_shard(self, runs: Iterable[tuple[str, str]]) -> Iterator[tuple[IndexKeys, list[str]]]:
        """Group (run id, member) pairs by the shard of each run."""
        keys, groups = self._connection.keys, dict[IndexKeys, list[str]]()
        for run_id, member in runs:
            groups.setdefault(keys.index(run_id), []).append(member)
        yield from groups.items()

    def newest_runs(
        self, limit: int, lists: Sequence[RunList] = (), before: RunCursor | None = None
    ) -> list[tuple[str, int]]:
        """The newest `limit` runs of every shard, newest first, as (run id, created ms):
        of the lists `lists` (all runs if none), created before `before` if given (runs
        are ordered by creation time, then by id, both newest first)."""
        keys = [(shard.slot, key) for shard in self.all() for key in shard.run_indexes(lists)]
        high = float("inf") if before is None else before[0]
        # Runs created in the cursor's very millisecond may come before it: read past them.
        slack = 0 if before is None else SAME_MS_SLACK
        return newest_first(self.read(keys, "newest", (0, high, limit + slack)), before, limit)

    def count_runs(self, lists: Sequence[RunList] = ()) -> int:
        """How many runs the lists `lists` (all runs if none) hold, in every shard (those
        expired but not yet pruned by the tick included)."""
        return self._connection.drive(reads.count_runs(self._connection.keys, lists, self.all()))

    def in_range(self, index: str, low: float, high: float, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` (member, score) of the shards' `index` ("outbox", "pending",
        "deadlines") scored from `low` to `high`, lowest first."""
        keys = [(shard.slot, getattr(shard, index)) for shard in self.all()]
        return self.lowest(keys, low, high, limit)

    def lowest(
        self, keys: list[tuple[int, str]], low: float, high: float, limit: int
    ) -> list[tuple[str, float]]:
        """Up to `limit` (member, score) of the sorted sets `keys` ((hash slot, key)
        pairs) scored from `low` to `high`, lowest first."""
        found = self.read(keys, "due", (low, high, limit))
        found.sort(key=lambda entry: entry[1])
        return found[:limit]

    def read(
        self,
        keys: list[tuple[int, str]],
        mode: Mode,
        bounds: tuple[float, float, int],
    ) -> list[tuple[str, float]]:
        """Range-read the sorted sets `keys` ((hash slot, key) pairs; any slot on a single
        Redis), unsorted: `mode` "due" takes each one's lowest scores from `low` to `high`,
        "newest" its highest. One command on a single Redis (one key), one SWEEP per node
        on a cluster, then one command per key a node missed."""
        connection, found = self._connection, list[tuple[str, float]]()
        low, high, limit = bounds
        with connection.errors():
            if connection.keys.cluster and len(keys) > 1:
                missed = self._sweep(keys, mode, (_bound(low), _bound(high), limit), found)
            else:
                missed = [key for _, key in keys]
            pipe = connection.redis.pipeline(transaction=False)
            for key in missed:
                if mode == "newest":
                    pipe.zrevrangebyscore(key, high, low, start=0, num=limit, withscores=True)
                else:
                    pipe.zrangebyscore(key, low, high, start=0, num=limit, withscores=True)
            for entries in pipe.execute() if missed else []:
                found.extend((as_text(member), float(score)) for member, score in entries)
        return found

    def _sweep(
        self,
        keys: list[tuple[int, str]],
        mode: Mode,
        bounds: tuple[str, str, int],
        found: list[tuple[str, float]],
    ) -> list[str]:
        """Read `keys` with one SWEEP per node (lua/sweep.lua) into `found`; return the keys
        a node did not serve."""
        cluster, by_node = self._connection.redis, dict[str, tuple[Any, list[str]]]()
        slots = cluster.nodes_manager
        for slot, key in keys:
            node = slots.get_node_from_slot(slot)
            by_node.setdefault(node.name, (node, []))[1].append(key)
        missed: list[str] = []
        low, high, limit = bounds
        for node, group in by_node.values():
            sweep = scripts.sweep(mode=mode, low=low, high=high, limit=limit, shards=group)
            swept = self._connection.run(sweep, on=cluster.get_redis_connection(node))
            found.extend(swept.found)
            missed += swept.missed
        return missed

    def keep_notes(self, notes: KeptNotes) -> None:
        """Keep a finished run's notes on a cluster, after the SAVE that finished it (they
        are in another slot). Their loss in a crash between the two is the cost: the
        next run starts without them; the run itself is saved either way."""
        key = notes_key(self._connection.keys, notes)
        with self._connection.errors():
            pipe = self._connection.redis.pipeline(transaction=False)
            pipe.rpush(key, *notes.notes)
            pipe.ltrim(key, -NOTES_MAX, -1)
            pipe.execute()


def _bound(score: float) -> str:
    """A score bound as ZRANGEBYSCORE reads it (`-inf`, `+inf`, or the number)."""
    if score == float("inf"):
        return "+inf"
    if score == float("-inf"):
        return "-inf"
    return repr(score)
