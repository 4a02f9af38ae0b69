"""The command line of live runs: `relay send|pause|resume|reply`, and `relay watch`
showing the answer as the model writes it, in a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.brain import call, final
from tests.support.cli import Terminal, clean_env
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.waiting import prompts_for
from workers.cli import cli

ANSWER = "The total for March is 1,234.50, and April is still open."


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("cli-live")) as running:
        running.worker("--concurrency", "4", "--pool", "threads")
        yield running


def invoke(f: Fleet, *args: str) -> tuple[int, str, str]:
    result = CliRunner(env=f.env).invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_send_pause_resume_and_reply_from_the_shell(f: Fleet) -> None:
    f.brain.script(
        "CLI-STEER:",
        {0: call("sleep", seconds=1.2), 1: final("March: 42"), 2: final("April: 7")},
    )
    run_id = f.relay.start("CLI-STEER: total")
    f.until(lambda: "sleep start 1.2" in f.ledger(), 30, "the tool")
    assert invoke(f, "send", run_id, "Use March") == (
        0,
        f"Sent to run {run_id}; the model sees it at its next call.\n",
        "",
    )
    code, out, _ = invoke(f, "pause", run_id)
    assert (code, out) == (0, f"Pausing run {run_id}; relay resume {run_id} goes on.\n")
    f.until(lambda: f.relay.status(run_id).waiting_for == "pause", 30, "the pause")
    assert invoke(f, "resume", run_id)[:2] == (0, f"Resuming run {run_id}.\n")
    assert f.relay.wait(run_id, 60).summary == "March: 42"
    assert "Use March" in prompts_for(f, "CLI-STEER:")[1]
    code, out, err = invoke(f, "reply", run_id, "Now April", "--strategy", "reject")
    assert (code, out, err) == (0, f"Replied to run {run_id} (reject).\n", "")
    assert f.relay.wait(run_id, 60).summary == "April: 7"
    assert invoke(f, "pause", run_id)[1] == f"Run {run_id} had finished already.\n"


def test_steering_a_finished_or_unknown_run_is_one_line(f: Fleet) -> None:
    f.brain.script("CLI-DONE:", {0: final("done")})
    run_id = f.relay.start("CLI-DONE: quick")
    f.relay.wait(run_id, 60)
    result = CliRunner(env=f.env).invoke(cli, ["send", run_id, "late"])
    assert result.exit_code == 1
    assert result.stderr == (
        f"relay: cannot send a message to run {run_id}: it has finished (reply to it to go on)\n"
    )
    result = CliRunner(env=f.env).invoke(cli, ["reply", "nosuchrun", "more"])
    assert result.exit_code == 1
    assert "no run 'nosuchrun'" in result.stderr
    result = CliRunner(env=f.env).invoke(cli, ["reply", run_id, "x", "--strategy", "later"])
    assert result.exit_code == 2


def test_watch_in_a_terminal_shows_the_answer_as_it_is_written(f: Fleet, tmp_path: Path) -> None:
    f.brain.script("CLI-WATCH:", {0: Reply(final(ANSWER), piece_chars=2, gap=0.1)})  # ~3.5 s
    run_id = f.relay.start("CLI-WATCH: total")
    terminal = Terminal("watch", run_id, env=clean_env(**f.env), cwd=tmp_path)
    try:
        terminal.expect("The total for", timeout=30)
        # Shown while it is written: the run is still at its model call.
        assert f.relay.status(run_id).state == "running"
        assert "■ Done" not in terminal.text
        terminal.expect(f"■ Done: {ANSWER}", timeout=30)
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert '{"final"' not in terminal.text  # the answer, never the JSON around it
