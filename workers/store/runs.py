"""The run store: every read and write of run state in Redis, one method each.

`RunStore` composes the store's parts on one `Connection`: its own methods
read and write runs (CREATE, LOAD, CLAIM, RENEW, UNCLAIM, RECORD, SAVE, SAVE_CLAIM, TRACE,
through `workers.store.scripts`), and it holds the sub-stores, each of which
takes the connection, never the store:

    people    what waits on a person; decisions and budget extensions (DECIDE, EXTEND)
    live      the trees' live streams, and follow-ups (STREAM, REPLY)
    upkeep    the tick's lock, pruning the runs index, the outbox's due messages
    shards    the fleet-wide indexes' shards, and reads over all of them (SWEEP)
    hot       the agents this process saved last: a load skips their restore

`workers.store.layout` is the map of what lives where; `workers.store.codec`
turns values into what is stored and back. Nothing here knows about agents
beyond opaque snapshot text (and the hot agents this process made itself).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agent_core import ToolOutput
from scheduler import ScheduleStore
from workers.engine.budget import NO_ADMISSION, Admission, Over, TreeLimits
from workers.engine.effects import Advanced, OwnOutcome
from workers.engine.events import InboxEvent
from workers.engine.ids import OutboxMember
from workers.engine.records import RunList, RunRecord, TraceEntry, Usage
from workers.errors import StoreUnavailable
from workers.store import reads, scripts
from workers.store.cluster import node_client
from workers.store.codec import (
    Loaded,
    StoredRun,
    as_text,
    inbox_of,
    loaded,
    record_of,
    trace_line,
)
from workers.store.connection import Connection
from workers.store.durability import Durability, probe, wait_durable
from workers.store.hot_agents import HotAgent, HotAgents
from workers.store.layout import TRACE_MAX, RunFields
from workers.store.live import LiveStreams
from workers.store.people import People
from workers.store.reads import RunCursor
from workers.store.schedule_shards import ClusterSchedules
from workers.store.scripts import ClaimAnswer, ClaimStatus, Recorded, Renewed, Saved
from workers.store.shards import Shards
from workers.store.upkeep import Upkeep

__all__ = ["CallClaim", "Claim", "HeldLease", "Loaded", "RunStore"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldLease:
    """The lease of a call being made (`RunStore.renew`, `renew_many`): whose, which attempt, and
    for how long each renewal keeps it; `holder`: its name at a model route, if routed."""

    run_id: str
    what: str
    attempt: int
    member: str
    token: str
    lease_ms: int
    holder: str = ""


@dataclass(frozen=True)
class CallClaim:
    """What claiming a call takes (`RunStore.claim`): the run, the call (`m<seq>` with
    `seq` for a model call), the claiming task's lease token and length, the time, the
    model call's admission against its tree's budget, and the Celery task carrying it."""

    run_id: str
    what: str
    seq: int | None
    token: str
    lease_ms: int
    now_ms: int
    admission: Admission = NO_ADMISSION
    task: str = ""

    @property
    def member(self) -> str:
        """The outbox member of the call's message."""
        if self.seq is None:
            return OutboxMember.tool(self.run_id, self.what)
        return OutboxMember.model(self.run_id, self.seq)


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
    reply_cap: int = 0
    """A model call's `max_tokens`, capped to what its tree has left (0: no cap)."""
    task_before: str = ""
    """The Celery task of the claim before (the lost attempt's, when this is a retake)."""


class RunStore:
    """Run state in Redis. One per process; safe to share between threads."""

    def __init__(self, url: str, prefix: str, *, cluster: bool = False) -> None:
        self.connection = Connection(url, prefix, cluster=cluster)
        self.url = url
        self.keys = self.connection.keys
        self.redis: Any = self.connection.redis
        self._durability: Durability | None = None
        self.shards = Shards(self.connection)
        """The fleet-wide indexes' shards (one on a single Redis, one per slot on a cluster)."""
        self.people = People(self.connection, self.shards)
        """What waits on a person, and the decisions and extensions that settle it."""
        self.upkeep = Upkeep(self.connection, self.shards)
        """The fleet-wide upkeep the tick does: its lock, pruning, the outbox's due messages."""
        self.live = LiveStreams(self.connection)
        """The trees' live streams (replies as they are written), and follow-ups."""
        self.hot = HotAgents()
        """The agents this process saved last (`store.hot_agents`): a load skips their restore."""
        shards = ClusterSchedules(self.connection, self.shards) if cluster else None
        self.schedules = ScheduleStore(self.redis, self.keys.prefix, shards)
        """The schedules of this prefix (scheduler.ScheduleStore; on a cluster, in shards)."""

    def errors(self) -> Any:
        """Return a context manager that translates Redis errors for this store."""
        return self.connection.errors()

    def ping(self) -> None:
        self.connection.ping()

    # --- creating and reading --------------------------------------------------------

    def create(
        self,
        record: RunRecord,
        snapshot: str,
        due_ms: int,
        stubs: Mapping[str, str] | None = None,
        start: str | None = None,
    ) -> bool:
        """Create a run (its budget, if any, becomes its tree's limits; its journal begins
        with `start`, default `record` and `snapshot`; a fork's `stubs`: call digest ->
        ToolOutput JSON); False if one with that id exists."""
        self.shards.enlist(record.id)  # through this process's cache of listed slots
        steps = reads.create(
            self.keys, record, snapshot, due_ms, stubs=stubs, start=start, enlist=False
        )
        return self.connection.drive(steps)

    def journal(self, run_id: str, start: int = 0) -> list[bytes]:
        """The run's journal as stored, from entry `start` on (entry 0 is its start);
        empty if it has none."""
        with self.errors():
            return list(self.redis.lrange(self.keys.journal(run_id), start, -1))

    def journal_length(self, run_id: str) -> int:
        """Entries in the run's journal, its start included."""
        with self.errors():
            return int(self.redis.llen(self.keys.journal(run_id)))

    def stub(self, root: str, digest: str) -> ToolOutput | None:
        """The outcome a fork (rooted at `root`) hands back for a tool call with `digest`
        instead of running it; None if it has none for it."""
        with self.errors():
            text = self.redis.hget(self.keys.run(root), RunFields.stub(digest))
        return None if text is None else ToolOutput.model_validate_json(text)

    def load(self, run_id: str, *, hot: bool = True) -> Loaded | None:
        """Return the run with its unapplied inbox, or None if there is no such run.

        With `hot`, a run this process saved last comes with its agent (`Loaded.hot`)
        and without its snapshot, which is then not read.
        """
        known = self.hot.version(run_id) if hot else ""
        stored = self.connection.run(scripts.load(self.keys, run_id=run_id, known_version=known))
        return self._loaded(run_id, known, stored)

    def _loaded(self, run_id: str, known: str, stored: StoredRun) -> Loaded | None:
        """A run as LOAD (or CLAIM) read it, with its hot agent if this process has it."""
        if known and stored.version and as_text(stored.version) == known:
            found = self.hot.get(run_id, known, stored.record)
            if found is None:  # the record changed without a save: read it all
                self.hot.forget(run_id)
                return self.load(run_id, hot=False)
            inbox = inbox_of(stored.inbox)
            # (Its fixed fields and loop counters are stored: the save that made this
            # version left them, or wrote them.)
            return Loaded(
                known, found.record, "", inbox, apart=True, hot=found.agent, fixed_stored=True,
                loops_stored=True,
            )  # fmt: skip
        return loaded(stored)

    def read(self, run_id: str) -> tuple[RunRecord, Usage] | None:
        """Return the run's record and what it and its descendants used (no snapshot),
        or None if there is no run.

        Raises:
            RunCorrupt: the stored record cannot be read.
        """
        return self.connection.drive(reads.read(self.keys, run_id))

    def briefs(self, run_ids: Sequence[str]) -> list[tuple[str, str | None] | None]:
        """Return each run's state and stop (None: not stopped) in one round trip: None
        for no such run, and ("finished", None) for a record that cannot be read."""
        with self.errors():
            pipe = self.redis.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.hmget(self.keys.run(run_id), RunFields.RECORD, RunFields.FIXED)
            found = pipe.execute()
        briefs: list[tuple[str, str | None] | None] = []
        for meta, fixed in found:
            if meta is None:
                briefs.append(None)
                continue
            try:
                record = record_of(meta, fixed)
            except ValidationError:
                briefs.append(("finished", None))  # it will never run again
                continue
            stop = None if record.outcome is None else record.outcome.stop.value
            briefs.append((record.state, stop))
        return briefs

    def outcome(self, run_id: str) -> tuple[RunRecord, bool] | None:
        """Return the run's record and whether a follow-up is on its way to it (its
        outcome is then not its last), read together in one command. None if there is
        no run.

        Raises:
            RunCorrupt: the stored record cannot be read.
        """
        return self.connection.drive(reads.outcome(self.keys, run_id))

    def limits(self, root: str) -> TreeLimits | None:
        """Return the tree's budget as it stands (extensions included), and what its
        calls in flight reserved; None if the tree has no limits (or no root)."""
        return self.connection.drive(reads.limits(self.keys, root))

    def snapshot(self, run_id: str) -> str | None:
        """Return the run's agent snapshot as stored (not validated), or None if no run."""
        found = self.load(run_id, hot=False)
        return None if found is None else found.snapshot

    # --- calls: claim, renew, record ---------------------------------------------------

    def claim(
        self,
        run_id: str,
        what: str,
        *,
        seq: int | None,
        token: str,
        lease_ms: int,
        now_ms: int,
        admission: Admission = NO_ADMISSION,
        task: str = "",
    ) -> Claim:
        """Claim call `what` of the run (a tool call, or with `seq` the model call `m<seq>`),
        carried by the Celery task `task` (kept: the next attempt's `resent` line names it).

        Only a call the run's record says is due can be claimed, and a model call only
        within its tree's budget (see lua/claim.lua; `Claim.over` says which limit).
        """
        return self.claim_with(
            CallClaim(run_id, what, seq, token, lease_ms, now_ms, admission, task)
        )

    def claim_with(self, asked: CallClaim) -> Claim:
        """`claim`, its terms in one value."""
        known = self.hot.version(asked.run_id)
        answer = self.connection.run(self._claim_script(asked, known))
        return self._claim(asked.run_id, known, answer)

    def _claim_script(self, asked: CallClaim, known: str) -> scripts.ScriptCall[ClaimAnswer]:
        return scripts.claim(
            self.keys, run_id=asked.run_id, call=asked.what, seq=asked.seq, token=asked.token,
            lease_ms=asked.lease_ms, now_ms=asked.now_ms, admission=asked.admission,
            known_version=known, task=asked.task,
        )  # fmt: skip

    def _claim(self, run_id: str, known: str, answer: ClaimAnswer) -> Claim:
        found = None if answer.run is None else self._loaded(run_id, known, answer.run)
        return Claim(
            answer.status, answer.attempts, answer.over, found, answer.reply_cap,
            answer.task_before,
        )  # fmt: skip

    def renew(self, held: HeldLease, now_ms: int) -> Renewed:
        """Keep (or take back, if nobody took it over) the lease `held`, and tell whether
        its run was cancelled meanwhile."""
        return self.connection.run(self._renewal(held, now_ms))

    def renew_many(self, leases: Sequence[HeldLease], now_ms: int) -> list[Renewed | None]:
        """`renew` every lease of `leases` in one round trip (a pipeline; one at a time on a
        cluster): for each, what RENEW did, or None if Redis refused that one."""
        answers = self.connection.run_many([self._renewal(held, now_ms) for held in leases])
        return [None if isinstance(kept, StoreUnavailable) else kept for kept in answers]

    def _renewal(self, held: HeldLease, now_ms: int) -> scripts.ScriptCall[Renewed]:
        return scripts.renew(
            self.keys, run_id=held.run_id, call=held.what, attempt=held.attempt,
            member=held.member, token=held.token, lease_ms=held.lease_ms, now_ms=now_ms,
        )  # fmt: skip

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
        unclaim = scripts.unclaim(
            self.keys, run_id=run_id, call=what, attempt=attempt, token=token, member=member,
            due_ms=due_ms,
        )  # fmt: skip
        return self.connection.run(unclaim)

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
        record = scripts.record(
            self.keys, run_id=run_id, call=what, event=event, attempt=attempt, member=member,
            token=token, due_ms=due_ms, counted=counted,
        )  # fmt: skip
        recorded = self.connection.run(record)
        return recorded, self.load(run_id) if recorded is Recorded.ADVANCE else None

    def forget_message(self, member: str) -> None:
        with self.errors():
            self.redis.zrem(self.keys.index(OutboxMember.run_of(member)).outbox, member)

    def append(
        self, run_id: str, event: InboxEvent, due_ms: int, *, cancel_flag: bool = False
    ) -> bool:
        """Append `event` to a live run's inbox and schedule its advance; False if no such run."""
        steps = reads.append(self.keys, run_id, event, due_ms, cancel_flag=cancel_flag)
        return self.connection.drive(steps)

    # --- saving ------------------------------------------------------------------------------

    @property
    def saves_tell_routes(self) -> bool:
        """Whether a save can tell a model route how its call went (`OwnOutcome.route`):
        on a single Redis; a cluster's routes are in other slots than the run's."""
        return not self.keys.cluster

    def save(self, advanced: Advanced, version: str, own: OwnOutcome | None = None) -> Saved:
        """Save a step if the run is still at `version`, with all its effects and, with
        `own`, the calling task's own outcome; say what happened."""
        save = scripts.save(self.keys, advanced=advanced, version=version, own=own)
        saved = self.connection.run(save)
        self._saved(advanced, version, saved, save)
        return saved

    def save_then_claim(
        self, advanced: Advanced, version: str, own: OwnOutcome | None, then: CallClaim
    ) -> tuple[Saved, Claim | None]:
        """`save`, and once it has saved, `claim` the call `then` (one the step decided), in
        the same round trip (SAVE_CLAIM): what the save did, and the claim if it was made.

        The claim reads the run as a claim after the save would: without its snapshot when
        this process keeps the agent the step saved (`advanced.stored`)."""
        save = scripts.save(self.keys, advanced=advanced, version=version, own=own)
        # (The version the save makes, whose agent `_saved` keeps: the claim skips its snapshot.)
        known = "" if advanced.stored is None else str(int(version) + 1)
        both = scripts.save_claim(save, self._claim_script(then, known))
        try:
            saved, answer = self.connection.run(both)
        except StoreUnavailable:
            self._give_back(then, 0)  # (if it ran and only its answer was lost)
            raise
        try:
            self._saved(advanced, version, saved, save)
            return saved, None if answer is None else self._claim(then.run_id, known, answer)
        except BaseException:
            if answer is not None and answer.status is ClaimStatus.CLAIMED:
                self._give_back(then, answer.attempts)
            raise

    def _give_back(self, then: CallClaim, attempt: int) -> None:
        """Give back the claim SAVE_CLAIM made of `then` (attempt 0: whichever holds its
        token), as best it can, so its message is due again now: nobody will make it."""
        member = then.member
        try:
            self.unclaim(
                then.run_id, then.what, attempt=attempt, token=then.token, member=member,
                due_ms=then.now_ms,
            )  # fmt: skip
        except StoreUnavailable as error:  # its lease lapses, and the tick sends it again
            log.warning("could not give back the claim of %s: %s", then.what, error)

    def _saved(
        self, advanced: Advanced, version: str, saved: Saved, save: scripts.ScriptCall[Saved]
    ) -> None:
        """After a SAVE: keep the agent it saved (or forget an older one); a cluster keeps
        the notes' shards."""
        run_id = advanced.record.id
        agent = None if advanced.stored is None else advanced.stored.agent
        if saved is Saved.SAVED and agent is not None:
            meta = str(save.args[1]).encode()  # the record as stored: a load compares it
            self.hot.put(run_id, HotAgent(str(int(version) + 1), meta, advanced.record, agent))
        else:
            self.hot.forget(run_id)
        notes = advanced.effects.notes
        if saved is Saved.SAVED and notes and self.keys.cluster:
            self.shards.keep_notes(notes)

    # --- traces and listings --------------------------------------------------------------------

    def trace(self, run_id: str, start: int = 0) -> tuple[int, list[TraceEntry]]:
        """Return (position after the last line, the run's lines from position `start` on).

        Positions count every line the run ever wrote; the oldest of a long run's
        lines may have been dropped (TRACE_MAX), and are skipped.
        """
        return self.connection.drive(reads.trace(self.keys, run_id, start))

    def activity_cursor(self, run_id: str) -> str:
        """Return the newest entry id of the run's activity stream (where a follower begins)."""
        return self.connection.drive(reads.activity_cursor(self.keys, run_id))

    def wait_activity(self, run_id: str, cursor: str, block_ms: int) -> tuple[str, set[str]]:
        """Wait up to `block_ms` for runs whose trace grew after `cursor`, in the activity
        stream `run_id` writes to (on a cluster: its slot's); return (cursor, runs)."""
        return self.connection.drive(reads.wait_activity(self.keys, run_id, cursor, block_ms))

    def add_trace(self, run_id: str, entry: TraceEntry) -> None:
        lines = [trace_line(entry, run_id)]
        self.connection.run(scripts.trace(self.keys, run_id=run_id, lines=lines, keep=TRACE_MAX))

    def note_resent(
        self,
        run_id: str,
        call: str,
        now_ms: int,
        *,
        taken: int = 0,
        lost_task: str = "",
    ) -> int | None:
        """Say in the run's trace (once per attempt) that `call` is sent again because the
        attempt that had it was lost: claimed, no outcome, its lease lapsed. From the tick
        (`taken` 0) before it sends the call again; from a worker that claimed attempt
        `taken` (> 1) of it, in case the tick did not say so first. The line links the lost
        attempt's Celery task (`lost_task`, or as CLAIM kept it). Returns the number of the
        attempt the call is sent for if this said it, else None."""
        if taken:
            lost = taken - 1
        else:
            fields = [RunFields.attempts(call), RunFields.carrier(call)]
            with self.errors():
                seen, carried = self.redis.hmget(self.keys.run(run_id), fields)
            if seen is None:
                return None  # never claimed: a message lost or queued, no attempt lost
            lost, lost_task = int(seen), as_text(carried or b"")
        if lost < 1:
            return None
        data: dict[str, object] = {"attempt": lost + 1, "lost": lost, "why": "lease lapsed"}
        if lost_task:
            data["task"] = lost_task  # (Flower keeps it STARTED: its worker never said more)
        entry = TraceEntry(
            at_ms=now_ms,
            run=run_id,
            kind="resent",
            text=f"attempt {lost} lost its lease with no outcome: its worker died or stalled",
            call_id=call,
            data=data,
        )
        noted = scripts.resent(
            self.keys, run_id=run_id, call=call, lost=lost, line=trace_line(entry, run_id),
            taken=bool(taken),
        )  # fmt: skip
        return lost + 1 if self.connection.run(noted) else None

    def runs(
        self, limit: int = 100, lists: Sequence[RunList] = (), before: RunCursor | None = None
    ) -> list[str]:
        """Return the newest run ids first: of `lists` if given, and created before
        `before` (a page's cursor) if given."""
        return [run_id for run_id, _ in self.shards.newest_runs(limit, lists, before)]

    def count_runs(self, lists: Sequence[RunList] = ()) -> int:
        """How many runs `lists` (all runs if none) hold, expired ones not yet pruned too."""
        return self.shards.count_runs(lists)
