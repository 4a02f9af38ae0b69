"""The run store: every read and write of run state in Redis, one method each.

Writes that touch more than one key go through the Lua scripts of
`workers/store/lua/` (`workers.store.scripts` names their answers), so each is atomic;
`workers.store.layout` is the map of what lives where, and `workers.store.codec` turns
values into what is stored and back. Redis errors are translated to
`StoreUnavailable` in one place (`_redis_errors`), with the URL's password
hidden. Nothing here knows about agents beyond opaque snapshot text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError
from redis.exceptions import RedisClusterException

from workers.engine.effects import Advanced, OwnOutcome
from workers.engine.records import InboxEvent, RunRecord, TraceEntry, Usage
from workers.errors import RunCorrupt, StoreUnavailable
from workers.redact import redact_url
from workers.store.agent_cache import HotAgent, HotAgents
from workers.store.cluster import cluster_url, connect, node_client
from workers.store.codec import (
    Loaded,
    as_int,
    as_text,
    corrupt,
    inbox_of,
    loaded,
    record_json,
    save_arguments,
    trace_line,
    usage_of,
)
from workers.store.durability import Durability, probe, wait_durable
from workers.store.layout import TRACE_MAX, Keys, OutboxMember, RunFields, outbox_run
from workers.store.live import LiveStreams
from workers.store.people import People
from workers.store.scripts import ClaimStatus, Recorded, Saved, lua
from workers.store.shards import Shards
from workers.store.snapshots import split
from workers.store.upkeep import Upkeep

__all__ = ["NO_ADMISSION", "Admission", "Claim", "Loaded", "Over", "RunStore", "TreeLimits"]


@dataclass(frozen=True)
class Admission:
    """What a model call's admission against its tree's budget needs beside the request:
    the reply's largest size, and the highest prices (micro-dollars per token) it may
    be charged. `max_tokens` 0: the reply's size is not capped (nor reserved for)."""

    max_tokens: int
    input_micro: float
    output_micro: float


NO_ADMISSION = Admission(0, 0.0, 0.0)


@dataclass(frozen=True)
class Over:
    """The limit a model call was not admitted under, with the numbers (for the person)."""

    limit: str
    """tokens, usd, model_calls, or deadline."""
    spent: int = 0
    reserved: int = 0
    cap: int = 0
    estimate: int = 0

    @classmethod
    def of(cls, text: str) -> Over | None:
        if not text:
            return None
        limit, *numbers = text.split("|")
        values = [int(float(n)) for n in numbers] + [0, 0, 0, 0]
        return cls(limit, *values[:4])


@dataclass(frozen=True)
class TreeLimits:
    """A tree's budget as it stands: tokens, micro-dollars, model calls, deadline (ms);
    None where it has no such limit; and what its calls in flight reserved."""

    tokens: int | None
    cost_micro: int | None
    model_calls: int | None
    deadline_ms: int | None
    reserved: tuple[int, int, int]


@dataclass(frozen=True)
class Claim:
    """The answer to a claim, with the attempt number when claimed.

    A claimed call also gets the run as it stands (`loaded`), so the call and the
    save after it need no other read. `over` is set when a model call was claimed
    but not admitted: its tree is at a limit of its budget.
    """

    status: ClaimStatus
    attempts: int
    over: Over | None = None
    loaded: Loaded | None = None


@contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    """Translate redis-py's errors into `StoreUnavailable` naming the URL without its password."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailable(f"Redis at {redact_url(url)} is unreachable: {error}") from error
    except RedisClusterException as error:  # no node answered when the client was made
        raise StoreUnavailable(f"Redis at {redact_url(url)}: {error}") from error
    except redis.RedisError as error:
        raise StoreUnavailable(f"Redis at {redact_url(url)} failed: {error}") from error


class RunStore:
    """Run state in Redis. One per process; safe to share between threads."""

    def __init__(self, url: str, prefix: str, *, cluster: bool = False) -> None:
        self.url = url
        self.keys = Keys(prefix, cluster=cluster or cluster_url(url))
        # Typed Any: redis-py annotates every reply as a union over its sync and
        # async clients, which says nothing useful here.
        with _redis_errors(url):  # a cluster's client asks a node for the slots now
            self.redis: Any = connect(url, cluster=self.keys.cluster)
        script = self.redis.register_script
        self._create: Any = script(lua("create"))
        self._load: Any = script(lua("load"))
        self._claim: Any = script(lua("claim"))
        self._renew: Any = script(lua("renew"))
        self._unclaim: Any = script(lua("unclaim"))
        self._record: Any = script(lua("record"))
        self._save: Any = script(lua("save"))
        self._trace: Any = script(lua("trace"))
        self._read_trace: Any = script(lua("read_trace"))
        self._durability: Durability | None = None
        self.people = People(self)
        """What waits on a person, and the decisions and extensions that settle it."""
        self.upkeep = Upkeep(self)
        """The fleet-wide upkeep the tick does: its lock, pruning, the outbox's due messages."""
        self.live = LiveStreams(self)
        """The trees' live streams (replies as they are written), and follow-ups."""
        self.hot = HotAgents()
        """The agents this process saved last (`store.agent_cache`): a load skips their restore."""
        self.shards = Shards(self)
        """The fleet-wide indexes' shards (one on a single Redis, one per slot on a cluster)."""

    def errors(self) -> Any:
        """Return a context manager that translates Redis errors for this store."""
        return _redis_errors(self.url)

    def ping(self) -> None:
        with self.errors():
            self.redis.ping()

    # --- creating and reading --------------------------------------------------------

    def create(self, record: RunRecord, snapshot: str, due_ms: int) -> bool:
        """Create a run (its budget, if any, becomes its tree's limits); False if one with
        that id exists."""
        k = self.keys
        head, history = split(snapshot)  # stored as CREATE keeps it: head, entries
        args: list[str | int] = [record.id, record_json(record), head, record.created_ms]
        args += [OutboxMember.advance(record.id), due_ms, *_limits(record), *history]
        index = k.index(record.id)
        keys = [k.run(record.id), index.runs, index.outbox, index.deadlines]
        keys.append(k.history(record.id))
        self.shards.enlist(record.id)
        with self.errors():
            answer = self._create(keys=keys, args=args)
        return as_text(answer) == "created"

    def load(self, run_id: str, *, hot: bool = True) -> Loaded | None:
        """Return the run with its unapplied inbox, or None if there is no such run.

        With `hot`, a run this process saved last comes with its agent (`Loaded.hot`)
        and without its snapshot, which is then not read.
        """
        k, known = self.keys, self.hot.version(run_id) if hot else ""
        keys = [k.run(run_id), k.history(run_id), k.inbox(run_id)]
        with self.errors():
            answer = self._load(keys=keys, args=[known])
        return self._loaded(run_id, known, answer)

    def _loaded(self, run_id: str, known: str, answer: list[Any]) -> Loaded | None:
        """A run as LOAD answered (or CLAIM: version, record, form, snapshot, history, inbox)."""
        version, meta, inbox = answer[0], answer[1], answer[5]
        if known and version and as_text(version) == known:
            found = self.hot.get(run_id, known, meta)
            if found is None:  # the record changed without a save: read it all
                self.hot.forget(run_id)
                return self.load(run_id, hot=False)
            return Loaded(known, found.record, "", inbox_of(inbox), apart=True, hot=found.agent)
        return loaded(answer)

    def read(self, run_id: str) -> tuple[RunRecord, Usage] | None:
        """Return the run's record and what it and its descendants used (no snapshot),
        or None if there is no run.

        Raises:
            RunCorrupt: the stored record cannot be read.
        """
        with self.errors():
            meta, *totals = self.redis.hmget(
                self.keys.run(run_id), [RunFields.RECORD, *RunFields.USAGE]
            )
        if meta is None:
            return None
        try:
            record = RunRecord.model_validate_json(meta)
        except ValidationError as error:
            raise RunCorrupt(f"run {run_id}: {corrupt(error)}") from None
        return record, usage_of(totals)

    def limits(self, root: str) -> TreeLimits | None:
        """Return the tree's budget as it stands (extensions included), and what its
        calls in flight reserved; None if the tree has no limits (or no root)."""
        fields = [
            RunFields.LIMIT_TOKENS,
            RunFields.LIMIT_COST,
            RunFields.LIMIT_CALLS,
            RunFields.DEADLINE,
            RunFields.RESERVED_TOKENS,
            RunFields.RESERVED_COST,
            RunFields.RESERVED_CALLS,
        ]
        with self.errors():
            values = self.redis.hmget(self.keys.run(root), fields)
        if all(v is None for v in values[:4]):
            return None
        tokens, cost, calls, deadline = (None if v is None else int(v) for v in values[:4])
        reserved = (as_int(values[4]), as_int(values[5]), as_int(values[6]))
        return TreeLimits(tokens, cost, calls, deadline, reserved)

    def snapshot(self, run_id: str) -> str | None:
        """Return the run's agent snapshot as stored (not validated), or None if no run."""
        found = self.load(run_id, hot=False)
        return None if found is None else found.snapshot

    def cancelled(self, run_id: str) -> bool:
        with self.errors():
            return bool(self.redis.hexists(self.keys.run(run_id), RunFields.CANCEL))

    # --- calls: claim, renew, record ---------------------------------------------------

    def claim(
        self,
        run_id: str,
        what: str,
        *,
        seq: int | None,
        member: str,
        token: str,
        lease_ms: int,
        now_ms: int,
        root: str,
        admission: Admission = NO_ADMISSION,
    ) -> Claim:
        """Claim call `what` of the run (a tool call, or with `seq` the model call `m<seq>`).

        Only a call the run's record says is due can be claimed, and a model call only
        within its tree's budget (see lua/claim.lua; `Claim.over` says which limit).
        """
        k, known = self.keys, self.hot.version(run_id)
        outbox = k.index(run_id).outbox
        keys = [k.run(run_id), k.lease(run_id, what), outbox, k.run(root), k.inbox(run_id)]
        keys.append(k.history(run_id))
        kind = "tool" if seq is None else "model"
        args: list[str | int | float] = [what, kind, seq or 0, token, lease_ms, member]
        args += [now_ms + lease_ms, run_id, admission.max_tokens]
        args += [admission.input_micro, admission.output_micro, now_ms, known]
        with self.errors():
            status, attempts, over, *run = self._claim(keys=keys, args=args)
        claimed = ClaimStatus(as_text(status))
        found = self._loaded(run_id, known, run) if claimed is ClaimStatus.CLAIMED else None
        return Claim(claimed, int(attempts), Over.of(as_text(over)), found)

    def renew(
        self,
        run_id: str,
        what: str,
        *,
        attempt: int,
        member: str,
        token: str,
        lease_ms: int,
        now_ms: int,
    ) -> bool:
        """Keep (or take back, if nobody took it over) the lease of call `what`."""
        k = self.keys
        keys = [k.lease(run_id, what), k.index(run_id).outbox, k.run(run_id)]
        args = [token, lease_ms, member, now_ms + lease_ms, what, attempt]
        with self.errors():
            return as_text(self._renew(keys=keys, args=args)) == "kept"

    def durability(self) -> Durability:
        """Return how this Redis makes a claim durable (asked once per process).

        Raises:
            SettingsError: it cannot (RELAY_DURABLE_CLAIMS needs a Redis setting changed).
            StoreUnavailable: Redis cannot be reached.
        """
        if self._durability is None:
            with self.errors():
                self._durability = probe(node_client(self.redis))
        return self._durability

    def make_durable(self, run_id: str, what: str, timeout_ms: int) -> bool:
        """Wait until the claim of call `what` is durable; False if Redis did not confirm
        it within `timeout_ms`."""
        mode = self.durability()
        key, field = self.keys.run(run_id), RunFields.attempts(what)
        with self.errors():
            return wait_durable(node_client(self.redis, key), mode, key, field, timeout_ms)

    def unclaim(
        self, run_id: str, what: str, *, attempt: int, token: str, member: str, due_ms: int
    ) -> bool:
        """Give back a claim whose call never started; False if it was not ours any more."""
        k = self.keys
        keys = [k.run(run_id), k.lease(run_id, what), k.index(run_id).outbox]
        with self.errors():
            answer = self._unclaim(keys=keys, args=[what, attempt, token, member, due_ms])
        return as_text(answer) == "given_back"

    def record(
        self,
        run_id: str,
        what: str,
        event: InboxEvent,
        *,
        attempt: int,
        member: str,
        token: str,
        due_ms: int,
        counted: bool,
    ) -> tuple[Recorded, Loaded | None]:
        """Record a call's outcome once, as an inbox event, if `attempt` is still its last claim.

        A `counted` outcome (a tool's) counts down the calls of its batch still out.
        Returns what happened, and the run loaded when it should advance now.
        """
        k = self.keys
        keys = [k.run(run_id), k.inbox(run_id), k.index(run_id).outbox, k.lease(run_id, what)]
        args = [what, event.model_dump_json(), member, OutboxMember.advance(run_id), due_ms]
        args += [token, "1" if counted else "0", attempt]
        with self.errors():
            recorded = Recorded(as_text(self._record(keys=keys, args=args)))
        return recorded, self.load(run_id) if recorded is Recorded.ADVANCE else None

    def forget_message(self, member: str) -> None:
        with self.errors():
            self.redis.zrem(self.keys.index(outbox_run(member)).outbox, member)

    def append(
        self, run_id: str, event: InboxEvent, due_ms: int, *, cancel_flag: bool = False
    ) -> bool:
        """Append `event` to a live run's inbox and schedule its advance; False if no such run."""
        k = self.keys
        with self.errors():
            if not self.redis.hexists(k.run(run_id), RunFields.VERSION):
                return False
            pipe = self.redis.pipeline(transaction=True)
            if cancel_flag:
                pipe.hset(k.run(run_id), RunFields.CANCEL, 1)
            pipe.xadd(k.inbox(run_id), {"e": event.model_dump_json()})
            pipe.zadd(k.index(run_id).outbox, {OutboxMember.advance(run_id): due_ms})
            pipe.execute()
        return True

    # --- saving ------------------------------------------------------------------------------

    def save(self, advanced: Advanced, version: str, own: OwnOutcome | None = None) -> Saved:
        """Save a step if the run is still at `version`, with all its effects and, with
        `own`, the calling task's own outcome; say what happened."""
        keys, args = save_arguments(self.keys, advanced, version, own)
        with self.errors():
            saved = Saved(as_text(self._save(keys=keys, args=args)))
        run_id = advanced.record.id
        agent = None if advanced.stored is None else advanced.stored.agent
        if saved is Saved.SAVED and agent is not None:
            meta = args[1].encode()
            self.hot.put(run_id, HotAgent(str(int(version) + 1), meta, advanced.record, agent))
        else:
            self.hot.forget(run_id)
        notes = advanced.effects.notes
        if saved is Saved.SAVED and notes and self.keys.cluster:
            self.shards.keep_notes(notes)
        return saved

    # --- traces and listings --------------------------------------------------------------------

    def trace(self, run_id: str, start: int = 0) -> tuple[int, list[TraceEntry]]:
        """Return (position after the last line, the run's lines from position `start` on).

        Positions count every line the run ever wrote; the oldest of a long run's
        lines may have been dropped (TRACE_MAX), and are skipped.
        """
        keys = [self.keys.run(run_id), self.keys.trace(run_id)]
        with self.errors():
            end, lines = self._read_trace(keys=keys, args=[max(0, start)])
        return int(end), [TraceEntry.model_validate_json(line) for line in lines]

    def activity_cursor(self, run_id: str) -> str:
        """Return the newest entry id of the run's activity stream (where a follower begins)."""
        with self.errors():
            newest = self.redis.xrevrange(self.keys.index(run_id).activity, "+", "-", count=1)
        return as_text(newest[0][0]) if newest else "0-0"

    def wait_activity(self, run_id: str, cursor: str, block_ms: int) -> tuple[str, set[str]]:
        """Wait up to `block_ms` for runs whose trace grew after `cursor`, in the activity
        stream `run_id` writes to (on a cluster: its slot's); return (cursor, runs)."""
        activity = self.keys.index(run_id).activity
        with self.errors():
            answer = self.redis.xread({activity: cursor}, block=block_ms, count=10_000)
        runs: set[str] = set()
        for _, entries in answer or []:
            for entry_id, data in entries:
                cursor = as_text(entry_id)
                runs.add(as_text(data[b"r"]))
        return cursor, runs

    def add_trace(self, run_id: str, entry: TraceEntry) -> None:
        k = self.keys
        keys = [k.run(run_id), k.trace(run_id), k.index(run_id).activity]
        with self.errors():
            self._trace(keys=keys, args=[run_id, TRACE_MAX, trace_line(entry)])

    def runs(self, limit: int = 100) -> list[str]:
        """Return the newest run ids first."""
        return self.shards.newest_runs(limit)


def _limits(record: RunRecord) -> list[str | int]:
    """The tree limits a new root's budget sets, in CREATE's order ('' for none)."""
    budget = record.budget
    if budget is None:
        return ["", "", "", ""]
    cost = budget.usd_micro
    deadline = None if budget.seconds is None else record.created_ms + int(budget.seconds * 1000)
    values = (budget.tokens, cost, budget.model_calls, deadline)
    return ["" if value is None else value for value in values]
