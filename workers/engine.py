"""Advancing one run: inbox events in, the next record, snapshot and messages out.

This is the host side of the agent, with no I/O of its own: the task that
calls it loads the run, and saves what comes back with one compare-and-set.
It applies each unapplied inbox event to the agent in order, then looks at the
step the agent waits on and decides what must happen next: a model call, the
calls of a batch (each on its own, side by side), a child run for each
delegation, a person's decision (the run parks), or the end of the run.

Duplicate and stale events change nothing: a model reply names the state
(`seq`) it answers, results name their call, and the agent ignores what it is
not waiting for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_core import (
    Agent,
    Ask,
    Config,
    Done,
    Outcome,
    Plan,
    Question,
    Run,
    Stop,
    Summarize,
    ToolCall,
    ToolOutput,
    TraceEvent,
)
from workers.model_client import Usage
from workers.records import (
    Answer,
    CallDecision,
    CallTrack,
    CancelRun,
    ChildDone,
    InboxEvent,
    ModelFailed,
    ModelReplied,
    Pending,
    PlanDecision,
    RunRecord,
    ToolDone,
    TraceEntry,
)
from workers.store import SaveEffects, advance_member, model_member, pending_member, tool_member

__all__ = ["Advanced", "Message", "Surroundings", "advance"]

MAX_VERIFIER_REJECTIONS = 3
DELEGATE = "delegate"

Verifier = Callable[[Outcome], str | None]


@dataclass(frozen=True)
class Message:
    """A task message to send once the save that decided it has landed."""

    kind: Literal["advance", "call_model", "run_tool"]
    run: str
    seq: int = 0
    call: str = ""
    tool: str = ""

    @property
    def member(self) -> str:
        """The message's entry in the outbox."""
        if self.kind == "call_model":
            return model_member(self.run, self.seq)
        if self.kind == "run_tool":
            return tool_member(self.run, self.call)
        return advance_member(self.run)


@dataclass(frozen=True)
class Surroundings:
    """What advancing needs from the host besides the run itself."""

    now_ms: int
    grace_ms: int
    """How long a message may go unhandled before the tick sends it again."""
    approval_ttl_ms: int | None
    retention_s: int
    verifier: Verifier | None = None


@dataclass
class Advanced:
    """What advancing decided: save `record` and `snapshot` with `effects`, then send `messages`."""

    record: RunRecord
    snapshot: str
    effects: SaveEffects
    messages: list[Message] = field(default_factory=list)


class _Run:
    """The mutable working copy of one run while it advances."""

    def __init__(self, record: RunRecord, agent: Agent, around: Surroundings) -> None:
        self.fields: dict[str, Any] = dict(record)
        self.calls: dict[str, CallTrack] = dict(record.calls)
        self.agent = agent
        self.around = around
        self.fx = SaveEffects()
        self.messages: list[Message] = []

    @property
    def id(self) -> str:
        return str(self.fields["id"])

    @property
    def seq(self) -> int:
        return int(self.fields["seq"])

    def note(self, kind: str, text: str = "", **data: Any) -> None:
        """Add a runtime line to the trace."""
        entry = TraceEntry(at_ms=self.around.now_ms, run=self.id, kind=kind, text=text, **data)
        self.fx.trace.append(entry)

    def take_trace(self) -> None:
        """Move the agent's new trace events to the run's trace; each batch is a new seq."""
        events = self.agent.take_trace()
        if events:
            self.fields["seq"] = self.seq + 1
            self.fx.trace.extend(_entry(self.id, self.around.now_ms, e) for e in events)

    def send(self, message: Message) -> None:
        self.messages.append(message)
        self.fx.send.append((message.member, self.around.now_ms + self.around.grace_ms))

    def add_usage(self, usage: Usage) -> None:
        self.fields["usage"] = self.fields["usage"] + usage
        counts = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
        for run in (*self.fields["ancestors"], self.id):
            self.fx.usage.append((run, *counts))
        self.note("usage", data={"tokens": usage.total_tokens})

    def deliver(self, run: str, event: InboxEvent, *, cancel_flag: bool = False) -> None:
        """Put `event` in another run's inbox with this save, and wake that run after it."""
        due = self.around.now_ms + self.around.grace_ms
        self.fx.deliver.append((run, event, due, cancel_flag))
        self.messages.append(Message("advance", run))


def advance(
    record: RunRecord,
    agent: Agent,
    inbox: list[tuple[str, InboxEvent | None]],
    around: Surroundings,
    own: InboxEvent | None = None,
) -> Advanced:
    """Apply `inbox` (and `own`, the outcome of the calling task) to the run, then
    decide what happens next."""
    run = _Run(record, agent, around)
    run.take_trace()
    for entry_id, event in inbox:
        run.fx.applied.append(entry_id)
        if event is None:
            run.note("ignored", "an inbox entry could not be read")
            continue
        _apply(run, event)
        run.take_trace()
    if own is not None:
        _apply(run, own)
        run.take_trace()
    _settle(run)
    run.fx.running = [call_id for call_id, t in run.calls.items() if t.status == "running"]
    run.fields["calls"] = run.calls
    run.fields["updated_ms"] = around.now_ms
    new_record = RunRecord.model_validate(run.fields)
    return Advanced(new_record, run.agent.snapshot(), run.fx, run.messages)


# --- applying events -----------------------------------------------------------------


def _waiting_for_model(run: _Run, seq: int) -> bool:
    return seq == run.seq and isinstance(run.agent.resume(), Ask | Summarize)


def _on_model_replied(run: _Run, event: ModelReplied) -> None:
    run.fx.forget += [f"r:m{event.seq}", f"a:m{event.seq}"]
    run.add_usage(event.usage)
    if _waiting_for_model(run, event.seq):
        run.agent.reply(event.text)


def _on_model_failed(run: _Run, event: ModelFailed) -> None:
    run.fx.forget += [f"r:m{event.seq}", f"a:m{event.seq}"]
    if not _waiting_for_model(run, event.seq):
        return
    if event.budget:
        _force_stop(run, Stop.BUDGET_EXCEEDED, event.error)
    else:
        run.agent.fail(event.error)


def _on_tool_done(run: _Run, event: ToolDone) -> None:
    # The markers only guard the call while it is due; applied, it is stale for good.
    run.fx.forget += [f"r:{event.call}", f"a:{event.call}"]
    run.calls.pop(event.call, None)
    run.agent.result(event.call, event.output)


def _on_child_done(run: _Run, event: ChildDone) -> None:
    run.calls.pop(event.call, None)
    run.agent.result(event.call, _child_output(event.outcome))


def _on_plan_decision(run: _Run, event: PlanDecision) -> None:
    if event.seq == run.seq and isinstance(run.agent.resume(), Plan):
        run.agent.approve_plan(event.yes)


def _on_answer(run: _Run, event: Answer) -> None:
    if event.seq == run.seq and isinstance(run.agent.resume(), Question):
        run.agent.answer(event.text)


def _on_cancel(run: _Run, event: CancelRun) -> None:
    _force_stop(run, Stop(event.stop), event.reason or "Cancelled.")


def _on_call_decision(run: _Run, event: CallDecision) -> None:
    track = run.calls.get(event.call)
    if track is None or track.status != "approval":
        return
    if event.yes:
        run.calls[event.call] = track.model_copy(update={"status": "running", "expires_ms": None})
        run.send(Message("run_tool", run.id, call=event.call, tool=track.tool))
        run.note("approved", call_id=event.call, tool=track.tool)
        return
    run.calls.pop(event.call)
    run.note("declined", event.reason, call_id=event.call, tool=track.tool)
    run.agent.result(event.call, ToolOutput.declined(event.reason))


_HANDLERS: dict[str, Callable[[_Run, Any], None]] = {
    "model_replied": _on_model_replied,
    "model_failed": _on_model_failed,
    "tool_done": _on_tool_done,
    "child_done": _on_child_done,
    "call_decision": _on_call_decision,
    "plan_decision": _on_plan_decision,
    "answer": _on_answer,
    "cancel": _on_cancel,
}


def _apply(run: _Run, event: InboxEvent) -> None:
    _HANDLERS[event.kind](run, event)


def _force_stop(run: _Run, stop: Stop, reason: str) -> None:
    if isinstance(run.agent.resume(), Done):
        return
    if stop is not Stop.CANCELLED:
        run.fields["forced_stop"] = stop
    run.agent.cancel(reason)


def _child_output(outcome: Outcome) -> ToolOutput:
    if outcome.stop is Stop.DONE:
        return ToolOutput.ok(outcome.summary)
    return ToolOutput.error(f"the specialist stopped ({outcome.stop.label()}): {outcome.summary}")


# --- deciding what happens next ------------------------------------------------------


def _settle(run: _Run) -> None:
    """Act on the step the agent now waits on (a verifier may send a final back first)."""
    while True:
        step = run.agent.resume()
        if isinstance(step, Done) and _verifier_rejects(run, step.outcome):
            continue
        break
    wanted: list[Pending] = []
    match step:
        case Ask() | Summarize():
            if run.fields["asked"] != run.seq:
                run.fields["asked"] = run.seq
                run.send(Message("call_model", run.id, seq=run.seq))
            _set_state(run, "running", "model")
        case Run(call=call):
            wanted = _dispatch(run, [call, *run.agent.queued()])
        case Plan(steps=steps):
            wanted = [_pending(run, "plan", "\n".join(steps))]
            _set_state(run, "waiting", "plan")
        case Question(text=text):
            wanted = [_pending(run, "question", text)]
            _set_state(run, "waiting", "question")
        case Done(outcome=outcome):
            _finish(run, outcome, run.agent.new_notes())
    _sync_pending(run, wanted)


def _set_state(run: _Run, state: str, waiting_for: str | None) -> None:
    run.fields["state"] = state
    run.fields["waiting_for"] = waiting_for


def _verifier_rejects(run: _Run, outcome: Outcome) -> bool:
    verifier = run.around.verifier
    if verifier is None or outcome.stop is not Stop.DONE:
        return False
    try:
        problem = verifier(outcome)
    except Exception as error:  # noqa: BLE001 - the host's check failing must end the run, not the worker
        run.note("verifier_failed", f"{type(error).__name__}: {error}")
        _force_stop(run, Stop.FAILED, "The final answer could not be checked.")
        run.take_trace()
        return True
    if not problem:
        return False
    rejections = run.fields["verifier_rejections"] + 1
    run.fields["verifier_rejections"] = rejections
    if rejections > MAX_VERIFIER_REJECTIONS:
        summary = f"The final answer was rejected {MAX_VERIFIER_REJECTIONS} times: {problem}"
        run.agent.reject_final(problem)
        _force_stop(run, Stop.FAILED, summary)
    else:
        run.note("rejected", problem)
        run.agent.reject_final(problem)
    run.take_trace()
    return True


def _dispatch(run: _Run, batch: list[ToolCall]) -> list[Pending]:
    """Send each call of the batch not yet under way; park the ones that need a yes."""
    now = run.around.now_ms
    for call in batch:
        if call.id in run.calls:
            continue
        if call.tool == DELEGATE:
            _start_child(run, call)
        elif call.ask:
            ttl = run.around.approval_ttl_ms
            expires = None if ttl is None else now + ttl
            run.calls[call.id] = CallTrack(
                status="approval", tool=call.tool, created_ms=now, expires_ms=expires
            )
            run.note("waiting", call.summary, call_id=call.id, tool=call.tool)
        else:
            run.calls[call.id] = CallTrack(status="running", tool=call.tool, created_ms=now)
            run.send(Message("run_tool", run.id, call=call.id, tool=call.tool))
    statuses = {t.status for t in run.calls.values()}
    if "running" in statuses:
        _set_state(run, "running", "tools")
    elif "child" in statuses:
        _set_state(run, "running", "children")
    else:
        _set_state(run, "waiting", "call")
    by_id = {c.id: c for c in batch}
    return [
        _call_pending(run, by_id[call_id], track)
        for call_id, track in run.calls.items()
        if track.status == "approval" and call_id in by_id
    ]


def _start_child(run: _Run, call: ToolCall) -> None:
    now = run.around.now_ms
    child_id = f"{run.id}.{call.id}"
    child = run.agent.start_child(call)
    record = RunRecord(
        id=child_id,
        parent=run.id,
        parent_call=call.id,
        root=run.fields["root"],
        ancestors=(*run.fields["ancestors"], run.id),
        depth=run.fields["depth"] + 1,
        task=str(call.args.get("task", ""))[:2_000],
        recipe=run.fields["recipe"],
        schedule=run.fields["schedule"],
        created_ms=now,
        updated_ms=now,
        config=run.fields["config"],
        tools=run.fields["tools"],
    )
    run.fx.create.append((record, child.snapshot(), now + run.around.grace_ms))
    run.messages.append(Message("advance", child_id))
    run.calls[call.id] = CallTrack(status="child", tool=DELEGATE, child=child_id, created_ms=now)
    run.fields["children"] = (*run.fields["children"], child_id)
    run.note("child", call.args.get("specialist", ""), call_id=call.id, data={"child": child_id})


def _pending(run: _Run, kind: Literal["plan", "question"], summary: str) -> Pending:
    ttl = run.around.approval_ttl_ms
    now = run.around.now_ms
    return Pending(
        kind=kind,
        run_id=run.id,
        root_id=run.fields["root"],
        summary=summary,
        created_ms=now,
        expires_ms=None if ttl is None else now + ttl,
        seq=run.seq,
    )


def _call_pending(run: _Run, call: ToolCall, track: CallTrack) -> Pending:
    return Pending(
        kind="call",
        run_id=run.id,
        root_id=run.fields["root"],
        call_id=call.id,
        tool=call.tool,
        summary=call.summary,
        args=call.args,
        risk=call.risk,
        created_ms=track.created_ms,
        expires_ms=track.expires_ms,
        seq=run.seq,
    )


def _sync_pending(run: _Run, wanted: list[Pending]) -> None:
    """Make the pending index hold exactly `wanted` for this run."""
    held = set(run.fields["pending"])
    members = {pending_member(p): p for p in wanted}
    run.fx.pending_del.extend(sorted(held - set(members)))
    run.fx.pending_add.extend(p for m, p in members.items() if m not in held)
    run.fields["pending"] = tuple(members)


def _finish(run: _Run, outcome: Outcome, notes: list[str]) -> None:
    """End the run: its outcome, its parent told, its children stopped, its notes kept."""
    forced = run.fields["forced_stop"]
    if forced is not None and outcome.stop is Stop.CANCELLED:
        outcome = outcome.model_copy(update={"stop": forced})
    run.fields["outcome"] = outcome
    run.fields["finished_ms"] = run.around.now_ms
    _set_state(run, "finished", None)
    for call_id, track in run.calls.items():
        if track.status == "child" and track.child:
            run.deliver(
                track.child, CancelRun(reason="The run that started it stopped."), cancel_flag=True
            )
        if track.status == "running":
            run.fx.unsend.append(tool_member(run.id, call_id))
    if run.fields["asked"] is not None:
        run.fx.unsend.append(model_member(run.id, run.fields["asked"]))
    run.calls = {}
    parent, parent_call = run.fields["parent"], run.fields["parent_call"]
    if parent and parent_call:
        run.deliver(parent, ChildDone(call=parent_call, child=run.id, outcome=outcome))
    root = run.fields["root"]
    if outcome.stop is Stop.BUDGET_EXCEEDED and root != run.id:
        run.deliver(
            root, CancelRun(reason=outcome.summary, stop="budget_exceeded"), cancel_flag=True
        )
    schedule = run.fields["schedule"]
    if schedule and run.fields["parent"] is None and notes:
        run.fx.notes = (schedule, notes)
    run.fx.retention = run.around.retention_s
    run.note("finished", outcome.summary, stop=outcome.stop.value)


def _entry(run_id: str, now_ms: int, event: TraceEvent) -> TraceEntry:
    return TraceEntry(
        at_ms=now_ms,
        run=run_id,
        kind=event.kind,
        text=event.text,
        call_id=event.call.id if event.call else None,
        tool=event.call.tool if event.call else None,
        status=event.output.status if event.output else None,
        stop=event.stop.value if event.stop else None,
        data={"args": event.call.args} if event.call and event.kind == "call" else {},
    )


def message_of(member: str) -> Message | None:
    """Return the message an outbox member stands for (None if it cannot be read)."""
    parts = member.split("|")
    match parts:
        case ["a", run]:
            return Message("advance", run)
        case ["m", run, seq] if seq.isdigit():
            return Message("call_model", run, seq=int(seq))
        case ["t", run, call]:
            return Message("run_tool", run, call=call)
    return None


def _stopped(record: RunRecord, snapshot: str, outcome: Outcome, around: Surroundings) -> Advanced:
    """Finish a run whose agent cannot be restored, telling its parent and children."""
    run = _Run.__new__(_Run)
    run.fields, run.calls, run.around = dict(record), dict(record.calls), around
    run.fx, run.messages = SaveEffects(), []
    _finish(run, outcome, [])
    _sync_pending(run, [])
    run.fields["calls"] = run.calls
    run.fields["updated_ms"] = around.now_ms
    return Advanced(RunRecord.model_validate(run.fields), snapshot, run.fx, run.messages)


def unreadable_snapshot(
    record: RunRecord, snapshot: str, problem: str, around: Surroundings
) -> Advanced:
    """Fail a run whose saved agent cannot be read; the other runs carry on."""
    return failed_run(
        record, snapshot, f"its saved agent state could not be read: {problem}", around
    )


def failed_run(record: RunRecord, snapshot: str, problem: str, around: Surroundings) -> Advanced:
    """Fail a run that cannot go on (its parent is told, its children stopped)."""
    outcome = Outcome(stop=Stop.FAILED, summary=f"The run failed: {problem}")
    return _stopped(record, snapshot, outcome, around)


def unreadable_record(run_id: str, snapshot: str, problem: str, around: Surroundings) -> Advanced:
    """Fail a run whose record cannot be read, telling its parent (named by its id)."""
    parent, _, parent_call = run_id.rpartition(".")
    record = RunRecord(
        id=run_id,
        parent=parent or None,
        parent_call=parent_call if parent else None,
        root=run_id.split(".", 1)[0],
        task="(unreadable)",
        created_ms=around.now_ms,
        updated_ms=around.now_ms,
        config=Config(),
    )
    outcome = Outcome(stop=Stop.FAILED, summary=f"The run's record could not be read: {problem}")
    return _stopped(record, snapshot, outcome, around)
