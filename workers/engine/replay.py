"""Playing a run's journal back: the same start and events, through today's code.

`replay` restores the journal's start with the tools and code at hand, applies
each entry's events through the engine (`workers.engine.decide`, exactly as the
save that wrote the entry did), and compares the step the agent then waits on
with the one recorded. It stops at the first divergence and says why, as far as
it can tell (a tool gone, a call whose arguments no longer check, a changed
prompt, or the core deciding otherwise). It does no I/O: what it returns
(`Replayed`) is the run's record and agent where it stopped, for a report or a
fork (`workers.client.replays`), and the outcome each tool call had, for a
fork's stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_core import Agent, AgentError, Done, Outcome, Run, ToolOutput
from workers.engine.decide import decide
from workers.engine.events import CallDecision, ToolDone
from workers.engine.journal import JournalEntry, JournalStart, StepSeen, seen, tool_digests
from workers.engine.records import RunRecord, TraceEntry
from workers.engine.working import Surroundings

__all__ = ["Divergence", "Replayed", "Taken", "replay"]

Restore = Callable[[RunRecord, str], Agent]


@dataclass(frozen=True)
class Divergence:
    """Where a replay first took another step than the run did (`step`: the journal
    entry, from 1; 0: the start itself could not be restored)."""

    step: int
    recorded: StepSeen | None
    now: StepSeen | None
    why: str


@dataclass(frozen=True)
class Taken:
    """What one replayed step waits on, beyond its journal digest: the batch's calls with
    the arguments they run with, or the outcome it ended with (a diff says what differs)."""

    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    ending: Outcome | None = None


@dataclass
class Replayed:
    """A replay's end: the run's record and agent after `steps` entries, and the first
    divergence (None: every step matched)."""

    record: RunRecord
    agent: Agent | None
    steps: int
    divergence: Divergence | None = None
    ran: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Each tool call the run made: its id -> (tool, the arguments it ran with)."""
    outcomes: dict[str, ToolOutput] = field(default_factory=dict)
    """Each tool call's recorded outcome, by call id (a call a person denied: declined)."""
    taken: list[Taken] = field(default_factory=list)
    """What each step that replayed the same waits on, in journal order."""


def replay(
    start: JournalStart,
    entries: Sequence[JournalEntry],
    restore: Restore,
    around: Surroundings,
) -> Replayed:
    """Feed `entries` to the run restored from `start`; stop at the first divergence."""
    record = start.record
    try:
        agent = restore(record, start.snapshot)
    except AgentError as error:
        why = f"its start cannot be restored with this code: {error}"
        return Replayed(record, None, 0, Divergence(0, None, None, why))
    played = Replayed(record, agent, 0)
    tools = _ToolChanges(start.tools, tool_digests(agent.offered()))
    _note_calls(played)
    for number, entry in enumerate(entries, start=1):
        inbox = [(str(i), event) for i, event in enumerate(entry.events)]
        try:
            advanced = decide(played.record, agent, inbox, around, whole=False)
        except Exception as error:  # noqa: BLE001 - a host's code raising is a divergence
            why = f"advancing it raised {type(error).__name__}: {error}"
            played.divergence = Divergence(number, entry.step, None, why)
            return played
        played.record, played.steps = advanced.record, number
        for event in entry.events:
            if isinstance(event, ToolDone):
                played.outcomes[event.call] = event.output
            elif isinstance(event, CallDecision) and not event.yes:
                played.outcomes[event.call] = ToolOutput.declined(event.reason)
        now = seen(agent)
        if now != entry.step:
            why = _why(entry.step, now, tools, advanced.effects.trace)
            played.divergence = Divergence(number, entry.step, now, why)
            return played
        played.taken.append(_note_calls(played))
    return played


def _note_calls(played: Replayed) -> Taken:
    """Remember the calls of the batch the agent waits on, with the arguments they run
    with (a person's edit included); return what the step waits on."""
    assert played.agent is not None
    step = played.agent.resume()
    if isinstance(step, Done):
        return Taken(ending=step.outcome)
    if not isinstance(step, Run):
        return Taken()
    batch = []
    for call in [step.call, *played.agent.queued()]:
        track = played.record.calls.get(call.id)
        edited = track.args if track is not None else None
        played.ran[call.id] = (call.tool, edited if edited is not None else call.args)
        batch.append(played.ran[call.id])
    return Taken(calls=tuple(batch))


@dataclass(frozen=True)
class _ToolChanges:
    """The tools the run was offered (digests, from its journal's start) and those this
    code offers: what changed explains most divergences."""

    then: dict[str, str]
    now: dict[str, str]

    def said(self, among: Sequence[str] = ()) -> str | None:
        """The change to name first (among `among`'s tools, if given), or None."""
        names = list(among) or sorted(set(self.then) | set(self.now))
        for name in names:
            if name in self.then and name not in self.now:
                return f"the tool {name} is gone"
        for name in names:
            if name in self.then and self.now.get(name) != self.then[name]:
                return f"the tool {name} changed (its arguments, description or risk)"
        added = [name for name in names if name in self.now and name not in self.then]
        return f"a tool was added: {added[0]}" if added and not among else None


def _why(
    recorded: StepSeen, now: StepSeen, tools: _ToolChanges, trace: Sequence[TraceEntry]
) -> str:
    """What most likely made the step differ, in words."""
    said = _core_said(trace)
    if recorded.kind == "run":
        return _why_calls(recorded, now, tools, said)
    if recorded.kind == now.kind and recorded.kind in ("ask", "summarize"):
        if recorded.system != now.system:
            changed = tools.said() if tools.then else None
            if changed is not None:
                return f"{changed}, so the system prompt changed"
            return "the system prompt changed (its template or the instructions)"
        return "the prompt changed (the task or history as the core writes it now)"
    return f"the core decides differently: {recorded.kind} then, {now.kind} now{said}"


def _why_calls(recorded: StepSeen, now: StepSeen, tools: _ToolChanges, said: str) -> str:
    """Why a batch of calls the run made is not made again."""
    changed = tools.said(recorded.tools)
    if changed is not None:
        return f"{changed} (the run called it here){said}"
    if now.kind != "run":
        return (
            f"the model's call of {', '.join(recorded.tools)} no longer checks against"
            f" the tool's arguments{said}"
        )
    if now.tools != recorded.tools:
        return f"the calls differ: {', '.join(recorded.tools)} then, {', '.join(now.tools)} now"
    return f"a call's arguments differ (as the tool reads them now){said}"


def _core_said(trace: Sequence[TraceEntry]) -> str:
    """The core's own words on the step (a refused reply says why), if it said any."""
    for line in reversed(trace):
        if line.text and line.kind not in ("usage", "reply"):
            return f" ({line.kind}: {line.text[:300]})"
    return ""
