"""`relay mcp`: the fleet as an MCP server, for an IDE, a desktop assistant or another agent.

Tools (every one returns JSON text):

    start_run(task, context?, route?)      start a run; its id
    run_schedule(schedule)                 fire a schedule's recipe once now
    run_status(run_id)                     state, what it waits for, usage, outcome
    run_trace(run_id, start?)              its trace lines from `start` on
    pending()                              what waits for a person
    run_text(run_id, after?, wait_seconds?) its model text streamed since `after`
    approve / deny / answer                only with --allow-decisions

Deciding is off unless the server is started with `--allow-decisions`: a model
driving Relay through MCP must never approve its own calls by default. With it,
every decision names the MCP client as who decided ("mcp client NAME"), and the
run's trace says so. Over HTTP (`--http PORT`) the server listens on 127.0.0.1
only and every request must carry `Authorization: Bearer $RELAY_MCP_TOKEN`.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

from workers.errors import RelayError
from workers.relay import Relay

__all__ = ["TOKEN_VARIABLE", "fleet_server", "guarded"]

TOKEN_VARIABLE = "RELAY_MCP_TOKEN"
TEXT_WAIT_MAX_S = 30.0
TRACE_LINES_MAX = 500
READS = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
STARTS = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
DECIDES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)


def fleet_server(relay: Relay, *, allow_decisions: bool = False) -> MCPServer:
    """An MCP server over `relay`'s runs (decisions only if `allow_decisions`)."""
    server = MCPServer(
        "relay",
        instructions=(
            "Start Relay runs, follow them and see what waits for a person."
            + ("" if allow_decisions else " Decisions are made by people, not here.")
        ),
    )
    _reading_tools(server, relay)
    if allow_decisions:
        _deciding_tools(server, relay)
    return server


def _reading_tools(server: MCPServer, relay: Relay) -> None:
    @server.tool(annotations=STARTS)
    def start_run(task: str, context: str = "", route: str = "") -> str:
        """Start a Relay run on the fleet; returns its run id."""
        run_id = relay.start(task, context, route=route or None)
        return _json({"run_id": run_id})

    @server.tool(annotations=STARTS)
    def run_schedule(schedule: str) -> str:
        """Fire a schedule's recipe once now, under its overlap policy (the next tick
        starts it); returns the firing's time in ms."""
        return _json({"schedule": schedule, "fired_ms": relay.scheduling.run_now(schedule)})

    @server.tool(annotations=READS)
    def run_status(run_id: str) -> str:
        """A run's state, what it waits for, its usage and its outcome."""
        status = relay.status(run_id)
        return status.model_dump_json(
            include={
                "id", "state", "waiting_for", "task", "parent", "children", "usage",
                "outcome", "ending", "unknown_calls", "pending", "paused",
            }
        )  # fmt: skip

    @server.tool(annotations=READS)
    def run_trace(run_id: str, start: int = 0) -> str:
        """A run's trace lines from line `start` on (at most 500 at a time)."""
        lines = relay.trace(run_id)[max(start, 0) :][:TRACE_LINES_MAX]
        return _json(
            {
                "start": max(start, 0),
                "lines": [line.model_dump(mode="json", exclude_defaults=True) for line in lines],
            }
        )

    @server.tool(annotations=READS)
    def pending() -> str:
        """What waits for a person: plans, calls and questions, oldest first."""
        return _json([p.model_dump(mode="json") for p in relay.pending()])

    @server.tool(annotations=READS)
    def run_text(run_id: str, after: str = "0", wait_seconds: float = 10.0) -> str:
        """The run's model text streamed since the event id `after` ("0": from the start),
        waiting up to `wait_seconds` (30 at most) for more; pass back `next` to go on.
        `finished` says the run is done."""
        return _json(_text_since(relay, run_id, after, wait_seconds))


def _deciding_tools(server: MCPServer, relay: Relay) -> None:
    @server.tool(annotations=DECIDES)
    def approve(run_id: str, ctx: Context, call_id: str = "") -> str:
        """Approve a call a run waits on (or, with no call id, its plan)."""
        who = _client(ctx)
        if call_id:
            relay.approve(run_id, call_id, by=who)
        else:
            relay.approve_plan(run_id, by=who)
        return _json({"run_id": run_id, "approved": call_id or "plan", "by": who})

    @server.tool(annotations=DECIDES)
    def deny(run_id: str, ctx: Context, call_id: str = "", reason: str = "") -> str:
        """Decline a call a run waits on (or, with no call id, its plan)."""
        who = _client(ctx)
        if call_id:
            relay.approve(run_id, call_id, yes=False, reason=reason, by=who)
        else:
            relay.approve_plan(run_id, yes=False, by=who)
        return _json({"run_id": run_id, "denied": call_id or "plan", "by": who})

    @server.tool(annotations=DECIDES)
    def answer(run_id: str, text: str, ctx: Context) -> str:
        """Answer the question a run waits on."""
        who = _client(ctx)
        relay.answer(run_id, text, by=who)
        return _json({"run_id": run_id, "answered": True, "by": who})


def _text_since(relay: Relay, run_id: str, after: str, wait_seconds: float) -> dict[str, Any]:
    wait = min(max(float(wait_seconds), 0.0), TEXT_WAIT_MAX_S)
    pieces: list[str] = []
    cursor, finished = after, False
    deadline = time.monotonic() + wait
    for event in relay.stream(run_id, after, timeout=wait):
        cursor = event.id
        if event.run_id != run_id:
            continue  # a specialist's text: its own run_text
        if event.kind == "text":
            pieces.append(event.text)
        elif event.kind == "restarted":
            pieces.append("\n[the reply started over]\n")
        elif event.kind == "done":
            finished = True
            break
        if pieces and time.monotonic() >= deadline - wait / 2:
            break  # enough to hand back; the caller asks again with `next`
    return {"text": "".join(pieces), "next": cursor, "finished": finished}


def _client(ctx: Context) -> str:
    """Who decided: the MCP client, by the name it gave (never a person's name)."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    name = str(getattr(info, "name", "") or "unnamed")[:80]
    return f"mcp client {name}"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def guarded(app: ASGIApp, token: str) -> ASGIApp:
    """`app`, answering 401 to any HTTP request without `Authorization: Bearer <token>`.

    Raises:
        RelayError: the token is empty or short (it must be a secret).
    """
    if len(token) < 16:
        raise RelayError(f"{TOKEN_VARIABLE} must hold a secret of at least 16 characters")
    expected = f"Bearer {token}".encode()

    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": b"a bearer token is needed"})
                return
        await app(scope, receive, send)

    return check
