"""`MCPServer`: one Model Context Protocol server whose tools a Relay's agents may call.

    MCPServer("fs", command=["npx", "-y", "@modelcontextprotocol/server-filesystem", "/data"],
              trust_annotations=True)
    MCPServer("tickets", url="https://tickets.internal/mcp",
              headers={"Authorization": "env:TICKETS_TOKEN"},
              risk={"lookup": "read"}, idempotent={"close": True})

A stdio server is a command line each tool worker process starts when it first
needs it (and again after it dies); a streamable-HTTP server is a URL. A header
value `env:NAME` is read from the environment where the connection is made, so
the secret lives in the worker's environment, never in the app's code, a file
or a log: `repr` shows neither headers nor env. `RELAY_MCP` names a JSON or TOML file
of servers (`{"servers": [...]}`, a list, or TOML `[[servers]]`), read when the
app gives none.

A server's tool annotations (`readOnlyHint`, ...) are its own claims about its tools:
they decide a tool's risk and idempotency only when the operator trusts the server
(`trust_annotations=True`). Otherwise each of its tools is WRITE (a person is asked
under the default policy) and not idempotent (a call a crash interrupted is never run
again), unless `risk` or `idempotent` name it: the team's word, which always wins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from agent_core import Risk
from workers.errors import MCPServerError, SettingsError
from workers.redact import redact_url
from workers.settings import load_entries

__all__ = ["ENV_PREFIX", "MCPServer", "checked_servers", "load_servers"]

ENV_PREFIX = "env:"
"""A header value read from the environment: `env:TICKETS_TOKEN`."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _server_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError("an MCP server's name is 1 to 32 letters, digits, '_' or '-'")
    return value


def _url(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        raise ValueError("an MCP server's url is an http:// or https:// URL")
    return value


def _headers(value: dict[str, str]) -> dict[str, str]:
    for name, given in value.items():
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise ValueError(f"{name!r} is not an HTTP header name")
        if given.startswith(ENV_PREFIX) and not _ENV_NAME.fullmatch(given[len(ENV_PREFIX) :]):
            raise ValueError(f"header {name}: {ENV_PREFIX} must name an environment variable")
    return value


class MCPServer(BaseModel):
    """An MCP server: `command` (stdio) or `url` (streamable HTTP), and how Relay takes
    its tools."""

    # A validation error never quotes what it was given: headers and env hold secrets.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    name: Annotated[str, AfterValidator(_server_name)]
    command: tuple[str, ...] | None = None
    """The command line of a stdio server (its first word is the program)."""
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra environment of a stdio server (over the MCP SDK's safe defaults)."""
    cwd: str | None = None
    url: Annotated[str | None, AfterValidator(_url)] = None
    """The endpoint of a streamable-HTTP server."""
    headers: Annotated[dict[str, str], AfterValidator(_headers)] = Field(
        default_factory=dict, repr=False
    )
    """HTTP headers; a value `env:NAME` is read from the environment when connecting."""
    timeout: float | None = Field(default=None, gt=0, le=86_400, allow_inf_nan=False)
    """Seconds one call may take (default RELAY_TOOL_TIMEOUT)."""
    connect_timeout: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    """Seconds to start (or reach) the server and list its tools."""
    trust_annotations: bool = False
    """Take the server's annotations as its tools' risk and idempotency (`readOnlyHint`
    READ, ...; see `workers.mcp.mapping`). Off: every tool is WRITE and not idempotent,
    whatever the server claims, unless `risk` or `idempotent` name it."""
    risk: dict[str, Risk] = Field(default_factory=dict)
    """Risk by tool name (the server's or Relay's), over the annotations and the
    untrusted default (`{"pay": "money"}`). It decides idempotency too: a tool
    overridden to READ is idempotent, to any other risk not, unless `idempotent` says."""
    idempotent: dict[str, bool] = Field(default_factory=dict)
    """Whether a worker that crashed mid-call may run the tool again, by tool name (the
    server's or Relay's), over everything else: the `idempotentHint` of a trusted server,
    what a `risk` override implies, the untrusted default (no)."""

    def __init__(self, name: str | None = None, /, **fields: Any) -> None:
        super().__init__(**fields if name is None else {**fields, "name": name})

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give an MCP server either a command (stdio) or a url (HTTP)")
        if self.command is not None and (not self.command or not self.command[0]):
            raise ValueError("an MCP server's command names a program")
        return self

    @property
    def where(self) -> str:
        """The server as a log line may name it: its program or URL (a password in it
        masked), never a header."""
        if self.url is not None:
            return redact_url(self.url)
        return " ".join((self.command or ())[:4])

    def identity(self) -> dict[str, object]:
        """What makes this server the same server to every process (not its secrets):
        its listing is kept in Redis under a digest of this."""
        return {
            "name": self.name,
            "command": list(self.command or ()),
            "cwd": self.cwd,
            "url": self.url,
        }

    def resolved_headers(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The headers to send, `env:` values read now.

        Raises:
            MCPServerError: a header names an environment variable that is not set.
        """
        env = os.environ if environ is None else environ
        resolved = {}
        for name, given in self.headers.items():
            variable = given[len(ENV_PREFIX) :] if given.startswith(ENV_PREFIX) else None
            if variable is not None and not env.get(variable):
                raise MCPServerError(
                    f"MCP server {self.name}: header {name} is read from {variable},"
                    " which is not set in this process's environment"
                )
            resolved[name] = env[variable] if variable is not None else given
        return resolved


def load_servers(path: str | Path) -> tuple[MCPServer, ...]:
    """Read MCP servers from a JSON or TOML file (RELAY_MCP).

    Raises:
        SettingsError: the file cannot be read, or a server is not one (one line).
    """
    return checked_servers(load_entries(path, MCPServer, variable="RELAY_MCP", what="server"))


def checked_servers(servers: object) -> tuple[MCPServer, ...]:
    """`servers` as a tuple of MCPServer, their names distinct.

    Raises:
        SettingsError: an entry is not an MCPServer, or two share a name.
    """
    if servers is None:
        return ()
    if not isinstance(servers, list | tuple) or not all(isinstance(s, MCPServer) for s in servers):
        raise SettingsError("mcp takes a list of workers.MCPServer")
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SettingsError(f"two MCP servers are named {twice[0]!r}")
    return tuple(servers)
