"""How a tool is described, how a call to it looks, and what came of it.

`Tool` is a builder: each method returns a new value, so a tool can be shared
and extended without surprises. The agent checks the model's arguments against
the declared ones (see `agent_core.args`) before any host sees a call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_core.errors import DefinitionError
from agent_core.text import clean, cut

__all__ = [
    "Arg",
    "Kind",
    "Policy",
    "Risk",
    "Tool",
    "ToolCall",
    "ToolOutput",
    "check_name",
]

NAME_MAX = 64
RESERVED_TOOL_NAMES = frozenset(
    {"delegate", "remember", "use_skill", "read_skill_file", "ask_user"}
)

ArgsFn = Callable[[dict[str, Any]], dict[str, Any]]
SummaryFn = Callable[[dict[str, Any]], str]


class Kind(StrEnum):
    """The type of a tool argument, as the model is told it."""

    TEXT = "text"
    NUMBER = "number"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    LIST = "list"
    OBJECT = "object"


class Risk(StrEnum):
    """What running a tool may do, from harmless to moving money."""

    READ = "read"
    CREATE = "create"
    WRITE = "write"
    OUTSIDE = "outside"
    MONEY = "money"


class Policy(BaseModel):
    """Which risks need a person's yes before a call runs. MONEY always does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ask: frozenset[Risk]

    CAUTIOUS: ClassVar[Policy]
    TRUSTING: ClassVar[Policy]

    def asks(self, risk: Risk) -> bool:
        """Return whether a call of this risk must be approved before it runs."""
        return risk is Risk.MONEY or risk in self.ask


Policy.CAUTIOUS = Policy(ask=frozenset({Risk.WRITE, Risk.OUTSIDE, Risk.MONEY}))
Policy.TRUSTING = Policy(ask=frozenset({Risk.OUTSIDE, Risk.MONEY}))


def check_name(name: object, what: str) -> str:
    """Return `name` if it is a usable identifier for a tool, argument or specialist.

    Raises:
        DefinitionError: the name is empty, too long or has characters other
            than ASCII letters, digits, `_` and `-`, or starts with a digit.
    """
    if not isinstance(name, str) or not name or len(name) > NAME_MAX:
        raise DefinitionError(f"{what} name must be 1 to {NAME_MAX} characters, got {name!r}")
    if not name.isascii() or not (name[0].isalpha() or name[0] == "_"):
        raise DefinitionError(f"{what} name must start with an ASCII letter or _, got {name!r}")
    if not all(c.isalnum() or c in "_-" for c in name):
        raise DefinitionError(f"{what} name may hold only letters, digits, _ and -, got {name!r}")
    return name


class Arg(BaseModel):
    """One declared argument of a tool."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Kind
    help: str = ""
    required: bool = True


class Tool(BaseModel):
    """A tool the model may call: `Tool(name, description).arg(...).risk(...)`."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    description: str
    args: tuple[Arg, ...] = ()
    risk_class: Risk = Risk.WRITE
    validator: ArgsFn | None = Field(default=None, exclude=True)
    summarizer: SummaryFn | None = Field(default=None, exclude=True)

    def __init__(self, name: str, description: str, **fields: Any) -> None:
        check_name(name, "tool")
        if name in RESERVED_TOOL_NAMES:
            raise DefinitionError(f"tool name {name!r} is reserved for the agent's own tools")
        if not isinstance(description, str):
            raise DefinitionError(f"tool {name!r} needs a text description")
        super().__init__(name=name, description=description, **fields)

    def _with(self, **changes: Any) -> Tool:
        return self.model_copy(update=changes)

    def arg(self, name: str, kind: Kind, help: str = "") -> Tool:  # noqa: A002 - public name
        """Return this tool with a required argument added."""
        return self._add(Arg(name=check_name(name, "argument"), kind=kind, help=help))

    def opt(self, name: str, kind: Kind, help: str = "") -> Tool:  # noqa: A002 - public name
        """Return this tool with an optional argument added (absent from args when left out)."""
        arg = Arg(name=check_name(name, "argument"), kind=kind, help=help, required=False)
        return self._add(arg)

    def _add(self, arg: Arg) -> Tool:
        if any(a.name == arg.name for a in self.args):
            raise DefinitionError(f"tool {self.name!r} already has an argument {arg.name!r}")
        return self._with(args=(*self.args, arg))

    def risk(self, risk: Risk) -> Tool:
        """Return this tool with its risk class set (default `Risk.WRITE`)."""
        return self._with(risk_class=Risk(risk))

    def validate(self, fn: ArgsFn) -> Tool:  # type: ignore[override]
        """Return this tool with a check run on the already-typed arguments.

        `fn(args)` returns the arguments to use, or raises `ToolArgsError` with
        a sentence the model is shown before it tries again.
        """
        return self._with(validator=fn)

    def summary(self, fn: SummaryFn) -> Tool:
        """Return this tool with a function that turns arguments into a readable line."""
        return self._with(summarizer=fn)


def tool_names(tools: Iterable[Tool]) -> list[str]:
    """Return the names of `tools`, in order."""
    return [t.name for t in tools]


class ToolCall(BaseModel):
    """One call the model asked for, with checked arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    tool: str
    args: dict[str, Any]
    risk: Risk
    ask: bool
    summary: str


OutputStatus = Literal["ok", "error", "declined", "unknown"]


class ToolOutput(BaseModel):
    """What came of a call: its text, and whether it worked, failed, was declined or is unknown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: OutputStatus
    text: str

    @classmethod
    def ok(cls, text: str) -> ToolOutput:
        """The call worked; `text` is what it returned."""
        return cls(status="ok", text=text)

    @classmethod
    def error(cls, text: str) -> ToolOutput:
        """The call failed; `text` says why, for the model."""
        return cls(status="error", text=text)

    @classmethod
    def declined(cls, reason: str = "") -> ToolOutput:
        """A person said no to the call."""
        return cls(status="declined", text=reason)

    @classmethod
    def unknown(cls, reason: str) -> ToolOutput:
        """Whether the call took effect is not known (e.g. its worker died mid-call)."""
        return cls(status="unknown", text=reason)


SUMMARY_SHOWN_CHARS = 60
"""Characters of each argument a call's default summary shows."""


def summary_line(
    tool: str, summarizer: Callable[[dict[str, Any]], str] | None, args: dict[str, Any]
) -> str:
    """The line a person reads for a call of `tool` (its approval, the trace): the tool's
    own summary of `args`, or `tool(name=value, ...)` with each value cut."""
    if summarizer is not None:
        try:
            line = summarizer(dict(args))
        except Exception:  # noqa: BLE001 - display only: a failing summary falls back to the default
            line = None
        if isinstance(line, str) and line.strip():
            return cut(clean(line), 500)
    shown = ", ".join(
        f"{name}={cut(json.dumps(value, ensure_ascii=False), SUMMARY_SHOWN_CHARS)}"
        for name, value in args.items()
    )
    return f"{tool}({shown})"
