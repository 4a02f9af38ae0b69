"""The agent's whole state: one frozen pydantic value, saved and loaded as JSON.

Everything the agent knows lives here: the task, what it waits for (`phase`),
the plan, the history the model sees, counters, what the `with_*` calls set up,
and trace events not yet handed to the host. `Snapshot` wraps it with a format
tag and version; `dump` and `load` are the only way in or out.

Versions: 1 had one turn and no loop counters, messages or continuations;
2 added them (`request`, `calls_before`, `model_calls`, `loops`, `told`,
`partial`, `cuts`, three history entries and four trace kinds); 3 writes the
loop counters' seen calls as one text (`Loops`); 4 writes each seen call's digest
in 8 characters of base64url instead of 16 of hex, and leaves out a count of 1.
Older snapshots still load (`_UPGRADES`); new ones are written as version 4.
"""

from __future__ import annotations

import base64
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from agent_core.errors import SnapshotError
from agent_core.skills import Skill
from agent_core.specialists import Specialist
from agent_core.steps import FROZEN, Attachment, Outcome, Stop
from agent_core.tools import ToolCall, ToolOutput

__all__ = [
    "START_FIELDS",
    "AgentState",
    "AnswerEntry",
    "Asking",
    "CallsEntry",
    "Entry",
    "Finished",
    "FollowUpEntry",
    "Idle",
    "Loops",
    "MessageEntry",
    "NoteEntry",
    "NoticeEntry",
    "Phase",
    "Questioning",
    "Reviewing",
    "Running",
    "Seen",
    "SentBackEntry",
    "SkillEntry",
    "Summarizing",
    "TraceEvent",
    "dump",
    "dump_head",
    "dump_loops",
    "dump_start",
    "load",
    "seen_digest",
]

FORMAT = "relay.agent"
VERSION = 4


# --- history: what the model is shown, one entry per turn -------------------------


class CallResult(BaseModel):
    model_config = FROZEN
    call: ToolCall
    output: ToolOutput


class CallsEntry(BaseModel):
    """A batch of calls and all their results: never separated."""

    model_config = FROZEN
    kind: Literal["calls"] = "calls"
    results: tuple[CallResult, ...]
    note: str = ""


class SentBackEntry(BaseModel):
    """A final answer that was sent back, and why."""

    model_config = FROZEN
    kind: Literal["sent_back"] = "sent_back"
    final: str
    problem: str


class NoteEntry(BaseModel):
    model_config = FROZEN
    kind: Literal["note"] = "note"
    text: str


class SkillEntry(BaseModel):
    """A skill loaded with `use_skill`: its body (the first part, when long) and a note
    listing its files and how to read the rest."""

    model_config = FROZEN
    kind: Literal["skill"] = "skill"
    name: str
    body: str
    note: str = ""


class AnswerEntry(BaseModel):
    model_config = FROZEN
    kind: Literal["answer"] = "answer"
    question: str
    answer: str


class MessageEntry(BaseModel):
    """A message a person sent while the agent worked (`Agent.tell`), once the model saw it."""

    model_config = FROZEN
    kind: Literal["message"] = "message"
    text: str


class NoticeEntry(BaseModel):
    """Something the agent told the model about its own progress (a loop warning)."""

    model_config = FROZEN
    kind: Literal["notice"] = "notice"
    text: str


class FollowUpEntry(BaseModel):
    """How one turn ended, and the person's next request (`Agent.follow_up`)."""

    model_config = FROZEN
    kind: Literal["follow_up"] = "follow_up"
    stop: Stop
    answer: str
    request: str


Entry = Annotated[
    CallsEntry
    | SentBackEntry
    | NoteEntry
    | SkillEntry
    | AnswerEntry
    | MessageEntry
    | NoticeEntry
    | FollowUpEntry,
    Field(discriminator="kind"),
]


# --- phase: what the agent waits for ---------------------------------------------


class Idle(BaseModel):
    """Not started yet."""

    model_config = FROZEN
    kind: Literal["idle"] = "idle"


class Asking(BaseModel):
    """Waiting for the model's reply (a plan first while `AgentState.planning`)."""

    model_config = FROZEN
    kind: Literal["asking"] = "asking"


class Summarizing(BaseModel):
    """Waiting for the model to summarise the oldest `fold` history entries."""

    model_config = FROZEN
    kind: Literal["summarizing"] = "summarizing"
    fold: int = Field(ge=1)


class Reviewing(BaseModel):
    """Waiting for a person to approve `AgentState.plan`."""

    model_config = FROZEN
    kind: Literal["reviewing"] = "reviewing"


class Running(BaseModel):
    """Waiting for the results of a batch of calls, in any order."""

    model_config = FROZEN
    kind: Literal["running"] = "running"
    batch: tuple[ToolCall, ...] = Field(min_length=1)
    results: dict[str, ToolOutput] = Field(default_factory=dict)
    note: str = ""

    @model_validator(mode="after")
    def _results_belong_to_batch(self) -> Running:
        ids = [call.id for call in self.batch]
        if len(set(ids)) != len(ids) or not set(self.results) < set(ids):
            raise ValueError("results must name calls of the batch, and one must still be due")
        return self


class Questioning(BaseModel):
    """Waiting for a person's answer to `question`."""

    model_config = FROZEN
    kind: Literal["questioning"] = "questioning"
    question: str


class Finished(BaseModel):
    model_config = FROZEN
    kind: Literal["finished"] = "finished"
    outcome: Outcome


Phase = Annotated[
    Idle | Asking | Summarizing | Reviewing | Running | Questioning | Finished,
    Field(discriminator="kind"),
]


# --- trace: what happened, for the host to show or keep ---------------------------

TraceKind = Literal[
    "started",
    "plan",
    "plan_approved",
    "plan_declined",
    "call",
    "result",
    "retry",
    "model_failed",
    "sent_back",
    "note",
    "skill",
    "question",
    "answer",
    "summary",
    "stop",
    "message",
    "warning",
    "follow_up",
    "continued",
]


class TraceEvent(BaseModel):
    """One thing that happened. `seq` counts from 1 over the agent's whole life."""

    model_config = FROZEN
    seq: int
    kind: TraceKind
    text: str = ""
    call: ToolCall | None = None
    output: ToolOutput | None = None
    stop: Stop | None = None


# --- loops: what shows a run is going nowhere (see agent_core.loops) ----------------


class Seen(BaseModel):
    """How often one call (tool, arguments and result, as a digest) happened this turn."""

    model_config = FROZEN
    key: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    """A digest in base64url (so the text form of `Loops.seen` reads back the same;
    version 3 wrote hex, which `_from_v3` turns into this form)."""
    count: PositiveInt


class Loops(BaseModel):
    """No-progress counters of the current turn."""

    model_config = FROZEN
    seen: tuple[Seen, ...] = ()
    """The most recently seen calls, newest last, a bounded number."""

    @field_serializer("seen")
    def _seen_as_text(self, seen: tuple[Seen, ...]) -> str:
        # A host saves the state every step and a long turn keeps 64 of these:
        # "key key:count" is a sixth of their JSON objects (most counts are 1).
        return " ".join(s.key if s.count == 1 else f"{s.key}:{s.count}" for s in seen)

    @field_validator("seen", mode="before")
    @classmethod
    def _seen_from_text(cls, value: object) -> object:
        """Read the text form; a list of objects (version 2) is validated as it is."""
        if not isinstance(value, str):
            return value
        seen = []
        for item in value.split():
            key, sep, count = item.rpartition(":")
            if not sep:  # (a count of 1 is left out)
                key, count = item, "1"
            if not key or not count.isdigit() or len(count) > 9:
                raise ValueError(f"not a seen call: {item[:40]!r}")
            seen.append({"key": key, "count": int(count)})
        return seen

    failures: NonNegativeInt = 0
    """Calls that failed in a row."""
    warned: bool = False
    """The model was told it is going nowhere (once a turn)."""


# --- the state ---------------------------------------------------------------------


class AgentState(BaseModel):
    model_config = FROZEN

    task: str = ""
    context: str = ""
    attachments: tuple[Attachment, ...] = ()
    phase: Phase = Idle()

    planning: bool = False
    """A plan is still to be asked for and approved."""
    plan: tuple[str, ...] = ()
    history: tuple[Entry, ...] = ()
    summary: str = ""
    request: str = ""
    """The person's current request after a follow-up (empty in the first turn)."""
    calls_used: NonNegativeInt = 0
    """Tool calls made this turn."""
    calls_before: NonNegativeInt = 0
    """Tool calls made in earlier turns (call ids count on from them)."""
    model_calls: NonNegativeInt = 0
    """Model calls answered this turn (replies and failures)."""
    loops: Loops = Loops()
    told: tuple[str, ...] = ()
    """Messages from a person the model has not seen yet, oldest first."""
    partial: str = ""
    """A reply cut by the length limit, waiting for the rest."""
    cuts: NonNegativeInt = 0
    """How often the reply being continued was cut."""
    bad_replies: NonNegativeInt = 0
    """Unusable replies or failed model calls in a row."""
    problem: str = ""
    """Why the last reply could not be used, shown to the model; empty after a usable one."""
    sent_back_early: bool = False

    # set up by the with_* calls (and by start_child for a child)
    specialists: tuple[Specialist, ...] = ()
    skills: tuple[Skill, ...] = ()
    skills_loaded: tuple[str, ...] = ()
    skill_reads: NonNegativeInt = 0
    """`read_skill_file` calls made this task (not counted against `max_calls`)."""
    remembering: bool = False
    memory: tuple[str, ...] = ()
    new_notes: tuple[str, ...] = ()
    questions: bool = False
    depth: NonNegativeInt = 0
    role: str = ""
    """The specialist this agent is (empty for a root agent)."""
    guidance: str = ""
    allowed_tools: tuple[str, ...] | None = None
    """The host tools this agent may use; None means all it was given."""

    trace: tuple[TraceEvent, ...] = ()
    trace_seq: NonNegativeInt = 0

    @model_validator(mode="after")
    def _fold_within_history(self) -> AgentState:
        if isinstance(self.phase, Summarizing) and self.phase.fold >= len(self.history):
            raise ValueError("a summary must fold fewer entries than the history holds")
        return self


class Snapshot(BaseModel):
    model_config = FROZEN
    format: Literal["relay.agent"]
    version: Literal[1, 2, 3, 4]
    state: AgentState


def _from_v1(state: AgentState) -> AgentState:
    """Return a version 1 state as version 2 means it.

    Every field version 2 added starts empty, which is what version 1 meant: one
    turn (no request, no earlier calls), no loop counters, no waiting messages,
    no cut reply. `model_calls` starts at 0, so a run saved mid-way gets the
    whole model-call allowance for the rest of its turn.
    """
    return state


def _from_v2(state: AgentState) -> AgentState:
    """Return a version 2 state as version 3 means it: the same state (3 only writes
    the loop counters' seen calls as text, and reads either form)."""
    return state


def _from_v3(state: AgentState) -> AgentState:
    """Return a version 3 state as version 4 means it: each seen call's hex digest as the
    base64url of its first 48 bits, the form `loops` now makes, so a call seen before the
    upgrade still counts as the same call after it."""
    seen = tuple(Seen(key=_digest_from_hex(s.key), count=s.count) for s in state.loops.seen)
    return state.model_copy(update={"loops": state.loops.model_copy(update={"seen": seen})})


def _digest_from_hex(key: str) -> str:
    if len(key) < DIGEST_BYTES * 2 or _HEX.fullmatch(key) is None:
        return key  # (not one `loops` wrote: it matches no new digest, as before)
    return seen_digest(bytes.fromhex(key[: DIGEST_BYTES * 2]))


_HEX = re.compile(r"[0-9a-f]+")
DIGEST_BYTES = 6
"""48 bits of a seen call's digest: among the `SEEN_KEPT` calls kept, a new call matches
another by chance once in 2**48 / 64 (about 4 * 10**12) calls."""


def seen_digest(digest: bytes) -> str:
    """A seen call's key: the first `DIGEST_BYTES` of its digest in base64url (8 characters)."""
    return base64.urlsafe_b64encode(digest[:DIGEST_BYTES]).decode("ascii")


_UPGRADES = {1: _from_v1, 2: _from_v2, 3: _from_v3}
"""From each old version to the next; `load` applies them in turn."""


_FIELDS = tuple(AgentState.model_fields)
_BEFORE_HISTORY = set(_FIELDS[: _FIELDS.index("history")])
_AFTER_HISTORY = set(_FIELDS[_FIELDS.index("history") + 1 :])
_DUMPED: dict[int, tuple[Entry, str]] = {}
_DUMPED_MAX = 4_096


def dump(state: AgentState) -> str:
    """Return the snapshot text for `state` (always the current version).

    The same text as dumping the `Snapshot` whole, but each history entry's JSON is
    memoised by identity (entries are immutable and a host saves every step, so the
    history would otherwise be serialised again each time).
    """
    before = state.model_dump_json(include=_BEFORE_HISTORY)
    after = state.model_dump_json(include=_AFTER_HISTORY)
    history = ",".join(_entry_json(entry) for entry in state.history)
    start = f'{{"format":"{FORMAT}","version":{VERSION},"state":'
    return f'{start}{before[:-1]},"history":[{history}],{after[1:]}}}'


def _entry_json(entry: Entry) -> str:
    """One history entry's JSON, memoised as `history.render_entry` memoises its text."""
    hit = _DUMPED.get(id(entry))
    if hit is not None and hit[0] is entry:
        return hit[1]
    text = entry.model_dump_json()
    if len(_DUMPED) >= _DUMPED_MAX:
        _DUMPED.clear()
    _DUMPED[id(entry)] = (entry, text)
    return text


START_FIELDS = ("task", "context", "attachments")
"""The state's fields the start sets and nothing changes after (a second start changes
nothing; a follow-up keeps the task): a host may store them once (`dump_start`)."""


def dump_head(
    state: AgentState, *, without_start: bool = False, without_loops: bool = False
) -> str:
    """Return the snapshot text for `state` without its history, for a host that stores
    the entries apart; `load` reads it (with or without the history put back).

    It is written every step, so the state's fields that hold their default are left
    out too (`load` gives them back). Only whole fields of the state: a nested value
    is written in full, so every entry and phase keeps its `kind`. With
    `without_start`, the `START_FIELDS` are left out as well (see `dump_start`); with
    `without_loops`, the loop counters (see `dump_loops`).
    """
    fields = AgentState.model_fields
    left_out = {n for n, f in fields.items() if n == "history" or getattr(state, n) == f.default}
    if without_start:
        left_out.update(START_FIELDS)
    if without_loops:
        left_out.add("loops")
    snapshot = Snapshot(format=FORMAT, version=VERSION, state=state)
    return snapshot.model_dump_json(exclude={"state": left_out})


def dump_loops(state: AgentState) -> str:
    """Return the state's loop counters as a JSON object of that one field (`{}` at its
    default): what `dump_head(without_loops=True)` leaves out. They are up to SEEN_KEPT
    digests, most of a long turn's head, and change only when a call's outcome (or an
    answer of the agent's own) is counted: a host may write them only then."""
    return state.model_dump_json(include={"loops"}, exclude_defaults=True)


def dump_start(state: AgentState) -> str:
    """Return the `START_FIELDS` of `state` as a JSON object (those at their default
    left out): what `dump_head(without_start=True)` leaves out."""
    return state.model_dump_json(include=set(START_FIELDS), exclude_defaults=True)


def load(saved: object) -> AgentState:
    """Return the state saved in `saved`, upgraded from an older version if need be.

    Raises:
        SnapshotError: `saved` is not text, is empty, is not JSON, lacks the
            format tag or a known version, or does not hold a valid state.
    """
    if not isinstance(saved, str | bytes):
        raise SnapshotError(f"a snapshot is JSON text, got {type(saved).__name__}")
    if not saved.strip():
        raise SnapshotError("the snapshot is empty")
    try:
        snapshot = Snapshot.model_validate_json(saved)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "snapshot"
        message = first["msg"]
        raise SnapshotError(
            f"not a Relay agent snapshot of version 1 to {VERSION}: {where}: {message}"
        ) from None
    except (ValueError, TypeError, RecursionError) as error:
        # TypeError: models with a positional __init__ (Attachment, Specialist)
        # are called with the saved fields, which may be missing or extra.
        raise SnapshotError(f"the snapshot cannot be read: {type(error).__name__}") from None
    state, version = snapshot.state, int(snapshot.version)
    while version < VERSION:
        state, version = _UPGRADES[version](state), version + 1
    return state
