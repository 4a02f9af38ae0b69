"""What each task does: one entry per task, then its work.

    relay.advance(run)           Steps.advance: apply the inbox, save, send what follows
    relay.call_model(run, seq)   Calls.call_model: claim, call the model, keep its reply
    relay.run_tool(run, call)    Calls.run_tool: claim, run the tool, keep its result
    relay.tick()                 Ticker: the fleet's tick, through its lock (schedules,
                                 then Healing)

`Runtime.task` is the body of every step task: the step its message asks for,
then each next step it may continue in place of publishing it
(`workers.runtime.continuation`, `RELAY_INLINE_MS`). A model call is handed to the
process's event loop (`workers.runtime.on_loop`), which holds it past its task; its
outcome is kept on a keeper thread, which goes on with the run as a task would. Every
step is counted in the fleet's metrics and its call traced (OpenTelemetry) as it
ends. Nothing here knows Celery: `workers.celery_app` registers these bodies as tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from workers.engine.budget import Price
from workers.engine.effects import Message
from workers.kit.agents import AgentKit
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteLimits
from workers.model.pricing import Pricing
from workers.model.router import ModelRouter
from workers.model.transport import ModelSource
from workers.runtime.calls import Calls
from workers.runtime.carrier import name_runs_in_logs
from workers.runtime.continuation import Continuation, Reach
from workers.runtime.metrics import FleetMetrics
from workers.runtime.on_loop import LoopCalls
from workers.runtime.reports import Report
from workers.runtime.steps import ClaimAhead, Steps
from workers.runtime.telemetry import Telemetry
from workers.runtime.tick import Healing, Ticker
from workers.settings import Settings, now_ms
from workers.store.runs import Claim, RunStore

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
        timing = settings.timing
        # Steps send through it: one next step may be kept and run by the same task.
        self.continuation = Continuation(send, settings.inline_ms, reach)
        self.steps = Steps(store, kit, timing, self.continuation.send, clock, app=key)
        routed = routes if models.given is None else ()
        pricing = Pricing(prices or {}, settings.model, settings.model_max_tokens, routed)
        router = None
        if routed:
            router = ModelRouter(
                routed,
                RouteLimits(store.connection),
                models.for_route,
                key_concurrency=key_concurrency,
                lease_ms=timing.lease_ms,
                clock=clock,
            )
        self._stop_wait_s = settings.model_timeout
        self.calls = Calls(
            self.steps, settings, model=models.get, pricing=pricing, router=router, key=key
        )
        self.on_loop = None
        if settings.model_carried:
            self.on_loop = LoopCalls(
                settings.model_carried, self.calls.renew_held, self._carried_done,
                lease_s=timing.lease_ms / 1000, kept=self._keep_held,
            )  # fmt: skip
            self.calls.on_loop = self.on_loop
        self.steps.in_place = _ClaimsInPlace(self.continuation, self.calls)
        self.ticker = Ticker(store.upkeep, tick, settings.tick_interval, clock)
        self.healing = Healing(store, send, timing)
        self.metrics = FleetMetrics(
            store.connection, store.shards, store.people, settings.metrics_flush_ms
        )
        self.telemetry = Telemetry(settings.model_url)
        self._carried_end: Callable[[Report], None] | None = None
        self._route_models = {route.name: route.model for route in routed}
        self._key = key
        self._model = settings.model
        name_runs_in_logs()  # a worker's lines about a call name its run and call

    def task(self, message: Message, hard_limit_s: float | None = None) -> Report:
        """The body of a step task: `message`'s step, then those it continues in place;
        what it did, in one line (`workers.runtime.reports`: Flower shows it).
        `hard_limit_s`: the task's time limit, where the pool kills at it."""
        self.calls.release_held()  # (none, unless a task was cut off after its save)
        self._gauge_held()  # (an idle process says what it could hold, too)
        return self.continuation.run(message, self._step, hard_limit_s)

    def _step(self, message: Message) -> Report:
        """One step, the one its message asks for, counted and traced."""
        if message.kind == "call_model":
            report = self.calls.call_model(message.run, message.seq)
        elif message.kind == "run_tool":
            report = self.calls.run_tool(message.run, message.call)
        else:
            report = self.steps.advance(message.run)
        if not report.carried:
            return self._counted(message.kind, report)
        self._gauge_held()
        return report

    def _keep_held(self, keep: Callable[[], Report]) -> Report:
        """Keep the outcome of a call the loop held (`keep`, on a keeper thread), counted and
        traced as the call's own; then go on with the run's next steps there as a task
        would, those that never wait: an advance, and a model call (handed to the loop)."""

        def counted() -> Report:
            return self._counted("call_model", keep())

        return self.continuation.on_keeper(counted, self._step)

    def _carried_done(self, report: Report) -> None:
        """A model call the loop held was kept (on a keeper thread), with the steps continued
        after it: say so to whoever ends its task (`on_carried_end`)."""
        self._gauge_held()
        if self._carried_end is not None:
            self._carried_end(report)

    def _gauge_held(self) -> None:
        """Tell the metrics how many calls the loop holds, of how many it may (`/metrics`)."""
        if self.on_loop is not None:
            self.metrics.held(self.on_loop.in_flight, self.on_loop.most)

    def on_carried_end(self, hook: Callable[[Report], None]) -> None:
        """Tell `hook` what each model call the loop held did once it is kept, on a keeper
        thread, in the context of the task that handed it over (`runtime.carrier`): the
        Celery tasks end that task in Flower then (`celery_app.carried_ends`)."""
        self._carried_end = hook

    def _counted(self, kind: str, report: Report) -> Report:
        """`report`, its call named by the model that served it (the app's key unless the
        run has one), counted in the metrics and recorded as a span."""
        facts = report.call
        if facts is not None:
            name = self._route_models.get(facts.route) or facts.name or self._model
            report = replace(report, call=replace(facts, name=name, key=facts.key or self._key))
        self.metrics.count(kind, report)
        if report.call is not None:
            self.telemetry.record(report.call)
        return report

    def stop(self) -> None:
        """This process stops: let the model calls its loop holds end (as long as a call may
        go without a byte, RELAY_MODEL_TIMEOUT), give back the claims of those that have not,
        then write what it counted and has not yet."""
        if self.on_loop is not None:
            left = self.on_loop.wait_idle(self._stop_wait_s)
            if left:
                log.warning("stopping with %d model calls held: their claims are given back", left)
                left = self.on_loop.hand_back()
            if left:
                log.warning("%d held model calls were not given back: their leases lapse", left)
        self.metrics.stop()

    def tick(self) -> None:
        """Tick unless another process ticked in this interval (the `relay.tick` task)."""
        self.ticker.tick_once()

    def start_ticking(self) -> Callable[[], None]:
        """Take part in the fleet's tick from a thread; return a function that stops it."""
        return self.ticker.start()

    def heal(self, now: int) -> int:
        """The runtime's part of a tick (`Healing.heal`); how many messages it re-sent."""
        return self.healing.heal(now)


class _ClaimsInPlace:
    """The call a task continues in place (`Continuation.ahead`) is claimed with the save
    that decided it (`Steps.save`), and held for the task's next step (`Calls.hand`)."""

    def __init__(self, continuation: Continuation, calls: Calls) -> None:
        self._continuation = continuation
        self._calls = calls

    def claim_for(self, messages: Sequence[Message]) -> ClaimAhead | None:
        message = self._continuation.ahead(messages)
        terms = None if message is None else self._calls.claim_ahead(message)
        return None if message is None or terms is None else ClaimAhead(message, terms)

    def keep(self, ahead: ClaimAhead, claim: Claim) -> None:
        self._calls.hand(ahead.claim, claim)
        self._continuation.keep(ahead.message, lambda: self._calls.release(ahead.claim))
