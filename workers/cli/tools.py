"""`relay tools`: the app's tools as its workers run them.

    tool              risk     idempotent  from             time limit  arguments
    read_note         read     yes         python           300s        name
    write_file        write    yes         mcp fs           300s        path, content
    charge            create   no          mcp faults       5s          label, seconds?

`--refresh` lists every MCP server again and keeps what they list now for the
whole app (workers take it when they restart).
"""

from __future__ import annotations

from typing import NamedTuple

import click
from rich.table import Table

from workers.cli.common import Context, app_option, json_option, print_json, span
from workers.cli.common import row as cells
from workers.cli.live import console
from workers.mcp.toolset import MCPCall
from workers.relay import Relay

__all__ = ["tools"]


@click.command()
@click.option(
    "--refresh",
    is_flag=True,
    help="List every MCP server again and keep what they list now (restart the workers after).",
)
@json_option
@app_option
@click.pass_obj
def tools(obj: Context, refresh: bool, as_json: bool) -> None:
    """Show the app's tools: each one's risk, whether a crash may run it again
    (idempotent), where it comes from (a Python function or an MCP server), its time
    limit and its arguments (`?`: optional).

    MCP servers' tools are as Redis keeps their listing for the whole app; with
    --refresh they are listed from the servers again first.
    """
    relay = obj.relay
    if refresh:
        listed = relay.refresh_mcp()
        servers = len(relay.mcp.servers) if relay.mcp is not None else 0
        if not as_json:
            console().print(
                f"Listed {len(listed)} tools from {servers} MCP server(s) and kept them for"
                " the app; restart the workers to take them."
            )
    rows = _rows(relay)
    if as_json:
        print_json([row._asdict() for row in rows])
        return
    table = Table(box=None, header_style="bold")
    for header in ("tool", "risk", "idempotent", "from", "time limit"):
        table.add_column(header, no_wrap=True)  # only the arguments wrap on a narrow screen
    table.add_column("arguments")
    for entry in rows:
        table.add_row(
            *cells(
                entry.tool,
                entry.risk,
                "yes" if entry.idempotent else "no",
                entry.source,
                span(entry.timeout),
                ", ".join(entry.arguments),
            )
        )
    console().print(table)


class _Row(NamedTuple):
    tool: str
    risk: str
    idempotent: bool
    source: str
    """`python`, or `mcp <server>`."""
    timeout: float
    arguments: list[str]
    """Each argument's name, `?` after an optional one."""


def _rows(relay: Relay) -> list[_Row]:
    found = []
    for tool in relay.tools:
        spec = relay.kit.spec(tool.name)
        if spec is None:
            continue
        source = f"mcp {spec.fn.server.name}" if isinstance(spec.fn, MCPCall) else "python"
        arguments = [arg.name + ("" if arg.required else "?") for arg in tool.args]
        timeout = relay.kit.timeout_of(tool.name)
        found.append(
            _Row(tool.name, tool.risk_class.value, spec.idempotent, source, timeout, arguments)
        )
    return found
