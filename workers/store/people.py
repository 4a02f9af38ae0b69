"""What waits on a person in Redis: the pending entries, and the decisions that settle them.

A plan, a call, a question or a tree's budget waits on a person as a pending
entry (`pending`, scored by its expiry; `pending:data`). A decision settles one
with the DECIDE script (used once; refused when too late), and an extension of
a tree's budget settles its parked runs with EXTEND. `RunStore.people` is the
way in; `workers.store.layout` maps the keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from workers.engine.records import BudgetExtended, InboxEvent, Pending
from workers.errors import RunNotFound
from workers.store.codec import as_text
from workers.store.layout import OutboxMember, PendingKind, RunFields, pending_member, pending_parts
from workers.store.scripts import Decided, lua

if TYPE_CHECKING:
    from workers.store.runs import RunStore

__all__ = ["People"]


class People:
    """Pending entries, decisions and extensions, on a RunStore's Redis."""

    def __init__(self, store: RunStore) -> None:
        self._store = store
        self._decide_script: Any = store.redis.register_script(lua("decide"))
        self._extend_script: Any = store.redis.register_script(lua("extend"))

    def decide(
        self,
        run_id: str,
        kind: PendingKind,
        what: str,
        event: InboxEvent,
        *,
        expired: InboxEvent,
        now_ms: int,
        due_ms: int,
    ) -> Decided:
        """Apply a decision for the pending entry (`kind`, `what`) of the run, unless it
        came after the entry's expiry: then `expired` (the event for "no decision in
        time") is applied instead."""
        k = self._store.keys
        index = k.index(run_id)
        keys = [k.run(run_id), k.inbox(run_id), index.outbox, index.pending, index.pending_data]
        args: list[str | int] = [pending_member(run_id, kind, what)]
        args += [RunFields.decision(kind, what), event.model_dump_json()]
        args += [OutboxMember.advance(run_id), due_ms, now_ms, expired.model_dump_json()]
        with self._store.errors():
            return Decided(as_text(self._decide_script(keys=keys, args=args)))

    def pending(self, limit: int = 1_000) -> list[Pending]:
        """Return what waits on a person, oldest expiry first."""
        found = self._store.shards.in_range("pending", float("-inf"), float("inf"), limit)
        return self.pending_of([member for member, _ in found])

    def pending_of(self, members: Sequence[str]) -> list[Pending]:
        """Return the pending entries named (in their order; one gone is skipped)."""
        if not members:
            return []
        shards = self._store.shards.by_shard((pending_parts(m)[0], m) for m in members)
        values: dict[str, Any] = {}
        with self._store.errors():
            pipe = self._store.redis.pipeline(transaction=False)
            groups = list(shards)
            for shard, group in groups:
                pipe.hmget(shard.pending_data, group)
            for (_, group), found in zip(groups, pipe.execute(), strict=True):
                values.update(zip(group, found, strict=True))
        return _readable([values[member] for member in members])

    def pending_members_of(self, run_id: str) -> tuple[str, ...]:
        """Return the pending entries a run holds, found by their names (for a lost record)."""
        redis, keys = self._store.redis, self._store.keys
        with self._store.errors():
            data = keys.index(run_id).pending_data
            found = redis.hscan_iter(data, match=f"{run_id}|*", count=1_000)
            return tuple(as_text(member) for member, _ in found)

    def expired_pending(self, now_ms: int, limit: int = 500) -> list[Pending]:
        found = self._store.shards.in_range("pending", 0, now_ms, limit)
        return self.pending_of([member for member, _ in found])

    def extend(
        self,
        root: str,
        raise_by: tuple[int | None, int | None, int | None, int | None],
        parked: Sequence[Pending],
        due_ms: int,
    ) -> tuple[bool, int]:
        """Raise the tree's limits (tokens, micro-dollars, model calls, deadline ms; None:
        leave it) and wake each run parked at the budget (`parked`: their pending
        entries). Return (whether a limit was raised, how many runs were woken).

        Raises:
            RunNotFound: there is no such root.
        """
        k = self._store.keys
        index = k.index(root)
        keys = [k.run(root), index.deadlines, index.pending, index.pending_data, index.outbox]
        args: list[str | int] = ["" if n is None else n for n in raise_by]
        args += [root, due_ms]
        for entry in parked:
            seq = str(entry.seq)
            keys += [k.run(entry.run_id), k.inbox(entry.run_id)]
            args += [pending_member(entry.run_id, "budget", seq)]
            args += [
                RunFields.decision("budget", seq),
                BudgetExtended(seq=entry.seq).model_dump_json(),
            ]
            args += [OutboxMember.advance(entry.run_id)]
        with self._store.errors():
            raised, woken = self._extend_script(keys=keys, args=args)
        if int(raised) < 0:
            raise RunNotFound(f"no run {root!r} (it never existed, or it finished and expired)")
        return bool(raised), int(woken)

    def pending_in_tree(self, root: str, kind: PendingKind) -> list[Pending]:
        """Return the pending entries of one kind held by the runs of a tree."""
        redis, keys = self._store.redis, self._store.keys
        with self._store.errors():
            data = keys.index(root).pending_data
            found = redis.hscan_iter(data, match=f"{root}*|{kind}|*", count=1_000)
            values = [value for _, value in found]
        return [p for p in _readable(values) if p.root_id == root]


def _readable(values: list[Any]) -> list[Pending]:
    """The pending entries that can be read (a missing or broken one is skipped)."""
    found: list[Pending] = []
    for value in values:
        if value is None:
            continue
        try:
            found.append(Pending.model_validate_json(value))
        except ValidationError:
            continue
    return found
