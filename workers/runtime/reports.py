"""What each task says it did: one readable line, for Flower, the log and the metrics.

Every Relay task returns a `Report`: a line like

    call-2 read_note ok, 120 chars; run waits for approval of call-3
    model call m4 failed: the server answered 503; run failed (the model could not be reached)

and whether the step failed: it ended its run in failure (a stop in
`FAILED_STOPS`), or the call it made failed (the model could not be reached,
the tool raised, timed out or its outcome is unknown). The Celery task raises
`StepFailed` with the line for a failed step, after everything is saved, so
Flower shows FAILURE with the reason. A run cancelled by a person, or whose
plan a person declined, did not fail. A call's `CallFacts` (what, how long,
tokens) go to the fleet's metrics and to OpenTelemetry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agent_core import Stop
from agent_core.text import cut
from workers.engine.effects import Advanced
from workers.engine.events import BudgetReached, InboxEvent, ModelFailed, ModelReplied, ToolDone
from workers.engine.records import RunRecord, Usage
from workers.store.scripts import Recorded

__all__ = [
    "FAILED_STOPS",
    "RECORDED",
    "CallFacts",
    "Report",
    "after_step",
    "call_facts",
    "did",
    "run_now",
]

FAILED_STOPS = frozenset(Stop) - {Stop.DONE, Stop.CANCELLED, Stop.PLAN_DECLINED}
"""The ends of a run that are failures: all but done, cancelled and a declined plan (a
person's choice), so a stop added to the core later counts as a failure."""

LINE_CHARS = 300


def _short(text: str, limit: int = LINE_CHARS) -> str:
    """`text` on one line (its whitespace runs made one space), cut to about `limit`."""
    return cut(" ".join(text.split()), limit)


@dataclass(frozen=True)
class CallFacts:
    """One model or tool call as it happened: for metrics and traces."""

    kind: str
    """`model` or `tool`."""
    run_id: str
    root_id: str
    call_id: str
    """`m<seq>` for a model call, the call id for a tool call."""
    name: str
    """The model's name, or the tool's."""
    key: str
    """The run's key (fairness and limits), '' where runs have none."""
    started_ns: int
    ended_ns: int
    ok: bool
    error: str = ""
    usage: Usage | None = None
    attempt: int = 1
    route: str = ""
    """The model route that served the call ("" for a tool, or the app's own model)."""

    @property
    def seconds(self) -> float:
        return max(0, self.ended_ns - self.started_ns) / 1e9


@dataclass(frozen=True)
class Report:
    """What one task did, in one line; `failed`: Flower should show it as FAILURE."""

    line: str
    failed: bool = False
    call: CallFacts | None = None
    idle: bool = False
    """The message did nothing: its call is under way elsewhere, or was made and applied
    (a second delivery), or it was never due (refused)."""
    waited: bool = False
    """The call waits for a model route's capacity (rate limits): it is sent again later."""
    carried: bool = False
    """The task claimed its call and handed it to the process's event loop
    (`workers.runtime.on_loop`): it is counted when the call ends. A task whose steps
    include such a call reports it too (`continued`): it ends in Flower when the call
    does (`workers.celery_app.flower`)."""

    def then(self, after: Report) -> Report:
        """This report followed by what came after it (the run's state once saved)."""
        return Report(f"{self.line}; {after.line}", self.failed or after.failed, self.call)

    def continued(self, step: str, after: Report) -> Report:
        """This report followed by the step `step`, which the same task ran next in place of
        publishing it (`workers.runtime.continuation`); failed if either failed."""
        line = f"{self.line} | continued {step}: {after.line}"
        return Report(
            line, self.failed or after.failed, self.call, carried=self.carried or after.carried
        )


def run_now(record: RunRecord) -> str:
    """Where the run is now: what it waits for, or how it ended."""
    outcome = record.outcome
    if record.state == "finished" and outcome is not None:
        verb = "failed" if outcome.stop in FAILED_STOPS else "finished"
        return f"run {verb} ({outcome.stop.label()}): {_short(outcome.summary, 160)}"
    waiting = record.waiting_for
    calls = record.calls
    if waiting == "call":
        asked = [c for c, t in calls.items() if t.status == "approval"]
        return f"run waits for approval of {', '.join(asked) or 'a call'}"
    if waiting == "tools":
        running = [c for c, t in calls.items() if t.status == "running"]
        return f"run waits for {', '.join(running) or 'its tools'}"
    if waiting == "children":
        children = [t.child or c for c, t in calls.items() if t.status == "child"]
        return f"run waits for specialists {', '.join(children)}"
    phrases = {
        "model": f"run waits for the model (step {record.seq})",
        "plan": "run waits for approval of its plan",
        "question": "run waits for an answer",
        "budget": "run waits for its budget to be extended",
        "pause": "run is paused until a person resumes it",
    }
    if waiting is None:
        return f"run is {record.state}"
    return phrases.get(waiting, f"run waits for {waiting}")


def after_step(before: RunRecord | None, advanced: Advanced) -> Report:
    """The report of a saved step: where the run is now; failed if it ended in failure now."""
    record = advanced.record
    if before is not None and before.state == "finished" and not advanced.effects.reopened:
        dropped = len(advanced.effects.applied)
        return Report(f"the run had finished already; {dropped} late event(s) dropped")
    ended = record.outcome is not None and record.state == "finished"
    failed = ended and record.outcome is not None and record.outcome.stop in FAILED_STOPS
    applied = len(advanced.effects.applied)
    line = run_now(record)
    return Report(f"applied {applied} event(s); {line}" if applied else line, failed)


def did(what: str, tool: str | None, event: InboxEvent) -> Report:
    """What a call did (`what` is `m<seq>` or the call id); failed if the call failed."""
    if isinstance(event, ModelReplied):
        return Report(f"model call {what} replied, {event.usage.total_tokens} tokens")
    if isinstance(event, BudgetReached):  # not a failure: the run parks until extended
        return Report(f"model call {what} not made: {_short(event.detail)}")
    if isinstance(event, ModelFailed):
        return Report(f"model call {what} failed: {_short(event.error)}", failed=True)
    if isinstance(event, ToolDone):
        output = event.output
        name = f"{what} {tool}" if tool else what
        if output.status == "ok":
            return Report(f"{name} ok, {len(output.text)} chars")
        return Report(f"{name} {output.status}: {_short(output.text)}", failed=True)
    return Report(f"{what}: {event.kind}")


def call_facts(
    record: RunRecord, what: str, event: InboxEvent, *, started_ns: int, attempt: int
) -> CallFacts:
    """The facts of call `what` of the run `record` (as claimed), which ended with `event`.

    A model call's `name` is left '' here: the runtime knows which model a route is."""
    done = did(what, None, event)
    track = record.calls.get(what)
    tool = isinstance(event, ToolDone)
    return CallFacts(
        kind="tool" if tool else "model",
        run_id=record.id,
        root_id=record.root,
        call_id=what,
        name=(track.tool if track else "?") if tool else "",
        key=str(getattr(record, "key", None) or ""),
        started_ns=started_ns,
        ended_ns=time.time_ns(),
        ok=not done.failed,
        error=done.line if done.failed else "",
        usage=event.usage if isinstance(event, ModelReplied) else None,
        attempt=attempt,
        route=event.route if isinstance(event, ModelReplied | ModelFailed) else "",
    )


RECORDED = {
    Recorded.WAITING: "recorded; the run waits for the rest of its batch",
    Recorded.DUPLICATE: "its outcome was recorded already",
    Recorded.FENCED: "another attempt took the call over; this outcome was discarded",
    Recorded.GONE: "the run is gone",
    Recorded.ADVANCE: "recorded",
}
"""What recording a call's outcome in the inbox did, in words."""
