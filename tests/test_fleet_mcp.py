"""`relay mcp` driven by the MCP SDK's own client, against a real fleet.

Over stdio (the client starts `relay mcp` as a command, as an IDE would) and over
streamable HTTP on loopback with bearer tokens. A client starts a run, follows
it, reads what waits for a person and is refused a decision unless the server was
started with --allow-decisions; then its decision names it, escaped. A client
sees only the runs of its apps and keys (another's is a run that does not exist);
approving a MONEY call needs its own flag; a refusal reaches the client as its
reason; a weak token stops the server at start; and `pending` answers at once
while 60 long polls wait.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from agent_core import Stop
from tests.apps.notes import build
from tests.support.brain import call, final
from tests.support.cli import Background, clean_env, relay, relay_args
from tests.support.fleet import Fleet
from tests.support.redis_server import free_port
from tests.support.waiting import pending_for, shared_fleet
from tests.support.web import RelayWeb
from workers.fleet_mcp import LONG_POLLS_PER_CLIENT, shown_name
from workers.fleet_mcp.tokens import check_bearer_token, estimated_bits
from workers.settings import Settings

APP = "tests.apps.notes:relay"
ME = Implementation(name="ide-test", version="1.0")
TOKEN = "tests-only-Zx8Qw3Rt7Yu2Io5Pa9Sd4Fg6Hj1Kl0"


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


def test_over_stdio_a_client_sees_only_the_app_served(f: Fleet) -> None:
    other_app = build(f.relay.settings, name="billing")  # same Redis and prefix, no worker
    theirs = other_app.start("MCP-OTHER: an invoice of another app")

    async def drive() -> Any:
        async with Client(_stdio(f), client_info=ME) as client:
            return await client.call_tool("run_status", {"run_id": theirs})

    refused = asyncio.run(drive())
    assert refused.is_error
    assert refused.content[0].text == (
        f"no run {theirs!r} (it never existed, or it finished and expired)"
    )
    assert other_app.status(theirs).state == "running"  # it is there, for its own app
    other_app.cancel(theirs)


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
    assert "needs a bearer token: RELAY_MCP_TOKEN (unset or blank now)" in refused.stderr
    assert "secrets.token_urlsafe(32)" in refused.stderr

    with _http(f, env={"RELAY_MCP_TOKEN": TOKEN}) as (url, server):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            answer = httpx.post(url, json={}, headers=headers, timeout=10)
            assert answer.status_code == 401, headers

        async def drive() -> set[str]:
            async with _session(url, TOKEN) as client:
                return {t.name for t in (await client.list_tools()).tools}

        assert "start_run" in asyncio.run(drive())
    assert TOKEN not in server.text


WEAK = {
    "sixteen spaces": " " * 16,
    "short": "s3cr3t-but-short",
    "one letter": "a" * 40,
    "few letters": "abcabcabcabcabcabcabcabcabcabcabcabc",
    "a piece repeated": "Ab1-Cd2_Ef" * 4,
    "a space inside": "Zx8Qw3Rt7Yu2Io5Pa9Sd4Fg6Hj1 Kl0mN",
    # The outside review's tokens, which eight different characters let through:
    "one letter and a tail": "a" * 24 + "bcdefghi",
    "eight letters repeated": "ABCDEFGH" * 4 + "I",
    "digits counted up": "0123456789" * 3 + "01",
    "a word twice and digits": "passwordpassword1234567890123456",
    "changeme thrice": "changeme-changeme-changeme-12345",
    "the alphabet": "abcdefghijklmnopqrstuvwxyzABCDEF",
}


@pytest.mark.parametrize("token", WEAK.values(), ids=WEAK.keys())
def test_a_weak_token_stops_the_server_at_start_saying_how_to_make_one(
    f: Fleet, token: str
) -> None:
    env = clean_env(**f.env, RELAY_MCP_TOKEN=token)
    refused = relay("--app", APP, "mcp", "--http", str(free_port()), env=env, timeout=60)
    assert refused.returncode == 1, refused.stdout
    said = refused.stderr
    if token.strip():
        assert (
            "RELAY_MCP_TOKEN: expected a random secret of at least 32 visible ASCII characters"
            " (no spaces) with an estimated 128 bits of entropy or more, but" in said
        ), said
        assert token.strip() not in said  # never echoed
    else:  # blank is unset, as for every setting
        assert "needs a bearer token: RELAY_MCP_TOKEN (unset or blank now)" in said, said
    assert "secrets.token_urlsafe(32)" in said


def test_the_token_never_shows_in_the_settings() -> None:
    for token in (TOKEN, "devtoken"):
        settings = Settings.from_env({"RELAY_MCP_TOKEN": token})
        assert settings.mcp_token is not None
        assert settings.mcp_token.get_secret_value() == token
        for shown in (repr(settings), str(settings), json.dumps(settings.redacted())):
            assert token not in shown
        assert settings.redacted()["mcp_token"] == "***"


def test_a_weak_token_stops_only_relay_mcp_not_workers_nor_commands(
    f: Fleet, tmp_path: Path
) -> None:
    # A shared .env from a release that took any token: the fleet must go on.
    weak = {"RELAY_MCP_TOKEN": "devtoken"}
    worker = f.worker("--concurrency", "1", name="weak-token", env=weak)  # waits for "ready."
    try:
        assert worker.process is not None
        assert worker.process.poll() is None  # still running
        listed = relay("--app", APP, "pending", env=clean_env(**f.env, **weak), timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "RELAY_MCP_TOKEN" not in listed.stderr + listed.stdout
    finally:
        worker.stop()
    assert "RELAY_MCP_TOKEN" not in worker.output()
    refused = relay(
        "--app", APP, "mcp", "--http", str(free_port()), env=clean_env(**f.env, **weak), timeout=60
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert "RELAY_MCP_TOKEN: expected a random secret" in refused.stderr
    assert "but it has 8 characters" in refused.stderr


A_TOKEN = "tests-acme-Qm4Vt8Lp2Xr6Nz1Bw5Hc9Jd3Ks7"
BILLING_TOKEN = "tests-billing-Ge5Wy9Tu3Ro7Ia1Pq6Sz2Dx8"
ALL_TOKEN = "tests-notes-Fk2Mv7Lc4Nb8Xj1Hg5Ds9Wq3Ez6"
BOT_TOKEN = "tests-bot-Rn6Tc1Vz8Ka3Gm5Yp2Lh9Wd4Bs7"
CLIENTS = [
    {"name": "acme-ide", "token": A_TOKEN, "apps": ["notes"], "keys": ["acme"]},
    {"name": "billing-ide", "token": BILLING_TOKEN, "apps": ["billing"]},
    {"name": "notes-desk", "token": ALL_TOKEN, "apps": ["notes"]},
    {"name": "notes-bot", "token": BOT_TOKEN, "apps": ["notes"]},
]


def test_a_weak_token_in_the_clients_file_stops_the_server(f: Fleet, tmp_path: Path) -> None:
    weak = {"name": "ide", "token": " " * 16, "apps": ["notes"]}
    listed = _clients_file(tmp_path, {**CLIENTS[0]}, weak)
    refused = relay(
        "--app", APP, "mcp", "--http", str(free_port()), "--clients", str(listed),
        env=clean_env(**f.env), timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert f"RELAY_MCP_CLIENTS: {listed}: client 2: token" in refused.stderr
    assert "but it has 16 characters" in refused.stderr
    assert "secrets.token_urlsafe(32)" in refused.stderr


def test_a_clients_file_nested_too_deeply_is_one_line_naming_it(f: Fleet, tmp_path: Path) -> None:
    deep = tmp_path / "clients.toml"
    deep.write_text("clients = " + "[" * 50_000 + "]" * 50_000)
    refused = relay(
        "--app", APP, "mcp", "--http", str(free_port()), "--clients", str(deep),
        env=clean_env(**f.env), timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.strip().splitlines() == [
        f"relay: RELAY_MCP_CLIENTS: cannot read {deep}: it is nested too deeply"
    ]


def test_a_random_token_passes_the_check() -> None:
    for _ in range(300):
        for token in (secrets.token_urlsafe(32), secrets.token_hex(32)):
            assert check_bearer_token(token) == token


@pytest.mark.parametrize("token", list(WEAK.values())[6:], ids=list(WEAK.keys())[6:])
def test_a_made_up_token_is_estimated_far_below_128_bits(token: str) -> None:
    assert estimated_bits(token) < 100
    with pytest.raises(ValueError, match=r"its entropy is estimated at \d+ bits"):
        check_bearer_token(token)


def test_the_estimate_counts_a_repeat_once_and_a_sequence_as_one_step() -> None:
    random_half = secrets.token_urlsafe(24)[:32]
    assert estimated_bits(random_half + random_half) < estimated_bits(random_half) + 20
    assert estimated_bits("".join(chr(33 + n) for n in range(90))) < 10  # !"#$%... in order


def test_a_client_sees_only_its_apps_and_keys_and_may_not_approve_money(
    f: Fleet, tmp_path: Path
) -> None:
    f.brain.script("MCP-PAY:", {0: call("pay", amount=999_999), 1: final("paid")})
    run_id = f.relay.start("MCP-PAY: pay the invoice (IBAN DE89 3704)", key="globex")
    pending_for(f, run_id)
    listed = _clients_file(tmp_path, *CLIENTS)

    async def as_client(url: str, token: str, *, inside: bool = False) -> dict[str, Any]:
        async with _session(url, token) as client:
            seen: dict[str, Any] = {
                "pending": [p["run_id"] for p in _said(await client.call_tool("pending", {}))]
            }
            for tool, args in (
                ("run_status", {}),
                ("run_trace", {}),
                ("run_text", {"wait_seconds": 0.5}),
                ("approve", {"call_id": "call-1"}),
                ("deny", {"call_id": "call-1"}),
                ("answer", {"text": "yes"}),
            )[: 4 if inside else None]:  # (a client that sees the run would deny it)
                for which, asked in (("run", run_id), ("none", "nosuchrun")):
                    result = await client.call_tool(tool, {"run_id": asked, **args})
                    text = result.content[0].text if result.is_error else None
                    seen[f"{tool} {which}"] = text and text.replace(asked, "RUN")
            for key in ("", "globex", "acme"):
                result = await client.call_tool("start_run", {"task": "MCP-PAY: x", "key": key})
                seen[f"start {key}"] = result.content[0].text if result.is_error else "started"
                if not result.is_error:
                    started = json.loads(result.content[0].text)["run_id"]
                    seen[f"key {key}"] = f.relay.status(started).key
                    f.relay.cancel(started)
            fired = await client.call_tool("run_schedule", {"schedule": "no-such"})
            seen["fire"] = fired.content[0].text
            return seen

    flags = ("--allow-decisions", "--allow-schedules", "--clients", str(listed))
    with _http(f, *flags) as (url, _):
        acme = asyncio.run(as_client(url, A_TOKEN))
        billing = asyncio.run(as_client(url, BILLING_TOKEN))
        desk = asyncio.run(as_client(url, ALL_TOKEN, inside=True))

    missing = "no run 'RUN' (it never existed, or it finished and expired)"
    for outside in (acme, billing):  # another key's run, another app's run: not there
        assert run_id not in outside["pending"]
        for tool in ("run_status", "run_trace", "run_text", "approve", "deny", "answer"):
            assert outside[f"{tool} run"] == outside[f"{tool} none"] == missing, tool
    assert run_id in desk["pending"]
    assert desk["run_status none"] == missing
    assert desk["run_status run"] is None  # it sees the run
    assert desk["approve run"] == (
        "call call-1 of run RUN moves money: this server may not approve it"
        " (relay mcp --allow-money-decisions); a person decides it in relay web or with"
        " relay approve"
    )  # the reason itself, not "Error executing tool approve"

    assert (acme["start "], acme["key "]) == ("started", "acme")  # its one key
    assert acme["start globex"] == "key 'globex' is not one of this client's keys (acme)"
    assert billing["start "] == "this client may not start runs of the app 'notes'"
    assert (desk["start globex"], desk["key globex"]) == ("started", "globex")
    assert desk["key "] == "notes"  # no key given: the app's name, as Relay.start says
    refused = "a schedule starts runs of the app 'notes' with the key 'notes': runs this"
    assert acme["fire"] == billing["fire"] == f"{refused} client may not start"
    assert desk["fire"] == "no schedule named 'no-such'"

    assert f.relay.status(run_id).state == "waiting"
    assert not [line for line in f.ledger() if line.startswith("pay")]

    async def approve(url: str) -> dict[str, Any]:
        async with _session(url, ALL_TOKEN) as client:
            return _said(await client.call_tool("approve", {"run_id": run_id, "call_id": "call-1"}))

    flags = ("--allow-decisions", "--allow-money-decisions", "--clients", str(listed))
    with _http(f, *flags) as (url, _):
        approved = asyncio.run(approve(url))
    assert approved["by"] == "mcp client ide-test (token notes-desk)"
    f.relay.wait(run_id, 30)
    assert any(line.startswith("pay") for line in f.ledger())


def test_money_decisions_go_with_decisions_and_clients_with_http(f: Fleet) -> None:
    refused = relay("--app", APP, "mcp", "--allow-money-decisions", env=clean_env(**f.env))
    assert refused.returncode == 1
    assert "--allow-money-decisions goes with --allow-decisions" in refused.stderr
    refused = relay("--app", APP, "mcp", "--clients", "x.toml", env=clean_env(**f.env))
    assert refused.returncode == 1
    assert "--clients goes with --http" in refused.stderr


def test_run_schedule_is_offered_only_with_its_flag_and_a_refusal_is_its_reason(f: Fleet) -> None:
    async def drive(*flags: str) -> tuple[set[str], Any]:
        async with Client(_stdio(f, *flags), client_info=ME) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            fired = None
            if "run_schedule" in names:
                fired = await client.call_tool("run_schedule", {"schedule": "no-such"})
            return names, fired

    names, _ = asyncio.run(drive())
    assert "run_schedule" not in names
    names, fired = asyncio.run(drive("--allow-schedules"))
    assert "run_schedule" in names
    assert fired.is_error
    assert fired.content[0].text == "no schedule named 'no-such'"


HOSTILE = "\x1b[31mevil\x07<b>x</b>[red]\u202e\n"  # an escape, a bell, HTML, Rich, bidi


def test_a_client_name_is_stored_and_shown_escaped(f: Fleet, tmp_path: Path) -> None:
    f.brain.script("MCP-NAME:", {0: call("delete_note", name="n.txt"), 1: final("gone")})
    hostile = Implementation(name=HOSTILE, version="1")

    async def drive() -> tuple[str, dict[str, Any]]:
        async with Client(_stdio(f, "--allow-decisions"), client_info=hostile) as client:
            run_id = _said(await client.call_tool("start_run", {"task": "MCP-NAME: go"}))["run_id"]
            await asyncio.to_thread(pending_for, f, run_id)
            return run_id, _said(
                await client.call_tool("approve", {"run_id": run_id, "call_id": "call-1"})
            )

    run_id, decided = asyncio.run(drive())
    f.relay.wait(run_id, 30)
    shown = r"mcp client \x1b\x5b31mevil\x07\x3cb\x3ex\x3c/b\x3e\x5bred\x5d\u202e\x0a"
    assert decided["by"] == shown
    approved = [line for line in f.relay.trace(run_id) if line.kind == "approved"]
    assert [line.data["by"] for line in approved] == [shown]
    with RelayWeb(f.env, tmp_path / "web.log") as web:
        page = web.client.get(f"/runs/{run_id}").text  # the trace's line: "by mcp client ..."
    printed = relay("show", "--json", run_id, env=clean_env(**f.env))
    assert printed.returncode == 0, printed.stderr
    for shown_there in (page, printed.stdout):
        assert "mcp client \\x1b\\x5b31mevil" in shown_there.replace("\\\\", "\\")
        for raw in ("\x1b", "\x07", "<b>", "[red", "\u202e"):
            assert raw not in shown_there


def test_shown_name_keeps_a_plain_name_and_cuts_a_long_one() -> None:
    assert shown_name("Claude Desktop 1.2 mac") == "Claude Desktop 1.2 mac"
    # A name cannot pass for the clients file's name of a token ("NAME (token T)").
    assert shown_name("ide (token billing-ide)") == r"ide \x28token billing-ide\x29"
    assert shown_name("") == shown_name(None) == "unnamed"
    assert shown_name("\x1b" * 100) == r"\x1b" * 20
    assert len(shown_name("x" * 500)) == 80


def test_pending_answers_at_once_while_60_long_polls_wait(f: Fleet, tmp_path: Path) -> None:
    f.brain.script("MCP-POLL:", {0: call("delete_note", name="p.txt"), 1: final("done")})
    run_id = f.relay.start("MCP-POLL: wait on me")
    pending_for(f, run_id)
    per_client = LONG_POLLS_PER_CLIENT
    second = 60 - per_client
    poll = {"run_id": run_id, "after": "$", "wait_seconds": 25}

    async def drive(url: str) -> tuple[float, list[Any], list[Any], bool]:
        async with (
            _session(url, ALL_TOKEN) as first,
            _session(url, BOT_TOKEN) as other,
            _session(url, ALL_TOKEN) as asker,
        ):
            # The cursor at the stream's end: every poll waits for text that never comes.
            after = _said(
                await first.call_tool("run_text", {**poll, "after": "0", "wait_seconds": 0.5})
            )
            waiting = {**poll, "after": after["next"]}
            polls = [
                asyncio.create_task(first.call_tool("run_text", waiting)) for _ in range(per_client)
            ]
            polls += [
                asyncio.create_task(other.call_tool("run_text", waiting)) for _ in range(second)
            ]
            await asyncio.sleep(2)  # every poll reaches the server and waits there
            over = await first.call_tool("run_text", waiting)  # one more than its cap
            started = time.monotonic()
            listed = _said(await asker.call_tool("pending", {}))
            took = time.monotonic() - started
            still_open = not any(p.done() for p in polls)
            for p in polls:
                p.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
            return took, listed, [over], still_open

    with _http(f, "--clients", str(_clients_file(tmp_path, *CLIENTS))) as (url, _):
        took, listed, (over,), still_open = asyncio.run(drive(url))
    f.relay.deny(run_id, "call-1", "the test is over")
    assert took < 5, took  # promised under 1 s; 5x margin for a loaded machine
    assert [p["run_id"] for p in listed if p["run_id"] == run_id] == [run_id]
    assert over.is_error  # the 33rd poll of one client is refused at once, with the reason
    assert over.content[0].text == (
        f"this client has {per_client} run_text calls waiting already (the most): ask again"
        " once one answers"
    )
    assert still_open  # and all 60 polls were still waiting when pending answered


# --- helpers ------------------------------------------------------------------------------


def _clients_file(directory: Path, *clients: dict[str, Any]) -> Path:
    path = directory / "mcp-clients.json"
    path.write_text(json.dumps({"clients": list(clients)}))
    return path


@contextmanager
def _http(
    f: Fleet, *flags: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, Background]]:
    """`relay mcp --http PORT FLAGS` running, and its URL."""
    port = free_port()
    server = Background(
        "--app", APP, "mcp", "--http", str(port), *flags, env=clean_env(**f.env, **(env or {}))
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        _until_listening(url, server)
        yield url, server
    finally:
        server.close()


@asynccontextmanager
async def _session(url: str, token: str) -> AsyncIterator[Client]:
    """An MCP SDK client session over streamable HTTP with `token` as its bearer."""
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415

    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, client_info=ME) as client:
            yield client


def _until_listening(url: str, server: Background) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if server.process.poll() is not None:
                raise AssertionError(f"relay mcp stopped:\n{server.text}") from None
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {url}")
