"""What waits on a person in Redis: the pending entries, and the decisions that settle them.

A plan, a call, a question or a tree's budget waits on a person as a pending
entry (`pending`, scored by its expiry; `pending:data`). A decision settles one
with the DECIDE script (used once; refused when too late), and an extension of
a tree's budget settles its parked runs with EXTEND (sent by the clients'
`extend_steps`). `RunStore.people` is the way in for the tick and the sync
client; `workers.store.layout` maps the keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.engine.events import InboxEvent
from workers.engine.ids import PendingKind
from workers.engine.records import Pending
from workers.store import reads, scripts
from workers.store.codec import as_text
from workers.store.connection import Connection
from workers.store.reads import pending_of
from workers.store.scripts import Decided
from workers.store.shards import Shards

__all__ = ["People"]


class People:
    """Pending entries, decisions and extensions, on one Redis connection."""

    def __init__(self, connection: Connection, shards: Shards) -> None:
        self._connection = connection
        self._shards = shards

    def decide(
        self,
        run_id: str,
        kind: PendingKind,
        what: str,
        event: InboxEvent,
        *,
        expired: InboxEvent,
        due_ms: int,
    ) -> Decided:
        """Apply a decision for the pending entry (`kind`, `what`) of the run, unless it
        came after the entry's expiry by Redis's clock (never the caller's): then
        `expired` (the event for "no decision in time") is applied instead."""
        decide = scripts.decide(
            self._connection.keys, run_id=run_id, kind=kind, what=what, event=event,
            expired=expired, due_ms=due_ms,
        )  # fmt: skip
        return self._connection.run(decide)

    def pending(self, limit: int = 1_000) -> list[Pending]:
        """Return what waits on a person, oldest expiry first."""
        return self._connection.drive(reads.pending(self._connection.keys, limit))

    def pending_of(self, members: Sequence[str]) -> list[Pending]:
        """Return the pending entries named (in their order; one gone is skipped)."""
        if not members:
            return []
        return self._connection.drive(pending_of(self._connection.keys, members))

    def pending_members_of(self, run_id: str) -> tuple[str, ...]:
        """Return the pending entries a run holds, found by their names (for a lost record)."""
        connection = self._connection
        with connection.errors():
            data = connection.keys.index(run_id).pending_data
            found = connection.redis.hscan_iter(data, match=f"{run_id}|*", count=1_000)
            return tuple(as_text(member) for member, _ in found)

    def expired_pending(self, now_ms: int, limit: int = 500) -> list[Pending]:
        found = self._shards.in_range("pending", 0, now_ms, limit)
        return self.pending_of([member for member, _ in found])

    def pending_in_tree(self, root: str, kind: PendingKind) -> list[Pending]:
        """Return the pending entries of one kind held by the runs of a tree."""
        keys = self._connection.keys
        return self._connection.drive(reads.pending_in_tree(keys, root, kind))
