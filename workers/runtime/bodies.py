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

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from functools import partial

from workers.engine.budget import Price
from workers.engine.effects import Message
from workers.kit.agents import AgentKit
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteLimits
from workers.model.pricing import Pricing
from workers.model.router import ModelRouter
from workers.model.transport import ModelSource
from workers.runtime.calls import Calls, Handed, HeldOutcome
from workers.runtime.carrier import carrier, name_runs_in_logs, working_on
from workers.runtime.claims import Claims
from workers.runtime.metrics import FleetMetrics
from workers.runtime.on_loop import LoopCalls, Stopped, Waiter
from workers.runtime.placement import Placement, Reach, Slice, label
from workers.runtime.reports import Report
from workers.runtime.steps import Steps
from workers.runtime.telemetry import Telemetry
from workers.runtime.tick import Healing, Ticker
from workers.settings import Settings, now_ms
from workers.store.runs import RunStore

__all__ = ["Runtime"]

log = logging.getLogger(__name__)

_MAY_WAIT: ContextVar[bool] = ContextVar("relay_may_wait", default=False)
"""Whether the task running here may wait a moment for a quick model reply (`Runtime.task`
sets it; off elsewhere: a keeper, one of a message's several runs)."""


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
        # Steps send through it: one next step may be kept and run by the same thread.
        self.placement = Placement(send, settings.inline_ms, reach)
        self.steps = Steps(store, kit, timing, self.placement.send, clock, app=key)
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
        self.claims = Claims(store, kit, pricing, timing.lease_ms, clock)
        self.steps.placement, self.steps.claims = self.placement, self.claims
        self.on_loop = None
        if settings.model_carried:
            self.on_loop = LoopCalls(
                settings.model_carried, store, router, lease_s=timing.lease_ms / 1000, clock=clock
            )
        self.calls = Calls(
            self.steps, settings, model=models.get, pricing=pricing, router=router, key=key,
            claims=self.claims, on_loop=self.on_loop,
        )  # fmt: skip
        self._stop_wait_s = settings.model_timeout
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

    # --- a task's life: body, placement, observe -----------------------------------------

    def task(
        self, message: Message, hard_limit_s: float | None = None, *, alone: bool = True
    ) -> Report:
        """The body of a step task: `message`'s step, then those it continues in place;
        what it did, in one line (`workers.runtime.reports`: Flower shows it).
        `hard_limit_s`: the task's time limit, where the pool kills at it. `alone`: False
        for one of the runs a message carries (`relay.advances`), which never waits for a
        quick reply: the message's next run would wait behind it. Nor does a task on the
        process's main thread (a prefork child, a solo worker): it is the process's only
        slot, and waiting 50 ms for each reply took a third off what a prefork fleet got
        through when messages queued (`bench.many`); a threads pool's others go on."""
        self.claims.release_held()  # (none, unless a task was cut off after its save)
        self._gauge_held()  # (an idle process says what it could hold, too)
        here = self.placement.open(hard_limit_s)
        waits = _MAY_WAIT.set(alone and threading.current_thread() is not threading.main_thread())
        try:
            return self._go_on(here, self._step(message))
        finally:
            _MAY_WAIT.reset(waits)
            self.placement.close(here)

    def _step(self, message: Message) -> Report:
        """One step: its body (the engine, a model call, a tool call); where a model call
        goes on (held on the loop, if the body handed it over); what it did, observed."""
        if message.kind == "call_model":
            done = self.calls.call_model(message.run, message.seq)
        elif message.kind == "run_tool":
            done = self.calls.run_tool(message.run, message.call)
        else:
            done = self.steps.advance(message.run)
        if isinstance(done, Handed):
            return self._hand(done)  # (observed once the call is kept)
        return self._counted(message.kind, done)

    def _go_on(self, here: Slice | None, report: Report) -> Report:
        """`report`, followed by each step the slice `here` kept to run in place."""
        while (message := self.placement.next(here)) is not None:
            report = report.continued(label(message), self._continued(message))
        return report

    def _continued(self, message: Message) -> Report:
        try:
            return self._step(message)
        except Exception as error:  # noqa: BLE001 - its message goes out; the first step stands
            log.warning("continuing %s failed (%s); it is published instead", label(message), error)
            self.placement.publish([message])  # a second delivery is harmless (claims, fences)
            return Report(f"failed ({type(error).__name__}); published instead")

    # --- model calls held on the loop ----------------------------------------------------

    def _hand(self, handed: Handed) -> Report:
        """Start a call the body handed over on the process's loop; the task goes on, after
        keeping the call's outcome itself if the reply came at once (`on_loop.Waiter`)."""
        assert self.on_loop is not None
        waiter = self.on_loop.waiter() if _MAY_WAIT.get() else None
        with working_on(handed.lease.run_id, handed.lease.what):
            self.on_loop.start(handed.lease, self._held(handed, waiter))
        self._gauge_held()
        outcome = None if waiter is None else waiter.wait()
        if outcome is not None:  # (the task's slice goes on with what its save kept)
            return self._kept_held(handed, outcome)
        return handed.report

    async def _held(self, handed: Handed, waiter: Waiter | None) -> None:
        """On the loop: make the call, then keep its outcome: in the task that handed it
        over, if it still waits, else on a keeper thread."""
        assert self.on_loop is not None
        outcome: HeldOutcome
        try:
            outcome = await handed.outcome
        except asyncio.CancelledError:
            outcome = Stopped.HANDED_BACK
        except Exception as error:  # noqa: BLE001 - the keeper says what it means
            outcome = error
        why = self.on_loop.made(handed.lease)
        if waiter is not None and waiter.give(why or outcome):
            return
        await self.on_loop.on_keeper(partial(self._keep_held, handed, why or outcome))

    def _kept_held(self, handed: Handed, outcome: HeldOutcome) -> Report:
        """Keep a held call's outcome, counted as the call's own."""
        try:
            return self._counted("call_model", self.calls.keep_held(handed, outcome))
        except Exception as error:  # noqa: BLE001 - its lease lapses; the tick re-sends it
            log.warning("a held call failed before its outcome was saved: %s", error)
            return Report(f"failed before its outcome was saved ({error})", failed=True)

    def _keep_held(self, handed: Handed, outcome: HeldOutcome) -> None:
        """On a keeper thread: keep a held call's outcome; go on with the run's next steps
        there as a task would, those that never wait (an advance, a model call handed back
        to the loop); tell who ends its task."""
        here = self.placement.open(keeper=True)
        try:
            report = self._go_on(here, self._kept_held(handed, outcome))
        finally:
            self.placement.close(here)
        self._gauge_held()
        if self._carried_end is not None:
            try:
                self._carried_end(report)
            except Exception as error:  # noqa: BLE001 - Flower's view must not lose the keeper
                log.warning("could not end the task of a held call in Flower: %s", error)

    def _gauge_held(self) -> None:
        """Tell the metrics how many calls the loop holds, of how many it may (`/metrics`)."""
        if self.on_loop is not None:
            self.metrics.held(self.on_loop.in_flight, self.on_loop.most, carrier().worker)

    def on_carried_end(self, hook: Callable[[Report], None]) -> None:
        """Tell `hook` what each model call the loop held did once it is kept, on a keeper
        thread, in the context of the task that handed it over (`runtime.carrier`): the
        Celery tasks end that task in Flower then (`celery_app.flower`)."""
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
