"""Tools registered on a Relay: their description for the model and how to run them.

A plain function becomes a tool: its name, its docstring's first paragraph as
the description, each parameter's type hint as the argument's `Kind` (a
parameter with a default, or `X | None`, is optional) and its help from the
docstring's `Args:` section (Google style) or `:param name:` lines. A
parameter annotated `ToolContext` receives the call's context instead.
"""

from __future__ import annotations

import inspect
import threading
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

from agent_core import Kind, Risk, Tool, ToolOutput
from agent_core.errors import AgentError
from agent_core.text import cut
from workers.errors import ToolRegistrationError
from workers.loop import run_blocking

__all__ = ["ToolContext", "ToolSpec", "describe_function", "is_async", "tool_output"]

_KINDS: dict[Any, Kind] = {
    str: Kind.TEXT,
    int: Kind.INTEGER,
    float: Kind.NUMBER,
    bool: Kind.BOOLEAN,
    list: Kind.LIST,
    tuple: Kind.LIST,
    Sequence: Kind.LIST,
    dict: Kind.OBJECT,
    Mapping: Kind.OBJECT,
}


@dataclass
class ToolContext:
    """What a running tool may know and do besides its arguments.

    `idempotency_key` is the same for every attempt at one call, so a tool can
    pass it to a service that deduplicates. Poll `cancelled()` in long work;
    `progress(text)` adds a line to the run's trace.
    """

    run_id: str
    call_id: str
    attempt: int = 1
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _report: Callable[[str], None] = field(default=lambda _text: None, repr=False)

    @classmethod
    def of_call(
        cls,
        run_id: str,
        call_id: str,
        attempt: int,
        cancel: threading.Event,
        report: Callable[[str], None],
    ) -> ToolContext:
        """The context of one claimed call: `cancel` is set when the call should stop (the
        run was cancelled, or the call ran past its time); `report` writes a progress line."""
        return cls(run_id, call_id, attempt, cancel, report)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.call_id}"

    def cancelled(self) -> bool:
        """Return whether the run was cancelled (or the call ran past its time) meanwhile."""
        return self._cancel.is_set()

    def progress(self, text: str) -> None:
        """Report progress; it shows in the run's trace and `relay watch`."""
        self._report(str(text))


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its description, its function and how to run it."""

    tool: Tool
    fn: Callable[..., Any]
    idempotent: bool
    timeout: float | None = None
    context_param: str | None = None
    lease_seconds: float | None = None
    """How long a claim on one of its calls lasts between renewals (None: the default)."""
    asynchronous: bool = False
    """An `async def` tool: `invoke` returns a coroutine, run on the process's event loop."""

    def invoke(self, args: dict[str, object], context: ToolContext) -> Any:
        """Call the tool's function with the call's arguments (and its context, if it asks);
        for an async tool, return the coroutine."""
        kwargs = dict(args)
        if self.context_param:
            kwargs[self.context_param] = context
        return self.fn(**kwargs)

    def call(self, args: dict[str, object], context: ToolContext) -> object:
        """Return what the tool returns, waiting here for an async one (outside a call's
        lease: a check run by the client, not a run's call)."""
        value = self.invoke(args, context)
        return run_blocking(value, self.timeout) if self.asynchronous else value


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` returns a coroutine (an `async def`, or an object whose
    `__call__` is one).

    Raises:
        ToolRegistrationError: `fn` is an async generator, which gives no single result.
    """
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object's async __call__ counts
    if inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(call):
        raise ToolRegistrationError(
            f"{getattr(fn, '__name__', fn)!r} is an async generator; a tool returns one text"
        )
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def tool_output(tool: str, value: object, limit: int) -> ToolOutput:
    """Return what a tool's function returned as its output, cut to `limit` characters."""
    if isinstance(value, ToolOutput):
        return ToolOutput(status=value.status, text=cut(value.text, limit))
    if isinstance(value, str):
        return ToolOutput.ok(cut(value, limit))
    return ToolOutput.error(
        f"the tool {tool} returned {type(value).__name__}, not text; a tool must return text"
    )


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(hint) if a is not type(None)]
        if len(members) == 1 and len(members) < len(get_args(hint)):
            return members[0], True
    return hint, False


def _kind(name: str, hint: Any) -> tuple[Kind, str]:
    """Return the Kind for a type hint, and extra help (the choices of a Literal)."""
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if all(isinstance(c, str) for c in choices):
            return Kind.TEXT, "one of: " + ", ".join(choices)
    base = get_origin(hint) or hint
    if base in _KINDS:
        return _KINDS[base], ""
    raise ToolRegistrationError(
        f"parameter {name!r} has type {hint!r}; a tool takes str, int, float, bool, list or dict"
    )


_SECTIONS = ("Args:", "Arguments:", "Parameters:")


def _docstring_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """Return a function's description (first paragraph) and per-argument help."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    description: list[str] = []
    for line in lines:
        if not line.strip() or line.strip() in _SECTIONS or line.startswith(":"):
            break
        description.append(line.strip())
    helps = _google_args(lines)
    for line in lines:
        if line.startswith(":param "):
            head, _, text = line[len(":param ") :].partition(":")
            helps[head.split()[-1]] = text.strip()
    return " ".join(description), helps


def _google_args(lines: list[str]) -> dict[str, str]:
    """Return the help of each entry of an `Args:` section (entries may wrap)."""
    helps: dict[str, str] = {}
    inside, entry_indent, current = False, -1, ""
    for line in lines:
        if line.strip() in _SECTIONS and not line[:1].isspace():
            inside, entry_indent, current = True, -1, ""
            continue
        if not inside or not line.strip():
            continue
        if not line[:1].isspace():
            inside = False
            continue
        indent = len(line) - len(line.lstrip())
        if entry_indent < 0:
            entry_indent = indent
        if indent == entry_indent:
            head, _, text = line.strip().partition(":")
            current = head.split("(")[0].strip()
            helps[current] = text.strip()
        elif current:
            helps[current] = f"{helps[current]} {line.strip()}"
    return helps


def describe_function(
    fn: Callable[..., Any], *, name: str | None = None, risk: Risk = Risk.WRITE
) -> tuple[Tool, str | None]:
    """Return the `Tool` that describes `fn`, and the name of its ToolContext parameter.

    Raises:
        ToolRegistrationError: a parameter has no usable type hint, or is *args/**kwargs.
    """
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:  # noqa: BLE001 - any failure to read hints is a registration error
        raise ToolRegistrationError(f"cannot read the type hints of {fn!r}: {error}") from None
    description, helps = _docstring_parts(fn)
    tool_name = str(name or getattr(fn, "__name__", ""))
    try:
        tool = Tool(tool_name, description or tool_name).risk(risk)
    except AgentError as error:
        raise ToolRegistrationError(str(error)) from None
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolRegistrationError(
                f"tool {tool_name!r}: *args and **kwargs cannot be described"
            )
        hint = hints.get(param.name)
        if _unwrap_optional(hint)[0] is ToolContext:
            context_param = param.name
            continue
        if hint is None:
            raise ToolRegistrationError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type hint"
            )
        hint, optional = _unwrap_optional(hint)
        kind, extra = _kind(param.name, hint)
        help_text = " ".join(t for t in (helps.get(param.name, ""), extra) if t)
        try:
            if optional or param.default is not param.empty:
                tool = tool.opt(param.name, kind, help_text)
            else:
                tool = tool.arg(param.name, kind, help_text)
        except AgentError as error:
            raise ToolRegistrationError(str(error)) from None
    return tool, context_param
