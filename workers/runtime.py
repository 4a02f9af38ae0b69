"""The worker side of Relay: what the tasks do, step by step.

`advance` loads a run, applies its inbox through `workers.engine`, saves with
a compare-and-set and sends what the save decided. `call_model` and
`run_tool` claim their call (a lease in Redis, so a duplicate delivery does
nothing and a dead worker's call is noticed), do the I/O, and move the run on
in the same task: saving the outcome with the run directly when the call is
alone, else recording it in the inbox (the last result of a batch advances).
`heal` is the tick's part: it re-sends whatever the outbox says was never dealt
with, and declines approvals whose time ran out.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent_core import Agent, AgentError, Ask, ModelRequest, Run, Summarize, ToolCall, ToolOutput
from agent_core.text import cut
from workers import engine
from workers.decisions import decision_field, expiry_event, pending_key
from workers.engine import Message, Surroundings
from workers.errors import StoreUnavailable
from workers.holding import save_holding
from workers.leases import CallTimedOut, Lease, run_leased
from workers.model_client import ModelCallError, ModelReply
from workers.records import (
    InboxEvent,
    ModelFailed,
    ModelReplied,
    Pending,
    RunRecord,
    ToolDone,
    TraceEntry,
)
from workers.registry import ToolContext, ToolSpec
from workers.settings import Settings
from workers.store import (
    Claim,
    ClaimStatus,
    Decided,
    Loaded,
    OwnOutcome,
    Recorded,
    RunStore,
    Saved,
    SaveEffects,
    advance_member,
    model_member,
    tool_member,
)
from workers.ticker import Ticker

__all__ = ["Model", "Runtime", "RuntimeHost", "now_ms"]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Claims of one call before Relay stops trying (each earlier worker died mid-call)."""
SAVE_TRIES = 20


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Model(Protocol):
    """What Relay needs of a model: a reply to a request (see workers.model_client)."""

    def complete(
        self, request: ModelRequest, *, should_stop: Callable[[], bool] | None = None
    ) -> ModelReply: ...


class RuntimeHost(Protocol):
    """What the runtime needs from the Relay object that owns it."""

    settings: Settings

    def restore_agent(self, record: RunRecord, snapshot: str) -> Agent: ...

    def tool_spec(self, name: str) -> ToolSpec | None: ...

    def verifier(self) -> engine.Verifier | None: ...

    def model(self) -> Model: ...


@dataclass(frozen=True)
class Timing:
    """The runtime's clocks, from RELAY_RECOVERY_SECONDS, RELAY_TICK_SECONDS,
    RELAY_APPROVAL_TTL and RELAY_RETENTION."""

    lease_ms: int
    """How long a call's claim lasts unless renewed (every third of it, while it runs)."""
    grace_ms: int
    """How long a message may go unhandled before the tick sends it again."""
    approval_ttl_ms: int | None
    retention_s: int

    @classmethod
    def of(cls, settings: Settings) -> Timing:
        # A dead worker's call is sent again by the first tick after its lease
        # lapses, so lease + one tick interval is the recovery time; a lease is
        # never shorter than half of it, whatever the tick interval.
        recovery_ms = int(settings.recovery_seconds * 1000)
        lapse_ms = max(recovery_ms - int(settings.tick_seconds * 1000), recovery_ms // 2)
        ttl = settings.approval_ttl
        return cls(
            lease_ms=max(lapse_ms, 200),
            grace_ms=max(lapse_ms, 1_000),
            approval_ttl_ms=None if ttl is None else int(ttl * 1000),
            retention_s=max(int(settings.retention), 1),
        )


class _Postponed(Exception):
    """Raised when a claimed call cannot start now; its message stays due in the outbox."""


@dataclass
class _Call:
    """One model or tool call a task makes: what it is, and the run as its claim found it."""

    run_id: str
    what: str
    """`m<seq>` for a model call, the call id for a tool call."""
    seq: int | None
    """The model call's step; None for a tool call."""
    member: str
    token: str
    claim: Claim | None = None
    loaded: Loaded | None = None
    agent: Agent | None = None

    def open(self, claim: Claim, host: RuntimeHost) -> bool:
        """Take in the run the claim read; False if it cannot go on (gone, ended, corrupt)."""
        self.claim, self.loaded = claim, claim.loaded
        if self.loaded is None or self.loaded.record is None:
            return False
        if self.loaded.record.state == "finished":
            return False
        try:
            self.agent = host.restore_agent(self.loaded.record, self.loaded.snapshot)
        except AgentError:
            return False
        return True

    def request(self, seq: int) -> ModelRequest | None:
        """Return the model request the run still waits on at `seq`, or None if stale."""
        assert self.agent is not None
        assert self.loaded is not None
        assert self.loaded.record is not None
        if self.loaded.record.seq != seq:
            return None
        step = self.agent.resume()
        return step.request if isinstance(step, Ask | Summarize) else None

    @property
    def attempt(self) -> int:
        """This claim's number among the call's attempts (1 unless a worker died on it)."""
        assert self.claim is not None
        return self.claim.attempts

    @property
    def label(self) -> str:
        """The call as the log names it."""
        kind = "model call" if self.seq is not None else "tool call"
        attempt = self.claim.attempts if self.claim is not None else "?"
        return f"{kind} {self.what} of run {self.run_id} (attempt {attempt})"

    def others_out(self) -> bool:
        """Whether other calls of the batch are still out (their saves would race ours)."""
        assert self.loaded is not None
        assert self.loaded.record is not None
        tracks = self.loaded.record.calls
        return any(c != self.what and t.status in ("running", "child") for c, t in tracks.items())

    def batch_call(self) -> ToolCall | None:
        """Return this call if the run's current batch still holds it, else None (stale)."""
        assert self.agent is not None
        step = self.agent.resume()
        batch = [step.call, *self.agent.queued()] if isinstance(step, Run) else []
        return next((c for c in batch if c.id == self.what), None)


class Runtime:
    """The tasks' bodies, shared by every task of one process."""

    def __init__(
        self, host: RuntimeHost, store: RunStore, send: Callable[[list[Message]], None]
    ) -> None:
        self.host = host
        self.store = store
        self.send = send
        self.timing = Timing.of(host.settings)
        self.clock: Callable[[], int] = now_ms
        self.on_tick: Callable[[int], object] = self.heal
        """What the tick does; the Relay sets it to the scheduler's tick."""
        self.ticker = Ticker(store, self._tick_now, host.settings.tick_seconds, self._now)
        self._token_prefix = f"{os.getpid()}-{secrets.token_hex(4)}"

    def _tick_now(self, now: int) -> None:
        self.on_tick(now)

    def _now(self) -> int:
        return self.clock()

    def _token(self) -> str:
        return f"{self._token_prefix}-{secrets.token_hex(4)}"

    def _around(self) -> Surroundings:
        t = self.timing
        return Surroundings(
            now_ms=self.clock(),
            grace_ms=t.grace_ms,
            approval_ttl_ms=t.approval_ttl_ms,
            retention_s=t.retention_s,
            verifier=self.host.verifier(),
        )

    # --- advancing ----------------------------------------------------------------------

    def advance(self, run_id: str, loaded: Loaded | None = None) -> None:
        """Apply the run's new inbox events and act on its next step; retries lost races."""
        for _ in range(SAVE_TRIES):
            if loaded is None:
                loaded = self.store.load(run_id)
            if loaded is None:
                self.store.forget_message(advance_member(run_id))
                return
            if self._advance_once(run_id, loaded):
                return
            loaded = None
        log.warning(
            "run %s: gave up saving after %d lost races; the tick will retry", run_id, SAVE_TRIES
        )

    def _advance_once(self, run_id: str, loaded: Loaded) -> bool:
        advanced = self._decide_next(run_id, loaded)
        saved = self.store.save(
            advanced.record, loaded.version, advanced.snapshot, advanced.effects
        )
        if saved is Saved.SAVED:
            self.send(advanced.messages)
        return saved is Saved.SAVED

    def _decide_next(
        self,
        run_id: str,
        loaded: Loaded,
        agent: Agent | None = None,
        own: InboxEvent | None = None,
    ) -> engine.Advanced:
        """Return what to save for the run: the next step, or its end if it cannot go on.

        `agent` is the run's agent when the caller restored it already; `own` the
        outcome of the calling task, applied after the inbox.
        """
        record = loaded.record
        around = self._around()
        if record is None:
            advanced = engine.unreadable_record(run_id, loaded.snapshot, loaded.problem, around)
            advanced.effects.pending_del.extend(self.store.pending_members_of(run_id))
            return advanced
        if record.state == "finished":
            effects = SaveEffects(retention=around.retention_s)
            effects.applied = [entry_id for entry_id, _ in loaded.inbox]
            return engine.Advanced(record, loaded.snapshot, effects)
        if agent is None:
            try:
                agent = self.host.restore_agent(record, loaded.snapshot)
            except AgentError as error:
                return engine.unreadable_snapshot(record, loaded.snapshot, str(error), around)
        try:
            return engine.advance(record, agent, loaded.inbox, around, own)
        except Exception as error:  # a host bug (a tool's validate, a verifier) ends the run
            log.exception("run %s: advancing failed; the run is stopped", run_id)
            problem = f"advancing it raised {type(error).__name__}: {error}"
            return engine.failed_run(record, loaded.snapshot, problem, around)

    # --- model calls ----------------------------------------------------------------------

    def call_model(self, run_id: str, seq: int) -> None:
        """Make the model call for the run's step `seq`, once, and advance the run."""
        self._once(
            _Call(run_id, f"m{seq}", seq, model_member(run_id, seq), self._token()),
            lambda call: self._model_event(call, seq),
            counted=False,
        )

    def _once(
        self, call: _Call, produce: Callable[[_Call], InboxEvent | None], *, counted: bool
    ) -> None:
        """Claim a call, let `produce` do it, save its outcome once, and advance the run.

        `produce` returns None when the call is stale (the run moved on or ended).
        The outcome is saved with the run in one compare-and-set when it is alone
        and nothing else changed the run meanwhile; otherwise it is recorded in the
        inbox, and the run advances when it is the last of its batch.
        """
        claim = self.store.claim(
            call.run_id,
            call.what,
            seq=call.seq,
            member=call.member,
            token=call.token,
            lease_ms=self.timing.lease_ms,
            now_ms=self.clock(),
            root=_root_of(call.run_id),
        )
        if claim.status is not ClaimStatus.CLAIMED:
            self._unclaimed(call, claim.status)
            return
        if not call.open(claim, self.host):
            self.store.forget_message(call.member)
            return
        try:
            event = produce(call)
        except _Postponed:
            return
        if event is None:
            self.store.forget_message(call.member)
            return
        recovery_s = self.host.settings.recovery_seconds
        save_holding(lambda: self._keep(call, event, counted), call.label, for_s=recovery_s)

    def _keep(self, call: _Call, event: InboxEvent, counted: bool) -> None:
        """Save the call's outcome with the run, or record it in the inbox; advance the run."""
        if not call.others_out() and self._save_own(call, event):
            return
        due = self.clock() + self.timing.grace_ms
        recorded, loaded = self.store.record(
            call.run_id,
            call.what,
            event,
            attempt=call.attempt,
            member=call.member,
            token=call.token,
            due_ms=due,
            counted=counted,
        )
        if recorded is Recorded.FENCED:
            _log_fenced(call)
        elif recorded is Recorded.ADVANCE:
            self.advance(call.run_id, loaded)

    def _save_own(self, call: _Call, event: InboxEvent) -> bool:
        """Save `event` with the run as the claim found it; False if the run changed since."""
        assert call.loaded is not None
        # Advancing changes the agent it is given: a second try (after a Redis outage)
        # starts again from the snapshot the claim read.
        agent, call.agent = call.agent, None
        advanced = self._decide_next(call.run_id, call.loaded, agent, event)
        lease = self.store.keys.lease(call.run_id, call.what)
        advanced.effects.own = OwnOutcome(call.what, call.attempt, lease, call.token, call.member)
        advanced.effects.forget.append(f"a:{call.what}")
        saved = self.store.save(
            advanced.record, call.loaded.version, advanced.snapshot, advanced.effects
        )
        if saved is Saved.SAVED:
            self.send(advanced.messages)
        elif saved is Saved.FENCED:
            _log_fenced(call)
        return saved is not Saved.STALE  # recorded (or fenced off) already: nothing left to do

    def _unclaimed(self, call: _Call, status: ClaimStatus) -> None:
        if status is ClaimStatus.REFUSED or status is ClaimStatus.GONE:
            # Never sent by Relay for a run in this state: forged, replayed or early.
            log.warning(
                "refused %s %s of run %s: %s",
                "model call" if call.seq is not None else "tool call",
                call.what,
                call.run_id,
                "there is no such run"
                if status is ClaimStatus.GONE
                else "the run's record does not call for it (not approved, not due, or the"
                " run finished); nothing was run",
            )
            self.store.forget_message(call.member)
        elif status is ClaimStatus.DONE:
            self.store.forget_message(call.member)
            self.advance(call.run_id)

    def _model_event(self, call: _Call, seq: int) -> InboxEvent | None:
        request = call.request(seq)
        if request is None:
            return None
        claim = call.claim
        assert claim is not None
        if claim.attempts > MAX_ATTEMPTS:
            error = f"gave up after {MAX_ATTEMPTS} attempts: each worker stopped mid-call"
            return ModelFailed(seq=seq, error=error)
        over = _over_budget(claim, request)
        if over:
            return ModelFailed(seq=seq, error=over, budget=True)
        cancel = threading.Event()
        lease = self._lease(call, self.timing.lease_ms)
        model = self.host.model()
        try:
            reply = run_leased(
                lambda: model.complete(request, should_stop=cancel.is_set), lease, None, cancel
            )
        except ModelCallError as error:
            return ModelFailed(seq=seq, error=str(error))
        except Exception as error:  # noqa: BLE001 - a failing model backend fails the call, not the worker
            return ModelFailed(seq=seq, error=f"{type(error).__name__}: {error}")
        return ModelReplied(seq=seq, text=reply.text, usage=reply.usage)

    def _lease(self, call: _Call, lease_ms: int) -> Lease:
        """Return how to keep `call`'s lease (of `lease_ms`) while it runs."""

        def renew() -> bool:
            return self.store.renew(
                call.run_id,
                call.what,
                attempt=call.attempt,
                member=call.member,
                token=call.token,
                lease_ms=lease_ms,
                now_ms=self.clock(),
            )

        return Lease(lease_ms / 1000, renew, lambda: self.store.cancelled(call.run_id), call.label)

    # --- tool calls -----------------------------------------------------------------------

    def run_tool(self, run_id: str, call_id: str) -> None:
        """Run one call of the run's batch, at most once unless its tool is idempotent."""

        def produce(call: _Call) -> InboxEvent | None:
            output = self._tool_output(call)
            return None if output is None else ToolDone(call=call_id, output=output)

        call = _Call(run_id, call_id, None, tool_member(run_id, call_id), self._token())
        self._once(call, produce, counted=True)

    def _tool_output(self, call: _Call) -> ToolOutput | None:
        tool_call = call.batch_call()
        if tool_call is None:
            return None
        assert call.claim is not None
        spec = self.host.tool_spec(tool_call.tool)
        if spec is None:
            return ToolOutput.error(f"the tool {tool_call.tool} is not registered on this worker")
        refused = _not_again(spec, call.claim.attempts)
        if refused is not None:
            return refused
        if self.host.settings.durable_claims and not spec.idempotent:
            self._ensure_durable(call)
        run_id, call_id = call.run_id, call.what
        context = ToolContext(run_id=run_id, call_id=call_id, attempt=call.claim.attempts)
        context._report = lambda text: self._progress(run_id, call_id, tool_call.tool, text)
        lease = self._tool_lease(call, spec)
        timeout = spec.timeout if spec.timeout is not None else self.host.settings.tool_timeout
        try:
            value = run_leased(
                lambda: _invoke(spec, tool_call.args, context), lease, timeout, context._cancel
            )
        except CallTimedOut as error:
            return ToolOutput.unknown(f"{error}; it was told to stop and may still finish")
        except Exception as error:  # noqa: BLE001 - a tool's failure is told to the model
            return ToolOutput.error(f"{type(error).__name__}: {error}".removesuffix(": "))
        return _as_output(tool_call.tool, value, self.host.settings.tool_output_chars)

    def _ensure_durable(self, call: _Call) -> None:
        """Return once the call's claim is durable (RELAY_DURABLE_CLAIMS); if Redis cannot
        confirm it, give the claim back and raise _Postponed: the call has not started,
        and the tick sends it again."""
        # Within half the lease: the claim must still be ours when the call starts.
        if self.store.make_durable(call.run_id, call.what, max(self.timing.lease_ms // 2, 100)):
            return
        log.warning("%s: Redis did not confirm its claim is durable; trying later", call.label)
        self.store.unclaim(
            call.run_id,
            call.what,
            attempt=call.attempt,
            token=call.token,
            member=call.member,
            due_ms=self.clock() + self.timing.grace_ms,
        )
        raise _Postponed

    def _tool_lease(self, call: _Call, spec: ToolSpec) -> Lease:
        """Return the call's lease, lengthened for a tool that asked for a longer one."""
        if spec.lease_seconds is None:
            return self._lease(call, self.timing.lease_ms)
        # A tool that may hold the GIL (C code, CPU work) cannot renew in time: it
        # asked for a longer lease, taken now, before it starts. (Were it lost in
        # between, the outcome would be fenced off when it is saved.)
        lease = self._lease(call, int(spec.lease_seconds * 1000))
        lease.renew()
        return lease

    def _progress(self, run_id: str, call_id: str, tool: str, text: str) -> None:
        entry = TraceEntry(
            at_ms=self.clock(),
            run=run_id,
            kind="progress",
            text=cut(text, 500),
            call_id=call_id,
            tool=tool,
        )
        try:
            self.store.add_trace(run_id, entry)
        except StoreUnavailable as error:
            log.warning("could not record progress: %s", error)

    def tick(self) -> None:
        """Tick unless another process ticked in this interval (the `relay.tick` task)."""
        self.ticker.tick_once()

    def start_ticking(self) -> Callable[[], None]:
        """Take part in the fleet's tick from a thread; return a function that stops it."""
        return self.ticker.start()

    # --- the tick's part ----------------------------------------------------------------------

    def heal(self, now: int) -> int:
        """Re-send what was never dealt with, decline what expired; return how many were re-sent."""
        for pending in self.store.expired_pending(now):
            self._expire(pending, now)
        self.store.prune_runs(now - self.timing.retention_s * 1000)
        members = self.store.due_messages(now)
        self.store.postpone(members, now + self.timing.grace_ms)
        messages = [m for m in (engine.message_of(member) for member in members) if m is not None]
        self.send(messages)
        return len(messages)

    def _expire(self, pending: Pending, now: int) -> None:
        """Decline (or answer for) what waited too long, and wake the run to hear it."""
        what = pending.call_id if pending.call_id is not None else str(pending.seq)
        event = expiry_event(pending.kind, what)
        decided = self.store.decide(
            pending.run_id,
            pending_key(pending.run_id, pending.kind, what),
            decision_field(pending.kind, what),
            event,
            expired=event,
            now_ms=now,
            due_ms=now + self.timing.grace_ms,
        )
        if decided in (Decided.APPLIED, Decided.EXPIRED):
            self.send([Message("advance", pending.run_id)])


def _log_fenced(call: _Call) -> None:
    log.warning(
        "%s lost its lease while it ran and another attempt took it over;"
        " this attempt's outcome is discarded",
        call.label,
    )


def _not_again(spec: ToolSpec, attempts: int) -> ToolOutput | None:
    """Return why an earlier attempt's death stops this one, or None if it may run."""
    if attempts > 1 and not spec.idempotent:
        return ToolOutput.unknown(
            "the worker running this call stopped before it reported, so it may or may not"
            " have taken effect; it was not run again"
        )
    if attempts > MAX_ATTEMPTS:
        return ToolOutput.unknown(
            f"it was tried {MAX_ATTEMPTS} times and each worker stopped mid-call"
        )
    return None


def _over_budget(claim: Claim, request: ModelRequest) -> str:
    """Return why the tree's token budget would be passed by this call, or ''."""
    if claim.root_budget is None:
        return ""
    estimate = (len(request.system) + len(request.prompt)) // 4
    if claim.root_tokens + estimate <= claim.root_budget:
        return ""
    return (
        f"The token budget of {claim.root_budget} would be passed"
        f" ({claim.root_tokens} used, about {estimate} more needed)."
    )


def _root_of(run_id: str) -> str:
    """A child's id starts with its root's: `root.call-2.call-1`."""
    return run_id.split(".", 1)[0]


def _invoke(spec: ToolSpec, args: dict[str, object], context: ToolContext) -> object:
    kwargs = dict(args)
    if spec.context_param:
        kwargs[spec.context_param] = context
    return spec.fn(**kwargs)


def _as_output(tool: str, value: object, limit: int) -> ToolOutput:
    if isinstance(value, ToolOutput):
        return ToolOutput(status=value.status, text=cut(value.text, limit))
    if isinstance(value, str):
        return ToolOutput.ok(cut(value, limit))
    return ToolOutput.error(
        f"the tool {tool} returned {type(value).__name__}, not text; a tool must return text"
    )
