"""The tools one agent may call: the host's (narrowed for a child) and its own.

The agent handles three tools itself: `delegate` (hand a task to a specialist;
a real call the host carries out with a child agent), `remember` and
`use_skill`. They are offered only when the matching `with_*` call set them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent_core.config import Config
from agent_core.errors import DefinitionError
from agent_core.state import AgentState
from agent_core.tools import Arg, Kind, Risk, Tool

__all__ = ["DELEGATE", "REMEMBER", "USE_SKILL", "Setup", "index_tools"]

DELEGATE, REMEMBER, USE_SKILL = "delegate", "remember", "use_skill"
MAX_DEPTH = 3
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
    """`remember` and `use_skill`, when set up: handled without the host."""

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
        return cls(config=config, tools=tools, own=own)

    def offered(self) -> list[Tool]:
        """Return every tool the model is told about, host tools first."""
        return [*self.tools.values(), *self.own.values()]
