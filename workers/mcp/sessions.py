"""This process's connections to MCP servers, on its event loop (`workers.loop`).

A connection is opened on the first call that needs it: a stdio server is
started, an HTTP one reached, and its tools listed. The listing's digest must
be the one the app was built with (kept in Redis, `workers.mcp.toolset`); if
the server now lists other tools, every call is refused with a line saying so,
and nothing else is run in its place.

A server that dies (its process killed, its connection closed) fails the calls
in flight with `ServerDied` and is started again on the next call. A call that
was cancelled (its time limit, its run's cancel) makes the connection suspect:
it is asked for its tools at once and, if it does not answer within two seconds,
started anew; the next call waits for that check. A connection quiet for a second is
asked the same before its next call, so a server that died between calls is started
again first. A server that hangs is replaced instead of hanging every call after it.

A stdio server's stderr is logged line by line (`workers.mcp.stderr`), never printed
over a command's output; its last lines are part of the error when it cannot be started.

The MCP SDK is imported here (and by the toolset's call, lazily): an app without MCP
servers never loads it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.jsonrpc import CONNECTION_CLOSED

from workers.errors import MCPServerError
from workers.mcp.config import MCPServer
from workers.mcp.mapping import Listed, digest
from workers.mcp.stderr import ServerStderr

__all__ = ["MAX_TOOLS", "ServerDied", "call_tool", "close_all", "list_tools"]

log = logging.getLogger(__name__)

MAX_TOOLS = 1000
"""Tools one server may list (a listing beyond it is refused, not cut)."""
PING_S = 2.0
"""How long a suspect server has to answer before it is started again."""
IDLE_S = 1.0
"""A connection quiet this long is asked for its tools before the next call: a server
that died between calls is then started again before the call is sent, instead of the
call failing with an outcome it cannot know."""


class ServerDied(Exception):
    """The server's connection closed while a call was in flight."""


async def list_tools(server: MCPServer) -> list[Listed]:
    """The server's tools, listed on a connection of its own (closed after).

    Raises:
        MCPServerError: it could not be started or reached, or its listing is unusable.
    """
    connection = _Connection(server, expected=None)
    try:
        await connection.open()
        return connection.listed
    finally:
        await connection.close()


async def call_tool(
    server: MCPServer, expected: str, name: str, arguments: dict[str, object]
) -> dict[str, Any]:
    """Call the tool `name` on this process's connection to `server` (opened if needed)
    and return its `CallToolResult` as JSON.

    Raises:
        ServerDied: the server's connection closed mid-call (it is opened again next time).
        MCPServerError: it cannot be started, or lists other tools than `expected` says.
        MCPError: the server answered the call with an error.
    """
    connection = _connections().get(server.name)
    if connection is None or connection.server != server or connection.expected != expected:
        if connection is not None:
            connection.retire()  # the app's view of the server changed: a new connection
        connection = _connections()[server.name] = _Connection(server, expected)
    client = await connection.ready()
    try:
        result = await client.call_tool(name, arguments)
        connection.heard = time.monotonic()
    except MCPError as error:
        if error.code == CONNECTION_CLOSED:
            connection.retire()
            raise ServerDied(error.message) from None
        raise
    except asyncio.CancelledError:
        connection.check_soon()
        raise
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


async def close_all() -> None:
    """Close this process's connections (each stdio server's process ends with its own)."""
    connections = _connections()
    for connection in list(connections.values()):
        await connection.close()
    connections.clear()


_by_process: dict[int, dict[str, _Connection]] = {}


def _connections() -> dict[str, _Connection]:
    """This process's connections (only the loop's thread reads or writes them)."""
    return _by_process.setdefault(os.getpid(), {})


class _Connection:
    """One server, connected from this process: an owner task holds the SDK's client
    open (its context must be entered and left in one task) until told to close."""

    def __init__(self, server: MCPServer, expected: str | None) -> None:
        self.server = server
        self.expected = expected
        self.listed: list[Listed] = []
        self.suspect = False
        self.heard = 0.0
        """When the server last answered (time.monotonic())."""
        self._client: Client | None = None
        self._closing: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._checking: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> Client:
        """The open client, (re)opened if it is not, checked if it is suspect."""
        async with self._lock:
            quiet = time.monotonic() - self.heard > IDLE_S
            if self._client is not None and (self.suspect or quiet):
                self.suspect = False
                if not await self._answers():
                    log.warning(
                        "MCP server %s did not answer within %g s; starting it again",
                        self.server.name,
                        PING_S,
                    )
                    self.retire()
            if self._client is None or self._owner is None or self._owner.done():
                await self.open()
            assert self._client is not None
            if self.expected is not None and digest(self.listed) != self.expected:
                raise MCPServerError(
                    f"MCP server {self.server.name} lists other tools than this app was built"
                    " with; nothing was run. Run `relay tools --refresh` once the fleet runs"
                    " the new server, then restart the workers"
                )
            return self._client

    def check_soon(self) -> None:
        """A call was cancelled (its time limit, its run's cancel): ask the server now,
        and start it again if it does not answer, before the next call needs it."""
        self.suspect = True
        self._checking = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        try:
            await self.ready()
        except Exception as error:  # noqa: BLE001 - the next call reports it
            log.warning("MCP server %s could not be started again: %s", self.server.name, error)

    async def _answers(self) -> bool:
        """Whether the server answers a request in time (a listing: MCP's ping is gone
        from the 2026-07-28 protocol)."""
        assert self._client is not None
        try:
            await asyncio.wait_for(self._client.list_tools(cache_mode="bypass"), PING_S)
        except Exception:  # noqa: BLE001 - any failure to answer means it is not usable
            return False
        self.heard = time.monotonic()
        return True

    async def open(self) -> None:
        """Start (or reach) the server and list its tools, within its connect timeout.

        Raises:
            MCPServerError: it could not, and why.
        """
        opened: asyncio.Future[tuple[Client, list[Listed]]] = (
            asyncio.get_running_loop().create_future()
        )
        closing = asyncio.Event()
        stderr = ServerStderr(self.server.name) if self.server.command is not None else None
        owner = asyncio.create_task(
            self._own(opened, closing, stderr), name=f"mcp-{self.server.name}"
        )
        try:
            client, listed = await asyncio.wait_for(
                asyncio.shield(opened), self.server.connect_timeout
            )
        except BaseException as error:
            closing.set()
            owner.cancel()
            # Wait (briefly) for the SDK to stop what it started: a one-shot command that
            # exits next must not leave a server process behind.
            await asyncio.wait({owner}, timeout=5)
            if stderr is not None:
                stderr.handed_over()  # (the owner may have been cancelled before it began)
            if isinstance(error, asyncio.CancelledError):
                raise
            said = await asyncio.to_thread(stderr.last) if stderr is not None else ""
            raise _not_opened(self.server, error, said) from None
        self._client, self.listed, self._closing, self._owner = client, listed, closing, owner
        self.heard = time.monotonic()
        log.info(
            "MCP server %s (%s): connected, %d tools",
            self.server.name,
            self.server.where,
            len(listed),
        )

    async def _own(
        self,
        opened: asyncio.Future[tuple[Client, list[Listed]]],
        closing: asyncio.Event,
        stderr: ServerStderr | None,
    ) -> None:
        try:
            async with AsyncExitStack() as stack:
                transport = await self._transport(stack, stderr)
                client = await stack.enter_async_context(Client(transport))
                if stderr is not None:
                    stderr.handed_over()  # the server's process has its end now
                listed = await _listing(client)
                if not opened.done():
                    opened.set_result((client, listed))
                await closing.wait()
        except Exception as error:  # noqa: BLE001 - told to whoever waits to open, or logged
            if not opened.done():
                opened.set_exception(error)
            else:
                log.info("MCP server %s closed: %s", self.server.name, error)
        finally:
            if stderr is not None:
                stderr.handed_over()

    async def _transport(self, stack: AsyncExitStack, stderr: ServerStderr | None) -> Any:
        """What the SDK's client connects through: the command's stdio (its stderr into
        `stderr`), or HTTP with the server's headers (read from the environment now)."""
        server = self.server
        if server.command is not None:
            program, *args = server.command
            params = StdioServerParameters(
                command=program, args=args, env=server.env or None, cwd=server.cwd
            )
            assert stderr is not None
            return stdio_client(params, errlog=stderr.errlog)
        assert server.url is not None
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=server.resolved_headers(), timeout=httpx2.Timeout(30.0, read=300.0)
            )
        )
        return streamable_http_client(server.url, http_client=http)

    async def close(self) -> None:
        """Close the connection and wait (a few seconds at most) for it to end."""
        owner = self.retire()
        if owner is not None and not owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(owner), 5)
            except (TimeoutError, asyncio.CancelledError):
                owner.cancel()

    def retire(self) -> asyncio.Task[None] | None:
        """Let the connection end in the background (the SDK stops a stdio server's
        process, asking politely first), so a new one can open at once."""
        owner, closing = self._owner, self._closing
        self._client = self._owner = self._closing = None
        if closing is not None:
            closing.set()
        if owner is not None and not owner.done():
            _retiring.add(owner)
            owner.add_done_callback(_retiring.discard)
        return owner


_retiring: set[asyncio.Task[None]] = set()
"""Connections ending in the background (kept here: the loop holds tasks weakly)."""


async def _listing(client: Client) -> list[Listed]:
    """Every page of the server's tool listing."""
    listed: list[Listed] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        listed.extend(
            Listed.from_json(t.model_dump(mode="json", by_alias=True, exclude_none=True))
            for t in page.tools
        )
        if len(listed) > MAX_TOOLS:
            raise MCPServerError(f"it lists more than {MAX_TOOLS} tools")
        cursor = page.next_cursor
        if not cursor:
            return listed


def _not_opened(server: MCPServer, error: BaseException, said: str) -> MCPServerError:
    if isinstance(error, MCPServerError) and str(error).startswith("MCP server"):
        return error
    if isinstance(error, TimeoutError):
        why = f"no answer within {server.connect_timeout:g} s"
    elif isinstance(error, ExceptionGroup):
        why = "; ".join(f"{type(e).__name__}: {e}" for e in _leaves(error))[:500]
    else:
        why = f"{type(error).__name__}: {error}"[:500]
    heard = f"; its stderr said: {said}" if said else ""
    return MCPServerError(
        f"MCP server {server.name} ({server.where}) could not be started or reached: {why}{heard}"
    )


def _leaves(group: BaseExceptionGroup[Any]) -> Sequence[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        found.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return found
