"""The events that move a run: everything that happens to it, in its inbox.

A model's reply or failure, a tool's result, a specialist's outcome, a person's
decision, answer, message, pause or follow-up, a cancel: each is appended to
the run's inbox (a Redis stream) as one of these, with a `kind` tag, and
applied exactly once by the step that saves it (`workers.engine.decide`). What
cannot be read back is skipped with a trace line, never applied.

A decision that comes too late becomes `expiry_event`'s: a no, or no answer.
The tick decides for people whose entry expired; DECIDE applies it in place of
a decision that came after the expiry.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, TypeAdapter, model_serializer

from agent_core import Outcome, ToolOutput
from agent_core.steps import FROZEN
from agent_core.text import counted
from workers.engine.budget import Over
from workers.engine.ids import PendingKind
from workers.engine.records import ReplyStrategy, Usage

__all__ = [
    "NO_ANSWER",
    "NO_DECISION",
    "NO_EXTENSION",
    "Answer",
    "BudgetExtended",
    "BudgetReached",
    "CallDecision",
    "CancelRun",
    "ChildDone",
    "FollowUp",
    "InboxEvent",
    "ModelFailed",
    "ModelReplied",
    "PauseRun",
    "PlanDecision",
    "Ran",
    "ResumeRun",
    "Told",
    "ToolDone",
    "expiry_event",
    "inbox_event",
    "not_admitted",
]


class Ran(BaseModel):
    """Who made a call: which attempt, on which worker (its Celery hostname), carried by
    which Celery task (the call's own, or the step task it was continued in)."""

    model_config = FROZEN
    attempt: int
    worker: str = ""
    task: str = ""
    ms: int | None = None
    """How long the call took, from its claim to its outcome."""
    stubbed: bool = False
    """Nothing ran: the outcome is one recorded before (a fork's `stub_tools`, a recorded
    tool), handed back by this worker."""

    @model_serializer(mode="wrap")
    def _stubbed_only_when_so(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Workers of the version before read every event but a stubbed one (their Ran
        # has no such field), so a fleet mid-upgrade goes on.
        data = handler(self)
        if isinstance(data, dict) and not self.stubbed:
            data.pop("stubbed", None)
        return data


class ModelReplied(BaseModel):
    model_config = FROZEN
    kind: Literal["model_replied"] = "model_replied"
    seq: int
    text: str
    usage: Usage = Usage()
    route: str = ""
    """The model route that served the call ("" when the app gave its own model)."""
    truncated: bool = False
    """The reply was cut by its length limit: the agent asks for the rest."""
    ran: Ran | None = None


class ModelFailed(BaseModel):
    model_config = FROZEN
    kind: Literal["model_failed"] = "model_failed"
    seq: int
    error: str
    budget: bool = False
    """The call was not made: the tree's time budget (`seconds`) is spent."""
    final: bool = False
    """The call's retries are spent (its client's, over its routes), or it can never
    succeed (a request the server calls wrong): the run stops, the agent is not asked
    to try again. One retry budget per call, whichever layer spends it."""
    status: int | None = None
    """The HTTP status the model server answered last, if it answered."""
    route: str = ""
    """The model route that failed last ("" where none was asked)."""
    ran: Ran | None = None


class ToolDone(BaseModel):
    model_config = FROZEN
    kind: Literal["tool_done"] = "tool_done"
    call: str
    output: ToolOutput
    ran: Ran | None = None


class ChildDone(BaseModel):
    model_config = FROZEN
    kind: Literal["child_done"] = "child_done"
    call: str
    child: str
    outcome: Outcome


class CallDecision(BaseModel):
    model_config = FROZEN
    kind: Literal["call_decision"] = "call_decision"
    call: str
    yes: bool
    reason: str = ""
    by: str = ""
    """Who decided (as the client that decided names them), for the trace."""
    args: dict[str, Any] | None = None
    """The call's arguments as a person edited them before approving (checked by the
    client against the tool, and again by the worker); None: as the model gave them."""


class PlanDecision(BaseModel):
    model_config = FROZEN
    kind: Literal["plan_decision"] = "plan_decision"
    seq: int
    yes: bool
    by: str = ""


class Answer(BaseModel):
    model_config = FROZEN
    kind: Literal["answer"] = "answer"
    seq: int
    text: str
    by: str = Field(default="", exclude_if=lambda by: not by)
    """Who answered, when told (an answer stored before this field had none)."""


class BudgetReached(BaseModel):
    """The model call was not made: the tree is at a limit of its budget. The run parks."""

    model_config = FROZEN
    kind: Literal["budget_reached"] = "budget_reached"
    seq: int
    limit: Literal["tokens", "usd", "model_calls"]
    detail: str
    need: int = Field(default=0, exclude_if=lambda need: not need)
    """What the next model call needs under `limit` (tokens, micro-dollars, calls): a
    raise that leaves less room than this would not let the run go on (0: not told)."""


class BudgetExtended(BaseModel):
    """A person raised the tree's limits: a run parked at its budget goes on."""

    model_config = FROZEN
    kind: Literal["budget_extended"] = "budget_extended"
    seq: int
    """The step the run was parked at (a decision names what the person saw)."""
    by: str = Field(default="", exclude_if=lambda by: not by)
    """Who raised it, when told (a raise stored before this field had none)."""
    raised: str = Field(default="", exclude_if=lambda raised: not raised)
    """What was raised, in words ("1,000 tokens, 2 model calls"); "" in older raises."""


class CancelRun(BaseModel):
    model_config = FROZEN
    kind: Literal["cancel"] = "cancel"
    reason: str = ""
    stop: Literal["cancelled", "budget_exceeded", "failed"] = "cancelled"


class Told(BaseModel):
    """A person's message for the model, shown at the run's next model call."""

    model_config = FROZEN
    kind: Literal["told"] = "told"
    text: str


class PauseRun(BaseModel):
    """A person paused the run (and its specialists) at its next step."""

    model_config = FROZEN
    kind: Literal["pause"] = "pause"


class ResumeRun(BaseModel):
    """A person let a paused run (and its specialists) go on."""

    model_config = FROZEN
    kind: Literal["resume"] = "resume"


class FollowUp(BaseModel):
    """A person's next request: a new turn of the run, with its history."""

    model_config = FROZEN
    kind: Literal["follow_up"] = "follow_up"
    text: str
    strategy: ReplyStrategy = "enqueue"


InboxEvent = Annotated[
    ModelReplied
    | ModelFailed
    | ToolDone
    | ChildDone
    | CallDecision
    | PlanDecision
    | Answer
    | BudgetReached
    | BudgetExtended
    | CancelRun
    | Told
    | PauseRun
    | ResumeRun
    | FollowUp,
    Field(discriminator="kind"),
]
_INBOX_EVENT: TypeAdapter[InboxEvent] = TypeAdapter(InboxEvent)


def inbox_event(text: str | bytes) -> InboxEvent:
    """Return the event stored as `text`; raises pydantic's ValidationError if it is not one."""
    return _INBOX_EVENT.validate_json(text)


NO_DECISION = "no decision came in time"
NO_ANSWER = "(No answer came in time. Carry on without it, and say what you assumed.)"
NO_EXTENSION = "The run's budget ran out, and nobody extended it in time."


def expiry_event(kind: PendingKind, what: str) -> InboxEvent:
    """The event that stands for "nobody decided in time": a no, or no answer."""
    if kind == "call":
        return CallDecision(call=what, yes=False, reason=NO_DECISION)
    if kind == "plan":
        return PlanDecision(seq=int(what), yes=False)
    if kind == "budget":
        return CancelRun(reason=NO_EXTENSION, stop="budget_exceeded")
    return Answer(seq=int(what), text=NO_ANSWER)


def not_admitted(seq: int, over: Over) -> InboxEvent:
    """The event for a model call its tree's budget did not admit."""
    if over.limit == "deadline":
        return ModelFailed(seq=seq, error="The run's time budget ran out.", budget=True)
    if over.limit == "usd":
        spent, cap, need = (f"${n / 1_000_000:,.6f}" for n in (over.spent, over.cap, over.estimate))
        held = f"${over.reserved / 1_000_000:,.6f}"
        detail = f"The tree has spent {spent} of its {cap}"
    else:
        what = "token" if over.limit == "tokens" else "model call"
        spent, cap, need = (counted(n, what) for n in (over.spent, over.cap, over.estimate))
        held = f"{over.reserved:,}"
        detail = f"The tree has used {spent} of its {cap}"
    reserved = f" ({held} held by calls under way)" if over.reserved else ""
    detail += f"{reserved}; the next model call may need {need}. Extend the budget to go on."
    limit = "usd" if over.limit == "usd" else "tokens" if over.limit == "tokens" else "model_calls"
    return BudgetReached(seq=seq, limit=limit, detail=detail, need=over.estimate)
