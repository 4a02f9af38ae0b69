"""`relay mcp`: serve the fleet to MCP clients (workers.fleet_mcp says what it offers).

relay mcp                           # stdio: an IDE or assistant starts it as a command
relay mcp --http 8765               # streamable HTTP on 127.0.0.1, RELAY_MCP_TOKEN's bearer
relay mcp --allow-decisions         # also approve, deny and answer (named as the client)
"""

from __future__ import annotations

import os

import click

from workers.cli.common import Context, Failure, app_option

__all__ = ["mcp_serve"]


@click.command("mcp")
@click.option(
    "--http",
    "port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve streamable HTTP on 127.0.0.1:PORT (bearer token: RELAY_MCP_TOKEN).",
)
@click.option(
    "--allow-decisions",
    is_flag=True,
    help="Offer approve, deny and answer too; each names the MCP client as who decided.",
)
@app_option
@click.pass_obj
def mcp_serve(obj: Context, port: int | None, allow_decisions: bool) -> None:
    """Serve the fleet to MCP clients (an IDE, a desktop assistant, another agent):
    start runs (a task, or a schedule's recipe now), read their status, trace and
    streamed text, and list what waits for a person.

    Over stdio by default; with --http, streamable HTTP on 127.0.0.1 only, and every
    request must carry `Authorization: Bearer $RELAY_MCP_TOKEN`. Deciding (approve,
    deny, answer) is off unless --allow-decisions: a model driving Relay through MCP
    must never approve its own calls by default.
    """
    from workers.fleet_mcp import TOKEN_VARIABLE, fleet_server, guarded  # noqa: PLC0415

    token = os.environ.get(TOKEN_VARIABLE, "")
    if port is not None and not token:
        raise Failure(f"relay mcp --http needs a bearer token in {TOKEN_VARIABLE}")
    server = fleet_server(obj.relay, allow_decisions=allow_decisions)
    if port is None:
        server.run("stdio")
        return
    import uvicorn  # noqa: PLC0415 - only this verb (and relay web) serves HTTP

    app = guarded(server.streamable_http_app(host="127.0.0.1"), token)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
