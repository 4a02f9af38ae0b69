"""`relay tools`: the app's tools as its workers run them.

    tool        risk    idempotent  from        risk from                  time limit  arguments
    read_note   read    yes         python      code                       300s        name
    write_file  write   yes         mcp fs      annotations (trusted)      300s        path, content
    wipe        write   no          mcp faults  default: untrusted server  5s          label
    charge      create  no          mcp faults  override                   5s          label, ...

An MCP tool's risk comes from its server's annotations only if the operator trusts
the server (`trust_annotations`); "risk from" says which it was. A stdio server's
stderr goes to the log, not over the table.

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

PYTHON_RISK_FROM = "code"
"""A Python tool's risk is what its code declares."""


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
    (idempotent), where it comes from (a Python function or an MCP server), where its
    risk comes from, its time limit and its arguments (`?`: optional).

    An MCP tool's risk is its server's `risk` override ("override"), its annotations
    if the server is marked `trust_annotations` ("annotations (trusted)"), else WRITE
    and not idempotent ("default: untrusted server"); a Python tool's is what its
    code says ("code"). A `risk` or `idempotent` entry that names none of its
    server's tools is an error, never ignored (with --refresh, nothing is kept).

    MCP servers' tools are as Redis keeps their listing for the whole app; with
    --refresh they are listed from the servers again first (what a stdio server
    writes to its stderr is logged, and shown only if it cannot be started).
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
    table = Table(box=None, header_style="bold", pad_edge=False)
    # On a narrow screen the risk's source and the arguments wrap, word by word; a risk
    # and the words of its source are never cut short.
    table.add_column("tool", no_wrap=True)
    table.add_column("risk", no_wrap=True, min_width=len("create"))
    table.add_column("idempotent", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("risk from", min_width=len("untrusted"))
    table.add_column("time limit", no_wrap=True)
    table.add_column("arguments")
    for entry in rows:
        table.add_row(
            *cells(
                entry.tool,
                entry.risk,
                "yes" if entry.idempotent else "no",
                entry.source,
                entry.risk_from,
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
    risk_from: str
    """`code` (a Python tool's own), or an MCP tool's: see workers.mcp.mapping's FROM_*."""
    timeout: float
    arguments: list[str]
    """Each argument's name, `?` after an optional one."""


def _rows(relay: Relay) -> list[_Row]:
    found = []
    for tool in relay.tools:
        spec = relay.kit.spec(tool.name)
        if spec is None:
            continue
        if isinstance(spec.fn, MCPCall):
            source, risk_from = f"mcp {spec.fn.server.name}", spec.fn.tool.risk_from
        else:
            source, risk_from = "python", PYTHON_RISK_FROM
        arguments = [arg.name + ("" if arg.required else "?") for arg in tool.args]
        timeout = relay.kit.timeout_of(tool.name)
        found.append(
            _Row(
                tool.name,
                tool.risk_class.value,
                spec.idempotent,
                source,
                risk_from,
                timeout,
                arguments,
            )
        )
    return found
