"""Tools from MCP servers on a real fleet: real servers over stdio and HTTP, real workers.

The notes app with RELAY_MCP naming four servers the operator trusts: npm's
filesystem server over a folder, PyPI's time and git servers, and our faults server
(tests/support/mcp_faults.py) for what a real server does only by accident: die
mid-call, hang, answer hugely, lie about its schema or its tool's risk, change its
listing under the fleet, greet on stderr. The same faults server untrusted (the
default) gets a fleet of its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Risk, Stop
from tests.apps.notes import build
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.mcp_servers import faults, npm_bin, pypi_bin, write_servers
from tests.support.redis_server import free_port, wait_for_port
from tests.support.waiting import pending_for
from workers import MCPServer

APP = "tests.apps.notes:relay"
BANNER = "faults MCP server running on stdio"
"""What the faults server writes to its stderr when it starts."""


def _servers(directory: Path) -> list[MCPServer]:
    files = directory / "files"
    files.mkdir(exist_ok=True)
    repo = directory / "repo"
    repo.mkdir(exist_ok=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "draft.txt").write_text("a draft\n")
    git = [pypi_bin("mcp-server-git"), "--repository", str(repo)]
    return [
        MCPServer(
            "fs", command=[npm_bin("mcp-server-filesystem"), str(files)], trust_annotations=True
        ),
        MCPServer("time", command=[pypi_bin("mcp-server-time")], trust_annotations=True),
        MCPServer("git", command=git, trust_annotations=True),
        faults(directory, timeout=5, trust_annotations=True),
    ]


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("mcp")
    servers = write_servers(directory / "mcp.json", _servers(directory))
    with fleet(directory, extra_env={"RELAY_MCP": str(servers)}) as running:
        running.worker("--concurrency", "2", "--pool", "threads")
        yield running


def _results(f: Fleet, run_id: str) -> list[tuple[str, str]]:
    return [(e.status, e.text) for e in f.relay.trace(run_id) if e.kind == "result"]


def _forge(f: Fleet, run_id: str, call_id: str) -> None:
    """Send a `relay.run_tool` straight to the broker, as anyone with access to it could."""
    queue = f.relay.queues.named("tools")
    f.relay.celery.send_task("relay.run_tool", args=[run_id, call_id], queue=queue)


def test_the_servers_tools_are_the_apps_with_risk_from_their_annotations(f: Fleet) -> None:
    tools = {t.name: t for t in f.relay.tools}
    # Python tools keep theirs; fs and faults tools join under their own names.
    assert {"read_note", "read_text_file", "write_file", "get_current_time", "charge"} <= set(tools)
    assert tools["read_text_file"].risk_class is Risk.READ  # readOnlyHint
    assert tools["write_file"].risk_class is Risk.WRITE  # destructive
    assert tools["create_directory"].risk_class is Risk.CREATE  # destructiveHint: false
    assert tools["post"].risk_class is Risk.OUTSIDE  # openWorldHint
    assert tools["charge"].risk_class is Risk.CREATE  # the team's override, over WRITE
    spec = f.relay.kit.spec("charge")
    assert spec is not None
    assert (spec.asynchronous, spec.idempotent, spec.timeout) == (True, False, 5)
    [arg] = tools["union"].args  # a schema the core cannot say: one object, passed through
    assert arg.name == "arguments"
    assert "anyOf" in arg.help


def test_relay_tools_shows_each_tool_as_the_workers_run_it(f: Fleet) -> None:
    shown = relay("--app", APP, "tools", "--json", env=clean_env(**f.env))
    assert shown.returncode == 0, shown.stderr
    rows = {row["tool"]: row for row in json.loads(shown.stdout)}
    assert rows["charge"] == {
        "tool": "charge",
        "risk": "create",
        "idempotent": False,
        "source": "mcp faults",
        "risk_from": "override",
        "timeout": 5,
        "arguments": ["label", "seconds?"],
    }
    assert (rows["read_note"]["source"], rows["write_file"]["source"]) == ("python", "mcp fs")
    assert (rows["read_note"]["risk_from"], rows["write_file"]["risk_from"]) == (
        "code",
        "annotations (trusted)",
    )
    table = relay("--app", APP, "tools", env=clean_env(**f.env, COLUMNS="200"))
    assert table.returncode == 0, table.stderr
    shown_rows = {cells[0]: cells for cells in _cells(table.stdout)}
    assert shown_rows["get_current_time"][:5] == [
        "get_current_time",
        "read",
        "yes",
        "mcp time",
        "annotations (trusted)",
    ]


def test_a_trusted_servers_read_only_claim_is_taken_and_runs_with_nobody_asked(
    f: Fleet,
) -> None:
    wipe = {t.name: t for t in f.relay.tools}["wipe"]
    assert wipe.risk_class is Risk.READ  # its readOnlyHint, believed: the operator trusts it
    spec = f.relay.kit.spec("wipe")
    assert spec is not None
    assert spec.idempotent is True  # and its idempotentHint
    f.brain.script("MCP-TRUSTED:", {0: call("wipe", label="trusted"), 1: final("wiped")})
    run_id = f.relay.start("MCP-TRUSTED: wipe the store")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert _results(f, run_id) == [("ok", "wiped trusted")]
    assert "wipe start trusted" in f.ledger()


def test_a_run_reads_a_file_and_its_write_waits_for_a_person(f: Fleet) -> None:
    files = f.directory / "files"
    (files / "in.txt").write_text("the quarterly numbers")
    f.brain.script(
        "MCP-COPY:",
        {
            0: call("read_text_file", path=str(files / "in.txt")),
            1: call("write_file", path=str(files / "out.txt"), content="copied: numbers"),
            2: final("copied"),
        },
    )
    run_id = f.relay.start("MCP-COPY: copy in.txt to out.txt")
    pending = pending_for(f, run_id)
    assert (pending.call_id, pending.tool) == ("call-2", "write_file")
    assert _results(f, run_id) == [("ok", "the quarterly numbers")]
    # A forged task for the waiting call runs nothing.
    _forge(f, run_id, "call-2")
    _forge(f, run_id, "call-2")
    f.until(lambda: f.full_logs().count(f"refused tool call call-2 of run {run_id}") >= 2, 30)
    assert not (files / "out.txt").exists()
    assert [p.call_id for p in f.relay.pending() if p.run_id == run_id] == ["call-2"]

    f.relay.approve(run_id, "call-2")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert (files / "out.txt").read_text() == "copied: numbers"
    assert _results(f, run_id)[1][0] == "ok"


def test_a_pypi_server_answers_and_its_error_is_a_tool_error(f: Fleet) -> None:
    f.brain.script(
        "MCP-TIME:",
        {
            0: call("get_current_time", timezone="Europe/Berlin"),
            1: call("get_current_time", timezone="Nowhere/Atlantis"),
            2: final("told"),
        },
    )
    run_id = f.relay.start("MCP-TIME: what time is it in Berlin")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    [(ok, said), (failed, why)] = _results(f, run_id)
    assert ok == "ok"
    assert '"timezone": "Europe/Berlin"' in said
    assert failed == "error"  # isError: the model sees it as the tool's error
    assert "Nowhere/Atlantis" in why


def test_the_git_server_reads_the_repository_it_was_given(f: Fleet) -> None:
    repo = f.directory / "repo"
    f.brain.script(
        "MCP-GIT:", {0: call("git_status", repo_path=str(repo)), 1: final("one untracked file")}
    )
    run_id = f.relay.start("MCP-GIT: what is the state of the repository")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    [(ok, said)] = _results(f, run_id)
    assert ok == "ok"
    assert "draft.txt" in said
    tools = {t.name: t for t in f.relay.tools}
    assert (tools["git_status"].risk_class, tools["git_commit"].risk_class) == (
        Risk.READ,
        Risk.CREATE,  # destructiveHint: false
    )


def test_the_server_killed_mid_call_is_restarted_and_the_next_call_works(f: Fleet) -> None:
    pid_file = f.directory / "faults.pid"
    f.brain.script(
        "MCP-DIE:",
        {
            0: call("charge", label="die", seconds=2.5),
            1: call("charge", label="after"),
            2: final("done"),
        },
    )
    run_id = f.relay.start("MCP-DIE: charge twice")
    f.until(lambda: "charge start die" in f.ledger(), 30, what="the call to start")
    first = int(pid_file.read_text())
    os.kill(first, signal.SIGKILL)
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    [(died, why), (ok, said)] = _results(f, run_id)
    assert died == "unknown"  # not idempotent: whether it charged is not known
    assert "MCP server faults stopped mid-call" in why
    assert (ok, said) == ("ok", "charged after")
    assert int(pid_file.read_text()) != first  # a new server process
    assert "charge end die" not in f.ledger()


def test_a_server_that_died_between_calls_is_started_again_before_the_next(f: Fleet) -> None:
    pid_file = f.directory / "faults.pid"
    f.brain.script("MCP-BEFORE:", {0: call("charge", label="before"), 1: final("ok")})
    assert f.relay.wait(f.relay.start("MCP-BEFORE: charge"), 60).stop is Stop.DONE
    os.kill(int(pid_file.read_text()), signal.SIGKILL)  # while no call is in flight
    time.sleep(1.5)  # quiet for longer than IDLE_S
    f.brain.script("MCP-AFTER:", {0: call("charge", label="after-death"), 1: final("ok")})
    run_id = f.relay.start("MCP-AFTER: charge")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    # Not "unknown": the dead connection was found before the call was sent.
    assert _results(f, run_id) == [("ok", "charged after-death")]


def test_a_server_that_hangs_times_out_and_is_replaced(f: Fleet) -> None:
    f.brain.script(
        "MCP-HANG:",
        {0: call("freeze", label="hang"), 1: call("charge", label="thawed"), 2: final("ok")},
    )
    run_id = f.relay.start("MCP-HANG: freeze, then charge")
    assert f.relay.wait(run_id, 90).stop is Stop.DONE, f.logs()
    [(hung, why), (ok, said)] = _results(f, run_id)
    assert hung == "unknown"
    assert "did not finish within 5 s; it was cancelled" in why
    assert (ok, said) == ("ok", "charged thawed")  # on a server started anew
    assert "MCP server faults did not answer within 2 s; starting it again" in f.full_logs()


def test_a_huge_result_is_cut_and_a_lying_schema_is_the_servers_error(f: Fleet) -> None:
    f.brain.script(
        "MCP-ODD:",
        {
            0: call("huge", size=3_000_000),
            1: call("liar", count=2),
            2: call("union", arguments={"value": 7, "extra": [1, 2]}),
            3: final("seen"),
        },
    )
    run_id = f.relay.start("MCP-ODD: odd answers")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    [(ok, _big), (failed, why), (passed, through)] = _results(f, run_id)
    assert ok == "ok"
    # Its output was cut to RELAY_TOOL_OUTPUT_CHARS, saying how much was left out.
    [made, *_] = f.relay.tool_calls(run_id)
    assert made.output is not None
    limit = f.relay.settings.tool_output_chars
    assert limit - 100 < len(made.output.text) <= limit
    hidden = re.search(r"\[… cut: (\d+) more characters\]", made.output.text)
    assert hidden is not None
    assert int(hidden.group(1)) > 3_000_000 - limit
    assert (failed, why) == ("error", "Error executing tool liar")  # what the server says
    assert (passed, through) == ("ok", "value=7 extra=[1, 2]")


def test_a_worker_killed_mid_call_to_a_non_idempotent_mcp_tool_leaves_it_unknown(
    tmp_path: Path,
) -> None:
    servers = write_servers(tmp_path / "mcp.json", [faults(tmp_path)])
    with fleet(tmp_path, extra_env={"RELAY_MCP": str(servers)}) as k:
        k.brain.script(
            "MCP-KILL:", {0: call("charge", label="card", seconds=5), 1: final("handled")}
        )
        first = k.worker("--concurrency", "2")
        run_id = k.relay.start("MCP-KILL: charge the card once")
        k.until(lambda: "charge start card" in k.ledger(), 30, what="the call to start")
        server_pid = int((tmp_path / "faults.pid").read_text())
        first.kill()
        k.worker("--concurrency", "2", name="second")
        assert k.relay.wait(run_id, 90).stop is Stop.DONE, k.logs()
        assert k.ledger().count("charge start card") == 1  # never run twice
        assert [s for s, _ in _results(k, run_id)] == ["unknown"]
        # The dead worker's server went with it (its stdin closed), not left behind.
        k.until(lambda: not _alive(server_pid), 20, what="the orphaned server to exit")


def test_an_untrusted_servers_read_only_claim_asks_a_person_and_never_runs_twice(
    tmp_path: Path,
) -> None:
    servers = write_servers(tmp_path / "mcp.json", [faults(tmp_path, timeout=60)])
    with fleet(tmp_path, extra_env={"RELAY_MCP": str(servers)}) as k:
        worker = k.worker("--concurrency", "2")
        k.brain.script(
            "MCP-LIAR:", {0: call("wipe", label="store", seconds=3), 1: final("handled")}
        )
        run_id = k.relay.start("MCP-LIAR: tidy the store")
        pending = pending_for(k, run_id)  # WRITE, whatever its readOnlyHint says
        assert (pending.call_id, pending.tool) == ("call-1", "wipe")
        assert not any(line.startswith("wipe") for line in k.ledger())

        k.relay.approve(run_id, "call-1")
        k.until(lambda: "wipe start store" in k.ledger(), 30, what="the wipe to start")
        os.kill(int((tmp_path / "faults.pid").read_text()), signal.SIGKILL)
        assert k.relay.wait(run_id, 60).stop is Stop.DONE, k.logs()
        [(status, why)] = _results(k, run_id)
        # Not idempotent, whatever its idempotentHint says: not run again on the new server.
        assert status == "unknown"
        assert "MCP server faults stopped mid-call" in why
        assert k.ledger().count("wipe start store") == 1
        # The server's stderr greeting is in the worker's log, under its name.
        assert f"MCP server faults said: {BANNER}" in worker.output()

        # The operator sees that what the server claims was not taken, and why.
        shown = relay("--app", APP, "tools", "--json", env=clean_env(**k.env))
        assert shown.returncode == 0, shown.stderr
        rows = {row["tool"]: row for row in json.loads(shown.stdout)}
        assert (rows["wipe"]["risk"], rows["wipe"]["idempotent"], rows["wipe"]["risk_from"]) == (
            "write",
            False,
            "default: untrusted server",
        )
        assert (rows["charge"]["risk"], rows["charge"]["risk_from"]) == ("create", "override")


def test_relay_tools_refresh_shows_where_risk_came_from_and_no_servers_stderr(
    tmp_path: Path,
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    overrides = {"charge": Risk.CREATE, "wipe": Risk.WRITE}  # wipe: over its idempotentHint
    servers = [
        faults(tmp_path, risk=overrides, trust_annotations=True),
        MCPServer("fs", command=[npm_bin("mcp-server-filesystem"), str(files)]),
    ]
    path = write_servers(tmp_path / "mcp.json", servers)
    with fleet(tmp_path, extra_env={"RELAY_MCP": str(path)}) as k:
        env = clean_env(**k.env, COLUMNS="200")
        listed = relay("--app", APP, "tools", "--refresh", env=env)
        assert listed.returncode == 0, listed.stderr
        # Both servers greet on stderr when started: neither line reaches the command.
        for said in (BANNER, "running on stdio"):
            assert said not in listed.stdout
            assert said not in listed.stderr
        rows = {cells[0]: cells for cells in _cells(listed.stdout)}
        assert rows["tool"][:6] == ["tool", "risk", "idempotent", "from", "risk from", "time limit"]
        assert rows["wipe"][:5] == ["wipe", "write", "no", "mcp faults", "override"]
        assert rows["charge"][:5] == ["charge", "create", "no", "mcp faults", "override"]
        trusted = "annotations (trusted)"
        assert rows["huge"][:5] == ["huge", "read", "yes", "mcp faults", trusted]
        assert rows["read_text_file"][1:5] == ["write", "no", "mcp fs", "default: untrusted server"]


def test_a_server_that_lists_other_tools_than_the_app_was_built_with_is_refused(
    tmp_path: Path,
) -> None:
    servers = write_servers(tmp_path / "mcp.json", [faults(tmp_path)])
    with fleet(tmp_path, extra_env={"RELAY_MCP": str(servers)}) as k:
        assert "extra" not in {t.name for t in k.relay.tools}  # listed, kept in Redis
        (tmp_path / "faults-extra").write_text("")  # the server the workers start differs
        k.worker("--concurrency", "2")
        k.brain.script("MCP-OTHER:", {0: call("charge", label="x"), 1: final("refused")})
        run_id = k.relay.start("MCP-OTHER: charge")
        assert k.relay.wait(run_id, 60).stop is Stop.DONE, k.logs()
        [(status, why)] = _results(k, run_id)
        assert status == "error"
        assert "lists other tools than this app was built with; nothing was run" in why
        assert "charge start x" not in k.ledger()

        # The way out the refusal names: list again, restart the workers.
        listed = relay("--app", APP, "tools", "--refresh", env=clean_env(**k.env, COLUMNS="200"))
        assert listed.returncode == 0, listed.stderr
        assert "Listed 8 tools from 1 MCP server(s)" in listed.stdout
        assert "extra" in [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
        k.processes[0].stop()
        k.worker("--concurrency", "2", name="restarted")
        k.brain.script("MCP-AGAIN:", {0: call("charge", label="y"), 1: final("charged")})
        again = build(k.relay.settings)  # a client built now reads the new listing
        run_id = again.start("MCP-AGAIN: charge")
        assert again.wait(run_id, 60).stop is Stop.DONE, k.logs()
        assert _results(k, run_id) == [("ok", "charged y")]


def test_a_server_behind_streamable_http_with_a_bearer_token_from_the_environment(
    tmp_path: Path,
) -> None:
    port = free_port()
    token = "s3cret-token"
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_faults", str(tmp_path), "--http", str(port)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "FAULTS_TOKEN": token},
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        http = MCPServer(
            "remote",
            url=url,
            headers={"Authorization": "env:REMOTE_TOKEN"},
            risk={"charge": Risk.CREATE},
        )
        servers = write_servers(tmp_path / "mcp.json", [http])
        env = {"RELAY_MCP": str(servers), "REMOTE_TOKEN": f"Bearer {token}"}
        wait_for_port(port)
        os.environ["REMOTE_TOKEN"] = env["REMOTE_TOKEN"]  # the client lists the tools too
        try:
            with fleet(tmp_path, extra_env=env) as k:
                k.worker("--concurrency", "2", env={"REMOTE_TOKEN": env["REMOTE_TOKEN"]})
                k.brain.script("MCP-HTTP:", {0: call("charge", label="http"), 1: final("ok")})
                run_id = k.relay.start("MCP-HTTP: charge over HTTP")
                assert k.relay.wait(run_id, 60).stop is Stop.DONE, k.logs()
                assert _results(k, run_id) == [("ok", "charged http")]
                assert token not in k.full_logs()  # the header is never printed
        finally:
            del os.environ["REMOTE_TOKEN"]
    finally:
        server.terminate()
        server.wait(10)


def test_a_real_server_behind_streamable_http_answers_with_text_an_image_and_links(
    tmp_path: Path,
) -> None:
    port = free_port()
    loopback = Path(__file__).resolve().parent / "support" / "node_loopback.cjs"
    env = {**os.environ, "PORT": str(port), "NODE_OPTIONS": f"--require {loopback}"}
    server = subprocess.Popen(
        [npm_bin("mcp-server-everything"), "streamableHttp"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        url = f"http://127.0.0.1:{port}/mcp"
        everything = MCPServer("everything", url=url, trust_annotations=True)
        servers = write_servers(tmp_path / "mcp.json", [everything])
        with fleet(tmp_path, extra_env={"RELAY_MCP": str(servers)}) as k:
            k.worker("--concurrency", "2")
            k.brain.script(
                "MCP-EVERY:",
                {
                    0: call("echo", message="over HTTP"),
                    1: call("get-tiny-image"),
                    2: call("get-resource-links", count=2),
                    3: call("get-structured-content", location="Chicago"),
                    4: final("seen"),
                },
            )
            run_id = k.relay.start("MCP-EVERY: show me")
            assert k.relay.wait(run_id, 60).stop is Stop.DONE, k.logs()
            [echo, image, links, structured] = _results(k, run_id)
        assert echo == ("ok", "Echo: over HTTP")
        # An image is described by its type and size, never its bytes.
        assert re.search(r"\[image: image/png, [\d,]+ bytes\]", image[1])
        assert "base64" not in image[1]
        assert links[1].count("[resource link ") == 2
        assert '"temperature"' in structured[1]  # structured content, with no text beside it
    finally:
        server.terminate()
        server.wait(10)


def _cells(table: str) -> list[list[str]]:
    """The cells of each row of a printed table (its columns are 2 or more spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited: its parent (the dead worker) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_misspelt_override_stops_relay_tools_and_a_worker_says_it(tmp_path: Path) -> None:
    good = write_servers(tmp_path / "mcp.json", [faults(tmp_path)])
    typo = {"charge": Risk.CREATE, "chrage": Risk.MONEY}  # meant to make charge MONEY
    misspelt = write_servers(tmp_path / "typo.json", [faults(tmp_path, risk=typo)])
    said = "MCP server faults: its risk names 'chrage', which is none of its tools (charge,"
    with fleet(tmp_path, extra_env={"RELAY_MCP": str(good)}) as k:
        assert "charge" in {t.name for t in k.relay.tools}  # the listing is kept in Redis
        env = clean_env(**{**k.env, "RELAY_MCP": str(misspelt)}, COLUMNS="200")
        for refresh in ((), ("--refresh",)):
            shown = relay("--app", APP, "tools", *refresh, env=env)
            assert shown.returncode == 1, shown.stdout
            assert said in shown.stderr, shown.stderr
            assert "Traceback" not in shown.stderr
        # A worker given the misspelt file says so in its log when a run needs its tools.
        k.worker("--concurrency", "1", env={"RELAY_MCP": str(misspelt)})
        k.brain.script("MCP-TYPO:", {0: call("charge", label="t"), 1: final("charged")})
        k.relay.start("MCP-TYPO: charge")
        k.until(lambda: said in k.full_logs(), 60, "the worker's log to name the entry")
        assert "charge start t" not in k.ledger()
