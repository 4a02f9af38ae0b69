"""`relay mcp` driven by the MCP SDK's own client, against a real fleet.

Over stdio (the client starts `relay mcp` as a command, as an IDE would) and over
streamable HTTP on loopback with a bearer token. A client starts a run, follows
it, reads what waits for a person and is refused a decision unless the server was
started with --allow-decisions; then its decision names it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.cli import Background, clean_env, relay, relay_args
from tests.support.fleet import Fleet
from tests.support.redis_server import free_port
from tests.support.waiting import shared_fleet

APP = "tests.apps.notes:relay"
ME = Implementation(name="ide-test", version="1.0")
TOKEN = "a-long-secret-for-the-tests"


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with shared_fleet(tmp_path_factory.mktemp("fleet-mcp"), "--concurrency", "2") as running:
        yield running


def _stdio(f: Fleet, *extra: str) -> StdioServerParameters:
    program, *args = relay_args("--app", APP, "mcp", *extra)
    return StdioServerParameters(command=program, args=args, env=clean_env(**f.env))


def _said(result: Any) -> Any:
    """A tool's JSON answer (its first text block)."""
    assert not result.is_error, result
    return json.loads(result.content[0].text)


async def _follow(client: Client, run_id: str) -> tuple[str, bool]:
    """The run's streamed text, read through run_text until it says finished."""
    text, after = "", "0"
    for _ in range(30):
        said = _said(await client.call_tool("run_text", {"run_id": run_id, "after": after}))
        text, after = text + said["text"], said["next"]
        if said["finished"]:
            return text, True
    return text, False


def test_a_client_starts_and_follows_a_run_and_may_not_decide(f: Fleet) -> None:
    f.brain.script("MCP-SERVE:", {0: call("delete_note", name="old.txt"), 1: final("deleted it")})

    async def drive() -> tuple[set[str], str, dict[str, Any], list[Any], bool]:
        async with Client(_stdio(f), client_info=ME) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            started = _said(await client.call_tool("start_run", {"task": "MCP-SERVE: delete"}))
            run_id = started["run_id"]
            waiting: list[Any] = []
            for _ in range(100):
                waiting = [
                    p for p in _said(await client.call_tool("pending", {}))
                    if p["run_id"] == run_id
                ]  # fmt: skip
                if waiting:
                    break
                await asyncio.sleep(0.1)
            status = _said(await client.call_tool("run_status", {"run_id": run_id}))
            refused = await client.call_tool("approve", {"run_id": run_id, "call_id": "call-1"})
            return names, run_id, status, waiting, refused.is_error

    names, run_id, status, waiting, refused = asyncio.run(drive())
    assert {"start_run", "run_status", "run_trace", "pending", "run_text"} <= names
    assert not names & {"approve", "deny", "answer"}  # no decisions without the flag
    assert refused
    assert (status["state"], status["waiting_for"]) == ("waiting", "call")
    assert [(p["call_id"], p["tool"]) for p in waiting] == [("call-1", "delete_note")]
    assert "delete_note old.txt" not in f.ledger()  # nothing was decided for it
    f.relay.deny(run_id, "call-1", "not through MCP")


def test_with_allow_decisions_a_decision_names_the_mcp_client(f: Fleet) -> None:
    f.brain.script(
        "MCP-DECIDE:", {0: call("delete_note", name="stale.txt"), 1: final("all done now")}
    )

    async def drive() -> tuple[str, dict[str, Any], str, bool, list[Any]]:
        async with Client(_stdio(f, "--allow-decisions"), client_info=ME) as client:
            run_id = _said(await client.call_tool("start_run", {"task": "MCP-DECIDE: go"}))[
                "run_id"
            ]
            for _ in range(100):
                status = _said(await client.call_tool("run_status", {"run_id": run_id}))
                if status["waiting_for"] == "call":
                    break
                await asyncio.sleep(0.1)
            decided = _said(
                await client.call_tool("approve", {"run_id": run_id, "call_id": "call-1"})
            )
            text, finished = await _follow(client, run_id)
            trace = _said(await client.call_tool("run_trace", {"run_id": run_id}))["lines"]
            return run_id, decided, text, finished, trace

    run_id, decided, text, finished, trace = asyncio.run(drive())
    assert decided["by"] == "mcp client ide-test"
    assert finished
    assert "all done now" in text  # the model's streamed reply, read through run_text
    approved = [line for line in trace if line["kind"] == "approved"]
    assert approved == [
        {
            "at_ms": approved[0]["at_ms"],
            "run": run_id,
            "kind": "approved",
            "text": "by mcp client ide-test",
            "call_id": "call-1",
            "tool": "delete_note",
            "data": {"by": "mcp client ide-test"},
        }
    ]
    assert f.relay.wait(run_id, 30).stop is Stop.DONE
    assert "delete_note stale.txt" in f.ledger()


def test_over_http_a_request_without_the_bearer_token_is_refused(f: Fleet) -> None:
    env = clean_env(**f.env)
    refused = relay("--app", APP, "mcp", "--http", "9", env=env)
    assert refused.returncode == 1
    assert "needs a bearer token in RELAY_MCP_TOKEN" in refused.stderr

    port = free_port()
    server = Background(
        "--app", APP, "mcp", "--http", str(port), env={**env, "RELAY_MCP_TOKEN": TOKEN}
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        _until_listening(url)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            answer = httpx.post(url, json={}, headers=headers, timeout=10)
            assert answer.status_code == 401, headers

        async def drive() -> set[str]:
            import httpx2  # noqa: PLC0415 - the MCP SDK's own HTTP client
            from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx2.AsyncClient(headers=auth) as http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, client_info=ME) as client:
                    return {t.name for t in (await client.list_tools()).tools}

        assert "start_run" in asyncio.run(drive())
    finally:
        server.close()
    assert TOKEN not in server.text


def _until_listening(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {url}")
