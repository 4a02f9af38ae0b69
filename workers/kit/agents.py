"""What a Relay's agents are made of: its tools, specialists, skills and final-answer check.

The `AgentKit` is built by the `Relay` (`@relay.tool`, `relay.add_tool`,
`relay.verifier`) and read by the runtime: it makes a run's agent (and restores
one from a snapshot) with exactly the tools the run may use, and it finds the
function behind each tool call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from agent_core import Agent, Config, Risk, Skill, Specialist, Tool
from agent_core.toolbox import READ_SKILL_FILE
from workers.engine.records import RunRecord
from workers.engine.working import Verifier
from workers.errors import ToolRegistrationError
from workers.kit.skills import skill_reader
from workers.kit.tools import ToolSpec, describe_function, is_async

__all__ = ["AgentKit"]

MAX_SECONDS = 1e7


class AgentKit:
    """The tools, specialists and skills of one Relay, and its check of final answers."""

    def __init__(
        self,
        *,
        specialists: Sequence[Specialist],
        skills: Sequence[Skill],
        questions: bool,
        tool_output_chars: int,
        tool_timeout: float,
    ) -> None:
        self.specialists = tuple(specialists)
        self.skills = tuple(skills)
        self.questions = questions
        self.verifier: Verifier | None = None
        self.tool_output_chars = tool_output_chars
        self.tool_timeout = tool_timeout
        """Seconds a tool may run unless it says otherwise (RELAY_TOOL_TIMEOUT)."""
        self._specs: dict[str, ToolSpec] = {}
        self._skill_reader = skill_reader(self.skills, tool_output_chars) if skills else None
        self._loaders: list[Callable[[], None]] = []
        self._load_lock = threading.RLock()
        self._loading = False

    def defer(self, load: Callable[[], None]) -> None:
        """Have `load` add tools when they are first read (an MCP server's, whose listing
        needs Redis or the server itself: never while an app module is imported)."""
        self._loaders.append(load)

    def _loaded(self) -> None:
        """Run the deferred loaders, once; one that fails stays to be tried again."""
        if not self._loaders:
            return
        with self._load_lock:  # re-entered by the loader's own reads, on this thread
            if self._loading:
                return
            self._loading = True
            try:
                while self._loaders:
                    self._loaders[0]()
                    self._loaders.pop(0)
            finally:
                self._loading = False

    def any_tools(self) -> bool:
        """Whether a tool is registered, or deferred (an MCP server's): without listing
        them (which may start a server)."""
        return bool(self._specs or self._loaders)

    def listed(self) -> bool:
        """Whether every tool is known already (no MCP server's listing deferred): then
        `spec` reads memory only, and needs no thread of its own."""
        return not self._loaders

    # --- registering ----------------------------------------------------------------------

    def register(
        self,
        fn: Callable[..., Any],
        *,
        risk: Risk,
        idempotent: bool | None,
        name: str | None,
        timeout: float | None,
        lease_seconds: float | None,
    ) -> None:
        """Add a function as a tool described by its docstring and type hints."""
        tool, context_param = describe_function(fn, name=name, risk=risk)
        self.add(
            tool,
            fn,
            idempotent=idempotent,
            timeout=timeout,
            context_param=context_param,
            lease_seconds=lease_seconds,
        )

    def add(
        self,
        tool: Tool,
        fn: Callable[..., Any],
        *,
        idempotent: bool | None = None,
        timeout: float | None = None,
        context_param: str | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        """Add an `agent_core.Tool` with the function that runs it.

        Raises:
            ToolRegistrationError: the name is taken, or a time is not a number of seconds.
        """
        if not isinstance(tool, Tool) or not callable(fn):
            raise ToolRegistrationError("add_tool takes an agent_core.Tool and a function")
        if tool.name in self._specs:
            raise ToolRegistrationError(f"a tool named {tool.name!r} is registered already")
        for what, seconds in (("timeout", timeout), ("lease_seconds", lease_seconds)):
            if seconds is not None and not _seconds(seconds):
                raise ToolRegistrationError(f"tool {tool.name!r}: {what} must be > 0 seconds")
        safe = idempotent if idempotent is not None else tool.risk_class is Risk.READ
        self._specs[tool.name] = ToolSpec(
            tool, fn, safe, timeout, context_param, lease_seconds, asynchronous=is_async(fn)
        )

    def drop(self, names: Sequence[str]) -> None:
        """Remove the tools named (an MCP server's, about to be listed again)."""
        for name in names:
            self._specs.pop(name, None)

    # --- what the runtime reads ------------------------------------------------------------

    @property
    def tools(self) -> list[Tool]:
        """The registered tools, in the order they were registered."""
        self._loaded()
        return [spec.tool for spec in self._specs.values()]

    def names(self) -> set[str]:
        self._loaded()
        return set(self._specs)

    def spec(self, name: str) -> ToolSpec | None:
        """The function behind a tool call (the agent's own `read_skill_file` included)."""
        if name == READ_SKILL_FILE:  # a reserved name, never registered
            return self._skill_reader
        self._loaded()
        return self._specs.get(name)

    def idempotent(self, tools: Sequence[Tool]) -> set[str]:
        """The names of `tools` whose calls may run again (a run's journal keeps them)."""
        return {t.name for t in tools if (spec := self.spec(t.name)) and spec.idempotent}

    def timeout_of(self, name: str) -> float:
        """Seconds a call of the tool `name` may run: its own timeout, or the default."""
        spec = self.spec(name)
        return spec.timeout if spec is not None and spec.timeout is not None else self.tool_timeout

    def new_agent(
        self,
        config: Config,
        tool_names: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
    ) -> Agent:
        """Return an unstarted agent with these tools (or those named) and helpers."""
        tools = self._named(tool_names)
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

    def restore(self, record: RunRecord, snapshot: str) -> Agent:
        """Return the run's agent as saved. Raises AgentError for a snapshot it cannot read."""
        return Agent.restore(record.config, self._named(record.tools), snapshot)

    def _named(self, names: Sequence[str] | None) -> list[Tool]:
        self._loaded()
        if names is None:
            return self.tools
        wanted = set(names)
        return [spec.tool for name, spec in self._specs.items() if name in wanted]


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < MAX_SECONDS
    )
