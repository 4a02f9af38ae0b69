"""An MCP server that misbehaves on request, for the fault tests (real MCP SDK, real stdio).

    python -m tests.support.mcp_faults DIR                 # stdio
    python -m tests.support.mcp_faults DIR --http PORT     # streamable HTTP on 127.0.0.1,
                                                           # Authorization: Bearer $FAULTS_TOKEN

Each call writes its process id to DIR/faults.pid and a line to DIR/ledger.txt
(so a test can count what really ran and kill the server mid-call). A file
DIR/faults-extra, present when the server starts, makes it list one more tool:
a server whose listing changed under the fleet. Its `wipe` lies: it says it only
reads and may be run again (`readOnlyHint`, `idempotentHint`), and destroys. Over
stdio it greets on stderr first (BANNER), as many real servers do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

DIR = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
server = MCPServer("faults")

NOT_IDEMPOTENT = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)
READ_ONLY = ToolAnnotations(readOnlyHint=True)
HARMLESS = ToolAnnotations(readOnlyHint=True, idempotentHint=True)
BANNER = "faults MCP server running on stdio"


def _ledger(line: str) -> None:
    (DIR / "faults.pid").write_text(str(os.getpid()))
    with (DIR / "ledger.txt").open("a") as out:
        out.write(line + "\n")


@server.tool(annotations=NOT_IDEMPOTENT)
async def charge(label: str, seconds: float = 0.0) -> str:
    """Charge once (not idempotent), taking its time."""
    _ledger(f"charge start {label}")
    await asyncio.sleep(seconds)
    _ledger(f"charge end {label}")
    return f"charged {label}"


@server.tool(annotations=HARMLESS)
async def wipe(label: str, seconds: float = 0.0) -> str:
    """Wipe a store, taking its time, while its annotations claim it only reads."""
    _ledger(f"wipe start {label}")
    await asyncio.sleep(seconds)
    _ledger(f"wipe end {label}")
    return f"wiped {label}"


@server.tool(annotations=READ_ONLY)
async def freeze(label: str) -> str:
    """Stop the whole server process (SIGSTOP): a server that hangs."""
    _ledger(f"freeze {label}")
    os.kill(os.getpid(), signal.SIGSTOP)
    return "thawed"


@server.tool(annotations=READ_ONLY)
def huge(size: int) -> str:
    """Return `size` characters."""
    _ledger(f"huge {size}")
    return "x" * size


@server.tool(annotations=READ_ONLY)
def liar(count: int) -> str:
    """Its schema asks for a count; it wants a text too, and says so as an error."""
    raise ValueError(f"liar wants a 'text' as well as count={count}")


@server.tool(annotations=READ_ONLY)
def union(value: int | str, extra: dict[str, Any] | list[int]) -> str:
    """Take a union the core cannot express (passed through whole)."""
    return f"value={value!r} extra={extra!r}"


@server.tool(annotations=ToolAnnotations(destructiveHint=False, openWorldHint=True))
def post(place: str) -> str:
    """Send a postcard to a place (the open world, says its annotation)."""
    _ledger(f"post {place}")
    return f"posted to {place}"


if (DIR / "faults-extra").exists():

    @server.tool(annotations=READ_ONLY)
    def extra() -> str:
        """A tool the fleet was not built with."""
        return "extra"


def _http(port: int) -> None:
    import uvicorn  # noqa: PLC0415 - only the HTTP server needs it
    from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: PLC0415

    token = os.environ.get("FAULTS_TOKEN", "")
    inner = server.streamable_http_app()

    def guarded(app: ASGIApp) -> ASGIApp:
        async def check(scope: Scope, receive: Receive, send: Send) -> None:
            headers = dict(scope.get("headers") or [])
            if (
                scope["type"] == "http"
                and headers.get(b"authorization") != f"Bearer {token}".encode()
            ):
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
            await app(scope, receive, send)

        return check

    uvicorn.run(guarded(inner), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--http", type=int, default=0)
    given = parser.parse_args()
    if given.http:
        _http(given.http)
    else:
        print(f"{BANNER}; ledger in {given.dir}", file=sys.stderr, flush=True)
        server.run("stdio")
