"""The worker side of Relay: what the tasks do.

    relay.advance(run)           Steps.advance: apply the inbox, save, send what follows
    relay.call_model(run, seq)   Calls.call_model: claim, call the model, keep its reply
    relay.run_tool(run, call)    Calls.run_tool: claim, run the tool, keep its result
    relay.tick()                 the fleet's tick, through its lock: schedules, then heal

A step task may go on with its run's next step in place of publishing it
(`workers.runtime.continuation`, `RELAY_INLINE_MS`): `Runtime.task` is what each task runs.

`heal` is the runtime's part of the tick: it declines approvals whose time ran
out, prunes expired runs from the index, and sends again whatever the outbox
says nobody dealt with (a lost message, a dead worker's call).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from workers.engine.budget import Price
from workers.engine.effects import Message
from workers.engine.events import CancelRun, expiry_event
from workers.engine.records import Pending
from workers.kit.agents import AgentKit
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteLimits
from workers.model.pricing import Pricing
from workers.model.router import ModelRouter
from workers.model.transport import ModelSource
from workers.runtime.calls import Calls
from workers.runtime.continuation import Continuation, Reach
from workers.runtime.metrics import FleetMetrics
from workers.runtime.reports import Report
from workers.runtime.steps import Steps
from workers.runtime.telemetry import Telemetry
from workers.runtime.tick import Ticker
from workers.settings import Settings, now_ms
from workers.store.runs import RunStore
from workers.store.scripts import Decided

__all__ = ["Runtime"]

log = logging.getLogger(__name__)


class Runtime:
    """The tasks' bodies, shared by every task of one process."""

    def __init__(
        self,
        settings: Settings,
        store: RunStore,
        kit: AgentKit,
        *,
        models: ModelSource,
        send: Callable[[list[Message]], None],
        tick: Callable[[int], object],
        prices: Mapping[str, Price] | None = None,
        routes: Sequence[ModelRoute] = (),
        key: str = "relay",
        key_concurrency: int | None = None,
        reach: Reach | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.store = store
        self.send = send
        self.timing = settings.timing
        # Steps send through it: one next step may be kept and run by the same task.
        self.inline = Continuation(send, settings.inline_ms, reach)
        self.steps = Steps(store, kit, self.timing, self.inline.send, clock)
        routed = routes if models.given is None else ()
        pricing = Pricing(prices or {}, settings.model, settings.model_max_tokens, routed)
        router = None
        if routed:
            router = ModelRouter(
                routed,
                RouteLimits(store.connection),
                models.for_route,
                key_concurrency=key_concurrency,
                lease_ms=self.timing.lease_ms,
                clock=clock,
            )
        self.calls = Calls(
            self.steps,
            settings,
            spec=kit.spec,
            model=models.get,
            pricing=pricing,
            router=router,
            key=key,
        )
        self.ticker = Ticker(store, tick, settings.tick_seconds, clock)
        self.metrics = FleetMetrics(store.connection, store.shards, store.people)
        self.telemetry = Telemetry(settings.model_url)
        self._route_models = {route.name: route.model for route in routed}
        self._key = key
        self._model = settings.model

    # Each returns what the task did, in one line (workers.runtime.reports): Flower shows it.

    def task(self, message: Message, hard_limit_s: float | None = None) -> Report:
        """What a step task does: `message`'s step, then those it continues in place
        (`hard_limit_s`: the task's time limit, where the pool kills at it)."""
        return self.inline.run(message, self._step, hard_limit_s)

    def _step(self, message: Message) -> Report:
        if message.kind == "call_model":
            return self.call_model(message.run, message.seq)
        if message.kind == "run_tool":
            return self.run_tool(message.run, message.call)
        return self.advance(message.run)

    def advance(self, run_id: str) -> Report:
        return self._seen("advance", self.steps.advance(run_id))

    def call_model(self, run_id: str, seq: int) -> Report:
        return self._seen("call_model", self.calls.call_model(run_id, seq))

    def run_tool(self, run_id: str, call_id: str) -> Report:
        return self._seen("run_tool", self.calls.run_tool(run_id, call_id))

    def _seen(self, task: str, report: Report) -> Report:
        """Count the task in the fleet's metrics, and trace its call."""
        facts = report.call
        if facts is not None:  # the model that served it; the app's key unless the run has one
            name = self._route_models.get(facts.route) or facts.name or self._model
            report = replace(report, call=replace(facts, name=name, key=facts.key or self._key))
        self.metrics.count(task, report)
        if report.call is not None:
            self.telemetry.record(report.call)
        return report

    def tick(self) -> None:
        """Tick unless another process ticked in this interval (the `relay.tick` task)."""
        self.ticker.tick_once()

    def start_ticking(self) -> Callable[[], None]:
        """Take part in the fleet's tick from a thread; return a function that stops it."""
        return self.ticker.start()

    # --- the tick's part ----------------------------------------------------------------------

    def heal(self, now: int) -> int:
        """Re-send what was never dealt with, decline what expired; return how many were re-sent."""
        for pending in self.store.people.expired_pending(now):
            self._expire(pending, now)
        for root in self.store.upkeep.deadlines_due(now):
            self._time_is_up(root, now)
        self.store.upkeep.prune_runs(now - self.timing.retention_s * 1000)
        members = self.store.upkeep.due_messages(now)
        self.store.upkeep.postpone(members, now + self.timing.grace_ms)
        messages = [m for m in (Message.of(member) for member in members) if m is not None]
        self.send(messages)
        return len(messages)

    def _time_is_up(self, root: str, now: int) -> None:
        """Stop a tree whose budget's `seconds` ran out, waiting or not (a finished one
        ignores it)."""
        stop = CancelRun(reason="The run's time budget ran out.", stop="budget_exceeded")
        if self.store.append(root, stop, now + self.timing.grace_ms, cancel_flag=True):
            self.send([Message("advance", root)])
        self.store.upkeep.forget_deadline(root)

    def _expire(self, pending: Pending, now: int) -> None:
        """Decline (or answer for) what waited too long, and wake the run to hear it."""
        what = pending.call_id if pending.call_id is not None else str(pending.seq)
        event = expiry_event(pending.kind, what)
        decided = self.store.people.decide(
            pending.run_id,
            pending.kind,
            what,
            event,
            expired=event,
            now_ms=now,
            due_ms=now + self.timing.grace_ms,
        )
        if decided in (Decided.APPLIED, Decided.EXPIRED):
            self.send([Message("advance", pending.run_id)])
