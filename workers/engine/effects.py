"""What one step of a run decides, as frozen values: the engine's output.

`Advanced` is the run's new record and snapshot, the `Effects` that go with
them in the same atomic save, and the task messages to send once the save has
landed. The store turns them into the SAVE script's arguments in one place
(`workers.store.scripts.save`, with `workers.store.codec`). Effects speak of
runs, calls and messages; which keys and fields they touch is the store's
business. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent_core import Agent
from workers.engine.events import InboxEvent
from workers.engine.ids import OutboxMember, model_call
from workers.engine.records import Pending, RunList, RunRecord, TraceEntry, Usage

__all__ = [
    "KEEP",
    "Advanced",
    "ChildRun",
    "Delivery",
    "Effects",
    "KeptNotes",
    "Message",
    "Outgoing",
    "OwnOutcome",
    "Reservation",
    "RouteNews",
    "Send",
    "SnapshotWrite",
    "UsageAdd",
]


@dataclass(frozen=True)
class Message:
    """A task message to send once the save that decided it has landed."""

    kind: Literal["advance", "call_model", "run_tool"]
    run: str
    seq: int = 0
    call: str = ""
    tool: str = ""
    delay_ms: int = 0
    """Deliver it no sooner than this (a model call waiting for its route's turn)."""

    @property
    def member(self) -> str:
        """The message's entry in the outbox (what the tick sends again if it is lost)."""
        if self.kind == "call_model":
            return OutboxMember.model(self.run, self.seq)
        if self.kind == "run_tool":
            return OutboxMember.tool(self.run, self.call)
        return OutboxMember.advance(self.run)

    @property
    def called(self) -> str:
        """The call a call message is for (`call-2`, or `m<seq>` for a model call); '' for
        an advance."""
        if self.kind == "call_model":
            return model_call(self.seq)
        return self.call if self.kind == "run_tool" else ""

    @classmethod
    def of(cls, member: str) -> Message | None:
        """Return the message an outbox member stands for (None if it cannot be read)."""
        match OutboxMember.parts(member):
            case ("a", run):
                return cls("advance", run)
            case ("m", run, seq) if seq.isdigit():
                return cls("call_model", run, seq=int(seq))
            case ("t", run, call):
                return cls("run_tool", run, call=call)
        return None


@dataclass(frozen=True)
class Outgoing:
    """Task messages a client command sends (emitted by its steps, `workers.store.ops`:
    the client that drives them sends them on its own transport)."""

    messages: list[Message]


@dataclass(frozen=True)
class Send:
    """Put `member` in the outbox, due to be sent again at `due_ms` if nobody deals with it."""

    member: str
    due_ms: int


@dataclass(frozen=True)
class UsageAdd:
    """What a model call used, to add to one run's totals (the run that called, and each
    ancestor)."""

    run_id: str
    usage: Usage


@dataclass(frozen=True)
class ChildRun:
    """A specialist's run to create (if absent), woken at once."""

    record: RunRecord
    snapshot: str
    due_ms: int
    start: str
    """Its journal's start (`workers.engine.journal.start_text`)."""


@dataclass(frozen=True)
class Delivery:
    """An event for another run's inbox (a child's outcome to its parent, a cancel down)."""

    run_id: str
    event: InboxEvent
    due_ms: int
    cancel_flag: bool = False
    """Also set the run's `cancel` field, which its running tools see."""


@dataclass(frozen=True)
class KeptNotes:
    """Notes a finished run remembered, kept for the next run of its schedule, or of its
    memory (`Relay.start(memory=name)`)."""

    name: str
    notes: tuple[str, ...]
    kind: Literal["schedule", "memory"] = "schedule"


@dataclass(frozen=True)
class RouteNews:
    """What a route's limits hear of a call they admitted, whatever came of it
    (lua/route_done.lua: its slots back, the tokens it was charged settled against those
    it used). A success's is told with the save of the call's outcome, in the same
    script, on a single Redis (`OwnOutcome.route`)."""

    route: str
    key: str
    holder: str
    """The call's name at the route (the one its admission held a slot by)."""
    now_ms: int
    paused_until_ms: int
    """The route has nothing left until then (the reply said so), else `now_ms`."""
    charged: int
    """The tokens its admission charged."""
    used: int | None
    """The tokens it used; None when unknown (it failed: all it was charged comes back)."""
    ms_per_token: float
    """The route's spacing of tokens (0: no tokens-per-minute limit)."""


@dataclass(frozen=True)
class OwnOutcome:
    """The calling task's own outcome, saved with the step: refused if it was recorded
    already, or if a later attempt took the call over."""

    run_id: str
    call: str
    attempt: int
    token: str
    member: str
    route: RouteNews | None = None
    """The route that gave a model call's reply hears it went well in the save's script,
    whatever the save answers (a save refused, stale or fenced still frees the slot)."""


@dataclass(frozen=True)
class Reservation:
    """What a model call reserved on its tree's budget (on the root), let go once its
    outcome is in or its run ended."""

    root: str
    run_id: str
    call: str


@dataclass(frozen=True)
class SnapshotWrite:
    """What a save does to the stored snapshot (`workers.store.snapshots` works it out).

    `head` empty: nothing (the step left the agent as it was stored). Otherwise
    the head is replaced and the history entries are changed: with `rewrite`,
    replaced by `append`; without, their first `drop` removed and `append` added.
    `agent` (optional) is the agent in exactly the saved state, for the agent cache.
    """

    head: str
    append: tuple[str, ...] = ()
    drop: int = 0
    rewrite: bool = False
    agent: Agent | None = None
    loops: str = ""
    """The agent's loop counters (`Agent.snapshot_loops`) when the step changed them, or
    they are not stored apart yet; '' leaves them as stored."""


KEEP = SnapshotWrite("")
"""Leave the stored snapshot as it is (a run that ends without advancing its agent)."""


@dataclass(frozen=True)
class Effects:
    """Everything written with one save, atomically with it."""

    applied: tuple[str, ...] = ()
    """Inbox entries applied by this step (deleted with the save)."""
    trace: tuple[TraceEntry, ...] = ()
    sends: tuple[Send, ...] = ()
    """Messages this step decided, in the outbox until they are dealt with."""
    unsend: tuple[str, ...] = ()
    """Outbox members no longer wanted (a finished run's calls)."""
    pending_add: tuple[Pending, ...] = ()
    pending_del: tuple[str, ...] = ()
    usage_adds: tuple[UsageAdd, ...] = ()
    create: tuple[ChildRun, ...] = ()
    deliveries: tuple[Delivery, ...] = ()
    retention_s: int = 0
    """Seconds to keep the run: set once it finished."""
    stale_calls: tuple[str, ...] = ()
    """Calls whose markers go (their outcome was applied, or their turn was stopped):
    a message for one of them is stale for good."""
    follow_up_taken: bool = False
    """A person's follow-up was applied: another may be sent now, even a `reject`."""
    running: tuple[str, ...] = ()
    """Calls of the batch out now: those not yet recorded are counted as `out`."""
    settle: tuple[Reservation, ...] = ()
    """Model calls whose reservation on the tree's budget goes now."""
    notes: KeptNotes | None = None
    done_summary: str | None = None
    """The run finished: its summary, for a "done" event in its tree's live stream."""
    reopened: bool = False
    """A follow-up reopened the finished run: its keys lose their TTLs."""
    relisted: tuple[RunList, RunList] | None = None
    """The run moves from one list to another (running to waiting, running to failed...)."""
    journal: str | None = None
    """The step's journal entry (`workers.engine.journal`): the events it applied and the
    step the agent then waited on; None: the step did not advance the agent."""


@dataclass(frozen=True)
class Advanced:
    """What a step decided: save `record` and `snapshot` with `effects`, then send `messages`."""

    record: RunRecord
    snapshot: str
    """The agent's whole snapshot text; '' where the caller asked for none
    (`decide(..., whole=False)`: `Steps.decide` works out `stored` from the agent, and a
    replay stores nothing)."""
    effects: Effects
    messages: tuple[Message, ...] = ()
    stored: SnapshotWrite | None = None
    """How the save changes the stored snapshot; None: it writes `snapshot` whole."""
    fixed_stored: bool = False
    """Whether the store holds the record's fixed fields already (the save leaves them);
    False: the save writes them too."""
