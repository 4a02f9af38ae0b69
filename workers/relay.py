"""`Relay`: one app's tools, specialists and settings, and the client API to its runs.

    relay = Relay("notes", config=Config(max_batch=4))

    @relay.tool(risk=Risk.WRITE)
    def write_file(path: str, text: str) -> str:
        \"\"\"Write a text file.\"\"\"

    run_id = relay.start("Copy notes.txt to backup.txt")
    relay.wait(run_id, timeout=60)

A Relay is made of explicit parts, each built on first use:

    relay.kit          the tools, specialists and skills its agents are made of (AgentKit)
    relay.store        its Redis (RunStore)
    relay.celery       its Celery app, with the tasks (`celery -A mymodule:app worker`)
    relay.runtime      what the tasks do (Runtime): a worker builds it as it starts
    relay.runs_client  the client API to runs: status, decisions, traces, steering (RunsClient)
    relay.scheduling   ... and to schedules (Scheduling)

`start` and `tick` are here; other client methods go to `runs_client`, `scheduling`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from celery import Celery

import scheduler
from agent_core import (
    Attachment,
    Config,
    Outcome,
    Policy,
    Recipe,
    Risk,
    Skill,
    Specialist,
    Tool,
    ToolArgsError,
    Trigger,
    UsageError,
)
from agent_core.args import check_args
from scheduler import Notification, Schedule, ScheduleStore
from scheduler.schedules import Mode
from workers.celery_app.app import Queues, build_celery
from workers.celery_app.sending import Sender, WorkerReach, sender
from workers.celery_app.tasks import register_tasks
from workers.client.replays import Diff, MadeCall, ReplayReport, Replays
from workers.client.runs import RunsClient
from workers.client.schedules import Scheduling
from workers.client.start import (
    PreparedRun,
    Recorded,
    Unattended,
    checked_concurrency,
    checked_many,
    checked_on_wait,
    checked_prices,
    new_run,
    recorded_stubs,
    start_steps,
    with_policy,
)
from workers.engine.budget import Budget, Price
from workers.engine.effects import Message
from workers.engine.records import Pending, ReplyStrategy, RunStatus, StreamEvent, TraceEntry
from workers.engine.working import Verifier
from workers.errors import DecisionRefused
from workers.kit.agents import AgentKit
from workers.kit.skills import gather_skills
from workers.mcp.config import MCPServer, checked_servers, load_servers
from workers.mcp.mapping import MCPTool
from workers.mcp.toolset import MCPCall, MCPToolset
from workers.model.endpoints import ModelRoute, checked_routes, routes_from
from workers.model.limits import RouteLimits, RouteState
from workers.model.pricing import load_prices
from workers.model.transport import ModelSource
from workers.model.wire import Model
from workers.runtime.bodies import Runtime
from workers.settings import Settings, now_ms
from workers.store.runs import RunStore

__all__ = ["Relay"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class _Parts:
    """What talks to Redis and the broker, built together on first use (a client never
    builds the runtime: the worker does, at its first task or tick)."""

    store: RunStore
    celery: Celery
    send: Sender
    runs: RunsClient


class Relay:
    """Tools, specialists and settings of one Relay app, and the client API to its runs."""

    def __init__(
        self,
        name: str = "relay",
        *,
        config: Config | None = None,
        specialists: Sequence[Specialist] = (),
        skills: Sequence[Skill] = (),
        skills_dir: str | os.PathLike[str] | None = None,
        questions: bool = False,
        settings: Settings | None = None,
        model: Model | None = None,
        prices: Mapping[str, Price] | None = None,
        models: Sequence[ModelRoute] | None = None,
        key_concurrency: int | None = None,
        mcp: Sequence[MCPServer] | None = None,
    ) -> None:
        self.name = name
        self.settings = settings if settings is not None else Settings.from_env()
        from_file = load_prices(self.settings.prices) if self.settings.prices else {}
        self.prices: dict[str, Price] = {**from_file, **checked_prices(prices)}
        """Dollars per million tokens by model name (RELAY_PRICES, then `prices`)."""
        self.config = config or Config()
        skills_found, self.skills_report = gather_skills(skills, skills_dir)
        """`skills` and every skill under `skills_dir`; the report says what did not load."""
        self.kit = AgentKit(
            specialists=specialists,
            skills=skills_found,
            questions=questions,
            tool_output_chars=self.settings.tool_output_chars,
            tool_timeout=self.settings.tool_timeout,
        )
        self.scheduling = Scheduling(lambda: self.store, lambda: self.tools)
        self._models = ModelSource(self.settings, model)
        self.routes = routes_from(models, self.settings)
        """The model routes, tried in order (`models`, RELAY_MODELS, or RELAY_MODEL_URL's)."""
        self.key_concurrency = checked_concurrency(key_concurrency) or (
            self.settings.key_concurrency or None
        )
        self._lock = threading.Lock()
        self._parts: _Parts | None = None
        self._runtime: Runtime | None = None
        servers = checked_servers(mcp) or (
            load_servers(self.settings.mcp) if self.settings.mcp else ()
        )
        self.mcp = MCPToolset(name, servers, self.settings.tool_output_chars) if servers else None
        """The MCP servers whose tools the agents may call (`mcp`, or RELAY_MCP's)."""
        if self.mcp is not None:
            self.kit.defer(self._add_mcp_tools)

    @property
    def specialists(self) -> tuple[Specialist, ...]:
        return self.kit.specialists

    @property
    def skills(self) -> tuple[Skill, ...]:
        return self.kit.skills

    # --- registering tools ------------------------------------------------------------

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        /,
        *,
        risk: Risk = ...,
        idempotent: bool | None = ...,
        name: str | None = ...,
        timeout: float | None = ...,
        lease_seconds: float | None = ...,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        risk: Risk = Risk.WRITE,
        idempotent: bool | None = None,
        name: str | None = None,
        timeout: float | None = None,
        lease_seconds: float | None = None,
    ) -> Any:
        """Register a function as a tool (`@relay.tool` or `@relay.tool(risk=Risk.READ)`).

        The description comes from the docstring, the arguments from the type
        hints. READ tools are idempotent unless told otherwise; others are not.
        `timeout` caps how long a call may run (default RELAY_TOOL_TIMEOUT).
        `lease_seconds` is for tools that can hold the GIL for long stretches (C
        code, CPU-bound work): the worker renews a call's claim every third of its
        lease, and a claim not renewed in time lets another worker take the call
        over (the late outcome is then discarded). Default: RELAY_RECOVERY_SECONDS
        less one tick interval and two seconds (8 s at the defaults), the lease
        that lets a dead worker's call be picked up within the recovery time.
        """

        def register(function: F) -> F:
            self.kit.register(
                function,
                risk=risk,
                idempotent=idempotent,
                name=name,
                timeout=timeout,
                lease_seconds=lease_seconds,
            )
            return function

        return register(fn) if fn is not None else register

    def add_tool(
        self,
        tool: Tool,
        fn: Callable[..., Any],
        *,
        idempotent: bool | None = None,
        timeout: float | None = None,
        context_param: str | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        """Register an `agent_core.Tool` with the function that runs it (called with its args)."""
        self.kit.add(
            tool,
            fn,
            idempotent=idempotent,
            timeout=timeout,
            context_param=context_param,
            lease_seconds=lease_seconds,
        )

    def _add_mcp_tools(self) -> None:
        """Add the MCP servers' tools to the kit, as Redis keeps their listings (listed
        from the servers when it keeps none)."""
        assert self.mcp is not None
        listings = self.mcp.listings(self.store.redis, self.settings.prefix)
        for made, call in self.mcp.tools(listings, taken=sorted(self.kit.names())):
            server = call.server
            self.kit.add(made.tool, call, idempotent=made.idempotent, timeout=server.timeout)

    def refresh_mcp(self) -> list[tuple[MCPTool, MCPCall]]:
        """List every MCP server again and keep what each lists now in Redis, for every
        process of the app; this Relay offers them from now on, and they are returned.
        Running workers keep the
        listing they started with (and refuse calls to a server that now lists other
        tools) until they restart.

        Raises:
            MCPServerError: a server could not be started or reached (nothing is replaced).
        """
        if self.mcp is None:
            return []
        listings = self.mcp.listings(self.store.redis, self.settings.prefix, refresh=True)
        before = [t.name for t in self.kit.tools if isinstance(self._fn_of(t.name), MCPCall)]
        self.kit.drop(before)
        made = self.mcp.tools(listings, taken=sorted(self.kit.names()))
        for tool, call in made:
            self.kit.add(tool.tool, call, idempotent=tool.idempotent, timeout=call.server.timeout)
        return made

    def _fn_of(self, tool: str) -> object:
        spec = self.kit.spec(tool)
        return None if spec is None else spec.fn

    def verifier(self, fn: Verifier) -> Verifier:
        """Register a check of each final answer: return a problem to send it back, or None."""
        self.kit.verifier = fn
        return fn

    @property
    def tools(self) -> list[Tool]:
        """The registered tools, in the order they were registered."""
        return self.kit.tools

    def model(self) -> Model:
        """Return this process's model backend (one HTTP client per process, made after fork)."""
        return self._models.get()

    @property
    def has_model(self) -> bool:
        """Whether this Relay can call a model: it was given one, or has routes (`models`,
        RELAY_MODELS or RELAY_MODEL_URL). Without, every model call fails at once."""
        return self._models.given is not None or bool(self.routes)

    # --- the parts, built on first use -------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url or DEFAULT_REDIS_URL

    @property
    def queues(self) -> Queues:
        return Queues.under(self.settings.prefix)

    def _built(self) -> _Parts:
        with self._lock:
            if self._parts is None:
                settings = self.settings
                store = RunStore(self.redis_url, settings.prefix, cluster=settings.cluster)
                app = build_celery(self.name, settings, settings.broker_url or self.redis_url)
                send = sender(app, self.queues, self.kit.timeout_of, settings.inline_ms)
                register_tasks(app, lambda: self.runtime)
                self._parts = _Parts(store, app, send, RunsClient(store, send, settings.timing))
            return self._parts

    @property
    def store(self) -> RunStore:
        return self._built().store

    def send_messages(self, messages: list[Message]) -> None:
        """Send task messages to the workers (through the app's Celery producer)."""
        self._built().send(messages)

    @property
    def celery(self) -> Celery:
        """The Celery app: `celery -A mymodule:app worker` with `app = relay.celery`."""
        return self._built().celery

    @property
    def runtime(self) -> Runtime:
        """What the tasks do, built on first use: in a worker, at its first task or tick."""
        parts = self._built()
        with self._lock:
            if self._runtime is None:
                settings = self.settings
                reach = WorkerReach(parts.celery, self.queues, self.kit.timeout_of, settings)
                self._runtime = Runtime(
                    settings,
                    parts.store,
                    self.kit,
                    models=self._models,
                    send=parts.send,
                    tick=self.tick,
                    prices=self.prices,
                    routes=self.routes,
                    key=self.name,
                    key_concurrency=self.key_concurrency,
                    reach=reach,
                )
            return self._runtime

    @property
    def runs_client(self) -> RunsClient:
        return self._built().runs

    # --- starting runs, and the tick ------------------------------------------------------------

    def start(
        self,
        task: str,
        context: str = "",
        *,
        config: Config | None = None,
        attachments: Iterable[Attachment] | None = None,
        budget: Budget | int | None = None,
        tools: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
        recipe: str | None = None,
        schedule: str | None = None,
        run_id: str | None = None,
        key: str | None = None,
        memory: str | None = None,
        route: str | Sequence[str] | None = None,
        recorded: Mapping[str, Sequence[Recorded]] | None = None,
        policy: Policy | None = None,
        approve_plan: bool = False,
        fired_ms: int | None = None,
        on_wait: str = "wait",
    ) -> str:
        """Start a run and return its id. It begins on a worker at once.

        `budget` caps what the run and its children may spend (a `Budget`: tokens,
        dollars, model calls, seconds; an int is a token budget); `tools` narrows
        the registered tools; `notes` enables memory with these notes; the notes it
        remembers are kept under `memory`, a name, for the next runs that give it.
        `run_id` names the run (letters and digits): starting a run whose id
        exists already does nothing and returns that id, so a retried start is safe.
        `key` groups runs for fair shares of the model routes (a tenant, say;
        default: the app's name): when a route is saturated, waiting keys take
        turns, and `Relay(key_concurrency=N)` caps each key's calls in flight.
        `route`: the model route(s) its calls take, in order (default: all). `recorded`:
        tools whose calls never run, each answered with the `Recorded` outcome for its
        arguments (or for any), else an error: what `relay eval` runs cases with.
        For a schedule's unattended runs (README): `policy`, `approve_plan`, `fired_ms`
        (its firing) and `on_wait` ("notify" or "skip" instead of waiting for a person).

        Raises:
            RelayError: the task or attachments are too large, or a name is unusable.
            StoreUnavailable: Redis cannot be reached.
        """
        made = self.prepare_run(
            task, context, config=config, attachments=attachments, budget=budget,
            tools=tools, notes=notes, recipe=recipe, schedule=schedule, run_id=run_id,
            key=key, memory=memory, route=route, recorded=recorded, policy=policy,
            approve_plan=approve_plan, fired_ms=fired_ms, on_wait=on_wait,
            remembered=self.memory,
        )  # fmt: skip
        parts = self._built()
        return parts.store.connection.drive(
            start_steps(parts.store.keys, made, enlisted=parts.store.shards.enlist),
            on_emit=parts.send,  # (it takes the `Outgoing` the steps emit)
        )

    def start_many(self, tasks: Sequence[str], **options: Any) -> list[str]:
        """Start a run for each of `tasks`, each as `start` would with the same `options`
        (all but `run_id`); return their ids, in order.

        Every run is checked before any is stored. Their first steps are sent together,
        as few Celery messages (`relay.advances`, up to 100 runs each): a worker takes
        them in one delivery and advances each run as it would alone; Flower still lists
        one `relay.advance` per run.

        Raises:
            RelayError: as `start` does, for any of the tasks (then none is started), or
                `tasks` is not a list of tasks, or `run_id` was given.
            StoreUnavailable: Redis cannot be reached (the runs stored before are started).
        """
        made = [
            self.prepare_run(task, remembered=self.memory, **options)
            for task in checked_many(tasks, options)
        ]
        parts = self._built()
        with parts.send.together():  # (the runs stored before a failure are started too)
            return [
                parts.store.connection.drive(
                    start_steps(parts.store.keys, one, enlisted=parts.store.shards.enlist),
                    on_emit=parts.send,
                )
                for one in made
            ]

    def prepare_run(
        self,
        task: str,
        context: str = "",
        *,
        remembered: Callable[[str], list[str]],
        config: Config | None = None,
        attachments: Iterable[Attachment] | None = None,
        budget: Budget | int | None = None,
        tools: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
        recipe: str | None = None,
        schedule: str | None = None,
        run_id: str | None = None,
        key: str | None = None,
        memory: str | None = None,
        route: str | Sequence[str] | None = None,
        recorded: Mapping[str, Sequence[Recorded]] | None = None,
        policy: Policy | None = None,
        approve_plan: bool = False,
        fired_ms: int | None = None,
        on_wait: str = "wait",
    ) -> PreparedRun:
        """The run `start` would create, not yet stored (`AsyncRelay.start` stores it on its
        own transport); `remembered(name)` gives a memory's notes. Raises as `start`."""
        names, stubs = recorded_stubs(recorded, {t.name: t for t in self.tools})
        record, snapshot, start = new_run(
            self.kit, task, context, with_policy(config or self.config, policy),
            remembered=remembered,
            attachments=attachments, budget=budget, tools=tools, notes=notes, recipe=recipe,
            schedule=schedule, run_id=run_id, key=key, memory=memory, app=self.name,
            routes=checked_routes(route, [r.name for r in self.routes]), recorded=names,
            unattended=Unattended(fired_ms, approve_plan is True, checked_on_wait(on_wait)),
        )  # fmt: skip
        due = record.created_ms + self.settings.timing.grace_ms
        return PreparedRun(record, snapshot, start, stubs, due, named=run_id is not None)

    # --- going back into runs: replay, fork, diff -------------------------------------------

    def _replays(self) -> Replays:
        parts = self._built()
        return Replays(
            parts.store,
            self.kit,
            app=self.name,
            routes=[route.name for route in self.routes],
            grace_ms=self.settings.timing.grace_ms,
            start=lambda run_id: parts.send([Message("advance", run_id)]),
        )

    def replay(self, run_id: str) -> ReplayReport:
        """Play the run's journal back offline, in this process, with this app's code and
        tools (no model, no tool, no worker, nothing written): `identical` if every step
        is the one the run took, else the first divergence and why; `problem` if the run
        cannot be replayed (no journal, trimmed, corrupt)."""
        return self._replays().replay(run_id)

    def replay_waiting(self) -> list[ReplayReport]:
        """Replay every run that is running or parked: the check to run with new code
        before the old workers stop (see the README's "Upgrading a fleet")."""
        return self._replays().waiting()

    def fork(
        self,
        run_id: str,
        at: int,
        *,
        route: str | Sequence[str] | None = None,
        config: Config | Mapping[str, Any] | None = None,
        stub_tools: bool = False,
        task: str | None = None,
    ) -> str:
        """Start a new run from `run_id`'s state after its first `at` journal steps (reached
        by replay: no model call and no tool call for them), going on live; return its id.

        `route`: the model route(s) its calls take; `config`: a Config, or the fields to
        change; `stub_tools`: a tool call identical (tool and arguments, to the byte) to
        one the original or its specialists made gets that call's recorded outcome and
        runs nothing (nor asks a person); any other call follows the policy. `task`
        begins a new turn, after the original's end (fork at its last step). The fork's
        approvals and budget start afresh; its status says `forked_from`.

        Raises:
            RelayError: the run cannot be replayed to `at`, `at` is out of range or at
                the run's end without `task`, or a route or config is refused.
        """
        return self._replays().fork(
            run_id, at, route=route, config=config, stub_tools=stub_tools, task=task
        )

    def diff(self, a: str, b: str) -> Diff:
        """Two runs step by step, their first difference, outcomes and usage."""
        return self._replays().diff(a, b)

    def tool_calls(self, run_id: str) -> list[MadeCall]:
        """Every tool call the run and its specialists made, read from their journals:
        tool, the arguments it ran with (a person's edit included), outcome (None: none
        yet). A call a person denied is here, with the denial as its outcome.

        Raises:
            RelayError: the run has no journal to read (the message says why).
        """
        return self._replays().calls(run_id)

    def tick(self, now: int | None = None) -> list[str]:
        """Tick once, now (schedules, then healing); return the runs it started.

        The fleet's workers tick by themselves, one tick per interval between them;
        this is for a program that wants a tick of its own (or a clock of its own).
        What it sends (the runs its schedules fire, the messages it sends again) goes
        out together as it ends, so their advances share a few messages.
        """
        with self._built().send.together():
            return scheduler.tick(self, now_ms() if now is None else now)

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals (part of the tick)."""
        return self.runtime.heal(now)

    # --- runs that exist (workers.client.runs.RunsClient) -----------------------------------------

    def status(self, run_id: str) -> RunStatus:
        """Where the run is: its state, what it waits for, usage, outcome, children."""
        return self.runs_client.status(run_id)

    def wait(self, run_id: str, timeout: float = 60.0) -> Outcome:
        """The run's outcome once it finishes (WaitTimeout if it does not in time)."""
        return self.runs_client.wait(run_id, timeout)

    def route_states(self) -> list[RouteState]:
        """Each model route as the fleet shares it now: circuit, pause, calls, last error."""
        limits, now = RouteLimits(self._built().store.connection), now_ms()
        return [limits.state(route, now) for route in self.routes]

    def pending(self) -> list[Pending]:
        """What waits on a person: plans, calls and questions, oldest first."""
        return self.runs_client.pending()

    def approve(
        self,
        run_id: str,
        call_id: str,
        yes: bool = True,
        reason: str = "",
        *,
        args: dict[str, Any] | None = None,
        by: str = "",
    ) -> None:
        """Decide a call that waits for approval (DecisionRefused unless it is pending).

        `args`: approve the call with these arguments instead of the model's. They are
        checked against the call's tool exactly as the model's were (its declared kinds,
        then its `validate`); refused, the call stays pending and DecisionRefused says
        why. `by` names who decided, for the run's trace.
        """
        if args is not None and yes:
            args = self.checked_edit(run_id, call_id, args)
        self.runs_client.approve(run_id, call_id, yes, reason, by=by, args=args)

    def checked_edit(self, run_id: str, call_id: str, args: object) -> dict[str, Any]:
        """`args` as a pending call's edited arguments, checked against its tool.

        Raises:
            DecisionRefused: the call is not pending, this app does not know its tool, or
                the arguments are refused (the message says why).
        """
        return self.edit_checked(self.status(run_id), call_id, args)

    def edit_checked(self, status: RunStatus, call_id: str, args: object) -> dict[str, Any]:
        """`args` checked as the edited arguments of the call `call_id` that the run in
        `status` waits on (`checked_edit`, with the status read already)."""
        run_id = status.id
        pending = [p for p in status.pending if p.call_id == call_id]
        if not pending or pending[0].kind != "call" or pending[0].tool is None:
            raise DecisionRefused(f"call {call_id} of run {run_id} is not waiting for approval")
        spec = self.kit.spec(pending[0].tool)
        if spec is None:
            raise DecisionRefused(
                f"this app has no tool {pending[0].tool!r} to check edited arguments against:"
                " decide from the app that runs it (--app)"
            )
        if not isinstance(args, dict):
            raise DecisionRefused(f"edited arguments are a JSON object, got {type(args).__name__}")
        try:
            return check_args(spec.tool, args)
        except (ToolArgsError, UsageError) as error:
            raise DecisionRefused(f"the edited arguments are refused: {error}") from None

    def deny(self, run_id: str, call_id: str, reason: str = "") -> None:
        """Decline a call that waits for approval (the model is told)."""
        self.runs_client.deny(run_id, call_id, reason)

    def approve_plan(self, run_id: str, yes: bool = True, *, by: str = "") -> None:
        """Decide the plan a run waits on (`by`: who decided, as the trace says)."""
        self.runs_client.approve_plan(run_id, yes, by=by)

    def answer(self, run_id: str, text: str, *, by: str = "") -> None:
        """Answer the question a run waits on (`by`: who answered, as the trace says)."""
        self.runs_client.answer(run_id, text, by=by)

    def extend(self, run_id: str, more: Budget, *, step: int | None = None, by: str = "") -> int:
        """Raise the tree's budget by `more` and let its parked runs go on; with `step`,
        once, as the decision of the wait `run_id` is parked at at that step; `by`: who
        raised it, for the trace (see RunsClient)."""
        return self.runs_client.extend(run_id, more, step=step, by=by)

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Stop a run and its children; False if it had finished already."""
        return self.runs_client.cancel(run_id, reason)

    def run_states(self, run_ids: Sequence[str]) -> list[str | None]:
        """Each run's state ("running", "waiting", "finished"), None for no such run."""
        return [None if b is None else b[0] for b in self._built().store.briefs(run_ids)]

    def trace(self, run_id: str) -> list[TraceEntry]:
        """The run's trace so far (its own events; children have their own)."""
        return self.runs_client.trace(run_id)

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[TraceEntry]:
        """Follow the trace of a run and its descendants as it happens, until it finishes."""
        return self.runs_client.watch(run_id, timeout=timeout)

    def runs(self, limit: int = 100, state: str = "", before: str = "") -> list[RunStatus]:
        """The newest runs first (those not yet expired): only those in `state` if given
        (`running`, `waiting`, `finished`, or how a finished run ended: `done`, `failed`,
        `cancelled`, `declined`), filtered before they are cut to `limit`; created before
        `before` if given (`workers.client.runs.page_cursor` of the last run of the page
        before).

        Raises:
            ValueError: `state` is no state, or `before` no cursor.
        """
        return self.runs_client.runs(limit, state, before)

    def count_runs(self, state: str = "") -> int:
        """How many runs are in `state` (every run if ""), counting expired runs until the
        tick prunes them."""
        return self.runs_client.count_runs(state)

    def memory(self, name: str) -> list[str]:
        """The notes kept under a memory's name, oldest first (its next run sees them)."""
        return self.runs_client.memory(name)

    def stream(
        self, run_id: str, after: str = "0", *, timeout: float | None = None
    ) -> Iterator[StreamEvent]:
        """A run's (and its specialists') replies as they are written, until it finishes."""
        return self.runs_client.stream(run_id, after, timeout=timeout)

    def send(self, run_id: str, text: str) -> None:
        """Give a working (or parked) run a person's message, seen at its next model call."""
        self.runs_client.send(run_id, text)

    def pause(self, run_id: str) -> bool:
        """Park the run at its next step, holding no worker; False if it had finished."""
        return self.runs_client.pause(run_id)

    def resume(self, run_id: str) -> bool:
        """Let a paused run go on; False if it had finished."""
        return self.runs_client.resume(run_id)

    def reply(self, run_id: str, text: str, strategy: ReplyStrategy = "enqueue") -> None:
        """Continue a run with a new turn; `strategy`: what if it still works (RunsClient)."""
        self.runs_client.reply(run_id, text, strategy)

    # --- schedules (workers.client.schedules.Scheduling) ---------------------------------------

    @property
    def schedule_store(self) -> ScheduleStore:
        return self.scheduling.schedule_store

    def schedule(
        self,
        name: str,
        recipe: Recipe,
        values: Mapping[str, str],
        trigger: Trigger,
        utc_offset_minutes: int = 0,
        *,
        mode: Mode = "run",
        budget: Budget | None = None,
        now_ms: int | None = None,
        **options: Any,
    ) -> Schedule:
        """Schedule `recipe`, filled with `values`, to fire on `trigger`, each run within
        `budget`; `options`: `overlap`, `approve_plan`, `ask`, `catch_up_ms`, `jitter_ms`,
        `end_ms` (see Scheduling)."""
        return self.scheduling.schedule(
            name,
            recipe,
            values,
            trigger,
            utc_offset_minutes,
            mode=mode,
            budget=budget,
            now_ms=now_ms,
            **options,
        )

    def schedules(self) -> list[Schedule]:
        """Every schedule by name, each with its `next_due_ms`."""
        return self.scheduling.schedules()

    def unschedule(self, name: str) -> bool:
        """Remove a schedule and its notes; False if there was none."""
        return self.scheduling.unschedule(name)

    def notifications(self, limit: int = 50) -> list[Notification]:
        """Notifications, newest first: notify-only slots and runs that could not start."""
        return self.scheduling.notifications(limit)

    def schedule_notes(self, name: str) -> list[str]:
        """The notes the schedule's runs remembered, oldest first: its next run sees them."""
        return self.scheduling.schedule_notes(name)
