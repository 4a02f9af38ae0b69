"""`Relay`: tools, specialists and settings for a fleet of agents, and the client API.

    relay = Relay("notes", config=Config(max_batch=4))

    @relay.tool(risk=Risk.WRITE)
    def write_file(path: str, text: str) -> str:
        \"\"\"Write a text file.\"\"\"

    run_id = relay.start("Copy notes.txt to backup.txt")
    relay.wait(run_id, timeout=60)

`relay.celery` is the Celery app (`celery -A mymodule:app worker` works).
`Relay(skills_dir="skills")` offers every Agent Skill under that folder
(`workers.skill_tools`).
`start` is here; the rest of the client API (status, wait, decisions, traces,
cancel) is `workers.client.RunsClient`, and schedules `workers.scheduling`.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from celery import Celery

import scheduler
from agent_core import (
    Agent,
    Attachment,
    Config,
    ModelRequest,
    Risk,
    Skill,
    Specialist,
    Tool,
)
from agent_core.errors import AgentError
from agent_core.toolbox import READ_SKILL_FILE
from workers.celery_app import Queues, build_celery, sender
from workers.client import RunsClient
from workers.engine import Message, Verifier
from workers.errors import (
    RelayError,
    ToolRegistrationError,
)
from workers.model_client import ModelCallError, ModelClient, ModelReply
from workers.records import (
    RunRecord,
)
from workers.registry import ToolSpec, describe_function
from workers.runtime import Model, Runtime, now_ms
from workers.scheduling import Scheduling
from workers.settings import Settings
from workers.skill_tools import gather_skills, skill_reader
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


class Relay(RunsClient, Scheduling):
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
    ) -> None:
        self.name = name
        self.settings = settings if settings is not None else Settings.from_env()
        self.config = config or Config()
        self.specialists = tuple(specialists)
        self.skills, self.skills_report = gather_skills(skills, skills_dir)
        """`skills` and every skill under `skills_dir`; the report says what did not load."""
        self.questions = questions
        self._specs: dict[str, ToolSpec] = {}
        self._verifier: Verifier | None = None
        self._model = model
        self._lock = threading.Lock()
        self._store: RunStore | None = None
        self._celery: Celery | None = None
        self._runtime: Runtime | None = None
        self._clients: dict[int, ModelClient] = {}
        reader = skill_reader(self.skills, self.settings.tool_output_chars)
        self._skill_reader = reader if self.skills else None

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
        over (the late outcome is then discarded). Default: half of
        RELAY_RECOVERY_SECONDS, which is also how soon a dead worker's call of
        this tool is picked up again.
        """

        def register(function: F) -> F:
            described, context_param = describe_function(function, name=name, risk=risk)
            self._add(
                described,
                function,
                idempotent=idempotent,
                timeout=timeout,
                context_param=context_param,
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
        if not isinstance(tool, Tool) or not callable(fn):
            raise ToolRegistrationError("add_tool takes an agent_core.Tool and a function")
        self._add(
            tool,
            fn,
            idempotent=idempotent,
            timeout=timeout,
            context_param=context_param,
            lease_seconds=lease_seconds,
        )

    def _add(
        self,
        tool: Tool,
        fn: Callable[..., Any],
        *,
        idempotent: bool | None,
        timeout: float | None,
        context_param: str | None,
        lease_seconds: float | None,
    ) -> None:
        if tool.name in self._specs:
            raise ToolRegistrationError(f"a tool named {tool.name!r} is registered already")
        for what, seconds in (("timeout", timeout), ("lease_seconds", lease_seconds)):
            if seconds is not None and not (
                isinstance(seconds, int | float)
                and not isinstance(seconds, bool)
                and 0 < seconds < 1e7
            ):
                raise ToolRegistrationError(f"tool {tool.name!r}: {what} must be > 0 seconds")
        safe = idempotent if idempotent is not None else tool.risk_class is Risk.READ
        self._specs[tool.name] = ToolSpec(
            tool, fn, safe, timeout, context_param, lease_seconds=lease_seconds
        )

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
        if name == READ_SKILL_FILE:  # the agent's own tool: a reserved name, never registered
            return self._skill_reader
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

    def tick(self, now: int | None = None) -> list[str]:
        """Do what the beat's tick does, once (schedules, healing); return the runs it started."""
        return self._tick(now_ms() if now is None else now)

    def _tick(self, now: int) -> list[str]:
        return scheduler.tick(self, now)

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals (part of the tick)."""
        return self.runtime.heal(now)


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
