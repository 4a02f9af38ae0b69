"""An MCP server's tool listing as Relay tools: names, arguments, risk and idempotency.

A tool's risk and idempotency, from the first line that applies:

    the server's `risk` names it        -> that risk (MONEY always asks a person);
                                           idempotent if READ
    the operator trusts the server (`trust_annotations=True`), by its annotations:
      readOnlyHint: true                -> READ, idempotent
      openWorldHint: true               -> OUTSIDE
      destructiveHint: false            -> CREATE (it only adds)
      otherwise                         -> WRITE
      idempotentHint: true              -> idempotent, whatever its risk
    otherwise (an untrusted server)     -> WRITE, not idempotent

and the server's `idempotent`, where it names the tool, says whether a crash
mid-call may run it again, over all of these.

An override names a tool as the server lists it or as Relay names it (spelled, or
prefixed with the server's name). One that names none of the server's tools is an
error (`check_overrides`), never ignored: a typo (`chrage`) would leave the payment
tool at WRITE, or at READ on a trusted server. It is met where the listing is read:
`relay tools --refresh` refuses before Redis keeps anything, and a process building
the app's tools (`relay tools`, a client, a worker's task) raises it naming the
entry and the server's tools.

Annotations are the server's claims about itself: a destructive tool may say
`readOnlyHint: true`, and taken at its word it would run with no person asked
and be run again after a crash. So they count only for a server the operator
trusts; the overrides are the team's word. An annotation the server leaves out
counts as not given: a tool is OUTSIDE only when it says so (MCP's own default
would make every unannotated tool OUTSIDE).

Arguments: each property of an input schema the core can say (string, integer,
number, boolean, array, object; `[T, "null"]` or `anyOf [T, null]` as an
optional T; a string enum as text with its choices) becomes an argument (an
object schema with no properties: a tool without arguments). A schema the core
cannot express (a union, a `$ref`, properties that are not a table) is passed
through whole: the tool takes one object, `arguments`, described by the schema's
text, and the server validates it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agent_core import Kind, Risk, Tool
from agent_core.errors import AgentError
from agent_core.text import cut
from agent_core.tools import RESERVED_TOOL_NAMES
from workers.errors import MCPServerError
from workers.mcp.config import MCPServer

__all__ = [
    "FROM_OVERRIDE",
    "FROM_TRUSTED",
    "FROM_UNTRUSTED",
    "PASSTHROUGH",
    "Listed",
    "MCPTool",
    "check_overrides",
    "digest",
    "relay_tools",
    "risk_of",
]

PASSTHROUGH = "arguments"
"""The one argument of a tool whose schema is passed through."""

# Where a tool's risk came from, as `relay tools` shows it.
FROM_OVERRIDE = "override"
FROM_TRUSTED = "annotations (trusted)"
FROM_UNTRUSTED = "default: untrusted server"

_KINDS = {
    "string": Kind.TEXT,
    "integer": Kind.INTEGER,
    "number": Kind.NUMBER,
    "boolean": Kind.BOOLEAN,
    "array": Kind.LIST,
    "object": Kind.OBJECT,
}
_DESCRIPTION_CHARS = 2000
_SCHEMA_HELP_CHARS = 1500


@dataclass(frozen=True)
class Listed:
    """One tool as the server listed it (the fields Relay reads, as sent)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Listed:
        schema, annotations = data.get("inputSchema"), data.get("annotations")
        return cls(
            name=str(data.get("name", "")),
            description=str(data.get("description") or ""),
            input_schema=schema if isinstance(schema, dict) else {},
            annotations=annotations if isinstance(annotations, dict) else {},
        )


def digest(listed: Sequence[Listed]) -> str:
    """A digest of a listing: two processes agree on a server's tools iff theirs match."""
    canonical = json.dumps(
        sorted((t.as_json() for t in listed), key=lambda t: str(t["name"])),
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MCPTool:
    """A tool of an MCP server as a Relay tool."""

    server: str
    remote: str
    """Its name on the server."""
    tool: Tool
    idempotent: bool
    passthrough: bool
    """Its arguments are one object, `arguments`, sent as they are."""
    risk_from: str
    """Where its risk came from: FROM_OVERRIDE, FROM_TRUSTED or FROM_UNTRUSTED."""

    def arguments(self, args: Mapping[str, object]) -> dict[str, object]:
        """The arguments to send the server for a call's checked `args`."""
        if self.passthrough:
            given = args.get(PASSTHROUGH)
            return dict(given) if isinstance(given, dict) else {}
        return dict(args)


def risk_of(annotations: Mapping[str, Any]) -> Risk:
    """The risk a tool's annotations claim (see the module's table: it counts only for a
    trusted server)."""
    if annotations.get("readOnlyHint") is True:
        return Risk.READ
    if annotations.get("openWorldHint") is True:
        return Risk.OUTSIDE
    if annotations.get("destructiveHint") is False:
        return Risk.CREATE
    return Risk.WRITE


def relay_tools(
    servers: Sequence[tuple[MCPServer, Sequence[Listed]]], taken: Iterable[str]
) -> list[MCPTool]:
    """The Relay tools of every server's listing, in order.

    A tool keeps its own name unless another server lists the same one, a Relay
    tool has it or the agent keeps it for its own (`ask_user`, ...), then it is
    `<server>_<name>`; a name the core cannot take is
    spelled with `_` for each other character. A tool the core cannot describe at
    all is left out (its name and why go to the caller's log through the error).

    Raises:
        MCPServerError: two tools would still share a name, or a server's `risk` or
            `idempotent` names none of its tools (`check_overrides`).
    """
    seen: dict[str, int] = {}
    for server, listed in servers:
        check_overrides(server, listed)
        for entry in listed:
            local = _spelled(entry.name)
            seen[local] = seen.get(local, 0) + 1
    used = set(taken) | RESERVED_TOOL_NAMES  # the agent's own tools' names, too
    made: list[MCPTool] = []
    for server, listed in servers:
        for entry in listed:
            local = _spelled(entry.name)
            if seen[local] > 1 or local in used:
                local = _spelled(f"{server.name}_{entry.name}")
            if local in used:
                raise MCPServerError(
                    f"MCP server {server.name}: its tool {entry.name!r} would be named"
                    f" {local!r}, which another tool has"
                )
            made.append(_relay_tool(server, entry, local))
            used.add(local)
    return made


T = TypeVar("T")
_NAMES_SHOWN = 30
"""A server's tools named in the error, at most (then how many more)."""


def check_overrides(server: MCPServer, listed: Sequence[Listed]) -> None:
    """Raises MCPServerError if `server`'s `risk` or `idempotent` names a tool it does
    not list (by any of the names `_names` gives), naming the entry and its tools."""
    known = {name for entry in listed for name in _names(server, entry)}
    for field, overrides in (("risk", server.risk), ("idempotent", server.idempotent)):
        unknown = sorted(name for name in overrides if name not in known)
        if not unknown:
            continue
        tools = sorted(entry.name for entry in listed)
        more = len(tools) - _NAMES_SHOWN
        shown = ", ".join(tools[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")
        raise MCPServerError(
            f"MCP server {server.name}: its {field} names {', '.join(map(repr, unknown))},"
            f" which is none of its tools ({shown or 'it lists none'}); correct or remove"
            " the entry: a misspelt one would leave its tool at the default risk"
        )


def _names(server: MCPServer, entry: Listed) -> tuple[str, ...]:
    """The names an override may give a tool by: the server's, and Relay's own (spelled,
    or prefixed with the server's name when another tool has its name)."""
    return (entry.name, _spelled(entry.name), _spelled(f"{server.name}_{entry.name}"))


def _override(overrides: Mapping[str, T], server: MCPServer, entry: Listed) -> T | None:
    """What `overrides` says of the tool, by the first of its names it gives."""
    return next((overrides[n] for n in _names(server, entry) if n in overrides), None)


def _spelled(name: str) -> str:
    spelled = re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"
    if not (spelled[0].isascii() and (spelled[0].isalpha() or spelled[0] == "_")):
        spelled = f"_{spelled}"
    return spelled[:64]


def _relay_tool(server: MCPServer, entry: Listed, local: str) -> MCPTool:
    description = cut(
        entry.description or f"{entry.name} (from MCP server {server.name})", _DESCRIPTION_CHARS
    )
    risk, idempotent, risk_from = _risk(server, entry)
    tool = Tool(local, description).risk(risk)
    try:
        tool = _with_arguments(tool, entry.input_schema)
        passthrough = False
    except (_Unexpressible, AgentError):
        tool = (
            Tool(local, description).risk(risk).arg(PASSTHROUGH, Kind.OBJECT, _schema_help(entry))
        )
        passthrough = True
    return MCPTool(server.name, entry.name, tool, idempotent, passthrough, risk_from)


def _risk(server: MCPServer, entry: Listed) -> tuple[Risk, bool, str]:
    """A tool's risk, whether a crash mid-call may run it again, and where its risk came
    from (the module's table). An override names the tool as the server or Relay does."""
    risk_said = _override(server.risk, server, entry)
    idempotent_said = _override(server.idempotent, server, entry)
    if risk_said is not None:
        risk, idempotent, risk_from = risk_said, risk_said is Risk.READ, FROM_OVERRIDE
    elif server.trust_annotations:
        risk = risk_of(entry.annotations)
        idempotent = entry.annotations.get("idempotentHint") is True or risk is Risk.READ
        risk_from = FROM_TRUSTED
    else:
        risk, idempotent, risk_from = Risk.WRITE, False, FROM_UNTRUSTED
    return risk, idempotent if idempotent_said is None else idempotent_said, risk_from


class _Unexpressible(Exception):
    """An input schema the core's argument kinds cannot say."""


def _with_arguments(tool: Tool, schema: Mapping[str, Any]) -> Tool:
    if schema.get("type", "object") != "object" or "$ref" in schema:
        raise _Unexpressible
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise _Unexpressible
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            raise _Unexpressible
        kind, optional, choices = _kind(prop)
        help_text = " ".join(t for t in (str(prop.get("description") or ""), choices) if t)
        if name in required and not optional:
            tool = tool.arg(name, kind, cut(help_text, 500))
        else:
            tool = tool.opt(name, kind, cut(help_text, 500))
    return tool


def _kind(prop: Mapping[str, Any]) -> tuple[Kind, bool, str]:
    """The kind of one property, whether null is allowed, and its choices."""
    types = prop.get("type")
    optional = False
    if types is None and isinstance(prop.get("anyOf"), list):
        types = [branch.get("type") for branch in prop["anyOf"] if isinstance(branch, dict)]
        if len(types) != len(prop["anyOf"]) or any(
            len(branch) != 1 for branch in prop["anyOf"] if branch.get("type") != "null"
        ):
            raise _Unexpressible
    if isinstance(types, list):
        named = [t for t in types if t != "null"]
        optional = len(named) < len(types)
        if len(named) != 1:
            raise _Unexpressible
        types = named[0]
    if types not in _KINDS or "$ref" in prop:
        raise _Unexpressible
    choices = ""
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(c, str) for c in enum):
        choices = "one of: " + ", ".join(enum)
    return _KINDS[types], optional, choices


def _schema_help(entry: Listed) -> str:
    text = json.dumps(entry.input_schema, separators=(",", ":"), sort_keys=True)
    return "an object of this JSON schema (the server checks it): " + cut(text, _SCHEMA_HELP_CHARS)
