"""The MCP server over a Relay's runs: its tools, each scoped to the client's `Sight`.

Every tool is a coroutine on `AsyncRelay` (redis.asyncio): none holds a thread, so
long polls (`run_text` waiting for text) do not starve the other tools; they are
capped per client (its token: the protocol has no sessions to tell clients apart)
and per process all the same, since each holds a Redis
connection while it waits. A refusal reaches the client as an MCP tool error whose
text is its reason; a run outside the client's sight is refused exactly as a run
that does not exist.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Hashable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from agent_core import AgentError, Risk
from workers.aio import AsyncRelay
from workers.engine.records import StreamEvent
from workers.errors import DecisionRefused, RelayError, RunNotFound
from workers.fleet_mcp.access import CLIENT_SCOPE, Sight, shown_name
from workers.relay import Relay
from workers.store.codec import record_of
from workers.store.layout import Keys, RunFields
from workers.store.ops import Batch, Command, Steps

__all__ = ["LONG_POLLS_MAX", "LONG_POLLS_PER_CLIENT", "Offer", "fleet_server"]

TEXT_WAIT_MAX_S = 30.0
TRACE_LINES_MAX = 500
LONG_POLLS_PER_CLIENT = 32
"""`run_text` calls one client (a token) may have waiting at once."""
LONG_POLLS_MAX = 256
"""`run_text` calls the server may have waiting at once, all clients together."""
READS = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
STARTS = ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False)
DECIDES = ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False)
STATUS_FIELDS = {
    "id", "state", "waiting_for", "task", "parent", "children", "usage", "outcome",
    "ending", "unknown_calls", "pending", "paused", "key",
}  # fmt: skip


@dataclass(frozen=True)
class Offer:
    """What the server offers beyond reading and starting runs (each off by default)."""

    decisions: bool = False
    """approve, deny and answer (a MONEY call's approval aside)."""
    money: bool = False
    """Approving a MONEY call too (with `decisions`)."""
    schedules: bool = False
    """run_schedule: firing a schedule's recipe now."""


def fleet_server(relay: Relay, *, offer: Offer = Offer(), local: Sight | None = None) -> MCPServer:
    """An MCP server over `relay`'s runs. Each request sees what its client's `Sight`
    allows: the one `guarded` put in its HTTP scope, else `local` (stdio's one client);
    with neither, every tool refuses."""
    fleet = _Fleet(relay, offer, local)
    server = MCPServer(
        "relay",
        instructions=(
            "Start Relay runs, follow them and see what waits for a person."
            + ("" if offer.decisions else " Decisions are made by people, not here.")
        ),
    )
    _reading_tools(server, fleet)
    if offer.schedules:
        _schedule_tool(server, fleet)
    if offer.decisions:
        _deciding_tools(server, fleet)
    return server


def _reading_tools(server: MCPServer, fleet: _Fleet) -> None:
    @server.tool(annotations=STARTS)
    async def start_run(
        task: str, ctx: Context, context: str = "", route: str = "", key: str = ""
    ) -> CallToolResult:
        """Start a Relay run on the fleet; returns its run id. `key`: the run's key (a
        tenant, say); a client limited to keys must use one of them."""
        return await _answer(fleet.start(ctx, task, context, route, key))

    @server.tool(annotations=READS)
    async def run_status(run_id: str, ctx: Context) -> CallToolResult:
        """A run's state, what it waits for, its usage and its outcome."""
        return await _answer(fleet.status(ctx, run_id))

    @server.tool(annotations=READS)
    async def run_trace(run_id: str, ctx: Context, start: int = 0) -> CallToolResult:
        """A run's trace lines from line `start` on (at most 500 at a time)."""
        return await _answer(fleet.trace(ctx, run_id, start))

    @server.tool(annotations=READS)
    async def pending(ctx: Context) -> CallToolResult:
        """What waits for a person: plans, calls and questions, oldest first."""
        return await _answer(fleet.pending(ctx))

    @server.tool(annotations=READS)
    async def run_text(
        run_id: str, ctx: Context, after: str = "0", wait_seconds: float = 10.0
    ) -> CallToolResult:
        """The run's model text streamed since the event id `after` ("0": from the start),
        waiting up to `wait_seconds` (30 at most) for more; pass back `next` to go on.
        `finished` says the run is done."""
        return await _answer(fleet.text(ctx, run_id, after, wait_seconds))


def _schedule_tool(server: MCPServer, fleet: _Fleet) -> None:
    @server.tool(annotations=STARTS)
    async def run_schedule(schedule: str, ctx: Context) -> CallToolResult:
        """Fire a schedule's recipe once now, under its overlap policy (the next tick
        starts it); returns the firing's time in ms."""
        return await _answer(fleet.fire(ctx, schedule))


def _deciding_tools(server: MCPServer, fleet: _Fleet) -> None:
    @server.tool(annotations=DECIDES)
    async def approve(run_id: str, ctx: Context, call_id: str = "") -> CallToolResult:
        """Approve a call a run waits on (or, with no call id, its plan)."""
        return await _answer(fleet.decide(ctx, run_id, call_id, yes=True))

    @server.tool(annotations=DECIDES)
    async def deny(
        run_id: str, ctx: Context, call_id: str = "", reason: str = ""
    ) -> CallToolResult:
        """Decline a call a run waits on (or, with no call id, its plan)."""
        return await _answer(fleet.decide(ctx, run_id, call_id, yes=False, reason=reason))

    @server.tool(annotations=DECIDES)
    async def answer(run_id: str, text: str, ctx: Context) -> CallToolResult:
        """Answer the question a run waits on."""
        return await _answer(fleet.answer(ctx, run_id, text))


async def _answer(work: Awaitable[object]) -> CallToolResult:
    """The tool's answer: what `work` returns as JSON text, or the reason it was refused
    as the tool's error (the SDK would send a bare "Error executing tool" instead)."""
    try:
        value = await work
    except (RelayError, AgentError, ValueError) as refused:
        return CallToolResult(content=[TextContent(type="text", text=str(refused))], is_error=True)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)])


class _Fleet:
    """The tools' work, each checked against the client's sight first."""

    def __init__(self, relay: Relay, offer: Offer, local: Sight | None) -> None:
        self.relay = relay
        self.arelay = AsyncRelay(relay)
        self.offer = offer
        self.local = local
        self.polls = LongPolls(LONG_POLLS_PER_CLIENT, LONG_POLLS_MAX)

    def sight(self, ctx: Context) -> Sight:
        request = ctx.request_context.request
        scope = getattr(request, "scope", None)
        given = scope.get(CLIENT_SCOPE) if isinstance(scope, dict) else None
        if isinstance(given, Sight):
            return given
        if self.local is None:
            raise RelayError("this request carries no client's token")
        return self.local

    async def visible(self, ctx: Context, run_id: str) -> None:
        """Raises RunNotFound, the same for a run out of the client's sight as for a
        run that does not exist (so a refusal tells nothing of another client's runs)."""
        (owner,) = await self.arelay.drive(_owners(self.arelay.keys, [str(run_id)]))
        if owner is None or not self.sight(ctx).sees(*owner):
            raise RunNotFound(f"no run {run_id!r} (it never existed, or it finished and expired)")

    async def start(self, ctx: Context, task: str, context: str, route: str, key: str) -> object:
        key_given = self.sight(ctx).key_to_start(self.relay.name, key)
        run_id = await self.arelay.start(task, context, route=route or None, key=key_given)
        return {"run_id": run_id}

    async def status(self, ctx: Context, run_id: str) -> str:
        await self.visible(ctx, run_id)
        return (await self.arelay.status(run_id)).model_dump_json(include=STATUS_FIELDS)

    async def trace(self, ctx: Context, run_id: str, start: int) -> object:
        await self.visible(ctx, run_id)
        lines = (await self.arelay.trace(run_id))[max(start, 0) :][:TRACE_LINES_MAX]
        shown = [line.model_dump(mode="json", exclude_defaults=True) for line in lines]
        return {"start": max(start, 0), "lines": shown}

    async def pending(self, ctx: Context) -> object:
        sight = self.sight(ctx)
        waiting = await self.arelay.pending()
        owners = await self.arelay.drive(_owners(self.arelay.keys, [p.run_id for p in waiting]))
        return [
            p.model_dump(mode="json")
            for p, owner in zip(waiting, owners, strict=True)
            if owner is not None and sight.sees(*owner)
        ]

    async def text(self, ctx: Context, run_id: str, after: str, wait_seconds: float) -> object:
        await self.visible(ctx, run_id)
        wait = min(max(float(wait_seconds), 0.0), TEXT_WAIT_MAX_S)
        with self.polls.held(self.sight(ctx)):
            return await _text_since(self.arelay, run_id, after, wait)

    async def fire(self, ctx: Context, schedule: str) -> object:
        app = self.relay.name  # a schedule's runs are the app's, under its default key
        if not self.sight(ctx).sees(app, app):
            raise RelayError(
                f"a schedule starts runs of the app {app!r} with the key {app!r}: runs this"
                " client may not start"
            )
        fired_ms = await asyncio.to_thread(self.relay.scheduling.run_now, schedule)
        return {"schedule": schedule, "fired_ms": fired_ms}

    async def decide(
        self, ctx: Context, run_id: str, call_id: str, *, yes: bool, reason: str = ""
    ) -> object:
        await self.visible(ctx, run_id)
        who = self.who(ctx)
        if not call_id:
            await self.arelay.approve_plan(run_id, yes, by=who)
            return {"run_id": run_id, "approved" if yes else "denied": "plan", "by": who}
        if yes and not self.offer.money:
            await self._not_money(run_id, call_id)
        await self.arelay.approve(run_id, call_id, yes, reason, by=who)
        return {"run_id": run_id, "approved" if yes else "denied": call_id, "by": who}

    async def _not_money(self, run_id: str, call_id: str) -> None:
        """Raises DecisionRefused if the call is a MONEY call (or of no known risk)."""
        status = await self.arelay.status(run_id)
        risks = [p.risk for p in status.pending if p.call_id == call_id and p.kind == "call"]
        if risks and risks[0] in (Risk.MONEY, None):
            raise DecisionRefused(
                f"call {call_id} of run {run_id} moves money: this server may not approve it"
                " (relay mcp --allow-money-decisions); a person decides it in relay web or"
                " with relay approve"
            )

    async def answer(self, ctx: Context, run_id: str, text: str) -> object:
        await self.visible(ctx, run_id)
        who = self.who(ctx)
        await self.arelay.answer(run_id, text, by=who)
        return {"run_id": run_id, "answered": True, "by": who}

    def who(self, ctx: Context) -> str:
        """Who decided: the MCP client by the name it gave, escaped (never a person's
        name), and the clients file's name of its token if it has one."""
        params = getattr(ctx.request_context.session, "client_params", None)
        name = shown_name(getattr(getattr(params, "client_info", None), "name", ""))
        token = self.sight(ctx).name
        return f"mcp client {name}" + (f" (token {token})" if token else "")


class LongPolls:
    """Counts the long polls waiting now, per client and in all; one more than either
    cap is refused at once (it would hold a Redis connection while it waits)."""

    def __init__(self, per_client: int, most: int) -> None:
        self.per_client = per_client
        self.most = most
        self.open: dict[Hashable, int] = {}

    @contextmanager
    def held(self, client: Hashable) -> Iterator[None]:
        """Hold one long poll of `client` for the block.

        Raises:
            RelayError: the client, or the server, has as many waiting as it may.
        """
        if self.open.get(client, 0) >= self.per_client:
            raise RelayError(
                f"this client has {self.per_client} run_text calls waiting already (the most):"
                " ask again once one answers"
            )
        if sum(self.open.values()) >= self.most:
            raise RelayError(
                f"the server has {self.most} run_text calls waiting already (the most):"
                " ask again shortly"
            )
        self.open[client] = self.open.get(client, 0) + 1
        try:
            yield
        finally:
            self.open[client] -= 1
            if not self.open[client]:
                del self.open[client]


def _owners(
    keys: Keys, run_ids: Sequence[str]
) -> Steps[list[tuple[str | None, str | None] | None]]:
    """Each run's (app, key), read in one round trip: None for no such run, or one whose
    record cannot be read (nobody's to see)."""
    if not run_ids:
        return []
    found = yield Batch(
        tuple(Command(("HMGET", keys.run(r), RunFields.RECORD, RunFields.FIXED)) for r in run_ids)
    )
    owners: list[tuple[str | None, str | None] | None] = []
    for meta, fixed in found:
        try:
            record = None if meta is None else record_of(meta, fixed)
        except ValidationError:
            record = None
        owners.append(None if record is None else (record.app, record.key))
    return owners


async def _text_since(arelay: AsyncRelay, run_id: str, after: str, wait: float) -> dict[str, Any]:
    pieces: list[str] = []
    cursor, finished = after, False
    deadline = time.monotonic() + wait
    stream = arelay.stream(run_id, after, timeout=wait)  # an async generator, closed below
    async with aclosing(cast(AsyncGenerator[StreamEvent, None], stream)) as events:
        async for event in events:
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
