"""`relay mcp`: serve the fleet to MCP clients (workers.fleet_mcp says what it offers).

relay mcp                           # stdio: an IDE or assistant starts it as a command
relay mcp --http 8765               # streamable HTTP on 127.0.0.1, RELAY_MCP_TOKEN's bearer
relay mcp --http 8765 --clients mcp-clients.toml   # a token per client, each its own apps/keys
relay mcp --allow-decisions         # also approve, deny and answer (named as the client)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from workers.cli.common import Context, Failure, app_option

if TYPE_CHECKING:  # (the MCP SDK takes half a second to import: only this verb's body does)
    from workers.fleet_mcp import Sight
    from workers.relay import Relay

__all__ = ["mcp_serve"]


@click.command("mcp")
@click.option(
    "--http",
    "port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve streamable HTTP on 127.0.0.1:PORT (a bearer token per request).",
)
@click.option(
    "--clients",
    "clients_file",
    metavar="FILE",
    default=None,
    help="With --http: a JSON or TOML file of clients, each a name, a token and the apps"
    " (and keys) whose runs it sees (or RELAY_MCP_CLIENTS).",
)
@click.option(
    "--allow-decisions",
    is_flag=True,
    help="Offer approve, deny and answer too; each names the MCP client as who decided."
    " Approving a MONEY call needs --allow-money-decisions as well.",
)
@click.option(
    "--allow-money-decisions",
    is_flag=True,
    help="With --allow-decisions: approving a MONEY call too.",
)
@click.option(
    "--allow-schedules",
    is_flag=True,
    help="Offer run_schedule: fire a schedule's recipe now.",
)
@app_option
@click.pass_obj
def mcp_serve(
    obj: Context,
    *,
    port: int | None,
    clients_file: str | None,
    allow_decisions: bool,
    allow_money_decisions: bool,
    allow_schedules: bool,
) -> None:
    """Serve the fleet to MCP clients (an IDE, a desktop assistant, another agent):
    start runs, read their status, trace and streamed text, and list what waits
    for a person, each client only the runs of its apps (and keys).

    Over stdio by default: the client sees the runs of the app served (--app).
    With --http, streamable HTTP on 127.0.0.1 only, and every request must carry
    `Authorization: Bearer TOKEN`: RELAY_MCP_TOKEN's (the app's runs), or a
    client's of --clients / RELAY_MCP_CLIENTS (its apps' runs, only its keys' if
    it names keys). A token is a random secret: 32 visible characters or more,
    with an estimated 128 bits of entropy (repeats and sequences count for
    little): make one with
    `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.

    Deciding (approve, deny, answer) is off unless --allow-decisions: a model
    driving Relay through MCP must never approve its own calls by default; and
    approving a MONEY call needs --allow-money-decisions too. run_schedule is off
    unless --allow-schedules.
    """
    from workers.fleet_mcp import Offer, Sight, fleet_server, guarded  # noqa: PLC0415

    if allow_money_decisions and not allow_decisions:
        raise Failure("--allow-money-decisions goes with --allow-decisions")
    if clients_file and port is None:
        raise Failure("--clients goes with --http (over stdio, the one client sees the app's runs)")
    offer = Offer(allow_decisions, allow_money_decisions, allow_schedules)
    relay = obj.relay
    served = Sight("", frozenset({relay.name}))
    if port is None:
        fleet_server(relay, offer=offer, local=served).run("stdio")
        return
    clients = _clients(relay, clients_file, served)
    import uvicorn  # noqa: PLC0415 - only this verb (and relay web) serves HTTP

    app = guarded(fleet_server(relay, offer=offer).streamable_http_app(host="127.0.0.1"), clients)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def _clients(relay: Relay, clients_file: str | None, served: Sight) -> dict[str, Sight]:
    """Each bearer token `relay mcp --http` takes, and what its client sees: a clients
    file's, or RELAY_MCP_TOKEN's (the app's runs)."""
    from workers.fleet_mcp import load_clients  # noqa: PLC0415
    from workers.fleet_mcp.tokens import MAKE_A_TOKEN, TOKEN_RULE, check_bearer_token  # noqa: PLC0415

    settings = relay.settings
    clients_file = clients_file or settings.mcp_clients
    token = settings.mcp_token
    if clients_file and token is not None:
        raise Failure(
            "relay mcp --http: RELAY_MCP_TOKEN and a clients file are both given; keep one"
            " (the file can list that token as a client of its own)"
        )
    if clients_file:
        return load_clients(clients_file)
    if token is None:
        raise Failure(
            "relay mcp --http needs a bearer token: RELAY_MCP_TOKEN (unset or blank now)"
            f" holding {TOKEN_RULE} (make one with: {MAKE_A_TOKEN}), or a clients file"
            " (--clients FILE or RELAY_MCP_CLIENTS)"
        )
    try:
        # Checked here, where it guards a server, not with the settings every process
        # reads: a weak token in a shared environment stops only this server.
        return {check_bearer_token(token.get_secret_value()): served}
    except ValueError as weak:
        raise Failure(f"RELAY_MCP_TOKEN: {weak}") from None
