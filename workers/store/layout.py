"""Where everything lives in Redis: every key, hash field and member Relay writes.

This module is the map. Every key starts with `RELAY_PREFIX` (default `relay:`);
the Lua scripts in `workers/store/lua/` spell the same field names, each script's
header says which keys and arguments it takes, and `workers.store.scripts` spells
each script's KEYS and ARGV from the names here.

Per run (a root task, or a specialist's child run `<parent>.<call>`):

    run:<id>        hash    the run itself (RunFields below): written by the CREATE
                            and SAVE scripts, read by every task; expires with the run
    inbox:<id>      stream  events not yet applied (results, decisions, cancels,
                            children's outcomes): appended by RECORD, DECIDE and the
                            client, deleted by the SAVE that applies them
    hist:<id>       list    the agent's history entries, oldest first (its snapshot's head
                            is the run hash's `head`, see workers.store.snapshots): a save
                            appends new entries and drops those the agent trimmed; written
                            by CREATE and SAVE, expiring and persisting with the run hash
    jr:<id>         list    the run's journal (`workers.engine.journal`): its start (record
                            and snapshot, written by CREATE or by the SAVE that makes a
                            specialist), then one entry per step a save made (the events
                            applied, the step after); capped at JOURNAL_MAX entries,
                            expiring and persisting with the run hash
    trace:<id>      list    what happened, for people (`relay watch`/`show`), newest
                            TRACE_MAX lines: written by SAVE and TRACE
    lease:<id>:<x>  string  the token of the worker making call <x> now (a TTL):
                            CLAIM takes it, RENEW keeps it, RECORD/SAVE release it

Keys the scripts spell themselves from a key they are sent, rather than have each step
send them (about 1,000 bytes a turn): SAVE, the saved call's lease (from `run:<tree>` and
the run's `<tree>`, `Keys.tree`). On a single Redis only, where no slot can move, more:
SAVE and CLAIM are sent the run's hash alone and spell its inbox, trace, history,
journal, a call's lease, the root's hash and the index keys (`outbox`, `pending`,
`pending:data`, `runs`, `activity`); STREAM, the tree's `live:<root>` from the root's
hash; ROUTE_ADMIT and ROUTE_DONE, the route's parts (`route:<r>:<part>` from
`route:<r>`), and SAVE, the route and key a model call's success is told to
(`route:<r>`, `key-inflight:<key>`, from the prefix: `engine.effects.RouteNews`). On a
cluster these are all sent (and a save tells no route), so a slot on the move
redirects the script before it writes. Each script refuses (an error reply) a key that
is not the run's it is told of, rather than spell names from it.
A name changed here must be changed in those scripts too (and CLAIM and SAVE spell
a call's outbox member: `engine.ids.OutboxMember`).

A run's hash (and history, journal and trace) get a TTL when, and only when, the run
finishes (SAVE); a follow-up that reopens it removes them again. STREAM relies on that.

Per tree (keyed by the root's id, so one cursor follows a run and its specialists):

    live:<root>     stream  the tree's live events, `StreamEvent` (fields k kind, r run,
                            t text): pieces of model replies as they arrive, "step",
                            "restarted" (STREAM, from the worker making the call) and
                            "done" (SAVE, when a run of the tree finishes). Made by the
                            first piece, so a tree whose model never streams has none;
                            capped at STREAM_MAX entries. A stream's first node costs
                            4 KB, more than a parked run, so it does not stay: it
                            expires STREAM_IDLE_S after its last event, STREAM_PARKED_S
                            after a run of the tree parks for a person (unless another
                            event renews it), and STREAM_KEEP_S after its root finishes

Fleet-wide (the index shards, `IndexKeys`: one set on a single Redis, one per hash
slot on a cluster, see below):

    runs            zset    run ids by creation time (`relay runs`); pruned by the tick
    runs:<list>     zset    the same, one per list a run is on (`engine.records.RunList`:
                            running, waiting, done, failed, cancelled, declined): CREATE
                            adds to running, SAVE moves a run when its list changes, the
                            tick prunes them with `runs` (and lists runs from before
                            these indexes once: `lists-cursor`, then `lists-built`)
    deadlines       zset    root ids by when their budget's `seconds` run out: the tick
                            stops each tree whose time is up (CREATE adds, EXTEND moves)
    outbox          zset    messages to send, scored by when to send them again
                            (`engine.ids.OutboxMember`); SAVE adds, CLAIM/RENEW
                            re-score, the tick re-sends what is due
    pending         zset    what waits on a person, scored by its expiry (a pending
                            member, `engine.ids.pending_member`)
    pending:data    hash    pending member -> the Pending JSON
    activity        stream  a run id per trace that grew: what `wait`/`watch` block on
    prune-cursor    string  how far the tick's sweep of expired runs got
    tick-lock       string  the process ticking in this interval (lapses after it)
    tick-stats      hash    n ticks, last_ms, by whom; seen_ms (Redis's clock at the last)
    metrics         hash    the fleet's counters (steps, calls, tokens, latency buckets):
                            added to by every task (workers.runtime.metrics), read by relay web
    worker-gauges   hash    <host>:<pid> -> what that worker process holds now (JSON: calls
                            in flight, capacity, loop lag, when): written with each metrics
                            flush, deleted as the process stops; relay web skips stale ones
                            and prunes those an hour old
    web-used:<n>    string  an approval form's nonce, used once (relay web; a TTL)
    schedule-notes:<name>  list  notes a schedule's runs remembered, for the next run
    memory:<name>   list    notes runs started with memory=<name> remembered, for the next

Per model route (`workers.model.limits`; every worker shares them):

    route:<r>                hash    GCRA times for rpm (`tat`) and tpm (`ttat`), `paused`
                                     until (a 429), the circuit (`circuit`, `failures`,
                                     `probe`: when the next probe may go), the last `error`,
                                     `round` (the last waiting tag admitted), `seq`
    route:<r>:inflight       zset    calls in flight on the route, by lease deadline
    route:<r>:queue          zset    waiting calls in turn order (tag * 1e6 + arrival)
    route:<r>:queue-keys     hash    waiting call -> its key
    route:<r>:tags           hash    key -> the tag of its last waiting call
    route:<r>:told           zset    waiting call -> when it was told to come back (ms)
    key-inflight:<key>       zset    a key's model calls in flight, by lease deadline

Schedules (`scheduler.ScheduleKeys` names them, since `scheduler` cannot import this):

    schedules       hash    name -> Schedule JSON
    schedule-due    zset    name by its next due time
    schedule-slot:<name>:<slot>  string  the claim on one fired slot (SET NX)
    schedule-firing zset    "name|slot[|source]" of slots whose run is not confirmed yet
    notifications   list    what notify-only schedules recorded, newest first
    schedule-history:<name>  list  what each firing did (scheduler.history.Firing), capped
    schedule-queue:<name>    zset  "source:slot" of run-now, backfilled and buffered firings
    schedule-queued          zset  names with a queue, by its first firing
    schedule-runs:<name>     zset  the last runs it started, by when (for its overlap policy)

On Redis Cluster (`Keys(prefix, cluster=True)`; workers.store.cluster, workers.store.shards).
The names above hold on a single Redis, unchanged, so runs in flight across an
upgrade keep working. On a cluster every Lua script touches one slot:

    a tree          run:{<root>}.<rest>, inbox:{<root>}..., trace:, lease:, live:{<root>}:
                    every key of a run carries its root's hash tag, so a specialist
                    `<root>.<call>` is in its root's slot (usage roll-up, settling
                    reservations, children, deliveries: all one slot)
    index shards    runs{<t>}, outbox{<t>}, pending{<t>}, pending:data{<t>},
                    deadlines{<t>}, activity{<t>}, prune-cursor{<t>}, runs:<list>{<t>},
                    lists-cursor{<t>}, lists-built{<t>}: one shard per hash
                    slot, `<t>` a short text hashing to that slot (sharding.slot_tag),
                    and a tree's entries in the shard of its own slot: SAVE, CREATE,
                    CLAIM, DECIDE... update the run and its entries in one script, and
                    no node holds a whole index
    index-slots{fleet}  set  the slots whose shards were ever written: added before a
                    root's CREATE (a second, idempotent write: the set is always a
                    superset), never removed; the tick and listings read these shards,
                    one SWEEP per node (lua/sweep.lua, the one read-only script across
                    slots), pruning PRUNE_SHARDS of them per tick
    tick-lock{fleet}, tick-stats{fleet}, metrics{fleet}, worker-gauges{fleet}: one slot
                    (one script uses two)
    schedule shards schedules{<t>}, schedule-due{<t>}, schedule-firing{<t>},
                    notifications{<t>}, schedule-slot{<t>}:<name>:<slot>,
                    schedule-history{<t>}:<name>, schedule-queue{<t>}:<name>,
                    schedule-queued{<t>}, schedule-runs{<t>}:<name>: one shard per
                    hash slot like the index shards, a schedule in the shard of its
                    name's slot (its claim touches only these); schedule-slots{fleet}
                    lists the slots written, added before a schedule's first write
    route:{<r>}:<part>, key-inflight:{<r>}<key>: a route in one slot; a key's cap on
                    calls in flight then counts per route, not across routes
    memory:<name>, schedule-notes:<name>: in their own slots, so SAVE leaves them out;
                    the store appends a finished run's notes right after its SAVE
                    (lost, not doubled, if the worker dies between the two)
    activity{<t>}   `wait`/`watch` follow the activity shard of the run they wait on
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from scheduler import ScheduleKeys
from workers.engine.ids import root_of, tree_parts
from workers.engine.records import RUN_LISTS, RunList
from workers.store.cluster import key_slot, slot_tag

__all__ = [
    "NOTES_MAX",
    "STREAM_CALL_CHARS",
    "STREAM_IDLE_S",
    "STREAM_KEEP_S",
    "STREAM_MAX",
    "STREAM_PARKED_S",
    "TRACE_MAX",
    "IndexKeys",
    "Keys",
    "RunFields",
]

TRACE_MAX = 2_000
"""Lines a run's trace keeps (the newest); each line is cut, so a trace stays bounded."""
NOTES_MAX = 100
"""Notes a schedule (or a memory) keeps, the newest."""
STREAM_MAX = 10_000
"""Entries a tree's live stream keeps (about: trimmed a node at a time), the newest; a
reader further behind than that misses the oldest."""
STREAM_KEEP_S = 3_600
"""Seconds a tree's live stream is kept after its root finished (or the retention, if
shorter): long enough for a reader to catch up, short enough to cost little."""
STREAM_IDLE_S = 600
"""Seconds a tree's live stream is kept after its last event (each event renews it)."""
STREAM_PARKED_S = 60
"""Seconds a tree's live stream is kept once one of its runs parks for a person (a plan,
a call, a question, a budget, a pause), unless another event renews it: a reader
catches up meanwhile, and thousands of parked runs cost no stream each."""
STREAM_CALL_CHARS = 60_000
"""Characters of one model call's reply that go into the live stream (the agent refuses
a longer reply anyway); the rest is not streamed."""


class RunFields:
    """The fields of a run's hash (`run:<id>`)."""

    VERSION = "v"
    """Counts saves; SAVE is a compare-and-set on it."""
    RECORD = "meta"
    """The RunRecord JSON (fields equal to their default left out), but for the fields in
    FIXED (a run saved before they were kept apart has them all here)."""
    FIXED = "fixed"
    """The RunRecord's fields that never change (`engine.records.FIXED_FIELDS`: its id,
    task, config, ...) as JSON, written when the run is made; RECORD holds the rest.
    A reader joins the two (`store.codec.record_text`)."""
    FORM = "sf"
    """How the agent's snapshot is stored, as runs saved before said it: 2, its head in
    HEAD and its history entries in `hist:<id>` (form 2). No longer written: a run with
    a HEAD is in form 2 (a save that writes a head whole drops `sf`); one without is
    whole in SNAPSHOT (runs saved before form 2; their next save writes them in it)."""
    HEAD = "head"
    """The agent's snapshot without its history (form 2), and without what its start set
    (START) once that is kept apart."""
    START = "start"
    """What the agent's start set (task, context, attachments: `Agent.snapshot_start`), a
    JSON object written once with FIXED; `store.snapshots.join` puts it back."""
    LOOPS = "lp"
    """The agent's loop counters (`Agent.snapshot_loops`), a JSON object kept apart from
    HEAD and written only by a step that changes them (or the first that keeps them
    apart); absent while there are none. A HEAD that still holds them has the last word."""
    SNAPSHOT = "snap"
    """The agent's whole snapshot (runs saved before form 2 only)."""
    TOTALS = "u"
    """What the run and all its descendants used (SAVE adds each model call's usage to
    the run and every ancestor): "<tokens in> <out> <total> <cached in> <micro-dollars>
    <model calls> <unpriced calls>", the order of `workers.engine.records.Usage`; absent
    while none (lua/totals.lua). One field, not seven: each field of a run's hash costs
    about 50 bytes. A run saved before has them in the seven below (USAGE) until its
    next usage moves them here."""
    PROMPT_TOKENS = "tp"
    COMPLETION_TOKENS = "tc"
    TOTAL_TOKENS = "tt"
    CACHED_TOKENS = "cc"
    COST = "cu"
    """Micro-dollars."""
    MODEL_CALLS = "mc"
    UNPRICED_CALLS = "np"
    USAGE = (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
        TOTAL_TOKENS,
        CACHED_TOKENS,
        COST,
        MODEL_CALLS,
        UNPRICED_CALLS,
    )
    """Where runs saved before TOTALS kept them, one field each, in its order."""
    LIMIT_TOKENS = "lt"
    LIMIT_COST = "lu"
    LIMIT_CALLS = "lc"
    DEADLINE = "ld"
    """The tree's budget, on its root: tokens, micro-dollars, model calls, and the time
    (ms) its `seconds` run out. CREATE sets them; EXTEND raises them."""
    RESERVED_TOKENS = "rt"
    RESERVED_COST = "ru"
    RESERVED_CALLS = "rc"
    """What the tree's model calls in flight reserved (CLAIM adds, SAVE settles)."""
    TRACE_LINES = "tn"
    """Trace lines ever written (the list keeps only the newest)."""
    OUT = "out"
    """Calls of the current batch not yet recorded: the last RECORD advances the run.
    Absent when none are (RECORD reads absent as 0)."""
    DUE = "due"
    """What CLAIM may take, as SAVE wrote it with RECORD and VERSION: "<version>|<seq of
    the model call due>|<its request's bytes>|<running tool calls>" (all but the version
    from `store.codec.claimable`), so a claim reads it without decoding the record.
    Absent, or of another version than the run's (a run no SAVE wrote yet, one saved
    before it was kept, or saved by an older worker), CLAIM decodes RECORD."""
    CANCEL = "cancel"
    """Set when the run is cancelled: running tools see it through their lease."""
    FOLLOW_UP = "fu"
    """Set while a follow-up is in the inbox, not yet applied (REPLY sets it, the SAVE
    that applies it clears it): a `reject` reply is refused meanwhile."""

    @staticmethod
    def result(call: str) -> str:
        """`r:<call>`: the call's outcome is recorded (in the inbox, not yet applied)."""
        return f"r:{call}"

    @staticmethod
    def attempts(call: str) -> str:
        """`a:<call>`: claims of the call so far (the fence: only the last may record)."""
        return f"a:{call}"

    @staticmethod
    def carrier(call: str) -> str:
        """`k:<call>`: the Celery task that carried the call's last claim."""
        return f"k:{call}"

    @staticmethod
    def noted(call: str) -> str:
        """`n:<call>`: the attempt whose loss the trace said last (`resent`)."""
        return f"n:{call}"

    @staticmethod
    def reservation(run_id: str, call: str) -> str:
        """`q:<run>|<call>` on the root: "tokens:micro-dollars" a model call reserved."""
        return f"q:{run_id}|{call}"

    @staticmethod
    def stub(digest: str) -> str:
        """`s:<digest>` on a fork's root: the recorded outcome (ToolOutput JSON) its tool
        calls with exactly that digest get instead of running (`Relay.fork(stub_tools=)`)."""
        return f"s:{digest}"

    @staticmethod
    def decision(kind: str, what: str) -> str:
        """`d:<call>`, `d:plan:<seq>`, `d:question:<seq>`: `decided`, or `expired`."""
        return f"d:{what}" if kind == "call" else f"d:{kind}:{what}"


@dataclass(frozen=True)
class IndexKeys:
    """The fleet-wide indexes of one shard: the only shard on a single Redis; on a
    cluster, the shard of one hash slot, whose keys end in that slot's tag."""

    runs: str
    lists: tuple[str, ...]
    """`runs:<list>` for each of RUN_LISTS, in its order (see `listed`)."""
    outbox: str
    pending: str
    pending_data: str
    deadlines: str
    activity: str
    prune_cursor: str
    lists_cursor: str
    lists_built: str
    slot: int = -1
    """The hash slot of the shard (-1: the only shard, on a single Redis)."""

    def listed(self, which: RunList) -> str:
        """The index of the runs on the list `which` (running, waiting, failed, ...)."""
        return self.lists[RUN_LISTS.index(which)]

    def run_indexes(self, lists: Sequence[RunList]) -> list[str]:
        """The indexes a listing of `lists` reads in this shard (every run's if none)."""
        return [self.listed(which) for which in lists] if lists else [self.runs]


@dataclass(frozen=True)
class Keys:
    """Every key under one prefix; with `cluster`, tagged for Redis Cluster (see above)."""

    prefix: str
    cluster: bool = False

    def __post_init__(self) -> None:
        if self.cluster and ("{" in self.prefix or "}" in self.prefix):
            # A brace in the prefix would become every key's hash tag: one slot for all.
            raise ValueError(f"a key prefix for Redis Cluster has no braces: {self.prefix!r}")

    def _(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def _fleet(self, name: str) -> str:
        # One tag for the fleet's few single keys: the tick's lock and its stats go
        # through one script, so they must share a slot.
        return self._(f"{name}{{fleet}}" if self.cluster else name)

    def _tree(self, run_id: str) -> str:
        """The run id as keys spell it: on a cluster `{<root>}.<rest>`, so every key of
        a tree hashes to its root's slot."""
        if not self.cluster:
            return run_id
        root, rest = tree_parts(run_id)
        return f"{{{root}}}{rest}"

    def tree(self, run_id: str) -> str:
        """The run id as its keys spell it (SAVE works out a call's lease key from it)."""
        return self._tree(run_id)

    def slot(self, run_id: str) -> int:
        """The hash slot of the run's tree (on a cluster)."""
        return key_slot(self.run(run_id).encode())

    def index(self, run_id: str) -> IndexKeys:
        """The index shard the run's entries go to (the same slot as its tree)."""
        return self.shard(self.slot(run_id)) if self.cluster else _single(self)

    def shard(self, slot: int) -> IndexKeys:
        """The index shard of hash slot `slot` (on a cluster)."""
        return _shard(self, slot)

    def _index(self, tag: str, slot: int = -1) -> IndexKeys:
        return IndexKeys(
            runs=self._(f"runs{tag}"),
            lists=tuple(self._(f"runs:{which}{tag}") for which in RUN_LISTS),
            outbox=self._(f"outbox{tag}"),
            pending=self._(f"pending{tag}"),
            pending_data=self._(f"pending:data{tag}"),
            deadlines=self._(f"deadlines{tag}"),
            activity=self._(f"activity{tag}"),
            prune_cursor=self._(f"prune-cursor{tag}"),
            lists_cursor=self._(f"lists-cursor{tag}"),
            lists_built=self._(f"lists-built{tag}"),
            slot=slot,
        )

    @property
    def index_slots(self) -> str:
        """The set of hash slots whose index shards were ever written (a cluster's)."""
        return self._fleet("index-slots")

    @property
    def tick_lock(self) -> str:
        return self._fleet("tick-lock")

    @property
    def tick_stats(self) -> str:
        return self._fleet("tick-stats")

    @property
    def metrics(self) -> str:
        return self._fleet("metrics")

    @property
    def worker_gauges(self) -> str:
        return self._fleet("worker-gauges")

    def web_used(self, nonce: str) -> str:
        return self._(f"web-used:{nonce}")

    def run(self, run_id: str) -> str:
        return self._(f"run:{self._tree(run_id)}")

    def inbox(self, run_id: str) -> str:
        return self._(f"inbox:{self._tree(run_id)}")

    def trace(self, run_id: str) -> str:
        return self._(f"trace:{self._tree(run_id)}")

    def history(self, run_id: str) -> str:
        return self._(f"hist:{self._tree(run_id)}")

    def journal(self, run_id: str) -> str:
        return self._(f"jr:{self._tree(run_id)}")

    def lease(self, run_id: str, what: str) -> str:
        return self._(f"lease:{self._tree(run_id)}:{what}")

    def schedule_notes(self, schedule: str) -> str:
        return self._(f"schedule-notes:{schedule}")

    def memory(self, name: str) -> str:
        return self._(f"memory:{name}")

    def live(self, run_id: str) -> str:
        """The live stream of the tree `run_id` belongs to (its root's)."""
        return self._(f"live:{self._tree(root_of(run_id))}")

    def route(self, name: str, part: str = "") -> str:
        """`route:<name>` or `route:<name>:<part>` (see the map above)."""
        tagged = f"{{{name}}}" if self.cluster else name
        return self._(f"route:{tagged}" + (f":{part}" if part else ""))

    def key_inflight(self, key: str, route: str) -> str:
        """A key's calls in flight; on a cluster, on `route` only (in the route's slot:
        the admission script touches both)."""
        return self._(f"key-inflight:{{{route}}}{key}" if self.cluster else f"key-inflight:{key}")

    def schedules(self, name: str) -> ScheduleKeys:
        """The scheduler's keys for the schedule `name`: on a single Redis the same for
        every schedule; on a cluster the shard of the slot `name` hashes to."""
        if not self.cluster:
            return ScheduleKeys.under(self.prefix)
        return self.schedule_shard(self.schedule_slot(name))

    def schedule_slot(self, name: str) -> int:
        """The hash slot of the schedule `name`'s shard (on a cluster)."""
        return key_slot(name.encode())

    def schedule_shard(self, slot: int) -> ScheduleKeys:
        """The scheduler's shard of hash slot `slot` (on a cluster)."""
        return _schedule_shard(self, slot)

    @property
    def schedule_slots(self) -> str:
        """The set of hash slots whose schedule shards were ever written (a cluster's)."""
        return self._fleet("schedule-slots")


@cache
def _single(keys: Keys) -> IndexKeys:
    # Made once: a step asks for its run's index a few times (about 10 µs each to spell).
    return keys._index("")


@cache
def _shard(keys: Keys, slot: int) -> IndexKeys:
    # Made once per slot: a tick over a cluster's 16384 shards would spend most of
    # its time spelling their names.
    return keys._index(f"{{{slot_tag(slot)}}}", slot)


@cache
def _schedule_shard(keys: Keys, slot: int) -> ScheduleKeys:
    return ScheduleKeys.under(keys.prefix, f"{{{slot_tag(slot)}}}")
