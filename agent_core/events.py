"""What can happen to an agent: the events `Agent`'s methods feed its transitions.

Each `Agent` method (`start`, `reply`, `fail`, `approve_plan`, `result`,
`answer`, `reject_final`, `tell`, `follow_up`, `cancel`) checks what it was
given and hands one of these to `agent_core.transitions.apply`, whose table
says what each does in each phase. Frozen values with a `kind` tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent_core.steps import Attachment
from agent_core.tools import ToolOutput

__all__ = [
    "Answered",
    "Cancelled",
    "Event",
    "Failed",
    "FinalRejected",
    "FollowedUp",
    "PlanDecided",
    "Replied",
    "ReplyCut",
    "ResultGiven",
    "Started",
    "Told",
]


@dataclass(frozen=True)
class Started:
    task: str
    context: str
    attachments: tuple[Attachment, ...]
    kind: Literal["started"] = "started"


@dataclass(frozen=True)
class Replied:
    text: str
    kind: Literal["replied"] = "replied"


@dataclass(frozen=True)
class Failed:
    error: str
    kind: Literal["failed"] = "failed"


@dataclass(frozen=True)
class PlanDecided:
    yes: bool
    kind: Literal["plan_decided"] = "plan_decided"


@dataclass(frozen=True)
class ResultGiven:
    call_id: str
    output: ToolOutput
    kind: Literal["result_given"] = "result_given"


@dataclass(frozen=True)
class Answered:
    text: str
    kind: Literal["answered"] = "answered"


@dataclass(frozen=True)
class FinalRejected:
    problem: str
    kind: Literal["final_rejected"] = "final_rejected"


@dataclass(frozen=True)
class Cancelled:
    reason: str
    kind: Literal["cancelled"] = "cancelled"


@dataclass(frozen=True)
class ReplyCut:
    """The model's reply stopped at the length limit (`finish_reason="length"`)."""

    text: str
    kind: Literal["reply_cut"] = "reply_cut"


@dataclass(frozen=True)
class Told:
    """A person's message for the model, sent while the agent works."""

    text: str
    kind: Literal["told"] = "told"


@dataclass(frozen=True)
class FollowedUp:
    """A person's next request to a finished agent."""

    text: str
    kind: Literal["followed_up"] = "followed_up"


Event = (
    Started
    | Replied
    | ReplyCut
    | Failed
    | PlanDecided
    | ResultGiven
    | Answered
    | FinalRejected
    | FollowedUp
    | Told
    | Cancelled
)
