"""The fleet's upkeep in Redis: the tick's lock, pruning expired runs, the outbox's due messages.

What one tick per interval does, besides firing schedules and declining what
expired (`workers.runtime.Runtime.heal`): the reads and writes here touch the
fleet-wide indexes, not one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workers.codec import as_int, as_text
from workers.scripts import lua

if TYPE_CHECKING:
    from workers.store import RunStore

__all__ = ["Upkeep"]


class Upkeep:
    """The tick's reads and writes, on a RunStore's Redis."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self._lock_script: Any = store.redis.register_script(lua("tick_lock"))

    def elect_ticker(self, holder: str, interval_ms: int, now_ms: int) -> int:
        """Return 0 if `holder` ticks now (it holds the lock for one interval), else the
        milliseconds until the lock lapses and the next tick is due."""
        k = self._store.keys
        keys = [k.tick_lock, k.tick_stats]
        with self._store.errors():
            return int(self._lock_script(keys=keys, args=[holder, interval_ms, now_ms]))

    def tick_stats(self) -> tuple[int, int | None, str | None]:
        """Return (ticks so far, when the last began in ms, which process ran it)."""
        redis, key = self._store.redis, self._store.keys.tick_stats
        with self._store.errors():
            count, last, by = redis.hmget(key, ["n", "last_ms", "by"])
        return (
            as_int(count),
            None if last is None else int(last),
            None if by is None else as_text(by),
        )

    def prune_runs(self, older_than_ms: int, limit: int = 500) -> int:
        """Drop expired runs from the runs index (their keys expired on their own).

        Each call looks at the next `limit` entries older than `older_than_ms`,
        after where the previous call stopped (`prune-cursor`), and starts again
        from the oldest once it has been through them all: runs that stay alive
        (parked for weeks) never stop the sweep from reaching the others.
        """
        redis, k = self._store.redis, self._store.keys
        with self._store.errors():
            cursor = float(redis.get(k.prune_cursor) or 0)
            old = redis.zrangebyscore(
                k.runs, f"({cursor}", older_than_ms, start=0, num=limit, withscores=True
            )
            if not old:
                redis.delete(k.prune_cursor)  # through them all: from the oldest next time
                return 0
            pipe = redis.pipeline(transaction=False)
            for run_id, _ in old:
                pipe.exists(k.run(as_text(run_id)))
            alive = pipe.execute()
            gone = [run_id for (run_id, _), exists in zip(old, alive, strict=True) if not exists]
            pipe = redis.pipeline(transaction=False)
            if gone:
                pipe.zrem(k.runs, *gone)
            pipe.set(k.prune_cursor, repr(old[-1][1]))
            pipe.execute()
        return len(gone)

    def deadlines_due(self, now_ms: int, limit: int = 500) -> list[str]:
        """Return the roots whose budget's `seconds` ran out by `now_ms`."""
        redis, key = self._store.redis, self._store.keys.deadlines
        with self._store.errors():
            roots = redis.zrangebyscore(key, 0, now_ms, start=0, num=limit)
        return [as_text(r) for r in roots]

    def forget_deadline(self, root: str) -> None:
        with self._store.errors():
            self._store.redis.zrem(self._store.keys.deadlines, root)

    def due_messages(self, now_ms: int, limit: int = 500) -> list[str]:
        """Return outbox members whose time to be dealt with has passed."""
        redis, outbox = self._store.redis, self._store.keys.outbox
        with self._store.errors():
            members = redis.zrangebyscore(outbox, 0, now_ms, start=0, num=limit)
        return [as_text(m) for m in members]

    def postpone(self, members: Sequence[str], due_ms: int) -> None:
        """Give messages just sent again another grace period before the next resend."""
        if not members:
            return
        redis, outbox = self._store.redis, self._store.keys.outbox
        with self._store.errors():
            redis.zadd(outbox, dict.fromkeys(members, due_ms), xx=True)
