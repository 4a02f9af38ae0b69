"""A run's journal: where it started, and every event its steps consumed, in order.

The agent core is deterministic: the same starting snapshot fed the same events
takes the same steps. So a run is fully described by its journal, a list in
Redis beside the run (`workers.store.layout`, `jr:<id>`):

    entry 0       `JournalStart`: the run's record and its agent's snapshot as
                  CREATE wrote them (later saves replace the head; this stays)
    entry 1..n    `JournalEntry`: for each step a save made, the inbox events it
                  applied (the calling task's own outcome last), and the step the
                  agent then waited on (`StepSeen`: its kind, digests of its request
                  or calls)

Replay (`workers.engine.replay`) feeds the entries again and compares the steps.
Not in it: who made a call (`Ran`: the trace's business, not the core's), and the
history the core keeps (its bounded window of cut outputs): the journal holds
each reply and outcome whole, once. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from agent_core import Agent, Ask, Done, Plan, Question, Run, Summarize, Tool
from agent_core.steps import FROZEN
from workers.engine.events import InboxEvent
from workers.engine.records import RunRecord

__all__ = [
    "JOURNAL_MAX",
    "JournalEntry",
    "JournalError",
    "JournalStart",
    "StepSeen",
    "call_digest",
    "entry_text",
    "read_entry",
    "read_start",
    "seen",
    "start_text",
    "tool_digests",
]

JOURNAL_MAX = 20_000
"""Entries a journal keeps; a run that takes more steps loses its oldest (and its start:
it can no longer be replayed, and says so)."""


class JournalError(Exception):
    """A journal entry cannot be read (`index`: which; 0 is the start)."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(problem)
        self.index = index


class StepSeen(BaseModel):
    """The step an agent waited on after a save, as the journal compares it.

    `digest` covers the whole step (the request's text and files, the batch's calls
    with their arguments, the plan, the question, the outcome); `system` the request's
    system text alone and `tools` the batch's tool names, so a divergence can say what
    changed."""

    model_config = FROZEN
    kind: str
    digest: str
    system: str = ""
    tools: tuple[str, ...] = ()


class JournalStart(BaseModel):
    model_config = FROZEN
    record: RunRecord
    snapshot: str
    tools: dict[str, str] = {}
    """A digest of each tool the agent was offered (name, description, arguments, risk):
    a replay's divergence says which tool is gone or changed."""


class JournalEntry(BaseModel):
    model_config = FROZEN
    events: tuple[InboxEvent | None, ...]
    step: StepSeen


def _digest(*parts: str) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(part.encode())
        hashed.update(b"\x00")
    return hashed.hexdigest()[:24]


def _digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def call_digest(tool: str, args: dict[str, Any]) -> str:
    """The whole digest of one tool call (its tool and arguments, keys in any order): a
    fork's stubbed outcome is served only to a call with exactly this digest."""
    return hashlib.sha256(f"{tool}\x00{_canonical(args)}".encode()).hexdigest()


def seen(agent: Agent) -> StepSeen:
    """The step `agent` waits on, as the journal keeps it."""
    step = agent.resume()
    match step:
        case Ask(request=request) | Summarize(request=request):
            files = [f"{a.name}:{a.mime}:{_digest_bytes(a.data)}" for a in request.attachments]
            digest = _digest(request.system, request.prompt, *files)
            return StepSeen(kind=step.kind, digest=digest, system=_digest(request.system))
        case Run(call=call):
            batch = [call, *agent.queued()]
            parts = [f"{c.id}:{call_digest(c.tool, c.args)}" for c in batch]
            return StepSeen(kind="run", digest=_digest(*parts), tools=tuple(c.tool for c in batch))
        case Plan(steps=steps):
            return StepSeen(kind="plan", digest=_digest(*steps))
        case Question(text=text):
            return StepSeen(kind="question", digest=_digest(text))
        case Done(outcome=outcome):
            return StepSeen(kind="done", digest=_digest(outcome.stop.value, outcome.summary))
    raise AssertionError(f"unknown step {step!r}")  # pragma: no cover


def tool_digests(tools: Sequence[Tool]) -> dict[str, str]:
    """A digest of each tool as the model is shown it, by name."""
    return {tool.name: _digest(tool.model_dump_json()) for tool in tools}


def start_text(record: RunRecord, snapshot: str, tools: Sequence[Tool] = ()) -> str:
    """Entry 0 of a new run's journal (`tools`: those its agent is offered)."""
    start = JournalStart(record=record, snapshot=snapshot, tools=tool_digests(tools))
    return start.model_dump_json()


def entry_text(events: Sequence[InboxEvent | None], agent: Agent) -> str:
    """The journal entry of a step that applied `events` and left `agent` as it is."""
    kept = tuple(_without_ran(event) for event in events)
    return JournalEntry(events=kept, step=seen(agent)).model_dump_json(exclude_none=True)


def _without_ran(event: InboxEvent | None) -> InboxEvent | None:
    if event is None or getattr(event, "ran", None) is None:
        return event
    return event.model_copy(update={"ran": None})


def read_start(text: str | bytes) -> JournalStart:
    try:
        return JournalStart.model_validate_json(text)
    except ValidationError as error:
        raise JournalError(0, f"it is not a journal's start: {_first(error)}") from None


def read_entry(index: int, text: str | bytes) -> JournalEntry:
    try:
        return JournalEntry.model_validate_json(text)
    except ValidationError as error:
        raise JournalError(index, f"entry {index} cannot be read: {_first(error)}") from None


def _first(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else str(problem["msg"])
