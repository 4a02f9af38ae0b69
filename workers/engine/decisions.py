"""What a late decision becomes: the event that stands for "nobody decided in time".

A person decides a plan, a call or a question through the client API; the tick
decides for them when the entry's time runs out. Both go through one DECIDE
script (`RunStore.decide`), which marks the entry decided (so it is used once)
and, when the decision came after the entry's expiry, applies `expiry_event` in
its place: a no, or no answer.
"""

from __future__ import annotations

from workers.engine.records import Answer, CallDecision, CancelRun, InboxEvent, PlanDecision
from workers.store.layout import PendingKind

__all__ = ["NO_ANSWER", "NO_DECISION", "NO_EXTENSION", "expiry_event"]

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
