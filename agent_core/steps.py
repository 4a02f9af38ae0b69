"""What the agent tells its host to do next, and how a run ended.

Every step is a frozen value with a `kind` tag, usable in `match`:

    match agent.resume():
        case Ask(request): ...
        case Run(call): ...
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_core.tools import Arg, ToolCall

__all__ = [
    "Ask",
    "Attachment",
    "Done",
    "ModelRequest",
    "OfferedTool",
    "Outcome",
    "Plan",
    "Question",
    "ReplyShape",
    "Run",
    "Step",
    "Stop",
    "Summarize",
]

FROZEN = ConfigDict(frozen=True, extra="forbid")
"""The model config of every value of the core, and of the runtime's records."""


class Attachment(BaseModel):
    """A file sent with the task on every model request (bytes are base64 in JSON)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    name: str
    mime: str
    data: bytes

    def __init__(self, name: str, mime: str, data: bytes) -> None:
        super().__init__(name=name, mime=mime, data=data)


class OfferedTool(BaseModel):
    """A tool a reply may call, as a model server that constrains replies needs it."""

    model_config = FROZEN

    name: str
    description: str
    args: tuple[Arg, ...] = ()
    alone: bool = False
    """It goes in a reply of its own, never in a batch (the agent's own tools)."""


class ReplyShape(BaseModel):
    """The reply objects a request allows, as data: what the system text tells the model,
    for a host whose model server can hold the model to it (a JSON schema, native
    function calling). `{"final": "..."}` is always allowed."""

    model_config = FROZEN

    plan_steps: int = 0
    """`{"plan": [...]}` with at most this many steps; 0: no plan is asked for."""
    tools: tuple[OfferedTool, ...] = ()
    """The tools `{"tool": "name", "args": {...}}` may call."""
    batch: int = 1
    """Calls `{"tools": [...]}` may hold; at 1 that form is not offered."""
    ask_user: bool = False
    """`{"ask_user": "question"}` is allowed."""


class ModelRequest(BaseModel):
    """One call to make to the model: a system text, a prompt, and any attachments.

    `reply` says which reply objects the request allows; None: the reply is plain text
    (a summary, the rest of a cut reply) or the request was made by hand. It is derived
    from the same state as the texts, and left out of a dump when None.
    """

    model_config = FROZEN

    system: str
    prompt: str
    attachments: tuple[Attachment, ...] = ()
    reply: ReplyShape | None = Field(default=None, exclude_if=lambda shape: shape is None)


class Stop(StrEnum):
    """Why a run ended."""

    DONE = "done"
    CALL_LIMIT = "call_limit"
    BAD_REPLIES = "bad_replies"
    MODEL_FAILED = "model_failed"
    PLAN_DECLINED = "plan_declined"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"
    FAILED = "failed"
    NO_PROGRESS = "no_progress"
    MODEL_CALL_LIMIT = "model_call_limit"

    def label(self) -> str:
        """Return a short human phrase for this stop."""
        return _LABELS[self]


_LABELS = {
    Stop.DONE: "done",
    Stop.CALL_LIMIT: "call limit reached",
    Stop.BAD_REPLIES: "too many unusable replies",
    Stop.MODEL_FAILED: "the model call failed",
    Stop.PLAN_DECLINED: "plan declined",
    Stop.CANCELLED: "cancelled",
    Stop.BUDGET_EXCEEDED: "budget exceeded",
    Stop.FAILED: "failed",
    Stop.NO_PROGRESS: "no progress",
    Stop.MODEL_CALL_LIMIT: "model call limit reached",
}


class Outcome(BaseModel):
    """How a run ended: the stop, a summary, the model's whole final object, calls made.

    `calls` counts the tool calls (and delegations) of the agent's whole life,
    every turn of it (see `Agent.follow_up`).
    """

    model_config = FROZEN

    stop: Stop
    summary: str
    data: dict[str, Any] = Field(default_factory=dict)
    calls: int = 0


class Ask(BaseModel):
    """Call the model with `request`; answer with `agent.reply(text)` or `agent.fail(error)`."""

    model_config = FROZEN
    kind: Literal["ask"] = "ask"
    request: ModelRequest
    __match_args__ = ("request",)


class Plan(BaseModel):
    """The model proposes these steps; answer with `agent.approve_plan(yes)`."""

    model_config = FROZEN
    kind: Literal["plan"] = "plan"
    steps: tuple[str, ...]
    __match_args__ = ("steps",)


class Run(BaseModel):
    """Run `call` (and `agent.queued()`, the rest of its batch); answer with `agent.result`."""

    model_config = FROZEN
    kind: Literal["run"] = "run"
    call: ToolCall
    __match_args__ = ("call",)


class Question(BaseModel):
    """Ask a person `text`; answer with `agent.answer(text)`."""

    model_config = FROZEN
    kind: Literal["question"] = "question"
    text: str
    __match_args__ = ("text",)


class Summarize(BaseModel):
    """Ask the model to summarise older history; answer with `agent.reply(text)` in plain text."""

    model_config = FROZEN
    kind: Literal["summarize"] = "summarize"
    request: ModelRequest
    __match_args__ = ("request",)


class Done(BaseModel):
    """The run ended; nothing more happens unless the host calls `reject_final` or `follow_up`."""

    model_config = FROZEN
    kind: Literal["done"] = "done"
    outcome: Outcome
    __match_args__ = ("outcome",)


Step = Annotated[Ask | Plan | Run | Question | Summarize | Done, Field(discriminator="kind")]
