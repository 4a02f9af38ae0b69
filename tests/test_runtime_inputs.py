"""Bad input, end to end: each a clear error, and nothing lost.

Unknown run ids, decisions for finished runs, tools that misbehave (non-text,
oversized, raising), refused `start` arguments, a `wait` that times out, a
malformed `--app`, a corrupt run record, and a cancel that reaches a running tool.
Real Redis, real `relay worker` processes, a real HTTP model server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_core import Stop
from agent_core.state import dump, load
from tests.support.brain import call, final
from tests.support.fleet import Fleet
from tests.support.waiting import pending_for, prompts_for, shared_fleet
from tests.support.worker_process import ROOT
from workers import DecisionRefused, Relay, RelayError, RunCorrupt, RunNotFound, WaitTimeout
from workers.engine.effects import Message

OUTPUT_CHARS = 2_000


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("inputs")
    env = {"RELAY_TOOL_OUTPUT_CHARS": str(OUTPUT_CHARS)}
    with shared_fleet(directory, "--concurrency", "2", extra_env=env) as running:
        yield running


# --- unknown runs and finished runs -------------------------------------------------------

NO_SUCH_RUN = "0123456789abcdef"

CLIENT_CALLS: dict[str, Callable[[Relay, str], object]] = {
    "status": lambda r, run: r.status(run),
    "wait": lambda r, run: r.wait(run, 5),
    "approve": lambda r, run: r.approve(run, "call-1"),
    "deny": lambda r, run: r.deny(run, "call-1", reason="no"),
    "approve_plan": lambda r, run: r.approve_plan(run),
    "answer": lambda r, run: r.answer(run, "September"),
    "cancel": lambda r, run: r.cancel(run),
    "trace": lambda r, run: r.trace(run),
    "watch": lambda r, run: next(r.watch(run, timeout=5)),
}


@pytest.mark.parametrize("name", sorted(CLIENT_CALLS))
def test_an_unknown_run_id_is_a_clear_error(f: Fleet, name: str) -> None:
    with pytest.raises(RunNotFound) as raised:
        CLIENT_CALLS[name](f.relay, NO_SUCH_RUN)
    assert str(raised.value) == (
        f"no run {NO_SUCH_RUN!r} (it never existed, or it finished and expired)"
    )
    assert f.relay.store.redis.exists(f"relay:run:{NO_SUCH_RUN}") == 0


def test_decisions_for_a_finished_run_are_refused(f: Fleet) -> None:
    f.brain.script("FINISHED:", {0: call("delete_note", name="fin.txt"), 1: final("deleted")})
    run_id = f.relay.start("FINISHED: delete a note")
    pending_for(f, run_id)
    f.relay.approve(run_id, "call-1")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    with pytest.raises(DecisionRefused, match=f"call call-1 of run {run_id}"):
        f.relay.approve(run_id, "call-1")
    with pytest.raises(
        DecisionRefused, match=rf"run {run_id} is not waiting for plan \(finished\)"
    ):
        f.relay.approve_plan(run_id)
    assert f.relay.status(run_id).outcome == outcome
    assert f.ledger().count("delete_note fin.txt") == 1


# --- tools that misbehave ---------------------------------------------------------------


def test_a_tool_returning_non_text_is_an_error_the_model_sees(f: Fleet) -> None:
    f.brain.script("NUMBER:", {0: call("number"), 1: final("noted the tool bug")})
    run_id = f.relay.start("NUMBER: get a number")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    told = prompts_for(f, "NUMBER:")[-1]
    assert "→ error: the tool number returned int, not text; a tool must return text" in told
    results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
    assert [(e.tool, e.status) for e in results] == [("number", "error")]


def test_an_oversized_output_is_cut_with_a_marker(f: Fleet) -> None:
    size = 10 * OUTPUT_CHARS
    f.brain.script("BIG:", {0: call("big", size=size), 1: final("saw a long text")})
    run_id = f.relay.start("BIG: get a long text")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    told = prompts_for(f, "BIG:")[-1]
    shown = max(len(run) for run in re.findall("x+", told))
    assert 0 < shown < OUTPUT_CHARS
    assert f"[… cut: {size - shown} more characters]" in told


def test_a_tool_that_raises_gives_its_error_to_the_model(f: Fleet) -> None:
    f.brain.script("BOOM:", {0: call("boom"), 1: final("the tool failed")})
    run_id = f.relay.start("BOOM: try the tool")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert "→ error: RuntimeError: kaboom" in prompts_for(f, "BOOM:")[-1]


# --- refused starts -------------------------------------------------------------------------

BAD_STARTS: list[tuple[str, dict[str, Any], str]] = [
    ("empty task", {"task": ""}, "the task must be non-empty text"),
    ("blank task", {"task": " \n\t "}, "the task must be non-empty text"),
    ("task not text", {"task": 42}, "the task must be non-empty text"),
    ("huge task", {"task": "x" * 100_001}, "the task is longer than 100000 characters"),
    ("unknown tools", {"task": "t", "tools": ["nope", "read_note"]}, "unknown tools: nope"),
    ("zero budget", {"task": "t", "budget": 0}, "budget must be a positive number of tokens"),
    ("negative budget", {"task": "t", "budget": -5}, "budget must be a positive number"),
    ("fractional budget", {"task": "t", "budget": 2.5}, "budget must be a positive number"),
]


@pytest.mark.parametrize(
    ("kwargs", "message"), [(k, m) for _, k, m in BAD_STARTS], ids=[n for n, _, _ in BAD_STARTS]
)
def test_a_bad_start_is_refused_and_creates_no_run(
    f: Fleet, kwargs: dict[str, Any], message: str
) -> None:
    runs = f.relay.store.runs(10_000)
    with pytest.raises(RelayError, match=re.escape(message)):
        f.relay.start(**kwargs)
    assert f.relay.store.runs(10_000) == runs


@settings(max_examples=30, deadline=None)
@given(task=st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=50))
def test_any_blank_task_is_refused(f: Fleet, task: str) -> None:
    with pytest.raises(RelayError, match="non-empty"):
        f.relay.start(task)


def test_a_wait_that_runs_out_is_a_timeout(f: Fleet) -> None:
    f.brain.script("SLOWPOKE:", {0: call("delete_note", name="slowpoke.txt")})
    run_id = f.relay.start("SLOWPOKE: delete a note")
    pending_for(f, run_id)
    began = time.monotonic()
    with pytest.raises(WaitTimeout, match=f"run {run_id} did not finish within 0.5 s") as raised:
        f.relay.wait(run_id, 0.5)
    assert time.monotonic() - began < 10
    assert isinstance(raised.value, TimeoutError)
    assert "(it is waiting)" in str(raised.value)
    assert f.relay.status(run_id).state == "waiting"  # waiting changed nothing
    f.relay.cancel(run_id)
    assert f.relay.wait(run_id, 60).stop is Stop.CANCELLED


# --- a malformed --app ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("nosuchmodule:relay", "cannot import 'nosuchmodule'"),
        ("tests.apps.notes:nothing", "has no attribute 'nothing'"),
        ("bad spec", "is not of the form module:attr"),
        ("tests.apps.notes:build", "is a function, not a workers.Relay"),
    ],
)
def test_a_malformed_app_is_one_line_and_a_failed_exit(spec: str, said: str) -> None:
    command = [
        sys.executable,
        "-c",
        "from workers.cli import main; main()",
        "--app",
        spec,
        "worker",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert said in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


# --- cancel of a running run ----------------------------------------------------------------


def test_a_running_run_is_cancelled_and_its_tool_sees_the_flag(f: Fleet) -> None:
    f.brain.script("LONG:", {0: call("until_cancelled", seconds=60), 1: final("never")})
    run_id = f.relay.start("LONG: work until told to stop")
    f.until(
        lambda: any(line.startswith(f"until_cancelled start {run_id}") for line in f.ledger()),
        60,
        what="the long tool to start",
    )
    assert f.relay.status(run_id).waiting_for == "tools"
    assert f.relay.cancel(run_id, reason="enough") is True
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.CANCELLED, f.logs()
    assert "enough" in outcome.summary
    f.until(lambda: "until_cancelled saw cancel" in f.ledger(), 30, what="the tool to see it")
    assert len(prompts_for(f, "LONG:")) == 1  # no model call after the cancel
    assert f.relay.cancel(run_id) is False


# --- a corrupt run record -----------------------------------------------------------------


def _corrupt_meta(f: Fleet, run_id: str) -> None:
    f.relay.store.redis.hset(f"relay:run:{run_id}", "meta", "{this is not a record")
    f.relay.runtime.send([Message("advance", run_id)])


def _corrupted(f: Fleet, run_id: str, *commands: tuple[str, ...]) -> None:
    """Change the run's keys by hand, and its version: a worker trusts the agent it saved
    only while the run is at the version it saved (workers.store.hot_agents), so a change Relay did
    not make is read, and validated, once the version moved."""
    pipe = f.relay.store.redis.pipeline()
    for command in commands:
        pipe.execute_command(*command)
    pipe.hincrby(f"relay:run:{run_id}", "v", 1)
    pipe.execute()
    assert f.relay.cancel(run_id) is True


def _corrupt_head(f: Fleet, run_id: str) -> None:
    _corrupted(f, run_id, ("HSET", f"relay:run:{run_id}", "head", "\x00 not a snapshot"))


def _corrupt_entry(f: Fleet, run_id: str) -> None:
    _corrupted(f, run_id, ("RPUSH", f"relay:hist:{run_id}", '{"kind":"no such entry"}'))


def _corrupt_whole_snapshot(f: Fleet, run_id: str) -> None:
    """A run stored in the old form (one `snap`, no `sf`) whose snapshot is corrupt."""
    key = f"relay:run:{run_id}"
    _corrupted(f, run_id, ("HDEL", key, "sf", "head"), ("HSET", key, "snap", "{not json"))


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (_corrupt_head, "saved agent state could not be read"),
        (_corrupt_entry, "saved agent state could not be read"),
        (_corrupt_whole_snapshot, "saved agent state could not be read"),
        (_corrupt_meta, "record could not be read"),
    ],
    ids=["head", "history-entry", "whole-snapshot", "meta"],
)
def test_a_corrupt_run_fails_alone(
    f: Fleet, corrupt: Callable[[Fleet, str], None], reason: str
) -> None:
    marker = f"CORRUPT-{corrupt.__name__}:"
    f.brain.script(marker, {0: call("delete_note", name=f"{marker}.txt")})
    bystander = f"BYSTANDER-{corrupt.__name__}:"
    f.brain.script(bystander, {0: call("sleep", seconds=1), 1: final("unbothered")})
    run_id = f.relay.start(f"{marker} delete a note")
    pending_for(f, run_id)
    other = f.relay.start(f"{bystander} take a nap")

    corrupt(f, run_id)

    def failed() -> bool:
        try:
            found = f.relay.store.read(run_id)
        except RunCorrupt:
            return False
        return found is not None and found[0].outcome is not None

    f.until(failed, 60, what="the corrupt run to fail")
    outcome = f.relay.wait(run_id, 5)
    assert outcome.stop is Stop.FAILED, f.logs()
    assert reason in outcome.summary, outcome.summary
    assert f.relay.status(run_id).state == "finished"
    assert f.relay.wait(other, 60).stop is Stop.DONE, f.logs()
    assert f"delete_note {marker}.txt" not in f.ledger()
    # Even when its record is lost, an ended run's approval is no longer listed.
    assert not [p for p in f.relay.pending() if p.run_id == run_id]


# --- a run saved by the previous version (its snapshot whole) -------------------------------


def test_a_run_stored_whole_goes_on_and_is_stored_apart_from_its_next_save(f: Fleet) -> None:
    f.brain.script(
        "WHOLE:",
        {0: call("sleep", seconds=0.1), 1: call("delete_note", name="old.txt"), 2: final("gone")},
    )
    run_id = f.relay.start("WHOLE: nap, then delete a note")
    pending_for(f, run_id)
    store = f.relay.store
    run, history = store.keys.run(run_id), store.keys.history(run_id)
    whole = dump(load(store.snapshot(run_id)))  # as the previous version wrote it: one text
    assert '"sleep"' in whole
    # Stored as before `sf` 2, by raw commands: `snap` whole, no head, no history list.
    pipe = store.redis.pipeline()
    pipe.hdel(run, "sf", "head")
    pipe.delete(history)
    pipe.hset(run, "snap", whole)
    pipe.hincrby(run, "v", 1)
    pipe.execute()

    f.relay.approve(run_id, "call-2")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert "sleep" in prompts_for(f, "WHOLE:")[-1]  # its history came along
    assert store.redis.hget(run, "snap") is None
    assert store.redis.hget(run, "head")  # stored apart (form 2) since
    assert store.redis.llen(history) >= 2
