"""A call's claim: its terms, and the claim a save made for the step this thread runs next.

A task that continues its run's next step in place (`workers.runtime.placement`)
claims that step's call in the round trip of the save that decided it (SAVE_CLAIM):
`ahead` gives the claim's terms before the save, `hand` holds the claim the save
made for this thread's next step, and `take` gives it to that step, which then makes
its call with no CLAIM of its own. A claim no step took is given back (`release`), so
the message published instead is claimed anew by its task.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from workers.engine.budget import NO_ADMISSION
from workers.engine.effects import Message
from workers.engine.ids import OutboxMember, model_call
from workers.errors import StoreUnavailable
from workers.kit.agents import AgentKit
from workers.model.pricing import Pricing
from workers.runtime.carrier import carrier
from workers.store.runs import CallClaim, Claim, RunStore
from workers.store.scripts import ClaimStatus

__all__ = ["CallMessage", "Claims"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallMessage:
    """A call a task message asks for: which run, which call, and this task's lease token."""

    run_id: str
    what: str
    """`m<seq>` for a model call, the call id for a tool call."""
    seq: int | None
    """The model call's step; None for a tool call."""
    member: str
    token: str

    @classmethod
    def model(cls, run_id: str, seq: int, token: str = "") -> CallMessage:
        return cls(run_id, model_call(seq), seq, OutboxMember.model(run_id, seq), token)

    @classmethod
    def tool(cls, run_id: str, call_id: str, token: str = "") -> CallMessage:
        return cls(run_id, call_id, None, OutboxMember.tool(run_id, call_id), token)

    def label(self, attempt: int | str = "?") -> str:
        """The call as the log names it."""
        kind = "model call" if self.seq is not None else "tool call"
        return f"{kind} {self.what} of run {self.run_id} (attempt {attempt})"


class Claims:
    """Claim terms for this process's calls, and the claim each thread holds for its next
    step (made with the save before it)."""

    def __init__(
        self,
        store: RunStore,
        kit: AgentKit,
        pricing: Pricing,
        lease_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self.store = store
        self.kit = kit
        self.pricing = pricing
        self.lease_ms = lease_ms
        self.clock = clock
        self._token_prefix = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._local = threading.local()
        """`held`: the claim this thread's next step makes its call with (`hand`), if any."""

    def token(self) -> str:
        """A new lease token: unique to this process and claim."""
        return f"{self._token_prefix}-{secrets.token_hex(4)}"

    def terms(self, asked: CallMessage) -> CallClaim:
        """What claiming `asked` takes now: its lease, and a model call's admission."""
        admission = self.pricing.admission() if asked.seq is not None else NO_ADMISSION
        return CallClaim(
            asked.run_id, asked.what, asked.seq, asked.token, self.lease_ms, self.clock(),
            admission, carrier().task,
        )  # fmt: skip

    def ahead(self, message: Message) -> CallClaim | None:
        """The claim of the call `message` asks for, to be made with the save that decided
        it (this thread then runs it in place); None for a message that is not a call, and
        for a tool that must not run twice: a claim nobody got to use (a lost answer, a
        worker that died right after the save) would make it report its outcome unknown
        without having run, so it is claimed as it starts, on its own."""
        if message.kind == "call_model":
            asked = CallMessage.model(message.run, message.seq, self.token())
        elif message.kind == "run_tool":
            spec = self.kit.spec(message.tool)
            if spec is None or not spec.idempotent:
                return None
            asked = CallMessage.tool(message.run, message.call, self.token())
        else:
            return None
        return self.terms(asked)

    def hand(self, terms: CallClaim, claim: Claim) -> None:
        """Hold `claim`, made with the save before, for this thread's next step."""
        self._local.held = (terms, claim)

    def take(self, asked: CallMessage) -> tuple[CallMessage, Claim] | None:
        """The claim held for `asked`, if this thread holds it (its token with it); None if
        not (a claim held for another call is given back)."""
        held: tuple[CallClaim, Claim] | None = getattr(self._local, "held", None)
        if held is None:
            return None
        self._local.held = None
        terms, claim = held
        if (terms.run_id, terms.what) == (asked.run_id, asked.what):
            return replace(asked, token=terms.token), claim
        self._local.held = held  # (never: the step kept is the one run next) give it back
        self.release(terms)
        return None

    def release(self, terms: CallClaim) -> None:
        """Give back the claim `hand` holds for `terms` if no step took it (its message is
        published instead, and its task claims anew)."""
        held: tuple[CallClaim, Claim] | None = getattr(self._local, "held", None)
        if held is None or held[0] is not terms:
            return
        self._local.held = None
        if held[1].status is ClaimStatus.CLAIMED:
            self.store.unclaim(
                terms.run_id, terms.what, attempt=held[1].attempts, token=terms.token,
                member=terms.member, due_ms=self.clock(),
            )  # fmt: skip

    def release_held(self) -> None:
        """Give back a claim this thread still holds from an earlier task (one that was cut
        off between the save and its next step): a new task never makes a call with it."""
        held: tuple[CallClaim, Claim] | None = getattr(self._local, "held", None)
        if held is None:
            return
        try:
            self.release(held[0])
        except StoreUnavailable as error:  # its lease lapses, and the tick sends it again
            log.warning("could not give back the claim of %s: %s", held[0].what, error)
