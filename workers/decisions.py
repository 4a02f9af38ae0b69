"""What a decision on something pending is called in Redis, and what a late one becomes.

A person decides a plan, a call or a question through the client API; the tick
decides for them when the entry's time runs out. Both go through one DECIDE
script (`RunStore.decide`), which names the entry (its pending member), marks it
decided (a field of the run's hash, so it is used once), and, when the decision
came after the entry's expiry, applies `expiry_event` in its place.
"""

from __future__ import annotations

from typing import Literal

from workers.records import Answer, CallDecision, InboxEvent, PlanDecision

__all__ = [
    "NO_ANSWER",
    "NO_DECISION",
    "PendingKind",
    "decision_field",
    "expiry_event",
    "pending_key",
]

PendingKind = Literal["plan", "call", "question"]

NO_DECISION = "no decision came in time"
NO_ANSWER = "(No answer came in time. Carry on without it, and say what you assumed.)"


def pending_key(run_id: str, kind: PendingKind, what: str) -> str:
    """The pending entry's member: `<run>|call|<call id>`, `<run>|plan|<seq>` or
    `<run>|question|<seq>`."""
    return f"{run_id}|{kind}|{what}"


def decision_field(kind: PendingKind, what: str) -> str:
    """The run hash field that marks the entry decided (`decided`, or `expired`)."""
    return f"d:{what}" if kind == "call" else f"d:{kind}:{what}"


def expiry_event(kind: PendingKind, what: str) -> InboxEvent:
    """The event that stands for "nobody decided in time": a no, or no answer."""
    if kind == "call":
        return CallDecision(call=what, yes=False, reason=NO_DECISION)
    if kind == "plan":
        return PlanDecision(seq=int(what), yes=False)
    return Answer(seq=int(what), text=NO_ANSWER)
