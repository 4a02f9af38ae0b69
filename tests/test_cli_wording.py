"""What the `relay` command says, read as a person reads it: `relay status`, an ending said
once, counts in the right number, articles, an edit that names who and what, and
`approve --args-file` saying it needs the run's app."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Agent, Config, Kind, Risk, Stop, Tool, run
from agent_core.text import a_or_an, counted
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.scripted import Script
from tests.support.scripted import call as scripted_call
from workers.cli.demo import build, notes_folder
from workers.settings import Settings

APP = "tests.apps.notes:relay"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Fleet]:
    with fleet(tmp_path) as f:
        f.worker("--concurrency", "2", "--pool", "threads")
        yield f


def _said(f: Fleet, *args: str, user: str = "ana") -> tuple[int, str, str]:
    done = relay(*args, env=clean_env(**f.env, USER=user), timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_an_edit_needs_the_runs_app_and_the_trace_says_who_and_what(
    running: Fleet, tmp_path: Path
) -> None:
    f = running
    f.brain.script("EDIT-1:", {0: call("pay", amount=500), 1: final("paid")})
    run_id = f.relay.start("EDIT-1: pay the invoice")
    f.until(lambda: f.relay.status(run_id).waiting_for == "call", what="the call to wait")
    edited = tmp_path / "args.json"
    edited.write_text('{"amount": 50}')

    code, out, err = _said(f, "status", run_id)
    assert code == 0, err
    assert out.startswith(f"{run_id}  waiting, for call")
    assert "waits on call-1:" in out

    # No --app: said at once, naming the run's app, and nothing is decided.
    code, _, err = _said(f, "approve", run_id, "call-1", "--args-file", str(edited))
    assert code == 1
    assert err.startswith("relay: --args-file needs --app (or RELAY_APP)")
    assert "the app 'notes'" in err
    assert [p.call_id for p in f.relay.status(run_id).pending] == ["call-1"]
    # Another app's --app: said so too.
    other = ("--app", "tests.apps.notes:billing", "approve", run_id, "call-1")
    code, _, err = _said(f, *other, "--args-file", str(edited))
    assert code == 1
    assert f"run {run_id} belongs to the app 'notes', not to 'billing'" in err
    help_text = _said(f, "approve", "--help")[1]
    assert "needs the run's app (--app" in " ".join(help_text.split())

    code, out, err = _said(f, "--app", APP, "approve", run_id, "call-1", "--args-file", str(edited))
    assert code == 0, err
    assert f.relay.wait(run_id, 30).summary == "paid"
    code, out, _ = _said(f, "show", run_id)
    assert code == 0
    assert re.search(
        r"✎ call-1 \(pay\) arguments edited by ana: amount 500(\.0)? → 50(\.0)?\n", out
    )
    assert "✓ call-1 (pay) approved by ana" in out
    assert "edited: arguments edited" not in out


def test_status_says_each_ending_once(running: Fleet) -> None:
    f = running
    f.brain.script("END-1:", {0: final("all good")})
    f.brain.script("END-2:", {0: call("delete_note", name="x.txt")})
    done = f.relay.start("END-1: finish")
    parked = f.relay.start("END-2: wait")
    assert f.relay.wait(done, 30).stop is Stop.DONE
    f.until(lambda: f.relay.status(parked).waiting_for == "call", what="the parked call")
    f.relay.cancel(parked, "not today")
    assert f.relay.wait(parked, 30).stop is Stop.CANCELLED
    f.brain.script("END-3:", {0: final("never")}, plan=["Do it"])
    planned = f.relay.start("END-3: plan first", config=Config(max_batch=4))
    f.until(lambda: f.relay.status(planned).waiting_for == "plan", what="the plan")
    f.relay.approve_plan(planned, yes=False)
    assert f.relay.wait(planned, 30).stop is Stop.PLAN_DECLINED

    code, out, err = _said(f, "status", done, parked, planned)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{done}  done  ")
    used = f.relay.status(done).total_usage.total_tokens
    assert lines[0].rstrip().endswith(f"  {used:,} tokens")
    assert lines[1].startswith(f"{parked}  cancelled  ")
    assert lines[2].startswith(f"{planned}  plan declined  ")
    code, out, _ = _said(f, "runs")
    for twice in ("cancelled: cancelled", "done: done", "declined: plan declined"):
        assert twice not in out
    assert f"{parked}  cancelled" in out
    code, out, err = _said(f, "status", "no-such-run")
    assert code == 1
    assert err.startswith("relay: no run 'no-such-run'")


def test_an_app_that_is_no_relay_is_named_with_its_article() -> None:
    done = relay("--app", "errno:ENOENT", "worker", env=clean_env())
    assert done.returncode == 1
    assert "--app 'errno:ENOENT' is an int, not a workers.Relay" in done.stderr


COUNTS = [
    (1, "model call", "1 model call"),
    (2, "model call", "2 model calls"),
    (0, "step", "0 steps"),
    (1_000, "token", "1,000 tokens"),
    (1, "entry", "1 entry"),
    (3, "entry", "3 entries"),
]


@pytest.mark.parametrize(("count", "noun", "said"), COUNTS)
def test_counts_take_the_right_number(count: int, noun: str, said: str) -> None:
    plural = "entries" if noun == "entry" else ""
    assert counted(count, noun, plural) == said


@pytest.mark.parametrize(
    ("word", "said"), [("int", "an int"), ("str", "a str"), ("object", "an object"), ("", "a ")]
)
def test_a_type_takes_its_article(word: str, said: str) -> None:
    assert a_or_an(word) == said


def test_a_run_stopped_at_one_model_call_says_one() -> None:
    read = Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)
    agent = Agent(Config(require_plan=False, max_model_calls=1), [read])
    script = Script([scripted_call("read_file", path="a"), scripted_call("read_file", path="b")])
    outcome = run(agent, script, "Read the files")
    assert outcome.stop is Stop.MODEL_CALL_LIMIT
    assert outcome.summary == "The limit of 1 model call was reached before the task was done."


def test_the_demo_lists_one_note_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_DEMO_DIR", str(tmp_path / "notes"))
    folder = notes_folder()  # made private, and filled with the sample notes
    for note in sorted(folder.iterdir())[1:]:
        note.unlink()
    [kept] = [note.name for note in folder.iterdir()]
    spec = build(Settings()).kit.spec("list_notes")
    assert spec is not None
    assert spec.fn() == f"1 note: {kept}"
