"""The working copy of one run while a step is decided, and what the step writes.

`Working` holds what a step may change (the run's seq, state, calls, pending
entries, usage, outcome) as typed attributes, collects what goes with the save
(trace lines, messages, usage for ancestors, children to create, deliveries),
and freezes it all into an `Advanced` (`decided`). `workers.engine.decide`
decides; this is where its decisions are written down. Each list here has the
name of the `Effects` field it becomes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_core import Agent, Outcome, TraceEvent
from workers.engine.effects import (
    Advanced,
    ChildRun,
    Delivery,
    Effects,
    KeptNotes,
    Message,
    Reservation,
    Send,
    UsageAdd,
)
from workers.engine.events import InboxEvent, Ran
from workers.engine.records import (
    CallTrack,
    Pending,
    RunList,
    RunRecord,
    RunState,
    TraceEntry,
    Usage,
    WaitingFor,
    by_route,
    run_list,
)

__all__ = ["Surroundings", "Verifier", "Working", "ran_data"]

Verifier = Callable[[Outcome], str | None]
"""A check of each final answer: a problem to send it back with, or None."""


@dataclass(frozen=True)
class Surroundings:
    """What advancing needs from the host besides the run itself."""

    now_ms: int
    grace_ms: int
    """How long a message may go unhandled before the tick sends it again."""
    approval_ttl_ms: int | None
    retention_s: int
    verifier: Verifier | None = None


class Working:
    """The working copy of one run while a step is decided: what changes, and what to write."""

    def __init__(self, record: RunRecord, agent: Agent | None, around: Surroundings) -> None:
        self.record = record
        self._agent = agent
        self.around = around
        self.seq = record.seq
        self.asked = record.asked
        self.state: RunState = record.state
        self.waiting_for: WaitingFor | None = record.waiting_for
        self.pending = record.pending
        self.calls: dict[str, CallTrack] = dict(record.calls)
        self.children = record.children
        self.usage = record.usage
        self.usage_by_route = record.route_usage()
        self.verifier_rejections = record.verifier_rejections
        self.unknown_calls = record.unknown_calls
        self.forced_stop = record.forced_stop
        self.outcome = record.outcome
        self.finished_ms = record.finished_ms
        self.applied: list[str] = []
        self.trace: list[TraceEntry] = []
        self.sends: list[Send] = []
        self.unsend: list[str] = []
        self.pending_add: list[Pending] = []
        self.pending_del: list[str] = []
        self.usage_adds: list[UsageAdd] = []
        self.create: list[ChildRun] = []
        self.deliveries: list[Delivery] = []
        self.stale_calls: list[str] = []
        self.follow_up_taken = False
        self.settle: list[Reservation] = []
        self.parked = record.parked
        self.asked_bytes = record.asked_bytes
        self.paused = record.paused
        self.queued = record.queued
        self.kept_note = record.kept_note
        self.notes: KeptNotes | None = None
        self.retention_s = 0
        self.done_summary: str | None = None
        self.reopened = False
        self.messages: list[Message] = []
        self.replied_by = ""
        """The route of the model reply just applied: its trace lines name it."""
        self.ran: dict[str, Ran] = {}
        """Who made the calls whose outcomes this step applies: their result lines say so."""
        self.journal: str | None = None
        """This step's journal entry, once it is decided."""

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def agent(self) -> Agent:
        assert self._agent is not None, "this run's agent could not be restored"
        return self._agent

    def due(self) -> int:
        """When a message sent now is due to be sent again if nobody dealt with it."""
        return self.around.now_ms + self.around.grace_ms

    def note(self, kind: str, text: str = "", **data: Any) -> None:
        """Add a runtime line to the trace."""
        entry = TraceEntry(at_ms=self.around.now_ms, run=self.id, kind=kind, text=text, **data)
        self.trace.append(entry)

    def take_trace(self) -> None:
        """Move the agent's new trace events to the run's trace; each batch is a new seq."""
        events = self.agent.take_trace()
        route, self.replied_by = self.replied_by, ""
        if events:
            self.seq += 1
            unknown = [e for e in events if e.output and e.output.status == "unknown"]
            self.unknown_calls += len(unknown)
            now = self.around.now_ms
            self.trace.extend(_entry(self.id, now, e, route, self.ran) for e in events)

    def send(self, message: Message) -> None:
        self.messages.append(message)
        self.sends.append(Send(message.member, self.due()))

    def add_usage(
        self, usage: Usage, route: str = "", call: str | None = None, ran: Ran | None = None
    ) -> None:
        """Add the tokens of one model call (`call`: its name, `m<seq>`; `route`: the route
        that served it; `ran`: who made it) to the run and above."""
        self.usage = self.usage + usage
        if route:
            self.usage_by_route[route] = self.usage_by_route.get(route, Usage()) + usage
        self.usage_adds += [UsageAdd(run, usage) for run in (*self.record.ancestors, self.id)]
        data: dict[str, object] = {"tokens": usage.total_tokens}
        if route:
            data["route"] = route
        if usage.cost_micro or usage.unpriced_calls:
            data["cost_micro"] = usage.cost_micro
        self.note("usage", call_id=call, data={**data, **ran_data(ran)})

    def deliver(self, run: str, event: InboxEvent, *, cancel_flag: bool = False) -> None:
        """Put `event` in another run's inbox with this save, and wake that run after it."""
        self.deliveries.append(Delivery(run, event, self.due(), cancel_flag))
        self.messages.append(Message("advance", run))

    def call_stale(self, call: str) -> None:
        """The call's outcome was applied (or its turn stopped): its markers go."""
        self.stale_calls.append(call)

    def settle_reservation(self, call: str) -> None:
        """Let go of what the model call `call` reserved on the tree's budget (once: a
        reply that ends the run is let go as a reply and as the run's last call)."""
        reservation = Reservation(self.record.root, self.id, call)
        if reservation not in self.settle:
            self.settle.append(reservation)

    def set_state(self, state: RunState, waiting_for: WaitingFor | None) -> None:
        self.state, self.waiting_for = state, waiting_for

    def decided(self, snapshot: str) -> Advanced:
        """Return what this step decided, with `snapshot` as the run's agent state."""
        record = self.record.model_copy(
            update={
                "seq": self.seq,
                "asked": self.asked,
                "asked_bytes": self.asked_bytes,
                "parked": self.parked,
                "state": self.state,
                "waiting_for": self.waiting_for,
                "pending": self.pending,
                "calls": self.calls,
                "children": self.children,
                "usage": self.usage,
                **by_route(self.usage, self.usage_by_route),
                "verifier_rejections": self.verifier_rejections,
                "unknown_calls": self.unknown_calls,
                "forced_stop": self.forced_stop,
                "outcome": self.outcome,
                "finished_ms": self.finished_ms,
                "updated_ms": self.around.now_ms,
                "paused": self.paused,
                "queued": self.queued,
                "kept_note": self.kept_note,
            }
        )
        effects = Effects(
            applied=tuple(self.applied),
            trace=tuple(self.trace),
            sends=tuple(self.sends),
            unsend=tuple(self.unsend),
            pending_add=tuple(self.pending_add),
            pending_del=tuple(self.pending_del),
            usage_adds=tuple(self.usage_adds),
            create=tuple(self.create),
            deliveries=tuple(self.deliveries),
            retention_s=self.retention_s,
            stale_calls=tuple(self.stale_calls),
            follow_up_taken=self.follow_up_taken,
            running=tuple(c for c, t in self.calls.items() if t.status == "running"),
            settle=tuple(self.settle),
            notes=self.notes,
            done_summary=self.done_summary,
            reopened=self.reopened,
            relisted=_relisted(self.record, record),
            journal=self.journal,
        )
        return Advanced(record, snapshot, effects, tuple(self.messages))


def _relisted(was: RunRecord, now: RunRecord) -> tuple[RunList, RunList] | None:
    before, after = run_list(was.state, was.outcome), run_list(now.state, now.outcome)
    return None if before == after else (before, after)


def ran_data(ran: Ran | None) -> dict[str, object]:
    """A trace line's data on who made its call: `attempt`, `worker`, `task` (where known);
    `stubbed` instead of the attempt when nothing ran."""
    if ran is None:
        return {}
    # A stubbed outcome ran nowhere: no attempt or time of its own to tell, only who
    # handed it back.
    data: dict[str, object] = {"stubbed": True} if ran.stubbed else {"attempt": ran.attempt}
    if ran.worker:
        data["worker"] = ran.worker
    if ran.task:
        data["task"] = ran.task
    if ran.ms is not None and not ran.stubbed:
        data["ms"] = ran.ms
    return data


def _entry(
    run_id: str, now_ms: int, event: TraceEvent, route: str, ran: dict[str, Ran]
) -> TraceEntry:
    made = ran.get(event.call.id) if event.call and event.kind == "result" else None
    return TraceEntry(
        at_ms=now_ms,
        run=run_id,
        kind=event.kind,
        text=event.text,
        call_id=event.call.id if event.call else None,
        tool=event.call.tool if event.call else None,
        status=event.output.status if event.output else None,
        stop=event.stop.value if event.stop else None,
        data={
            **({"args": event.call.args} if event.call and event.kind == "call" else {}),
            **({"route": route} if route else {}),
            **ran_data(made),
        },
    )
