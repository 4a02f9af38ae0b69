"""agent_core: a pure agent state machine. It says what to do next; the host does it.

No I/O, no clock, no randomness, no environment: events in, steps out. See
`Agent` for the methods, `run` for a blocking driver, and DESIGN §2.
"""

from agent_core.agent import Agent
from agent_core.config import Config
from agent_core.driver import Host, run
from agent_core.errors import (
    AgentError,
    DataError,
    DefinitionError,
    RecipeError,
    SkillError,
    SnapshotError,
    ToolArgsError,
    UsageError,
)
from agent_core.recipes import Recipe
from agent_core.skills import Skill, SkillReport
from agent_core.specialists import Specialist
from agent_core.state import TraceEvent
from agent_core.steps import (
    Ask,
    Attachment,
    Done,
    ModelRequest,
    Outcome,
    Plan,
    Question,
    Run,
    Step,
    Stop,
    Summarize,
)
from agent_core.stream import FinalStream
from agent_core.tools import Kind, Policy, Risk, Tool, ToolCall, ToolOutput
from agent_core.triggers import Cron, Daily, Every, Trigger, Weekly, trigger_from_json

__all__ = [
    "Agent",
    "AgentError",
    "Ask",
    "Attachment",
    "Config",
    "Cron",
    "Daily",
    "DataError",
    "DefinitionError",
    "Done",
    "Every",
    "FinalStream",
    "Host",
    "Kind",
    "ModelRequest",
    "Outcome",
    "Plan",
    "Policy",
    "Question",
    "Recipe",
    "RecipeError",
    "Risk",
    "Run",
    "Skill",
    "SkillError",
    "SkillReport",
    "SnapshotError",
    "Specialist",
    "Step",
    "Stop",
    "Summarize",
    "Tool",
    "ToolArgsError",
    "ToolCall",
    "ToolOutput",
    "TraceEvent",
    "Trigger",
    "UsageError",
    "Weekly",
    "run",
    "trigger_from_json",
]
