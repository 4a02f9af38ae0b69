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

import base64
import hashlib
import json
import zlib
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    "is_start",
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
    changed. Stored with one-letter keys (`k`, `d`, `y`, `t`): a journal is read rarely,
    and written at every step."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    kind: str = Field(alias="k")
    digest: str = Field(alias="d")
    system: str = Field(default="", alias="y")
    tools: tuple[str, ...] = Field(default=(), alias="t")


class JournalStart(BaseModel):
    model_config = FROZEN
    record: RunRecord
    snapshot: str
    tools: dict[str, str] = {}
    """A digest of each tool the agent was offered (name, description, arguments, risk):
    a replay's divergence says which tool is gone or changed."""
    risks: dict[str, str] | None = None
    """Each offered tool's risk as the run started (`WRITE`): the model is not shown it,
    so a change replays the same steps, yet a call may ask a person or not (None: a run
    from before starts kept them)."""
    idempotent: tuple[str, ...] | None = None
    """The offered tools whose calls may run again (a lost worker's call is retried), as
    the run started (None: not kept, as for a specialist's start, made by the engine)."""


class JournalEntry(BaseModel):
    """One step: the events it applied (`e`), the step the agent then waited on (`s`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
    events: tuple[InboxEvent | None, ...] = Field(alias="e")
    step: StepSeen = Field(alias="s")


def _digest(*parts: str) -> str:
    hashed = hashlib.sha256()
    for part in parts:
        hashed.update(part.encode())
        hashed.update(b"\x00")
    return hashed.hexdigest()[:16]


def _digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def call_digest(tool: str, args: dict[str, Any]) -> str:
    """The whole digest of one tool call (its tool and arguments, keys in any order): a
    fork's stubbed outcome is served only to a call with exactly this digest."""
    return hashlib.sha256(f"{tool}\x00{_canonical(args)}".encode()).hexdigest()


def any_call_digest(tool: str) -> str:
    """The digest a recorded tool's outcome for any arguments is kept under (no call's
    arguments can have it: a call's arguments are an object)."""
    return hashlib.sha256(f"{tool}\x00*".encode()).hexdigest()


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
    """A short digest of each tool as the model is shown it, by name."""
    return {tool.name: _digest(tool.model_dump_json())[:8] for tool in tools}


# --- the start, packed -------------------------------------------------------------------

_PACKED = "z1:"
"""A start packed with `_PRESET` (raw deflate, then base64, so it travels in JSON too)."""
_PRESET = (
    b'{"record":{"id":"","root":"","task":"","created_ms":1,"updated_ms":1,"key":"","app":"",'
    b'"config":{"require_plan":false,"max_batch":4,"policy":{"ask":["money","outside"]}}},'
    b'"snapshot":{"format":"relay.agent","version":3,"state":{"task":"","context":"",'
    b'"attachments":[],"phase":{"kind":"asking"},"planning":false,"plan":[],"history":[],'
    b'"summary":"","request":"","calls_used":0,"calls_before":0,"model_calls":0,'
    b'"loops":{"seen":"","failures":0,"warned":false},"told":[],"partial":"","cuts":0,'
    b'"bad_replies":0,"problem":"","sent_back_early":false,"specialists":[],"skills":[],'
    b'"skills_loaded":[],"skill_reads":0,"remembering":false,"memory":[],"new_notes":[],'
    b'"questions":false,"depth":0,"role":"","guidance":"","allowed_tools":null,'
    b'"trace":[{"seq":1,"kind":"started","text":"","call":null,"output":null,"stop":null}],'
    b'"trace_seq":1}},"tools":{}}'
)
"""What most starts have in common, so a packed start holds little but what is its own.
Never change it: starts packed with it are read with it (a new one is `z2:`)."""


def start_text(
    record: RunRecord,
    snapshot: str,
    tools: Sequence[Tool] = (),
    idempotent: Collection[str] | None = None,
) -> str:
    """Entry 0 of a new run's journal (`tools`: those its agent is offered; `idempotent`:
    the names of those whose calls may run again, if known), packed."""
    digests = json.dumps(tool_digests(tools), separators=(",", ":"))
    record_text = record.model_dump_json(exclude_defaults=True)
    classes: dict[str, Any] = {"risks": {tool.name: tool.risk_class.name for tool in tools}}
    if idempotent is not None:
        classes["idempotent"] = sorted(set(idempotent) & {tool.name for tool in tools})
    kept = json.dumps(classes, separators=(",", ":"))[1:-1]
    raw = f'{{"record":{record_text},"snapshot":{snapshot},"tools":{digests},{kept}}}'.encode()
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _PRESET)
    return _PACKED + base64.b64encode(packer.compress(raw) + packer.flush()).decode()


def read_start(text: str | bytes) -> JournalStart:
    """The start of a journal, as `start_text` wrote it."""
    raw = text.decode(errors="replace") if isinstance(text, bytes) else text
    if not raw.startswith(_PACKED):
        raise JournalError(0, "it is not a journal's start")
    try:
        unpacker = zlib.decompressobj(-15, _PRESET)
        document = json.loads(unpacker.decompress(base64.b64decode(raw[len(_PACKED) :])))
        snapshot = json.dumps(document.pop("snapshot"), separators=(",", ":"), ensure_ascii=False)
        return JournalStart.model_validate({**document, "snapshot": snapshot})
    except (ValueError, TypeError, KeyError, AttributeError, zlib.error) as error:
        raise JournalError(0, f"its journal's start cannot be read: {_said(error)}") from None


def is_start(text: str | bytes) -> bool:
    """Whether `text` is a journal's start (packed), readable or not."""
    prefix = _PACKED.encode() if isinstance(text, bytes) else _PACKED
    return text.startswith(prefix)  # type: ignore[arg-type]


# --- the entries ---------------------------------------------------------------------------

_NOT_THE_CORES = {"ran", "usage", "route"}
"""Who made a call, what it used and which route served it: the trace's and the totals'
business, never the core's, so never in the journal."""


def entry_text(events: Sequence[InboxEvent | None], agent: Agent) -> str:
    """The journal entry of a step that applied `events` and left `agent` as it is:
    each event without what the core never reads, and its fields at their defaults."""
    kept = [None if event is None else _compact(event) for event in events]
    step = seen(agent).model_dump(by_alias=True, exclude_defaults=True)
    return json.dumps({"e": kept, "s": step}, separators=(",", ":"), ensure_ascii=False)


def _compact(event: InboxEvent) -> dict[str, Any]:
    fields = event.model_dump(mode="json", exclude_defaults=True, exclude=_NOT_THE_CORES)
    return {"kind": event.kind, **fields}


def read_entry(index: int, text: str | bytes) -> JournalEntry:
    try:
        return JournalEntry.model_validate_json(text)
    except ValidationError as error:
        raise JournalError(index, f"entry {index} cannot be read: {_first(error)}") from None


def _first(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else str(problem["msg"])


def _said(error: Exception) -> str:
    if isinstance(error, ValidationError):
        return _first(error)
    return f"{type(error).__name__}: {error}"
