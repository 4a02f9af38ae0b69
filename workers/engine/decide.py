"""Advancing one run: inbox events in, the next record, snapshot and messages out.

This is the host side of the agent, with no I/O of its own: the task that
calls it has loaded the run, and saves what comes back (`Advanced`) with one
compare-and-set. It applies each unapplied inbox event to the agent in order,
then looks at the step the agent waits on and decides what must happen next:

    the agent waits on   the run                       sent after the save
    Ask, Summarize       running, waiting for model    relay.call_model (once per step)
    Run (a batch)        running, tools / children     relay.run_tool per call that needs
                         (or waiting for a call)       no yes; a child run per delegation;
                                                       a pending entry per call that does
    Plan, Question       waiting for plan / question   (a pending entry)
    Done                 finished                      its parent told, its children stopped
    Done, a turn queued  running                       (the next turn begins: see above)

A paused run (`workers.engine.steering`: people's messages, pause, resume, follow-ups)
sends nothing new: an Ask waits (waiting for pause), and a batch's calls wait
as `held` until it is resumed; what was sent before the pause goes on.

Duplicate and stale events change nothing: a model reply names the step (`seq`)
it answers, results name their call, and the agent ignores what it is not
waiting for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from agent_core import (
    Agent,
    Ask,
    Done,
    ModelRequest,
    Outcome,
    Plan,
    Question,
    Risk,
    Run,
    Step,
    Stop,
    Summarize,
    ToolArgsError,
    ToolCall,
    ToolOutput,
    UsageError,
)
from agent_core.text import clean, cut
from agent_core.toolbox import DELEGATE
from workers.engine import steering
from workers.engine.effects import (
    Advanced,
    ChildRun,
    KeptNotes,
    Message,
)
from workers.engine.events import (
    Answer,
    BudgetExtended,
    BudgetReached,
    CallDecision,
    CancelRun,
    ChildDone,
    InboxEvent,
    ModelFailed,
    ModelReplied,
    PlanDecision,
    ToolDone,
)
from workers.engine.ids import child_id, model_call, pending_member
from workers.engine.journal import call_digest, entry_text, start_text
from workers.engine.records import CallTrack, Pending, RunRecord
from workers.engine.working import Surroundings, Working, ran_data

__all__ = ["decide", "finish", "forget_model_call", "sync_pending"]

MAX_VERIFIER_REJECTIONS = 3
NOBODY_THERE = "Nobody is there to answer: this run is unattended. Go on without an answer."
FINAL_CHARS = 4_000
"""Characters of a run's summary its "done" stream event carries."""


def decide(
    record: RunRecord,
    agent: Agent,
    inbox: list[tuple[str, InboxEvent | None]],
    around: Surroundings,
    own: InboxEvent | None = None,
    *,
    whole: bool = True,
) -> Advanced:
    """Apply `inbox` (and `own`, the outcome of the calling task) to the run, then
    decide what happens next. With `whole` False, the agent's whole snapshot text is
    not made (`Advanced.snapshot` is ''): for a caller that works out what to store from
    the advanced agent itself (`Steps.decide`) or stores nothing (`replay`), where it was
    made only to be dropped (some 3% of a step's CPU)."""
    run = Working(record, agent, around)
    run.take_trace()
    for entry_id, event in inbox:
        run.applied.append(entry_id)
        if event is None:
            run.note("ignored", "an inbox entry could not be read")
            continue
        _HANDLERS[event.kind](run, event)
        run.take_trace()
    if own is not None:
        _HANDLERS[own.kind](run, own)
        run.take_trace()
    _settle(run)
    consumed = [event for _, event in inbox] + ([own] if own is not None else [])
    run.journal = entry_text(consumed, run.agent)
    return run.decided(run.agent.snapshot() if whole else "")


# --- applying events -----------------------------------------------------------------


def forget_model_call(run: Working, seq: int) -> None:
    """Its outcome is in: drop its markers, and settle what it reserved on the budget."""
    call = model_call(seq)
    run.call_stale(call)  # the markers only guard a call while it is due
    run.settle_reservation(call)


def _waiting_for_model(run: Working, seq: int) -> bool:
    return seq == run.seq and isinstance(run.agent.resume(), Ask | Summarize)


def _on_model_replied(run: Working, event: ModelReplied) -> None:
    forget_model_call(run, event.seq)
    run.add_usage(event.usage, event.route, model_call(event.seq), event.ran)
    run.replied_by = event.route
    if _waiting_for_model(run, event.seq):
        run.agent.reply(event.text, truncated=event.truncated)


def _on_model_failed(run: Working, event: ModelFailed) -> None:
    forget_model_call(run, event.seq)
    if not _waiting_for_model(run, event.seq):
        return
    if event.budget:
        _force_stop(run, Stop.BUDGET_EXCEEDED, event.error)
    elif event.final:
        said = cut(clean(event.error), 500)  # (no "trying again": nobody will)
        # The failed call's own line: which route, attempt, worker and task made it.
        made = {**ran_data(event.ran), **({"route": event.route} if event.route else {})}
        run.note("call_failed", said, call_id=model_call(event.seq), data=made)
        _force_stop(run, Stop.MODEL_FAILED, f"{_model_failure(event.status)}: {said}")
    else:
        run.agent.fail(event.error)


def _model_failure(status: int | None) -> str:
    """What went wrong with a model call, in words, by the HTTP status it last got."""
    if status is None:
        return "The model could not be reached"
    if status >= 500:
        return "The model server failed"
    if status == 429:
        return "The model server kept refusing for its rate limit"
    return "The model server refused the call"


def _on_budget_reached(run: Working, event: BudgetReached) -> None:
    forget_model_call(run, event.seq)
    if _waiting_for_model(run, event.seq):
        run.parked = event.detail  # no model call until the budget is extended
        run.asked = None
        # (The limit and what the next call needs: a person's raise is checked against them.)
        run.note("budget", event.detail, data={"limit": event.limit, "need": event.need})


def _on_budget_extended(run: Working, event: BudgetExtended) -> None:
    if run.parked is not None and event.seq == run.seq:
        run.parked = None
        # Who raised it and by what, where the event says (one stored before does not).
        said = ", ".join(filter(None, [event.raised and f"{event.raised} more",
                                       event.by and f"by {event.by}"]))  # fmt: skip
        data = {k: v for k, v in (("by", event.by), ("raised", event.raised)) if v}
        run.note("budget_extended", said, data=data)


def _on_tool_done(run: Working, event: ToolDone) -> None:
    if event.ran is not None:
        run.ran[event.call] = event.ran
    run.call_stale(event.call)
    track = run.calls.pop(event.call, None)
    output = event.output
    if track is not None and track.args is not None:
        # The model asked for other arguments: it must know what really ran.
        edited = json.dumps(track.args, ensure_ascii=False)
        told = f"(A person edited this call's arguments before approving it; it ran with {edited}.)"
        output = output.model_copy(update={"text": f"{told}\n{output.text}"})
    run.agent.result(event.call, output)


def _on_child_done(run: Working, event: ChildDone) -> None:
    run.calls.pop(event.call, None)
    run.agent.result(event.call, _child_output(event.outcome))


def _on_plan_decision(run: Working, event: PlanDecision) -> None:
    if event.seq == run.seq and isinstance(run.agent.resume(), Plan):
        if event.by:
            run.note("decided", f"plan {'approved' if event.yes else 'declined'} by {event.by}")
        run.agent.approve_plan(event.yes)


def _on_answer(run: Working, event: Answer) -> None:
    if event.seq == run.seq and isinstance(run.agent.resume(), Question):
        if event.by:
            run.note("decided", f"question answered by {event.by}")
        run.agent.answer(event.text)


def _on_cancel(run: Working, event: CancelRun) -> None:
    run.queued = ()  # a stopped run takes no next turn
    _force_stop(run, Stop(event.stop), event.reason or "Cancelled.")


def _on_call_decision(run: Working, event: CallDecision) -> None:
    track = run.calls.get(event.call)
    if track is None or track.status != "approval":
        return
    who = {"by": event.by} if event.by else {}
    edited: dict[str, Any] | None = None
    if event.yes and event.args is not None:
        edited = _edited_args(run, event, track.tool)
        if edited is None:
            return  # refused: declined with the reason
    if event.yes:
        status = "held" if run.paused else "running"  # a paused run sends it when resumed
        changes = {"status": status, "expires_ms": None, "args": edited}
        run.calls[event.call] = track.model_copy(update=changes)
        if not run.paused:
            run.send(Message("run_tool", run.id, call=event.call, tool=track.tool))
        by = f"by {event.by}" if event.by else ""
        run.note("approved", by, call_id=event.call, tool=track.tool, data=who)
        return
    run.calls.pop(event.call)
    run.note("declined", event.reason, call_id=event.call, tool=track.tool, data=who)
    run.agent.result(event.call, ToolOutput.declined(event.reason))


def _edited_args(run: Working, event: CallDecision, tool: str) -> dict[str, Any] | None:
    """The arguments a person edited the call to, checked again here as the model's were
    (the client checked them too; a decision that reaches Redis another way may not have
    been): the trace shows both versions and who edited. None: refused, and the call is
    declined with the reason (the model is told)."""
    assert event.args is not None
    try:
        checked = run.agent.check_args(tool, event.args)
    except (ToolArgsError, UsageError) as error:
        reason = f"the edited arguments were refused: {error}"
        run.calls.pop(event.call)
        run.note("declined", reason, call_id=event.call, tool=tool)
        run.agent.result(event.call, ToolOutput.declined(reason))
        return None
    was = next((c.args for c in _batch(run) if c.id == event.call), None)
    data = {"was": was, "now": checked, **({"by": event.by} if event.by else {})}
    text = f"arguments edited by {event.by}" if event.by else "arguments edited"
    run.note("edited", text, call_id=event.call, tool=tool, data=data)
    return checked


def _batch(run: Working) -> list[ToolCall]:
    """The calls of the run's current batch (none if it is not running one)."""
    step = run.agent.resume()
    return [step.call, *run.agent.queued()] if isinstance(step, Run) else []


_HANDLERS: dict[str, Callable[[Working, Any], None]] = {
    "model_replied": _on_model_replied,
    "model_failed": _on_model_failed,
    "tool_done": _on_tool_done,
    "child_done": _on_child_done,
    "call_decision": _on_call_decision,
    "plan_decision": _on_plan_decision,
    "answer": _on_answer,
    "cancel": _on_cancel,
    "budget_reached": _on_budget_reached,
    "budget_extended": _on_budget_extended,
    "told": steering.on_told,
    "pause": steering.on_pause,
    "resume": steering.on_resume,
    "follow_up": steering.on_follow_up,
}


def _force_stop(run: Working, stop: Stop, reason: str) -> None:
    if isinstance(run.agent.resume(), Done):
        return
    if stop is not Stop.CANCELLED:
        run.forced_stop = stop
    run.agent.cancel(reason)


def _child_output(outcome: Outcome) -> ToolOutput:
    if outcome.stop is Stop.DONE:
        return ToolOutput.ok(outcome.summary)
    return ToolOutput.error(f"the specialist stopped ({outcome.stop.label()}): {outcome.summary}")


# --- deciding what happens next ------------------------------------------------------


def _settle(run: Working) -> None:
    """Act on the step the agent now waits on (a verifier may send a final back first)."""
    while True:
        step = run.agent.resume()
        if isinstance(step, Done) and (
            _verifier_rejects(run, step.outcome) or steering.next_turn(run, step.outcome)
        ):
            continue
        if _unattended(run, step):
            continue
        break
    wanted: list[Pending] = []
    match step:
        case Ask(request=request) | Summarize(request=request):
            wanted = _ask(run, request)
        case Run(call=call):
            wanted = _dispatch(run, [call, *run.agent.queued()])
        case Plan(steps=steps):
            wanted = [_pending(run, "plan", "\n".join(steps))]
            run.set_state("waiting", "plan")
        case Question(text=text):
            wanted = [_pending(run, "question", text)]
            run.set_state("waiting", "question")
        case Done(outcome=outcome):
            finish(run, outcome, run.agent.new_notes())
    sync_pending(run, wanted)


def _unattended(run: Working, step: Step) -> bool:
    """Decide, for nobody, what an unattended run would wait on: its plan (a schedule's
    `approve_plan`), and with `on_wait` "skip" a question, a plan, or the calls that would
    ask (never a MONEY call: that always waits for a person). True if the agent moved on."""
    record = run.record
    by = f"schedule {record.schedule}" if record.schedule else "the start"
    skip = record.on_wait == "skip"
    if isinstance(step, Plan) and (record.approve_plan or skip):
        run.note("decided", f"plan {'approved' if record.approve_plan else 'declined'} by {by}")
        run.agent.approve_plan(record.approve_plan)
        return True
    if isinstance(step, Question) and skip:
        run.note("answered", f"by {by}: {NOBODY_THERE}")
        run.agent.answer(NOBODY_THERE)
        return True
    if not (isinstance(step, Run) and skip):
        return False
    moved = False
    for call in [step.call, *run.agent.queued()]:
        if call.ask and call.risk is not Risk.MONEY and call.id not in run.calls:
            reason = f"nobody is there to approve it: {by} does not wait for a person"
            run.note("declined", reason, call_id=call.id, tool=call.tool)
            run.agent.result(call.id, ToolOutput.declined(reason))
            moved = True
    return moved


def _ask(run: Working, request: ModelRequest) -> list[Pending]:
    """Send the model call for this step (once), unless the run is parked or paused."""
    if run.parked is not None:
        run.set_state("waiting", "budget")
        return [_pending(run, "budget", run.parked)]
    if run.asked != run.seq:
        if run.paused:  # (a call sent before the pause goes on)
            run.set_state("waiting", "pause")
            return []
        run.asked = run.seq
        run.asked_bytes = request_bytes(request)
        run.send(Message("call_model", run.id, seq=run.seq))
    run.set_state("running", "model")
    return []


def _verifier_rejects(run: Working, outcome: Outcome) -> bool:
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
    run.verifier_rejections += 1
    if run.verifier_rejections > MAX_VERIFIER_REJECTIONS:
        summary = f"The final answer was rejected {MAX_VERIFIER_REJECTIONS} times: {problem}"
        run.agent.reject_final(problem)
        _force_stop(run, Stop.FAILED, summary)
    else:
        run.note("rejected", problem)
        run.agent.reject_final(problem)
    run.take_trace()
    return True


def _dispatch(run: Working, batch: list[ToolCall]) -> list[Pending]:
    """Send each call of the batch not yet under way; park the ones that need a yes."""
    now = run.around.now_ms
    for call in batch:
        track = run.calls.get(call.id)
        if track is not None and (track.status != "held" or run.paused):
            continue
        if call.ask and track is None and not _stubbed(run, call):
            ttl = run.around.approval_ttl_ms
            expires = None if ttl is None else now + ttl
            run.calls[call.id] = CallTrack(
                status="approval", tool=call.tool, created_ms=now, expires_ms=expires
            )
            run.note("waiting", call.summary, call_id=call.id, tool=call.tool)
        elif run.paused:
            run.calls[call.id] = CallTrack(status="held", tool=call.tool, created_ms=now)
        elif call.tool == DELEGATE:
            _start_child(run, call)
        else:
            run.calls[call.id] = CallTrack(status="running", tool=call.tool, created_ms=now)
            run.send(Message("run_tool", run.id, call=call.id, tool=call.tool))
    statuses = {t.status for t in run.calls.values()}
    if "running" in statuses:
        run.set_state("running", "tools")
    elif "child" in statuses:
        run.set_state("running", "children")
    else:
        run.set_state("waiting", "pause" if "held" in statuses else "call")
    by_id = {c.id: c for c in batch}
    return [
        _call_pending(run, by_id[call_id], track)
        for call_id, track in run.calls.items()
        if track.status == "approval" and call_id in by_id
    ]


def _stubbed(run: Working, call: ToolCall) -> bool:
    """Whether a fork hands this call the original's recorded outcome (nothing runs, so
    nobody is asked: the outcome stands for the decision the original had)."""
    stubbed = run.record.stubbed
    return bool(stubbed) and call_digest(call.tool, call.args) in stubbed


def _start_child(run: Working, call: ToolCall) -> None:
    now = run.around.now_ms
    new_id = child_id(run.id, call.id)
    child = run.agent.start_child(call)
    parent = run.record
    record = RunRecord(
        id=new_id,
        parent=run.id,
        parent_call=call.id,
        root=parent.root,
        ancestors=(*parent.ancestors, run.id),
        depth=parent.depth + 1,
        task=str(call.args.get("task", ""))[:2_000],
        recipe=parent.recipe,
        schedule=parent.schedule,
        created_ms=now,
        updated_ms=now,
        config=parent.config,
        tools=parent.tools,
        key=parent.key,
        app=parent.app,
        routes=parent.routes,
        stubbed=parent.stubbed,
        recorded=parent.recorded,
    )
    snapshot = child.snapshot()
    start = start_text(record, snapshot, child.offered())
    run.create.append(ChildRun(record, snapshot, run.due(), start))
    run.messages.append(Message("advance", new_id))
    run.calls[call.id] = CallTrack(status="child", tool=DELEGATE, child=new_id, created_ms=now)
    run.children = (*run.children, new_id)
    run.note("child", call.args.get("specialist", ""), call_id=call.id, data={"child": new_id})


def request_bytes(request: ModelRequest) -> int:
    """How big a model request is, in bytes of text: what admission reserves tokens for
    (half of it; an image counts as 2,000 bytes)."""
    size = len(request.system.encode()) + len(request.prompt.encode())
    for attachment in request.attachments:
        image = attachment.mime.lower().startswith("image/")
        size += 2_000 if image else len(attachment.data)
    return size


def _pending(run: Working, kind: Literal["plan", "question", "budget"], summary: str) -> Pending:
    ttl = run.around.approval_ttl_ms
    now = run.around.now_ms
    return Pending(
        kind=kind,
        run_id=run.id,
        root_id=run.record.root,
        summary=summary,
        created_ms=now,
        expires_ms=None if ttl is None else now + ttl,
        seq=run.seq,
    )


def _call_pending(run: Working, call: ToolCall, track: CallTrack) -> Pending:
    return Pending(
        kind="call",
        run_id=run.id,
        root_id=run.record.root,
        call_id=call.id,
        tool=call.tool,
        summary=call.summary,
        args=call.args,
        risk=call.risk,
        created_ms=track.created_ms,
        expires_ms=track.expires_ms,
        seq=run.seq,
    )


def _member(pending: Pending) -> str:
    what = pending.call_id if pending.call_id is not None else str(pending.seq)
    return pending_member(pending.run_id, pending.kind, what)


def sync_pending(run: Working, wanted: list[Pending]) -> None:
    """Make the pending index hold exactly `wanted` for this run."""
    held = set(run.pending)
    members = {_member(p): p for p in wanted}
    run.pending_del.extend(sorted(held - set(members)))
    run.pending_add.extend(p for m, p in members.items() if m not in held)
    run.pending = tuple(members)


def finish(run: Working, outcome: Outcome, notes: list[str]) -> None:
    """End the run: its outcome, its parent told, its children stopped, its notes kept."""
    if run.forced_stop is not None and outcome.stop is Stop.CANCELLED:
        outcome = outcome.model_copy(update={"stop": run.forced_stop})
    run.outcome = outcome
    run.finished_ms = run.around.now_ms
    run.set_state("finished", None)
    steering.stop(run, fence=False)
    record = run.record
    if record.parent and record.parent_call:
        run.deliver(
            record.parent, ChildDone(call=record.parent_call, child=run.id, outcome=outcome)
        )
    if outcome.stop is Stop.BUDGET_EXCEEDED and record.root != run.id:
        spent = CancelRun(reason=outcome.summary, stop="budget_exceeded")
        run.deliver(record.root, spent, cancel_flag=True)
    run.notes = _kept_notes(run, notes)
    run.retention_s = run.around.retention_s
    run.done_summary = outcome.summary[:FINAL_CHARS]
    run.note("finished", outcome.summary, stop=outcome.stop.value)


def _kept_notes(run: Working, notes: list[str]) -> KeptNotes | None:
    """The notes a root run's turn remembered that are not kept yet, to keep under its
    memory (or its schedule's name)."""
    record = run.record
    name = record.memory or record.schedule
    if name is None or record.parent is not None:
        return None
    if run.kept_note in notes:  # an earlier turn kept those up to it
        notes = notes[len(notes) - notes[::-1].index(run.kept_note) :]
    if not notes:
        return None
    run.kept_note = notes[-1]
    return KeptNotes(name, tuple(notes), "memory" if record.memory else "schedule")
