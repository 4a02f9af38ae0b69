"""`Relay`: tools, specialists and settings for a fleet of agents, and the client API.

    relay = Relay("notes", config=Config(max_batch=4))

    @relay.tool(risk=Risk.WRITE)
    def write_file(path: str, text: str) -> str:
        \"\"\"Write a text file.\"\"\"

    run_id = relay.start("Copy notes.txt to backup.txt")
    relay.wait(run_id, timeout=60)

`relay.celery` is the Celery app (`celery -A mymodule:app worker` works). The
client methods talk to Redis directly and wake runs with small `relay.advance`
messages; they never wait on a worker.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

from celery import Celery

import scheduler
from agent_core import (
    Agent,
    Attachment,
    Config,
    ModelRequest,
    Outcome,
    Risk,
    Skill,
    Specialist,
    Tool,
)
from agent_core.errors import AgentError
from workers.celery_app import Queues, build_celery, sender
from workers.engine import Message, Verifier
from workers.errors import (
    DecisionRefused,
    RelayError,
    RunCorrupt,
    RunNotFound,
    ToolRegistrationError,
    WaitTimeout,
)
from workers.model_client import ModelCallError, ModelClient, ModelReply, Usage
from workers.records import (
    Answer,
    CallDecision,
    CancelRun,
    InboxEvent,
    Pending,
    PlanDecision,
    RunRecord,
    RunStatus,
    TraceEntry,
)
from workers.registry import ToolSpec, describe_function
from workers.runtime import Model, Runtime, now_ms
from workers.scheduling import Scheduling
from workers.settings import Settings
from workers.store import RunStore

__all__ = ["Relay"]

F = TypeVar("F", bound=Callable[..., Any])

MAX_TASK_CHARS = 100_000
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class _NoModel:
    """Stands in when no model is configured: every call fails with a clear reason."""

    def complete(
        self, request: ModelRequest, *, should_stop: Callable[[], bool] | None = None
    ) -> ModelReply:
        del request, should_stop
        raise ModelCallError("no model is configured: set RELAY_MODEL_URL", retryable=False)


class Relay(Scheduling):
    """Tools, specialists and settings of one Relay app, and the client API to its runs."""

    def __init__(
        self,
        name: str = "relay",
        *,
        config: Config | None = None,
        specialists: Sequence[Specialist] = (),
        skills: Sequence[Skill] = (),
        questions: bool = False,
        settings: Settings | None = None,
        model: Model | None = None,
    ) -> None:
        self.name = name
        self.settings = settings if settings is not None else Settings.from_env()
        self.config = config or Config()
        self.specialists = tuple(specialists)
        self.skills = tuple(skills)
        self.questions = questions
        self._specs: dict[str, ToolSpec] = {}
        self._verifier: Verifier | None = None
        self._model = model
        self._lock = threading.Lock()
        self._store: RunStore | None = None
        self._celery: Celery | None = None
        self._runtime: Runtime | None = None
        self._clients: dict[int, ModelClient] = {}

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
    ) -> Any:
        """Register a function as a tool (`@relay.tool` or `@relay.tool(risk=Risk.READ)`).

        The description comes from the docstring, the arguments from the type
        hints. READ tools are idempotent unless told otherwise; others are not.
        """

        def register(function: F) -> F:
            described, context_param = describe_function(function, name=name, risk=risk)
            self._add(described, function, idempotent, timeout, context_param)
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
    ) -> None:
        """Register an `agent_core.Tool` with the function that runs it (called with its args)."""
        if not isinstance(tool, Tool) or not callable(fn):
            raise ToolRegistrationError("add_tool takes an agent_core.Tool and a function")
        self._add(tool, fn, idempotent, timeout, context_param)

    def _add(
        self,
        tool: Tool,
        fn: Callable[..., Any],
        idempotent: bool | None,
        timeout: float | None,
        context_param: str | None,
    ) -> None:
        if tool.name in self._specs:
            raise ToolRegistrationError(f"a tool named {tool.name!r} is registered already")
        if timeout is not None and not timeout > 0:
            raise ToolRegistrationError(f"tool {tool.name!r}: timeout must be > 0 seconds")
        safe = idempotent if idempotent is not None else tool.risk_class is Risk.READ
        self._specs[tool.name] = ToolSpec(tool, fn, safe, timeout, context_param)

    def verifier(self, fn: Verifier) -> Verifier:
        """Register a check of each final answer: return a problem to send it back, or None."""
        self._verifier = fn
        return fn

    @property
    def tools(self) -> list[Tool]:
        """The registered tools, in the order they were registered."""
        return [spec.tool for spec in self._specs.values()]

    # --- what the runtime needs (workers.runtime.RuntimeHost) -------------------------------

    def tool_spec(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    def verifier_fn(self) -> Verifier | None:
        return self._verifier

    def model(self) -> Model:
        """Return this process's model backend (one HTTP client per process, made after fork)."""
        if self._model is not None:
            return self._model
        if self.settings.model_url is None:
            return _NoModel()
        pid = os.getpid()
        with self._lock:
            client = self._clients.get(pid)
            if client is None:
                client = ModelClient(self.settings.model_settings())
                self._clients = {pid: client}
        return client

    def new_agent(
        self,
        config: Config,
        tool_names: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
    ) -> Agent:
        """Return an unstarted agent with this Relay's tools (or those named) and helpers."""
        tools = self._tools_named(tool_names)
        agent = Agent(config, tools)
        have = {t.name for t in tools}
        specialists = [s for s in self.specialists if set(s.tool_names) <= have]
        if specialists:
            agent = agent.with_specialists(specialists)
        if self.skills:
            agent = agent.with_skills(self.skills)
        if self.questions:
            agent = agent.with_questions()
        if notes is not None:
            agent = agent.with_memory(notes)
        return agent

    def restore_agent(self, record: RunRecord, snapshot: str) -> Agent:
        return Agent.restore(record.config, self._tools_named(record.tools), snapshot)

    def _tools_named(self, names: Sequence[str] | None) -> list[Tool]:
        if names is None:
            return self.tools
        return [spec.tool for name, spec in self._specs.items() if name in set(names)]

    # --- the pieces, built on first use -------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url or DEFAULT_REDIS_URL

    @property
    def store(self) -> RunStore:
        with self._lock:
            if self._store is None:
                self._store = RunStore(self.redis_url, self.settings.prefix)
            return self._store

    @property
    def queues(self) -> Queues:
        return Queues.under(self.settings.prefix)

    @property
    def celery(self) -> Celery:
        """The Celery app: `celery -A mymodule:app worker` with `app = relay.celery`."""
        with self._lock:
            if self._celery is None:
                broker = self.settings.broker_url or self.redis_url
                self._celery = build_celery(self.name, self.settings, broker, lambda: self.runtime)
            return self._celery

    @property
    def runtime(self) -> Runtime:
        celery = self.celery
        store = self.store
        with self._lock:
            if self._runtime is None:
                send = sender(celery, self.queues, self._tool_timeout)
                self._runtime = Runtime(_Host(self), store, send)
                self._runtime.on_tick = self._tick
            return self._runtime

    def _tool_timeout(self, name: str) -> float:
        spec = self._specs.get(name)
        if spec is not None and spec.timeout is not None:
            return spec.timeout
        return self.settings.tool_timeout

    def _send(self, messages: list[Message]) -> None:
        self.runtime.send(messages)

    # --- the client API -------------------------------------------------------------------------

    def start(
        self,
        task: str,
        context: str = "",
        *,
        config: Config | None = None,
        attachments: Iterable[Attachment] | None = None,
        budget: int | None = None,
        tools: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
        recipe: str | None = None,
        schedule: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run and return its id. It begins on a worker at once.

        `budget` caps the tokens the run and its children may use; `tools`
        narrows the registered tools; `notes` enables memory with these notes.
        `run_id` names the run (letters and digits): starting a run whose id
        exists already does nothing and returns that id, so a retried start is safe.

        Raises:
            RelayError: the task or attachments are too large, or a tool name is unknown.
            StoreUnavailable: Redis cannot be reached.
        """
        if not isinstance(task, str) or not task.strip():
            raise RelayError("the task must be non-empty text")
        if len(task) > MAX_TASK_CHARS:
            raise RelayError(f"the task is longer than {MAX_TASK_CHARS} characters")
        if budget is not None and (not isinstance(budget, int) or budget <= 0):
            raise RelayError("budget must be a positive number of tokens")
        files = tuple(attachments or ())
        if sum(len(a.data) for a in files) > MAX_ATTACHMENT_BYTES:
            raise RelayError(f"attachments are larger than {MAX_ATTACHMENT_BYTES} bytes in all")
        unknown = sorted(set(tools or ()) - set(self._specs))
        if unknown:
            raise RelayError(f"unknown tools: {', '.join(unknown)}")
        run_config = config or self.config
        try:
            agent = self.new_agent(run_config, tools, notes)
            agent.start_with(task, context, files)
        except AgentError as error:
            raise RelayError(str(error)) from None
        if run_id is not None and not (run_id.isascii() and run_id.isalnum() and len(run_id) <= 64):
            raise RelayError(f"a run id is 1 to 64 letters and digits, got {run_id!r}")
        chosen = run_id is not None
        run_id = run_id or secrets.token_hex(8)
        now = now_ms()
        record = RunRecord(
            id=run_id,
            root=run_id,
            task=task[:2_000],
            recipe=recipe,
            schedule=schedule,
            created_ms=now,
            updated_ms=now,
            config=run_config,
            tools=tuple(tools) if tools is not None else None,
            budget=budget,
        )
        created = self.store.create(
            record, agent.snapshot(), now + self.runtime.timing.grace_ms, budget
        )
        if not created and not chosen:
            raise RelayError(f"a run with id {run_id} exists already")  # 64 random bits: never
        if created:
            self._send([Message("advance", run_id)])
        return run_id

    def _record(self, run_id: str) -> tuple[RunRecord, tuple[int, int, int]]:
        found = self.store.read(run_id)
        if found is None:
            raise RunNotFound(f"no run {run_id!r} (it never existed, or it finished and expired)")
        return found

    def status(self, run_id: str) -> RunStatus:
        """Return where the run is: its state, what it waits for, usage, outcome, children."""
        record, (tp, tc, tt) = self._record(run_id)
        return RunStatus(
            id=record.id,
            state=record.state,
            waiting_for=record.waiting_for,
            task=record.task,
            parent=record.parent,
            root=record.root,
            children=record.children,
            recipe=record.recipe,
            schedule=record.schedule,
            usage=record.usage,
            total_usage=Usage(prompt_tokens=tp, completion_tokens=tc, total_tokens=tt),
            created_ms=record.created_ms,
            updated_ms=record.updated_ms,
            finished_ms=record.finished_ms,
            outcome=record.outcome,
            pending=tuple(self.store.pending_of(record.pending)),
        )

    def wait(self, run_id: str, timeout: float = 60.0) -> Outcome:
        """Return the run's outcome once it finishes.

        Raises:
            WaitTimeout: it did not finish within `timeout` seconds.
            RunNotFound: there is no such run.
        """
        deadline = time.monotonic() + timeout
        cursor = self.store.activity_cursor()
        while True:
            record, _ = self._record(run_id)
            if record.outcome is not None:
                return record.outcome
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    f"run {run_id} did not finish within {timeout:g} s (it is {record.state})"
                )
            # Wake when this run's trace grows (the save that ends a run writes a line),
            # and look at the record at least every second whatever else is busy.
            until = time.monotonic() + min(left, 1.0)
            while (now := time.monotonic()) < until:
                cursor, grew = self.store.wait_activity(cursor, max(1, int((until - now) * 1000)))
                if run_id in grew:
                    break

    def pending(self) -> list[Pending]:
        """Return what waits on a person: plans, calls and questions, oldest first."""
        return self.store.pending()

    def approve(self, run_id: str, call_id: str, yes: bool = True, reason: str = "") -> None:
        """Decide a call that waits for approval. Refused unless that call is pending.

        Raises:
            DecisionRefused: the call is not waiting for a decision (or was decided already).
            RunNotFound: there is no such run.
        """
        _check_yes(yes)
        event = CallDecision(call=call_id, yes=yes, reason=reason[:2_000])
        self._decide(run_id, f"{run_id}|call|{call_id}", f"d:{call_id}", event, f"call {call_id}")

    def deny(self, run_id: str, call_id: str, reason: str = "") -> None:
        """Decline a call that waits for approval (the model is told)."""
        self.approve(run_id, call_id, yes=False, reason=reason)

    def approve_plan(self, run_id: str, yes: bool = True) -> None:
        """Decide the plan a run waits on."""
        _check_yes(yes)
        seq = self._pending_seq(run_id, "plan")
        self._decide(
            run_id,
            f"{run_id}|plan|{seq}",
            f"d:plan:{seq}",
            PlanDecision(seq=seq, yes=yes),
            "a plan",
        )

    def answer(self, run_id: str, text: str) -> None:
        """Answer the question a run waits on."""
        if not isinstance(text, str):
            raise DecisionRefused("an answer must be text")
        seq = self._pending_seq(run_id, "question")
        event = Answer(seq=seq, text=text[:20_000])
        self._decide(run_id, f"{run_id}|question|{seq}", f"d:question:{seq}", event, "a question")

    def _pending_seq(self, run_id: str, kind: str) -> int:
        record, _ = self._record(run_id)
        for member in record.pending:
            _, pending_kind, what = member.split("|")
            if pending_kind == kind:
                return int(what)
        state = (
            "finished"
            if record.state == "finished"
            else f"{record.state}, waiting for {record.waiting_for}"
        )
        raise DecisionRefused(f"run {run_id} is not waiting for {kind} ({state})")

    def _decide(self, run_id: str, member: str, field: str, event: InboxEvent, what: str) -> None:
        due = now_ms() + self.runtime.timing.grace_ms
        result = self.store.decide(run_id, member, field, event, due)
        if result == 1:
            self._send([Message("advance", run_id)])
            return
        self._record(run_id)  # RunNotFound for an unknown run
        if result == -1:
            raise DecisionRefused(f"{what} of run {run_id} was decided already")
        raise DecisionRefused(f"{what} of run {run_id} is not waiting for a decision")

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Stop a run (parked or running) and its children; False if it had finished already.

        A run whose record cannot be read is woken too, so it fails and frees what it held.
        """
        try:
            record, _ = self._record(run_id)
        except RunCorrupt:
            record = None
        if record is not None and record.state == "finished":
            return False
        event = CancelRun(reason=reason[:2_000] or "Cancelled by a person.")
        due = now_ms() + self.runtime.timing.grace_ms
        if not self.store.append(run_id, event, due, cancel_flag=True):
            raise RunNotFound(f"no run {run_id!r}")
        self._send([Message("advance", run_id)])
        return True

    def trace(self, run_id: str) -> list[TraceEntry]:
        """Return the run's trace so far (its own events; children have their own)."""
        self._record(run_id)
        return self.store.trace(run_id)[1]

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[TraceEntry]:
        """Yield the trace of a run and its descendants as it happens, until the run finishes.

        A run that finished already yields its whole trace, its specialists' included.
        """
        self._record(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = self.store.activity_cursor()
        positions = {run_id: 0}
        due = {run_id}
        finished = False
        look_again = time.monotonic() + 2.0
        while True:
            while due:  # read every run that grew, and each child as soon as it is named
                run = due.pop()
                positions[run], entries = self.store.trace(run, positions[run])
                for entry in entries:
                    child = entry.data.get("child") if entry.kind == "child" else None
                    if isinstance(child, str) and child not in positions:
                        positions[child] = 0
                        due.add(child)
                    finished = finished or (run == run_id and entry.kind == "finished")
                    yield entry
            if finished or (deadline is not None and time.monotonic() > deadline):
                return
            cursor, grew = self.store.wait_activity(cursor, 500)
            due = grew & positions.keys()
            if time.monotonic() >= look_again:
                # Whatever else is busy (a busy activity stream can drop entries),
                # read every run followed now and then.
                look_again = time.monotonic() + 2.0
                finished = self._record(run_id)[0].state == "finished"
                due = set(positions)

    def runs(self, limit: int = 100) -> list[RunStatus]:
        """Return the newest runs first (those not yet expired)."""
        found = []
        for run_id in self.store.runs(limit):
            try:
                found.append(self.status(run_id))
            except RunNotFound:
                continue
        return found

    def tick(self, now: int | None = None) -> list[str]:
        """Do what the beat's tick does, once (schedules, healing); return the runs it started."""
        return self._tick(now_ms() if now is None else now)

    def _tick(self, now: int) -> list[str]:
        return scheduler.tick(self, now)

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals (part of the tick)."""
        return self.runtime.heal(now)


def _check_yes(yes: object) -> None:
    # bool("no") is True: a decision must be a real bool, never a guess.
    if not isinstance(yes, bool):
        raise DecisionRefused(f"a decision is True or False, got {yes!r}")


class _Host:
    """Adapts a Relay to what the runtime needs (workers.runtime.RuntimeHost)."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self.settings = relay.settings

    def restore_agent(self, record: RunRecord, snapshot: str) -> Agent:
        return self._relay.restore_agent(record, snapshot)

    def tool_spec(self, name: str) -> ToolSpec | None:
        return self._relay.tool_spec(name)

    def verifier(self) -> Verifier | None:
        return self._relay.verifier_fn()

    def model(self) -> Model:
        return self._relay.model()
