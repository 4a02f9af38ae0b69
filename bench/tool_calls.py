"""What an MCP tool call costs over a Python one, and an async tool over a sync one:
`python -m bench.tool_calls [--calls 2000] [--quick]`.

In this process, with no Celery and no Redis on the call's path, each call made the
way a worker makes it, timed from the call to its answer:
- a sync Python tool through `run_leased` (a pooled thread runs it; the caller waits);
- an async Python tool through `run_leased_async` (the process's event loop runs it);
- an MCP tool over stdio, and the same over streamable HTTP on 127.0.0.1: the real
  `MCPCall` (built from listings kept in a private Redis) through `run_leased_async`,
  on this process's connection to the server, reused from call to call.
Every tool echoes its text argument, and every answer is checked (a wrong one stops the
run). The kinds take turns in rounds (a batch of each per round, the order rotated), so
the machine's noise falls on all alike. Per kind: the median, 99th percentile and worst
call in microseconds, and the median over the sync Python tool's; and, apart, the first
call of each (an MCP server's: starting or reaching it and listing its tools). The
table is printed; every figure goes to bench/out/tool_calls.json. The echo servers are
this module (`--serve-stdio`, `--serve-http PORT`); everything it starts it stops.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.report import machine

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer as EchoServer

    from workers.mcp.toolset import MCPCall
    from workers.runtime.leases import Lease

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "out"
ROUNDS = 5
QUICK_CALLS = 300
TIMEOUT_S = 60.0
"""The time limit each call is given (a worker gives RELAY_TOOL_TIMEOUT)."""
SYNC = "python sync"
ASYNC = "python async"
STDIO = "mcp stdio"
HTTP = "mcp http"


# --- the echo server (this module run with --serve-stdio or --serve-http) ----------------


def _echo_server() -> EchoServer:
    from mcp.server.mcpserver import MCPServer  # noqa: PLC0415 - the measuring side never needs it
    from mcp.types import ToolAnnotations  # noqa: PLC0415

    server = MCPServer("echo", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def echo(text: str) -> str:
        """Return the text."""
        return text

    return server


def _serve_http(port: int) -> None:
    import uvicorn  # noqa: PLC0415 - only the HTTP server needs it

    app = _echo_server().streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- the measuring side -------------------------------------------------------------------


@dataclass
class Kind:
    """One way of calling a tool, and how long each of its calls took."""

    name: str
    call: Callable[[str], str]
    """Make one call with this text, the worker's way; return the output's text."""
    first_ns: int = 0
    times_ns: list[int] = field(default_factory=list)

    def once(self, text: str) -> int:
        """One call, checked; its wall time in ns.

        Raises:
            AssertionError: the tool did not answer with `text`.
        """
        began = time.perf_counter_ns()
        got = self.call(text)
        took = time.perf_counter_ns() - began
        if got != text:
            raise AssertionError(f"{self.name}: asked to echo {text!r}, answered {got!r}")
        return took


def _echo(text: str) -> str:
    return text


async def _echo_async(text: str) -> str:
    return text


def _python_kinds(lease: Lease) -> list[Kind]:
    from workers.runtime.leases import run_leased, run_leased_async  # noqa: PLC0415 - see _kinds

    def sync(text: str) -> str:
        return run_leased(lambda: _echo(text), lease, TIMEOUT_S, threading.Event())

    def asynchronous(text: str) -> str:
        return run_leased_async(_echo_async(text), lease, TIMEOUT_S, threading.Event())

    return [Kind(SYNC, sync), Kind(ASYNC, asynchronous)]


def _mcp_kind(name: str, call: MCPCall, lease: Lease) -> Kind:
    from workers.runtime.leases import run_leased_async  # noqa: PLC0415 - see _kinds

    def through(text: str) -> str:
        output = run_leased_async(call(text=text), lease, TIMEOUT_S, threading.Event())
        return output.text if output.status == "ok" else f"[{output.status}] {output.text}"

    return Kind(name, through)


def _kinds(stack: ExitStack, work: Path) -> list[Kind]:
    """The four kinds, their servers started (and stopped by `stack`).

    The worker's modules are imported here, not at the top: the echo servers, which are
    this module, must start as a plain MCP server would, without them.
    """
    import redis  # noqa: PLC0415

    from tests.support.redis_server import RedisServer, free_port, wait_for_port  # noqa: PLC0415
    from workers.mcp.config import MCPServer  # noqa: PLC0415
    from workers.mcp.toolset import MCPToolset  # noqa: PLC0415
    from workers.runtime.leases import Lease  # noqa: PLC0415

    store = stack.enter_context(RedisServer(work))
    port = free_port()
    command = [sys.executable, "-m", "bench.tool_calls"]
    http = subprocess.Popen([*command, "--serve-http", str(port)], cwd=ROOT)
    stack.callback(_stop, http)
    wait_for_port(port)
    servers = [
        MCPServer("stdio", command=[*command, "--serve-stdio"], cwd=str(ROOT)),
        MCPServer("http", url=f"http://127.0.0.1:{port}/mcp"),
    ]
    toolset = MCPToolset("bench", servers, output_chars=20_000)
    client = redis.Redis.from_url(store.url)
    stack.callback(client.close)
    listings = toolset.listings(client, "bench:")
    stack.callback(_close_connections)  # (before the HTTP server stops: a stack runs backwards)
    calls = {tool.server: call for tool, call in toolset.tools(listings, taken=[])}
    lease = Lease(length_s=15, renew=lambda: True, cancelled=lambda: False)
    return [
        *_python_kinds(lease),
        _mcp_kind(STDIO, calls["stdio"], lease),
        _mcp_kind(HTTP, calls["http"], lease),
    ]


def _close_connections() -> None:
    """Close this process's MCP connections (the SDK stops the stdio server's process)."""
    from workers.loop import run_blocking  # noqa: PLC0415
    from workers.mcp import sessions  # noqa: PLC0415

    run_blocking(sessions.close_all(), 30)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _measure(kinds: list[Kind], calls: int) -> None:
    """Each kind's first call, then `calls` more of each, in ROUNDS interleaved rounds."""
    for kind in kinds:
        kind.first_ns = kind.once("first call")
    batch = math.ceil(calls / ROUNDS)
    for round_ in range(ROUNDS):
        order = kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]
        for kind in order:
            todo = min(batch, calls - len(kind.times_ns))
            kind.times_ns.extend(kind.once(f"round {round_} call {n}") for n in range(todo))


def _figures(kinds: list[Kind], calls: int) -> dict[str, Any]:
    def us(ns: float) -> float:
        return round(ns / 1000, 1)

    medians = {kind.name: statistics.median(kind.times_ns) for kind in kinds}
    per_call = {
        kind.name: {
            "median": us(medians[kind.name]),
            "mean": us(statistics.fmean(kind.times_ns)),
            "p99": us(sorted(kind.times_ns)[math.ceil(len(kind.times_ns) * 0.99) - 1]),
            "worst": us(max(kind.times_ns)),
            "median / python sync median": round(medians[kind.name] / medians[SYNC], 2),
        }
        for kind in kinds
    }
    return {
        "calls of each kind": calls,
        "rounds": ROUNDS,
        "per call (us)": per_call,
        "first call (ms)": {kind.name: round(kind.first_ns / 1e6, 1) for kind in kinds},
        "ratios": {
            "async / sync": round(medians[ASYNC] / medians[SYNC], 2),
            "mcp stdio / python": round(medians[STDIO] / medians[SYNC], 2),
            "mcp http / python": round(medians[HTTP] / medians[SYNC], 2),
            "mcp http / mcp stdio": round(medians[HTTP] / medians[STDIO], 2),
        },
    }


RATIO_LINES = {
    "async / sync": "median call of an async Python tool / of a sync one (both via a lease)",
    "mcp stdio / python": "median MCP call over stdio (connection reused) / sync Python tool's",
    "mcp http / python": "median MCP call over streamable HTTP on 127.0.0.1 / sync Python tool's",
    "mcp http / mcp stdio": "median MCP call over HTTP / the same call over stdio",
}


def _table(found: dict[str, Any]) -> str:
    lines = [
        f"per call, us: {found['calls of each kind']} calls of each kind,"
        f" {found['rounds']} interleaved rounds",
        f"{'kind':<14}{'median':>10}{'p99':>10}{'worst':>10}{'÷ sync median':>16}",
    ]
    for name, row in found["per call (us)"].items():
        lines.append(
            f"{name:<14}{row['median']:>10,.1f}{row['p99']:>10,.1f}{row['worst']:>10,.1f}"
            f"{row['median / python sync median']:>16.2f}"
        )
    first = found["first call (ms)"]
    lines.append(
        f"first MCP call (start or reach the server, list its tools, call): stdio"
        f" {first[STDIO]:,.1f} ms, http {first[HTTP]:,.1f} ms"
    )
    lines.append("")
    for name, ratio in found["ratios"].items():
        lines.append(f"{name} = {ratio:.2f}: {RATIO_LINES[name]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tool_calls", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls of each kind")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_CALLS} calls of each kind")
    parser.add_argument("--serve-stdio", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-http", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_stdio:
        _echo_server().run("stdio")
        return 0
    if args.serve_http:
        _serve_http(args.serve_http)
        return 0
    calls = QUICK_CALLS if args.quick else args.calls
    if calls < ROUNDS:
        parser.error(f"--calls takes at least {ROUNDS}")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tool-calls-") as work, ExitStack() as stack:
        kinds = _kinds(stack, Path(work))
        _measure(kinds, calls)
    found: dict[str, Any] = {
        "machine": {**machine(), "mcp": metadata.version("mcp")},
        **_figures(kinds, calls),
        "seconds": round(time.monotonic() - began, 1),
    }
    print(_table(found))
    out = OUT / "tool_calls.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(found, indent=2) + "\n")
    print(f"\nall figures: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
