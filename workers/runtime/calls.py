"""Making one call, once: claim it, do it (model or tool), save its outcome, move the run on.

    relay.call_model(run, seq) / relay.run_tool(run, call)
      1. CLAIM     the run's record must call for it; the attempt is counted and a
                   lease taken (a duplicate finds it busy; a forgery is refused)
      2. open      the run as the claim read it: its agent, the request or batch
      3. produce   the I/O: a model call a coroutine on the process's loop, handed to
                   it (`Handed`: the loop holds it past the task, its lease renewed
                   with the others it holds) or, when the loop is full, waited for
                   here; a tool call on a pooled thread; the lease renewed meanwhile
      4. keep      the outcome saved with the run in one compare-and-set when the
                   call is alone, else recorded in the inbox (the last of a batch
                   advances the run); fenced by the attempt; held through an outage
                   (a held call's on a keeper thread: `keep_held`)

A second attempt (the first worker died, its lease lapsed) runs an idempotent
tool again and reports any other as "outcome unknown", never running it twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NoReturn, TypeVar

from agent_core import Agent, AgentError, Ask, ModelRequest, Run, Summarize, ToolCall, ToolOutput
from agent_core.text import cut
from workers.engine.budget import Over
from workers.engine.effects import Message, OwnOutcome, RouteNews
from workers.engine.events import (
    InboxEvent,
    ModelFailed,
    ModelReplied,
    Ran,
    ToolDone,
    not_admitted,
)
from workers.engine.journal import any_call_digest, call_digest
from workers.engine.records import RunRecord, TraceEntry
from workers.errors import CallCancelled, CallTimedOut, ModelCallError, StoreUnavailable
from workers.kit.tools import ToolContext, ToolSpec, tool_output
from workers.model.endpoints import ModelRoute
from workers.model.pricing import Pricing
from workers.model.router import ModelRouter, Requeue
from workers.model.wire import Model, ModelReply, awaited, complete
from workers.runtime.carrier import carrier, working_on
from workers.runtime.claims import CallMessage, Claims
from workers.runtime.leases import CallLease, Holding, run_leased, run_leased_async
from workers.runtime.on_loop import LoopCalls, Outcome, Stopped
from workers.runtime.reports import RECORDED, Report, after_step, call_facts, did
from workers.runtime.steps import Steps
from workers.runtime.streaming import ReplyStream
from workers.settings import Settings
from workers.store.codec import Loaded
from workers.store.runs import Claim, HeldLease
from workers.store.scripts import ClaimStatus, Recorded, Saved

__all__ = ["MAX_CALL_ATTEMPTS", "Calls", "Handed", "HeldOutcome"]

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_CALL_ATTEMPTS = 3
"""Claims of one call before Relay stops trying (each earlier worker died mid-call)."""


class Claimed:
    """A call this task holds the lease of, with the run as its claim read it."""

    def __init__(
        self,
        asked: CallMessage,
        attempt: int,
        over: Over | None,
        loaded: Loaded,
        reply_cap: int = 0,
    ) -> None:
        assert loaded.record is not None
        self.asked = asked
        self.attempt = attempt
        self.over = over
        """Set when the tree's budget did not admit this (model) call."""
        self.reply_cap = reply_cap
        """The reply's cap in tokens, when the tree has less left than max_tokens (0: none)."""
        self.loaded = loaded
        self.record: RunRecord = loaded.record
        self._agent: Agent | None = None
        self.task_before = ""
        """The Celery task of the claim before (the lost attempt's, on a retake)."""
        self.fallback = ""
        """Said in the run's trace once the reply is kept: the route spoke text instead of
        its protocol (the loop never writes to Redis itself)."""
        self.route_ok: RouteNews | None = None
        """What the model route that replied is still to hear: told by the save of the
        reply (`OwnOutcome.route`), else by `Calls._tell_route`; once either way."""

    @property
    def label(self) -> str:
        return self.asked.label(self.attempt)

    def open(self, restore: Callable[[RunRecord, str], Agent]) -> bool:
        """Restore the run's agent; False if the run cannot go on (ended, unreadable)."""
        if self.record.state == "finished":
            return False
        try:
            self._agent = self.loaded.agent(restore)
        except AgentError:
            return False
        return True

    @property
    def agent(self) -> Agent:
        assert self._agent is not None, "open() it first"
        return self._agent

    def take_agent(self) -> Agent | None:
        """Hand the agent over to be advanced (which changes it); a second taker gets None
        and restores from the snapshot again (a save tried again after an outage)."""
        agent, self._agent = self._agent, None
        return agent

    def request(self) -> ModelRequest | None:
        """Return the model request the run still waits on at this step, or None if stale."""
        if self.record.seq != self.asked.seq:
            return None
        step = self.agent.resume()
        return step.request if isinstance(step, Ask | Summarize) else None

    def batch_call(self) -> ToolCall | None:
        """Return this call if the run's current batch still holds it, else None (stale)."""
        step = self.agent.resume()
        batch = [step.call, *self.agent.queued()] if isinstance(step, Run) else []
        call = next((c for c in batch if c.id == self.asked.what), None)
        track = self.record.calls.get(self.asked.what)
        if call is not None and track is not None and track.args is not None:
            return call.model_copy(update={"args": track.args})  # as a person edited it
        return call

    def others_out(self) -> bool:
        """Whether other calls of the batch are still out (their saves would race ours)."""
        tracks = self.record.calls
        return any(
            c != self.asked.what and t.status in ("running", "child") for c, t in tracks.items()
        )


class _Postponed(Exception):
    """Raised when a claimed call cannot start now: its claim is given back, and its
    message comes again (`waits_for_route`: for a model route's capacity)."""

    def __init__(self, why: str, *, waits_for_route: bool) -> None:
        super().__init__(why)
        self.why = why
        self.waits_for_route = waits_for_route


Produce = Callable[[Claimed], InboxEvent | None]


HeldOutcome = Outcome[InboxEvent | Requeue]
"""What a call held on the loop came to: its outcome, when to come back, or why not."""


@dataclass(frozen=True)
class Handed:
    """A model call a task hands to the process's loop (`Runtime` starts it there): the
    lease the loop renews, the coroutine that makes it, and what the task says meanwhile."""

    lease: HeldLease
    outcome: Coroutine[Any, Any, InboxEvent | Requeue]
    call: Claimed
    live: ReplyStream
    started_ns: int
    report: Report


@dataclass(frozen=True)
class _Made:
    """A call's outcome, made and not yet kept (`Calls._make`)."""

    event: InboxEvent
    started_ns: int


class Calls:
    """The bodies of `relay.call_model` and `relay.run_tool`."""

    def __init__(
        self,
        steps: Steps,
        settings: Settings,
        *,
        model: Callable[[], Model],
        pricing: Pricing,
        router: ModelRouter | None = None,
        key: str = "relay",
        claims: Claims,
        on_loop: LoopCalls | None = None,
    ) -> None:
        self.steps = steps
        self.claims = claims
        self.on_loop = on_loop
        """Where model calls are held past their tasks (RELAY_MODEL_CARRIED), if anywhere."""
        self.store = steps.store
        self.kit = steps.kit
        self.settings = settings
        self.timing = steps.timing
        self.model = model
        self.pricing = pricing
        self.router = router
        self.settings_key = key
        """The key of runs started without one (the app's name)."""

    def call_model(self, run_id: str, seq: int) -> Report | Handed:
        """Make the model call for the run's step `seq`, once, and advance the run; or hand
        it to the process's loop (`Handed`: the caller starts it there)."""
        return self._once(CallMessage.model(run_id, seq), self._model_event)

    def run_tool(self, run_id: str, call_id: str) -> Report:
        """Run one call of the run's batch, at most once unless its tool is idempotent."""
        done = self._once(CallMessage.tool(run_id, call_id), self._tool_event)
        assert isinstance(done, Report)  # (a tool call is never handed to the loop)
        return done

    def _claimed(self, asked: CallMessage) -> tuple[CallMessage, Claim]:
        """The call's claim: the one made with the save before, if this thread holds it, else
        a CLAIM now (with a new lease token)."""
        taken = self.claims.take(asked)
        if taken is not None:
            return taken
        asked = replace(asked, token=self.claims.token())
        return asked, self.store.claim_with(self.claims.terms(asked))

    # --- claim, produce, keep ---------------------------------------------------------------

    def _once(self, asked: CallMessage, produce: Produce) -> Report | Handed:
        asked, claim = self._claimed(asked)
        if claim.status is not ClaimStatus.CLAIMED:
            return self._unclaimed(asked, claim.status)
        assert claim.loaded is not None
        call = Claimed(asked, claim.attempts, claim.over, claim.loaded, claim.reply_cap)
        call.task_before = claim.task_before
        not_here = self._not_run_here(call)
        if not_here is not None:
            return not_here
        with working_on(asked.run_id, asked.what):
            if asked.seq is not None and self.on_loop is not None:
                handed = self._hand_to_loop(call)
                if handed is not None:
                    return handed
            return self._kept(call, self._make(call, produce))

    def _make(self, call: Claimed, produce: Produce) -> _Made | Report:
        """Make the claimed call: its outcome, or what happened instead."""
        asked = call.asked
        if call.attempt > 1:
            self._say_taken_over(call)
        started = time.time_ns()
        try:
            event = produce(call)
        except _Postponed as later:
            return Report(f"{asked.what}: {later.why}", waited=later.waits_for_route)
        except BaseException:
            self._tell_route(call)  # (a reply came, then something failed: its slot goes back)
            raise
        if event is None:  # stale: the run moved on or ended
            self.store.forget_message(asked.member)
            return Report(f"{asked.what}: the run moved on; nothing was run", idle=True)
        return _Made(event, started)

    def _kept(self, call: Claimed, made: _Made | Report) -> Report:
        """Keep a call's outcome (`_make`'s) and advance the run."""
        if isinstance(made, Report):
            self._tell_route(call)
            return made
        asked, started = call.asked, made.started_ns
        event = _with_ran(made.event, call.attempt, (time.time_ns() - started) // 1_000_000)
        facts = call_facts(call.record, asked.what, event, started_ns=started, attempt=call.attempt)
        try:
            after = self._keep_holding(call, event)
        finally:
            self._tell_route(call)  # (unless the save took it along: then there is none)
        done = did(asked.what, facts.name if asked.seq is None else None, event)
        return Report(done.line, done.failed, facts).then(after)

    def _keep_holding(self, call: Claimed, event: InboxEvent) -> Report:
        """`_keep`, its outcome held through a Redis outage (`leases.Holding`)."""
        settings = self.settings
        with Holding(
            call.label, for_s=settings.recovery_seconds, cap=settings.held_outcomes
        ) as holding:
            while True:
                try:
                    after = self._keep(call, event)
                except StoreUnavailable as error:
                    holding.failed(error)
                    continue
                holding.saved()
                return after

    def _not_run_here(self, call: Claimed) -> Report | None:
        """Why a claimed call is not run: its run cannot be read or has ended (the message
        is done with), or another app started it (the claim is given back)."""
        asked, record = call.asked, call.loaded.record
        if record is None:
            self.store.forget_message(asked.member)
            return Report(f"{asked.what}: the run's record cannot be read; nothing was run")
        foreign = self.steps.foreign(record)
        if foreign is not None:
            self._unclaim(call, due_ms=self.steps.clock() + self.timing.grace_ms)
            return foreign
        if not call.open(self.kit.restore):
            self.store.forget_message(asked.member)
            return Report(f"{asked.what}: the run has ended (or cannot be read); nothing was run")
        return None

    def _say_taken_over(self, call: Claimed) -> None:
        """This attempt follows one that was lost: the run's trace and this log say so
        (unless the tick said it as it sent the call again)."""
        asked = call.asked
        try:
            said = self.store.note_resent(
                asked.run_id, asked.what, self.steps.clock(), taken=call.attempt,
                lost_task=call.task_before,
            )  # fmt: skip
        except StoreUnavailable:
            return  # the call matters more than saying so
        if said is not None:
            log.warning(
                "took over %s of run %s as attempt %d: attempt %d lost its lease with no"
                " outcome (its worker died or stalled)",
                asked.what, asked.run_id, call.attempt, call.attempt - 1,
            )  # fmt: skip

    def _unclaimed(self, asked: CallMessage, status: ClaimStatus) -> Report:
        if status is ClaimStatus.REFUSED or status is ClaimStatus.GONE:
            # Never sent by Relay for a run in this state: forged, replayed or early.
            why = (
                "there is no such run"
                if status is ClaimStatus.GONE
                else "the run's record does not call for it (not approved, not due, or the"
                " run finished); nothing was run"
            )
            kind = "model call" if asked.seq is not None else "tool call"
            log.warning("refused %s %s of run %s: %s", kind, asked.what, asked.run_id, why)
            self.store.forget_message(asked.member)
            return Report(f"refused {asked.what}: {why}", idle=True)
        if status is ClaimStatus.DONE:
            self.store.forget_message(asked.member)
            after = self.steps.advance(asked.run_id)
            return Report(f"{asked.what} was made already").then(after)
        return Report(f"{asked.what} is being made by another worker; nothing to do", idle=True)

    def _keep(self, call: Claimed, event: InboxEvent) -> Report:
        """Save the call's outcome with the run, or record it in the inbox; advance the run."""
        saved = None if call.others_out() else self._save_with_run(call, event)
        if saved is not None:
            return saved
        asked = call.asked
        recorded, loaded = self.store.record(
            asked.run_id,
            asked.what,
            event,
            attempt=call.attempt,
            member=asked.member,
            token=asked.token,
            due_ms=self.steps.clock() + self.timing.grace_ms,
            counted=asked.seq is None,  # a tool's result counts down its batch
        )
        if recorded is Recorded.FENCED:
            _log_fenced(call)
        elif recorded is Recorded.ADVANCE:
            return self.steps.advance(asked.run_id, loaded)
        return Report(RECORDED[recorded])

    def _save_with_run(self, call: Claimed, event: InboxEvent) -> Report | None:
        """Save `event` with the run as the claim found it; None if the run changed since."""
        asked = call.asked
        advanced = self.steps.decide(asked.run_id, call.loaded, call.take_agent(), event)
        # The route that replied hears of it in the save's script, whatever the save answers;
        # taken off the call first, so a save tried again (Redis away) does not tell it twice.
        ok, call.route_ok = call.route_ok, None
        own = OwnOutcome(asked.run_id, asked.what, call.attempt, asked.token, asked.member, ok)
        saved = self.steps.save(advanced, call.loaded.version, own)
        if saved is Saved.FENCED:
            _log_fenced(call)
        if saved in (Saved.FENCED, Saved.DUPLICATE):
            return Report(RECORDED[Recorded(saved.value)])
        return after_step(call.record, advanced) if saved is Saved.SAVED else None

    def _lease(self, call: Claimed, lease_ms: int) -> CallLease:
        """Return how to keep `call`'s lease (of `lease_ms`) while it runs in this task."""
        held = self._held_lease(call, lease_ms)
        return CallLease(self.store, held, self.steps.clock, router=self.router, label=call.label)

    def _held_lease(self, call: Claimed, lease_ms: int) -> HeldLease:
        """`call`'s lease as it is renewed: by its task (`_lease`) or with the others the
        loop holds; a routed model call's route slot with it."""
        asked = call.asked
        routed = self.router is not None and asked.seq is not None
        return HeldLease(
            asked.run_id, asked.what, call.attempt, asked.member, asked.token, lease_ms,
            _route_holder(call) if routed else "",
        )  # fmt: skip

    # --- model calls ----------------------------------------------------------------------

    def _model_event(self, call: Claimed) -> InboxEvent | None:
        """Make the model call in this task, on the process's loop, waiting for its reply
        (the loop holds all it may, or none: RELAY_MODEL_CARRIED=0)."""
        request = self._model_request(call)
        if not isinstance(request, ModelRequest):
            return request
        seq = call.asked.seq
        assert seq is not None
        cancel = threading.Event()
        lease = self._lease(call, self.timing.lease_ms)
        try:  # the reply goes to the tree's live stream as it comes (workers.store.live)
            with ReplyStream(self.store.live, call.asked.run_id, seq, call.attempt) as live:
                outcome = run_leased_async(
                    self._model_outcome(call, request, live, cancel.is_set), lease, None, cancel
                )
        except CallCancelled as error:
            return ModelFailed(seq=seq, error=f"model call stopped: {error}", final=True)
        if isinstance(outcome, Requeue):
            self._come_back(call, outcome)
        self._warn_fallback(call)
        return outcome

    def _model_request(self, call: Claimed) -> ModelRequest | InboxEvent | None:
        """The request to make, or the outcome the call has without one (None: stale)."""
        request = call.request()
        seq = call.asked.seq
        if request is None or seq is None:
            return None
        if call.attempt > MAX_CALL_ATTEMPTS:
            error = f"gave up after {MAX_CALL_ATTEMPTS} attempts: each worker stopped mid-call"
            return ModelFailed(seq=seq, error=error, final=True)
        if call.over is not None:
            return not_admitted(seq, call.over)
        return request

    async def _model_outcome(
        self,
        call: Claimed,
        request: ModelRequest,
        live: ReplyStream,
        should_stop: Callable[[], bool] | None = None,
    ) -> InboxEvent | Requeue:
        """On the loop: the call's outcome, or when to come back (no route has room).

        Raises:
            StoreUnavailable: no route could be asked, no call was made (the lease lapses,
                and the tick sends the call again).
        """
        seq = call.asked.seq
        assert seq is not None
        try:
            reply, route = await self._ask(call, request, should_stop, live)
        except Requeue as later:
            return later
        except StoreUnavailable:
            raise
        except ModelCallError as error:  # its retries are spent
            return ModelFailed(
                seq=seq, error=str(error), final=True, status=error.status, route=error.route
            )
        except Exception as error:  # noqa: BLE001 - a failing model backend fails the call, not the worker
            return ModelFailed(seq=seq, error=f"{type(error).__name__}: {error}")
        if reply.protocol_fallback and route is not None:
            said = f"does not take the {route.protocol} protocol: {reply.protocol_fallback}"
            call.fallback = f"model route {route.name} {said}; speaking text"
        usage = self.pricing.priced(reply, route)
        cut = reply.finish_reason == "length"
        name = route.name if route is not None else ""
        return ModelReplied(seq=seq, text=reply.text, usage=usage, route=name, truncated=cut)

    async def _ask(
        self,
        call: Claimed,
        request: ModelRequest,
        should_stop: Callable[[], bool] | None,
        live: ReplyStream,
    ) -> tuple[ModelReply, ModelRoute | None]:
        """Make the model call, on the app's own model or on the first route that takes it;
        its text goes to `live` as it comes."""
        if self.router is None:
            reply = await complete(self.model(), request, should_stop=should_stop, on_text=live)
            return reply, None
        prompt = -(-call.record.asked_bytes // 2)  # what admission reserved for: bytes / 2
        cap = call.reply_cap or None  # what the tree has left, if less than max_tokens
        routed = await self.router.complete(
            request,
            key=call.record.key or self.settings_key,
            holder=_route_holder(call),
            tokens=prompt + (cap or self.pricing.max_tokens),
            should_stop=should_stop,
            on_text=live,
            max_tokens=cap,
            only=call.record.routes,
            tell_ok=not self.store.saves_tell_routes,
        )
        call.route_ok = routed.ok  # (kept even if the task is not: the save tells it)
        return routed.reply, routed.route

    # --- model calls held on the loop -----------------------------------------------------

    def _hand_to_loop(self, call: Claimed) -> Handed | None:
        """The claimed model call, to be held on the process's loop past this task; None if
        the loop holds all it may, or the call needs no request (this task makes it)."""
        assert self.on_loop is not None
        request = self._model_request(call)
        seq = call.asked.seq
        if not isinstance(request, ModelRequest) or seq is None:
            return None
        held = self.on_loop.reserve()
        if held is None:
            return None
        if call.attempt > 1:
            self._say_taken_over(call)
        asked, started = call.asked, time.time_ns()
        lease = self._held_lease(call, self.timing.lease_ms)
        live = ReplyStream(self.store.live, asked.run_id, seq, call.attempt)
        line = f"{asked.what}: held on the event loop ({held} in flight)"
        outcome = self._model_outcome(call, request, live)
        return Handed(lease, outcome, call, live, started, Report(line, carried=True))

    def keep_held(self, handed: Handed, outcome: HeldOutcome) -> Report:
        """On a keeper thread: keep what a call held on the loop came to, and advance the run."""
        call = handed.call
        handed.live.close()  # (its last pieces reach the stream before the step is saved)
        seq = call.asked.seq
        assert seq is not None
        if outcome is Stopped.CANCELLED:
            outcome = ModelFailed(seq=seq, error=f"model call stopped: {outcome.value}", final=True)
        if isinstance(outcome, Stopped):
            self._tell_route(call)
            if outcome is Stopped.HANDED_BACK:
                self._unclaim(call, due_ms=self.steps.clock())
            return Report(f"{call.asked.what}: {outcome.value}; nothing was saved", idle=True)
        if isinstance(outcome, Requeue):  # (an Exception too: it must come first)
            try:
                self._come_back(call, outcome)
            except _Postponed as later:
                return Report(f"{call.asked.what}: {later.why}", waited=True)
        if isinstance(outcome, Exception):
            self._tell_route(call)
            raise outcome
        self._warn_fallback(call)
        return self._kept(call, _Made(outcome, handed.started_ns))

    def _warn_fallback(self, call: Claimed) -> None:
        """Say in the run's trace that the route that replied spoke text, not its protocol."""
        said, call.fallback = call.fallback, ""
        if said:
            self._warn(call.asked.run_id, said)

    def _tell_route(self, call: Claimed) -> None:
        """Tell the route that replied to `call` that it went well, if no save told it."""
        ok, call.route_ok = call.route_ok, None
        if ok is not None and self.router is not None:
            self.router.tell(ok)

    def _unclaim(self, call: Claimed, *, due_ms: int) -> None:
        """Give the claim back, uncounted (the call never started); its message is due
        again at `due_ms`."""
        asked = call.asked
        self.store.unclaim(
            asked.run_id, asked.what, attempt=call.attempt, token=asked.token,
            member=asked.member, due_ms=due_ms,
        )  # fmt: skip

    def _come_back(self, call: Claimed, later: Requeue) -> NoReturn:
        """No route takes the call soon: give its claim back, and send it again when its
        turn comes (the task ends; no worker waits meanwhile)."""
        asked, now = call.asked, self.steps.clock()
        self._unclaim(call, due_ms=later.at_ms + self.timing.grace_ms)
        delay = max(later.at_ms - now, 0)
        assert asked.seq is not None
        self.steps.send([Message("call_model", asked.run_id, seq=asked.seq, delay_ms=delay)])
        log.info("%s waits %d ms for a model route (%s)", call.label, delay, later.why)
        raise _Postponed(f"waits {delay} ms for a model route ({later.why})", waits_for_route=True)

    # --- tool calls -----------------------------------------------------------------------

    def _tool_event(self, call: Claimed) -> InboxEvent | None:
        stubbed = self._stubbed(call)
        if stubbed is not None:  # (its trace line says so: nothing ran)
            ran = Ran(attempt=call.attempt, stubbed=True)
            return ToolDone(call=call.asked.what, output=stubbed, ran=ran)
        output = self._tool_output(call)
        return None if output is None else ToolDone(call=call.asked.what, output=output)

    def _tool_output(self, call: Claimed) -> ToolOutput | None:
        tool_call = call.batch_call()
        if tool_call is None:
            return None
        spec = self.kit.spec(tool_call.tool)
        if spec is None:
            return ToolOutput.error(f"the tool {tool_call.tool} is not registered on this worker")
        refused = _not_again(spec, call.attempt)
        if refused is not None:
            return refused
        if self.settings.durable_claims and not spec.idempotent:
            self._ensure_durable(call)
        run_id, call_id = call.asked.run_id, call.asked.what
        cancel = threading.Event()  # set when the run is cancelled, or the call overruns

        def progress(text: str) -> None:
            self._progress(run_id, call_id, tool_call.tool, text)

        context = ToolContext.of_call(run_id, call_id, call.attempt, cancel, progress)
        lease = self._tool_lease(call, spec)
        timeout = self.kit.timeout_of(tool_call.tool)
        try:
            if spec.asynchronous:
                value = run_leased_async(
                    awaited(spec.invoke(tool_call.args, context)), lease, timeout, cancel
                )
            else:
                value = run_leased(
                    partial(spec.invoke, tool_call.args, context), lease, timeout, cancel
                )
        except CallTimedOut as error:
            after = (
                "it was cancelled; what it did before that stands"
                if spec.asynchronous
                else "it was told to stop and may still finish"
            )
            return ToolOutput.unknown(f"{error}; {after}")
        except Exception as error:  # noqa: BLE001 - a tool's failure is told to the model
            return ToolOutput.error(f"{type(error).__name__}: {error}".removesuffix(": "))
        return tool_output(tool_call.tool, value, self.settings.tool_output_chars)

    def _stubbed(self, call: Claimed) -> ToolOutput | None:
        """The outcome recorded for this call, handed back instead of running it: a fork's
        (`Relay.fork(stub_tools=True)`: the original's identical call) or a recorded tool's
        (`Relay.start(recorded=...)`: the outcome for these arguments, else for any)."""
        record = call.record
        tool_call = call.batch_call() if record.stubbed or record.recorded else None
        if tool_call is None:
            return None
        digest = call_digest(tool_call.tool, tool_call.args)
        if tool_call.tool in record.recorded:
            kept = self.store.stub(record.root, digest) or self.store.stub(
                record.root, any_call_digest(tool_call.tool)
            )
            return kept or ToolOutput.error(
                f"{tool_call.tool} has no recorded outcome for these arguments; it was not run"
            )
        if digest not in record.stubbed:
            return None
        kept = self.store.stub(record.root, digest)
        # Nobody was asked for it (its outcome stood for the decision): never run it here.
        return kept or ToolOutput.error("its recorded outcome is gone; it was not run")

    def _ensure_durable(self, call: Claimed) -> None:
        """Return once the call's claim is durable (RELAY_DURABLE_CLAIMS); if Redis cannot
        confirm it, give the claim back and raise _Postponed: the call has not started,
        and the tick sends it again."""
        asked = call.asked
        # Within half the lease: the claim must still be ours when the call starts.
        wait_ms = max(self.timing.lease_ms // 2, 100)
        if self.store.make_durable(asked.run_id, asked.what, wait_ms):
            return
        log.warning("%s: Redis did not confirm its claim is durable; trying later", call.label)
        self._unclaim(call, due_ms=self.steps.clock() + self.timing.grace_ms)
        raise _Postponed(
            "its claim is not durable yet; the tick sends it again", waits_for_route=False
        )

    def _tool_lease(self, call: Claimed, spec: ToolSpec) -> CallLease:
        """Return the call's lease, lengthened for a tool that asked for a longer one."""
        if spec.lease_seconds is None:
            return self._lease(call, self.timing.lease_ms)
        # A tool that may hold the GIL (C code, CPU work) cannot renew in time: it
        # asked for a longer lease, taken now, before it starts. (Were it lost in
        # between, the outcome would be fenced off when it is saved.)
        lease = self._lease(call, int(spec.lease_seconds * 1000))
        lease.renew()
        return lease

    def _warn(self, run_id: str, text: str) -> None:
        """Add a warning line to the run's trace (a model route that changed how it is
        spoken to)."""
        entry = TraceEntry(
            at_ms=self.steps.clock(), run=run_id, kind="warning", text=cut(text, 500)
        )
        try:
            self.store.add_trace(run_id, entry)
        except StoreUnavailable as error:
            log.warning("could not add a warning to the trace of run %s: %s", run_id, error)

    def _progress(self, run_id: str, call_id: str, tool: str, text: str) -> None:
        entry = TraceEntry(
            at_ms=self.steps.clock(),
            run=run_id,
            kind="progress",
            text=cut(text, 500),
            call_id=call_id,
            tool=tool,
        )
        try:
            self.store.add_trace(run_id, entry)
        except StoreUnavailable as error:
            log.warning("could not record progress of %s of run %s: %s", call_id, run_id, error)


def _with_ran(event: InboxEvent, attempt: int, took_ms: int) -> InboxEvent:
    """`event` with who made its call (the attempt, the worker, the task that carried it)
    and how long it took."""
    if not isinstance(event, ModelReplied | ModelFailed | ToolDone):
        return event
    here = carrier()
    stubbed = event.ran is not None and event.ran.stubbed
    ran = Ran(attempt=attempt, worker=here.worker, task=here.task, ms=took_ms, stubbed=stubbed)
    return event.model_copy(update={"ran": ran})


def _log_fenced(call: Claimed) -> None:
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
    if attempts > MAX_CALL_ATTEMPTS:
        return ToolOutput.unknown(
            f"it was tried {MAX_CALL_ATTEMPTS} times and each worker stopped mid-call"
        )
    return None


def _route_holder(call: Claimed) -> str:
    """A model call's name at the routes: the same each time it comes back, so it keeps
    its place in a route's queue."""
    return f"{call.asked.run_id}|{call.asked.seq}"
