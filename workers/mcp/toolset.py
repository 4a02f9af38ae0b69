"""The MCP servers of one app: their listings, kept in Redis, and a call of one tool.

Every process of an app (each worker, each client) must offer the model the
same tools and run the same ones. The first process that needs an MCP server's
tools lists them from the server and keeps the listing in Redis, under the app
and a digest of the server's identity (its command or URL); every other
process reads that listing instead of asking its own copy of the server. A
worker's own connection checks that its server still lists exactly those tools
before each call (`workers.mcp.sessions`). `relay tools --refresh` lists the
servers again and replaces what Redis keeps.

The MCP SDK is imported on first use only (it costs half a second to import).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent_core import ToolOutput
from workers.errors import MCPServerError
from workers.loop import run_blocking
from workers.mcp.config import MCPServer
from workers.mcp.mapping import Listed, MCPTool, check_overrides, digest, relay_tools
from workers.mcp.results import output_of

__all__ = ["Listing", "MCPCall", "MCPToolset"]


class _Redis(Protocol):
    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: str, *, nx: bool = ...) -> Any: ...


@dataclass(frozen=True)
class Listing:
    """A server's tools as the app knows them, and their digest."""

    server: MCPServer
    tools: tuple[Listed, ...]
    digest: str

    def as_json(self) -> str:
        return json.dumps({"digest": self.digest, "tools": [t.as_json() for t in self.tools]})


@dataclass(frozen=True)
class MCPCall:
    """The function behind one MCP tool: an async call on this process's connection."""

    server: MCPServer
    tool: MCPTool
    expected: str
    """The digest of the listing the app was built with."""
    output_chars: int

    async def __call__(self, **args: object) -> ToolOutput:
        from mcp import MCPError  # noqa: PLC0415 - the SDK is loaded by an app that uses it

        from workers.mcp.sessions import ServerDied, call_tool  # noqa: PLC0415

        name = self.server.name
        arguments = self.tool.arguments(args)
        for attempt in (1, 2):
            try:
                result = await call_tool(self.server, self.expected, self.tool.remote, arguments)
            except ServerDied as died:
                if self.tool.idempotent and attempt == 1:
                    continue  # safe to run again, on the server started anew
                return ToolOutput.unknown(
                    f"MCP server {name} stopped mid-call ({died}); whether the call took effect"
                    " is unknown. The server is started again for the next call"
                )
            except MCPServerError as error:
                return ToolOutput.error(str(error))
            except MCPError as error:
                return ToolOutput.error(f"MCP server {name} refused the call: {error.message}")
            return output_of(result, self.output_chars)
        raise AssertionError("unreachable: the second attempt returns")


class MCPToolset:
    """The MCP servers of one app and what it knows of their tools."""

    def __init__(self, app: str, servers: Sequence[MCPServer], output_chars: int) -> None:
        self.app = app
        self.servers = tuple(servers)
        self.output_chars = output_chars

    def key(self, prefix: str, server: MCPServer) -> str:
        identity = json.dumps(server.identity(), sort_keys=True)
        who = hashlib.sha256(identity.encode()).hexdigest()[:12]
        return f"{prefix}mcp-tools:{self.app}:{server.name}:{who}"

    def listings(self, redis: _Redis, prefix: str, *, refresh: bool = False) -> list[Listing]:
        """Each server's listing: kept in Redis, else (or if `refresh`) listed now and kept.
        Servers to list are listed at once; with `refresh`, nothing is replaced unless every
        server answered.

        Raises:
            MCPServerError: a server that must be listed cannot be started or reached, or
                its `risk` or `idempotent` names a tool it does not list (then nothing
                is kept: the workers go on with the listing they have).
        """
        kept = {
            s.name: None if refresh else _read(redis.get(self.key(prefix, s)), s)
            for s in self.servers
        }
        missing = [s for s in self.servers if kept[s.name] is None]
        if missing:
            wait = max(s.connect_timeout for s in missing) + 10
            listed = run_blocking(_list_all(missing), wait)
            for server, tools in zip(missing, listed, strict=True):
                check_overrides(server, tools)
            for server, tools in zip(missing, listed, strict=True):
                made = Listing(server, tuple(tools), digest(tools))
                key = self.key(prefix, server)
                if refresh or redis.get(key) is not None:  # asked to, or what it kept is unreadable
                    redis.set(key, made.as_json())
                elif not redis.set(key, made.as_json(), nx=True):
                    made = _read(redis.get(key), server) or made  # another process was first
                kept[server.name] = made
        return [found for s in self.servers if (found := kept[s.name]) is not None]

    def tools(
        self, listings: Sequence[Listing], taken: Sequence[str]
    ) -> list[tuple[MCPTool, MCPCall]]:
        """The Relay tools of these listings, each with the function that calls it."""
        by_server = {listing.server.name: listing for listing in listings}
        made = relay_tools([(lst.server, lst.tools) for lst in listings], taken)
        return [
            (
                tool,
                MCPCall(
                    by_server[tool.server].server,
                    tool,
                    by_server[tool.server].digest,
                    self.output_chars,
                ),
            )
            for tool in made
        ]


async def _list_all(servers: Sequence[MCPServer]) -> list[list[Listed]]:
    """Every server's listing, listed side by side (the first failure is raised)."""
    from workers.mcp.sessions import list_tools  # noqa: PLC0415 - see MCPCall

    return list(await asyncio.gather(*(list_tools(server) for server in servers)))


def _read(raw: object, server: MCPServer) -> Listing | None:
    """The listing Redis keeps, or None if there is none (or it cannot be read: listed anew)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw if isinstance(raw, str | bytes) else "")
        tools = tuple(Listed.from_json(t) for t in data["tools"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if data.get("digest") != digest(tools):
        return None
    return Listing(server, tools, digest(tools))
