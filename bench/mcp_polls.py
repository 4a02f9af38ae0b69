"""`relay mcp` under long polls: how long `pending` takes while N `run_text` calls wait.

One run parks at an approval (its text stream then stays quiet). A real `relay mcp
--http` serves the bench app to two clients of a clients file; each opens half of
N `run_text` long polls at the stream's end (each waits `WAIT_S` for text that
never comes), and a third connection asks `pending` `SAMPLES` times, one after
another, timing each from the MCP SDK client's side. Printed: p50, p95 and max,
with no poll open and with N open. The promise: under 1 s with 60 open.

    python -m bench.mcp_polls [--polls 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bench.context import Bench, bench, median, percentile
from bench.model import Task
from tests.support.cli import Background, clean_env
from tests.support.redis_server import free_port

__all__ = ["GOAL_S", "run"]

GOAL_S = 1.0
WAIT_S = 25
SAMPLES = 20


async def _pending_times(url: str, tokens: list[str], run_id: str, polls: int) -> list[float]:
    from mcp import Client  # noqa: PLC0415 - only this benchmark speaks MCP
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415

    async with AsyncExitStack() as stack:
        clients = []
        for i in range(3):  # two that poll, one that asks `pending`
            auth = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
            http = await stack.enter_async_context(create_mcp_http_client(headers=auth))
            transport = streamable_http_client(url, http_client=http)
            clients.append(await stack.enter_async_context(Client(transport)))
        first = await clients[0].call_tool("run_text", {"run_id": run_id, "wait_seconds": 0.5})
        after = json.loads(first.content[0].text)["next"]
        ask = {"run_id": run_id, "after": after, "wait_seconds": WAIT_S}
        waiting = [
            asyncio.create_task(clients[i % 2].call_tool("run_text", ask)) for i in range(polls)
        ]
        await asyncio.sleep(2 if polls else 0)  # every poll reaches the server and waits
        times = []
        for _ in range(SAMPLES):
            started = time.monotonic()
            await clients[2].call_tool("pending", {})
            times.append(time.monotonic() - started)
        if any(task.done() for task in waiting):
            raise RuntimeError("a long poll answered before the samples were taken")
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return times


def run(b: Bench, polls: int = 60) -> dict[str, Any]:
    """Park a run, serve `relay mcp --http`, and time `pending` with 0 and `polls` waiting."""
    worker = b.relay_worker("mcp-polls", "--concurrency", "2")
    run_id = b.relay.start(Task("mcp-poll-0", park=1).text())
    deadline = time.monotonic() + 120
    while not b.relay.status(run_id).pending:
        if time.monotonic() > deadline:
            raise TimeoutError("the run did not park")
        time.sleep(0.1)
    tokens = [secrets.token_urlsafe(32) for _ in range(2)]
    clients = [{"name": f"c{i}", "token": t, "apps": ["bench"]} for i, t in enumerate(tokens)]
    listed = b.directory / "mcp-clients.json"
    listed.write_text(json.dumps({"clients": clients}))
    port = free_port()
    server = Background(
        "--app", "bench.app:relay", "mcp", "--http", str(port), "--clients", str(listed),
        env=clean_env(**b.env),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _until_listening(port, server)
        idle = asyncio.run(_pending_times(url, tokens, run_id, 0))
        loaded = asyncio.run(_pending_times(url, tokens, run_id, polls))
    finally:
        server.close()
        worker.stop()
    return {"polls": polls, "idle_s": _summary(idle), "loaded_s": _summary(loaded)}


def _summary(times: list[float]) -> dict[str, float]:
    return {"p50": median(times), "p95": percentile(times, 95), "max": max(times)}


def _until_listening(port: int, server: Background) -> None:
    import socket  # noqa: PLC0415

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if server.process.poll() is not None:
            raise RuntimeError(f"relay mcp stopped:\n{server.text}")
        time.sleep(0.1)
    raise TimeoutError("relay mcp did not listen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=60)
    polls = parser.parse_args().polls
    with tempfile.TemporaryDirectory() as directory, bench(Path(directory), quick=True) as b:
        found = run(b, polls)
    print(f"pending over MCP, {SAMPLES} asks, seconds (goal: under {GOAL_S:g} s with {polls} open)")
    for name in ("idle_s", "loaded_s"):
        shown = found[name]
        label = "no poll open" if name == "idle_s" else f"{polls} polls open"
        print(
            f"  {label:<16} p50 {shown['p50']:.3f}  p95 {shown['p95']:.3f}  max {shown['max']:.3f}"
        )
    if found["loaded_s"]["max"] >= GOAL_S:
        sys.exit(f"missed: pending took {found['loaded_s']['max']:.3f} s with {polls} polls open")


if __name__ == "__main__":
    main()
