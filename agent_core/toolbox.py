"""The tools one agent may call: the host's (narrowed for a child) and its own.

The agent has four tools of its own, offered only when the matching `with_*`
call set them up: `delegate` (hand a task to a specialist; a real call the
host carries out with a child agent), `remember` and `use_skill` (handled
without the host), and `read_skill_file` (checked by the agent, read by the
host: see `agent_core.skill_files.read_part`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from agent_core.config import Config
from agent_core.errors import DefinitionError
from agent_core.history import output_cap
from agent_core.state import AgentState
from agent_core.steps import OfferedTool
from agent_core.tools import Arg, Kind, Risk, Tool

__all__ = [
    "DELEGATE",
    "READ_SKILL_FILE",
    "READ_SKILL_FILE_TOOL",
    "REMEMBER",
    "USE_SKILL",
    "Setup",
    "body_shown",
    "index_tools",
    "part_chars",
]

DELEGATE, REMEMBER, USE_SKILL = "delegate", "remember", "use_skill"
READ_SKILL_FILE = "read_skill_file"
MAX_SPECIALIST_DEPTH = 3
"""How deep delegation may go: a root (0) → child (1) → grandchild (2), no further."""


def _own_tool(name: str, description: str, *args: Arg) -> Tool:
    # Built with model_construct: these names are reserved for user tools on purpose.
    return Tool.model_construct(name=name, description=description, args=args, risk_class=Risk.READ)


REMEMBER_TOOL = _own_tool(
    REMEMBER,
    "Save a short note for later tasks (a fact, a preference, a lesson). Reply with it alone.",
    Arg(name="note", kind=Kind.TEXT, help="The note, at most 300 characters"),
)
USE_SKILL_TOOL = _own_tool(
    USE_SKILL,
    "Load the full instructions of one of the skills listed below. Reply with it alone.",
    Arg(name="name", kind=Kind.TEXT, help="The skill's name"),
)
READ_SKILL_FILE_TOOL = _own_tool(
    READ_SKILL_FILE,
    "Read a file of a skill (its files are listed when you load it with use_skill), or the"
    " rest of a long SKILL.md, one part at a time. Reply with it alone.",
    Arg(name="skill", kind=Kind.TEXT, help="The skill's name"),
    Arg(name="path", kind=Kind.TEXT, help="The file as listed, or SKILL.md"),
    Arg(
        name="offset",
        kind=Kind.INTEGER,
        help="Where to start, in characters; a part that stops early gives the next offset",
        required=False,
    ),
)


def body_shown(config: Config) -> int:
    """Return how much of a skill's body `use_skill` shows; the rest is read in parts."""
    return output_cap(config.history_chars) * 2


def part_chars(config: Config) -> int:
    """Return the characters one `read_skill_file` part may hold, leaving room for its note."""
    return output_cap(config.history_chars) - 200


def _delegate_tool(state: AgentState) -> Tool:
    listed = "; ".join(f"{s.name}: {s.description}" for s in state.specialists)
    return _own_tool(
        DELEGATE,
        "Hand a sub-task to a specialist, who works on it with their own tools and"
        f" reports back. Specialists: {listed}.",
        Arg(name="specialist", kind=Kind.TEXT, help="The specialist's name"),
        Arg(name="task", kind=Kind.TEXT, help="What they should do, in full"),
    )


def index_tools(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Return `tools` by name.

    Raises:
        DefinitionError: an entry is not a `Tool`, or two share a name.
    """
    index: dict[str, Tool] = {}
    for tool in tools:
        if not isinstance(tool, Tool):
            raise DefinitionError(f"tools must be Tool values, got {type(tool).__name__}")
        if tool.name in index:
            raise DefinitionError(f"two tools are named {tool.name!r}")
        index[tool.name] = tool
    return index


@dataclass(frozen=True)
class Setup:
    """What the transitions need besides the state: the limits and the tools on offer."""

    config: Config
    tools: dict[str, Tool]
    """Host tools this agent may call, plus `delegate` when it has specialists."""
    own: dict[str, Tool]
    """`remember`, `use_skill` and `read_skill_file`, when set up: each in a reply of its
    own, none counted against `max_calls`; only `read_skill_file` goes to the host."""

    @classmethod
    def build(cls, config: Config, all_tools: dict[str, Tool], state: AgentState) -> Setup:
        allowed = state.allowed_tools
        tools = {n: t for n, t in all_tools.items() if allowed is None or n in allowed}
        if state.specialists:
            tools[DELEGATE] = _delegate_tool(state)
        own: dict[str, Tool] = {}
        if state.remembering:
            own[REMEMBER] = REMEMBER_TOOL
        if state.skills:
            own[USE_SKILL] = USE_SKILL_TOOL
        shown = body_shown(config)
        if any(s.resources or len(s.body) > shown for s in state.skills):
            own[READ_SKILL_FILE] = READ_SKILL_FILE_TOOL
        return cls(config=config, tools=tools, own=own)

    def offered(self) -> list[Tool]:
        """Return every tool the model is told about, host tools first."""
        return [*self.tools.values(), *self.own.values()]

    @cached_property
    def shaped(self) -> tuple[tuple[OfferedTool, ...], tuple[OfferedTool, ...]]:
        """The host tools and the agent's own as a reply shape offers them: made once per
        setup, not on every request (`prompts.reply_shape`)."""
        host = tuple(_offered(t, alone=False) for t in self.tools.values())
        return host, tuple(_offered(t, alone=True) for t in self.own.values())


def _offered(tool: Tool, *, alone: bool) -> OfferedTool:
    return OfferedTool(name=tool.name, description=tool.description, args=tool.args, alone=alone)
