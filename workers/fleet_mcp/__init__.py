"""`relay mcp`: the fleet as an MCP server, for an IDE, a desktop assistant or another agent.

Tools (every one answers JSON text, or a refusal's reason as the tool's error):

    start_run(task, context?, route?, key?) start a run; its id
    run_status(run_id)                      state, what it waits for, usage, outcome
    run_trace(run_id, start?)               its trace lines from `start` on
    pending()                               what waits for a person
    run_text(run_id, after?, wait_seconds?) its model text streamed since `after`
    run_schedule(schedule)                  only with --allow-schedules
    approve / deny / answer                 only with --allow-decisions (approving a
                                            MONEY call: --allow-money-decisions too)

A client sees only the runs its token is for (`access`: the apps, and keys, of its
entry in RELAY_MCP_CLIENTS; with one RELAY_MCP_TOKEN, or over stdio, the served
app's runs); another run is, to it, a run that does not exist. Deciding is off
unless the server is started with `--allow-decisions`: a model driving Relay
through MCP must never approve its own calls by default. With it, every decision
names the MCP client as who decided ("mcp client NAME", its self-reported name
escaped), and the run's trace says so. Over HTTP (`--http PORT`) the server
listens on 127.0.0.1 only and every request must carry a client's bearer token.
"""

from __future__ import annotations

from workers.fleet_mcp.access import ClientEntry, Sight, guarded, load_clients, shown_name
from workers.fleet_mcp.server import LONG_POLLS_MAX, LONG_POLLS_PER_CLIENT, Offer, fleet_server

__all__ = [
    "LONG_POLLS_MAX",
    "LONG_POLLS_PER_CLIENT",
    "ClientEntry",
    "Offer",
    "Sight",
    "fleet_server",
    "guarded",
    "load_clients",
    "shown_name",
]
