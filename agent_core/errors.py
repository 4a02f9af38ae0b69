"""Errors raised by agent_core.

The model's misbehaviour is never an exception: an unusable reply, an unknown
tool or bad arguments become a retry, and too many of them a stated `Stop`.
Exceptions are for the host: it called the agent wrongly, it described a tool
or trigger that cannot exist, or it handed over text that cannot be used.

    AgentError
    ├── UsageError          the host called the agent in a way it cannot serve
    ├── DefinitionError     a tool, specialist, config or trigger that cannot be built
    ├── ToolArgsError       a tool's own check refused the model's arguments
    └── DataError           text from outside that cannot be used
        ├── SnapshotError   saved text that is not a snapshot this version can restore
        ├── SkillError      a skill folder or SKILL.md that cannot be used
        └── RecipeError     a recipe filled with unknown or missing values
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "DataError",
    "DefinitionError",
    "RecipeError",
    "SkillError",
    "SnapshotError",
    "ToolArgsError",
    "UsageError",
]


class AgentError(Exception):
    """Raised for every error agent_core reports; the root of the tree."""


class UsageError(AgentError):
    """Raised when the host calls the agent in a way it cannot serve (e.g. before `start`)."""


class DefinitionError(AgentError, ValueError):
    """Raised when a tool, specialist, config or trigger is described with impossible values."""


class ToolArgsError(AgentError, ValueError):
    """Raised by a tool's `validate` function; its message is a sentence for the model."""


class DataError(AgentError, ValueError):
    """Raised when text handed over from outside cannot be used."""


class SnapshotError(DataError):
    """Raised when saved text is empty, corrupt, foreign or of an unknown version."""


class SkillError(DataError):
    """Raised when a skill folder cannot be read, or its SKILL.md breaks the format."""


class RecipeError(DataError):
    """Raised when a recipe is filled with an unknown blank or lacks a value for one."""
