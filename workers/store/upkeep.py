"""The fleet's upkeep in Redis: the tick's lock, pruning expired runs, the outbox's due messages.

What one tick per interval does, besides firing schedules and declining what
expired (`workers.runtime.bodies.Runtime.heal`): the reads and writes here touch the
fleet-wide indexes, not one run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from workers.engine.ids import OutboxMember
from workers.store import scripts
from workers.store.codec import as_int, as_text
from workers.store.connection import Connection
from workers.store.layout import IndexKeys
from workers.store.shards import Shards

__all__ = ["PRUNE_SHARDS", "Upkeep"]

PRUNE_SHARDS = 256
"""Index shards one tick prunes on a cluster: all 16384 every 64 ticks (expired runs
wait a little longer to leave the index; the tick stays a few milliseconds)."""


class Upkeep:
    """The tick's reads and writes, on one Redis connection."""

    def __init__(self, connection: Connection, shards: Shards) -> None:
        self._connection = connection
        self._shards = shards

    def elect_ticker(
        self, holder: str, interval_ms: int, now_ms: int, *, settle_ms: int = 0
    ) -> int:
        """Return 0 if `holder` ticks now (it holds the lock for one interval), else the
        milliseconds until the lock lapses and the next tick is due. After two intervals
        with no tick (Redis or the fleet was away), the next is `settle_ms` later."""
        lock = scripts.tick_lock(
            self._connection.keys,
            holder=holder,
            interval_ms=interval_ms,
            now_ms=now_ms,
            settle_ms=settle_ms,
        )
        return self._connection.run(lock)

    def tick_stats(self) -> tuple[int, int | None, str | None]:
        """Return (ticks so far, when the last began in ms, which process ran it)."""
        redis, key = self._connection.redis, self._connection.keys.tick_stats
        with self._connection.errors():
            count, last, by = redis.hmget(key, ["n", "last_ms", "by"])
        return (
            as_int(count),
            None if last is None else int(last),
            None if by is None else as_text(by),
        )

    def prune_runs(self, older_than_ms: int, limit: int = 500) -> int:
        """Drop expired runs from the runs index (their keys expired on their own).

        Each call looks, in each shard (on a cluster: in the next PRUNE_SHARDS of them),
        at the next `limit` entries older than
        `older_than_ms`, after where the previous call stopped (the shard's
        `prune-cursor`), and starts again from the oldest once it has been through
        them all: runs that stay alive (parked for weeks) never stop the sweep from
        reaching the others.
        """
        redis, shards = self._connection.redis, self._shards.window(PRUNE_SHARDS)
        with self._connection.errors():
            pipe = redis.pipeline(transaction=False)
            for shard in shards:
                pipe.get(shard.prune_cursor)
            cursors = [float(c or 0) for c in pipe.execute()]
            pipe = redis.pipeline(transaction=False)
            for shard, cursor in zip(shards, cursors, strict=True):
                pipe.zrangebyscore(
                    shard.runs, f"({cursor}", older_than_ms, start=0, num=limit, withscores=True
                )
            olds: list[list[tuple[bytes, float]]] = pipe.execute()
            pipe = redis.pipeline(transaction=False)
            for old in olds:
                for run_id, _ in old:
                    pipe.exists(self._connection.keys.run(as_text(run_id)))
            alive = iter(pipe.execute())
            return self._forget_gone(shards, olds, alive)

    def _forget_gone(
        self, shards: list[IndexKeys], olds: list[list[tuple[bytes, float]]], alive: Iterator[int]
    ) -> int:
        """Take the runs found gone out of their shards, and move each shard's cursor."""
        pipe, dropped = self._connection.redis.pipeline(transaction=False), 0
        for shard, old in zip(shards, olds, strict=True):
            if not old:
                pipe.delete(shard.prune_cursor)  # through them all: from the oldest next time
                continue
            gone = [run_id for run_id, _ in old if not next(alive)]
            if gone:
                for index in (shard.runs, *shard.lists):
                    pipe.zrem(index, *gone)
            pipe.set(shard.prune_cursor, repr(old[-1][1]))
            dropped += len(gone)
        pipe.execute()
        return dropped

    def list_old_runs(self, limit: int = 500) -> int:
        """Put runs from before the list indexes (`runs:<list>`) on their lists: the next
        `limit` of each shard (on a cluster: of the next PRUNE_SHARDS shards) not looked
        at yet, oldest first, until a shard is through (`lists-built`). Returns how many
        were listed. Once every shard is through it costs one read per shard."""
        connection = self._connection
        shards = self._shards.window(PRUNE_SHARDS)
        redis, listed = connection.redis, 0
        with connection.errors():
            pipe = redis.pipeline(transaction=False)
            for shard in shards:  # (no MGET: a cluster's pipeline refuses it)
                pipe.get(shard.lists_built)
                pipe.get(shard.lists_cursor)
            read = pipe.execute()
            marks = zip(read[::2], read[1::2], strict=True)
            for shard, (built, cursor) in zip(shards, marks, strict=True):
                if built is not None:
                    continue
                start = "-inf" if cursor is None else as_text(cursor)
                batch = redis.zrangebyscore(
                    shard.runs, start, "+inf", start=0, num=limit, withscores=True
                )
                runs = [(as_text(run_id), int(score)) for run_id, score in batch]
                through = len(runs) < limit
                if not through and runs[0][1] != runs[-1][1]:
                    # The batch may cut a millisecond in two: its runs go with the next.
                    last = runs[-1][1]
                    runs = [(run_id, score) for run_id, score in runs if score != last]
                if runs:
                    listed += connection.run(
                        scripts.relist(connection.keys, shard=shard, runs=runs)
                    )
                if through:  # runs made since are listed by their own CREATE
                    redis.set(shard.lists_built, 1)
                else:  # (a batch all of one millisecond: more of it than `limit` are missed)
                    redis.set(shard.lists_cursor, f"({runs[-1][1]}")
        return listed

    def deadlines_due(self, now_ms: int, limit: int = 500) -> list[str]:
        """Return the roots whose budget's `seconds` ran out by `now_ms`."""
        return [root for root, _ in self._shards.in_range("deadlines", 0, now_ms, limit)]

    def forget_deadline(self, root: str) -> None:
        with self._connection.errors():
            self._connection.redis.zrem(self._connection.keys.index(root).deadlines, root)

    def due_messages(self, now_ms: int, limit: int = 500) -> list[str]:
        """Return outbox members whose time to be dealt with has passed."""
        return [member for member, _ in self._shards.in_range("outbox", 0, now_ms, limit)]

    def postpone(self, members: Sequence[str], due_ms: int) -> None:
        """Give messages just sent again another grace period before the next resend."""
        if not members:
            return
        groups = self._shards.by_shard((OutboxMember.run_of(m), m) for m in members)
        with self._connection.errors():
            pipe = self._connection.redis.pipeline(transaction=False)
            for shard, group in groups:
                pipe.zadd(shard.outbox, dict.fromkeys(group, due_ms), xx=True)
            pipe.execute()
