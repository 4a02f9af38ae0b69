"""Crashes, duplicates and load: nothing lost, nothing that must not run twice runs twice.

Real Redis, real `relay worker` processes killed with SIGKILL and nothing else
(the workers' own tick re-sends what a dead worker left), a real HTTP model server.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.waiting import calls_for
from workers import StoreUnavailable
from workers.engine.effects import Message
from workers.engine.records import TraceEntry


def test_twenty_runs_at_once_all_finish(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        for n in range(20):
            f.brain.script(f"MANY-{n:02d}:", {0: call("sleep", seconds=0.1), 1: final(f"done {n}")})
        f.worker("--concurrency", "4", "--pool", "threads")
        f.worker("--concurrency", "2", name="second")
        runs = [f.relay.start(f"MANY-{n:02d}: sleep a little") for n in range(20)]
        outcomes = [f.relay.wait(run_id, timeout=120) for run_id in runs]
        assert [o.stop for o in outcomes] == [Stop.DONE] * 20, f.logs()
        assert sorted(o.summary for o in outcomes) == sorted(f"done {n}" for n in range(20))
        assert f.ledger().count("sleep start 0.1") == 20


def test_a_batch_runs_side_by_side(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        four = batch(*[("sleep", {"seconds": 1}) for _ in range(4)])
        f.brain.script("BATCH", {0: four, 4: final("slept four times")})
        f.worker("--concurrency", "4", "--pool", "threads")
        started = time.monotonic()
        outcome = f.relay.wait(f.relay.start("BATCH: sleep four times"), timeout=60)
        elapsed = time.monotonic() - started
        assert outcome.stop is Stop.DONE, f.logs()
        lines = f.ledger()
        # They ran at the same time, not one by one: at least three began before any
        # ended (all four, unless one was slow to start).
        assert sorted(lines) == sorted(["sleep start 1"] * 4 + ["sleep end 1"] * 4), lines
        assert lines[-1] == "sleep end 1", lines
        assert lines.index("sleep end 1") >= 3, lines
        print(f"a batch of four 1 s tools took {elapsed:.2f} s")


def _wait_for_line(f: Fleet, line: str, timeout: float = 30) -> None:
    f.until(lambda: line in f.ledger(), timeout, what=line)


def test_a_worker_killed_during_a_non_idempotent_tool(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("ONCE", {0: call("once", label="charge", seconds=3), 1: final("handled")})
        first = f.worker("--concurrency", "2")
        run_id = f.relay.start("ONCE: do it once")
        _wait_for_line(f, "once start charge")
        first.kill()
        f.worker("--concurrency", "2", name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        # It started once and never again: its outcome is unknown, and the model was told so.
        assert f.ledger().count("once start charge") == 1, f.ledger()
        assert "once end charge" not in f.ledger()
        assert any("outcome unknown" in c.prompt for c in f.model.calls), f.logs()
        trace = f.relay.trace(run_id)
        results = [e for e in trace if e.kind == "result"]
        assert [r.status for r in results] == ["unknown"]
        _assert_recovery_told(f, trace, "call-1")
        status = f.relay.status(run_id)  # done, and flagged: one call's outcome is unknown
        assert (status.ending, status.unknown_calls) == ("done", 1)
        [listed] = f.relay.runs(limit=5, state="done")
        assert (listed.id, listed.unknown_calls) == (run_id, 1)


def test_a_worker_killed_during_an_idempotent_tool(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("SAFE", {0: call("sleep", seconds=3), 1: final("slept")})
        first = f.worker("--concurrency", "2")
        run_id = f.relay.start("SAFE: sleep")
        _wait_for_line(f, "sleep start 3")
        first.kill()
        f.worker("--concurrency", "2", name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        # Safe to repeat, so it ran again, once, to the end.
        assert f.ledger() == ["sleep start 3", "sleep start 3", "sleep end 3"], f.ledger()
        trace = f.relay.trace(run_id)
        results = [e for e in trace if e.kind == "result"]
        assert [r.status for r in results] == ["ok"]
        _assert_recovery_told(f, trace, "call-1")


def _assert_recovery_told(f: Fleet, trace: list[TraceEntry], call: str) -> None:
    """The trace says once that `call` was sent again as attempt 2 after attempt 1 was
    lost, before the line that says who made it (attempt 2, the second worker, a task);
    and one worker's log says so, naming the run and the call."""
    [resent] = [e for e in trace if e.kind == "resent"]
    assert resent.call_id == call
    assert (resent.data["attempt"], resent.data["lost"]) == (2, 1)
    made = [e for e in trace if e.call_id == call and e.data.get("attempt") == 2]
    assert made, trace
    assert trace.index(resent) < trace.index(made[-1])
    assert made[-1].data["worker"] == "second@test"
    assert made[-1].data["task"]
    # ... and links the lost attempt's task (Flower keeps it STARTED: a call sent as its
    # own task keeps its id at every sending; one continued in an advance has another).
    assert resent.data["task"]
    said = [line for line in f.logs().splitlines() if "lost its lease with no outcome" in line]
    assert len(said) == 1, said
    assert f"{call} of run {trace[0].run} " in said[0]
    assert "attempt 2" in said[0]


def test_a_worker_killed_during_a_model_call(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        slow_final = Reply(text=final("answered"), delay=3)
        f.brain.script("THINK", {0: call("read_note", name="a"), 1: slow_final})
        first = f.worker("--concurrency", "2")
        run_id = f.relay.start("THINK: read and answer")
        f.until(lambda: len(f.model.calls) >= 2, 30, what="the slow model call")
        first.kill()
        f.worker("--concurrency", "2", name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        assert outcome.summary == "answered"
        _assert_recovery_told(f, f.relay.trace(run_id), "m3")


def test_every_message_delivered_twice(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env={"RELAY_TEST_DUPLICATES": "1"}) as f:
        script = {
            0: call("write_note", name="d.txt", text="once"),
            1: batch(
                ("once", {"label": "x"}), ("once", {"label": "y"}), ("sleep", {"seconds": 0.2})
            ),
            4: final("all done"),
        }
        for n in range(3):
            f.brain.script(f"DUP-{n}:", script)
        f.worker("--concurrency", "4", "--pool", "threads")
        f.worker("--concurrency", "2", name="second")
        runs = [f.relay.start(f"DUP-{n}: work") for n in range(3)]
        # The client sends its wake-ups twice as well.
        f.relay.runtime.send([m for run_id in runs for m in [_advance(run_id)] * 2])
        outcomes = [f.relay.wait(r, timeout=90) for r in runs]
        assert [o.stop for o in outcomes] == [Stop.DONE] * 3, f.logs()
        ledger = f.ledger()
        assert ledger.count("write_note d.txt") == 3, ledger
        assert ledger.count("once start x") == 3, ledger
        assert ledger.count("once start y") == 3, ledger
        # Three model calls per run (call, batch, final): none paid twice.
        for n in range(3):
            made = [c for c in f.model.calls if f"DUP-{n}:" in c.prompt]
            assert len(made) == 3, [c.prompt[-200:] for c in made]
        for run_id in runs:
            kinds = [e.kind for e in f.relay.trace(run_id)]
            assert kinds.count("call") == 4, kinds
            assert kinds.count("result") == 4, kinds
            assert kinds.count("stop") == 1


def _advance(run_id: str) -> Message:
    return Message("advance", run_id)


def test_redis_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    with fleet(tmp_path, appendonly=True) as f:
        f.brain.script(
            "AOF",
            {
                0: call("sleep", seconds=2),
                1: call("write_note", name="r.txt", text="x"),
                2: final("survived"),
            },
        )
        f.worker("--concurrency", "2")
        run_id = f.relay.start("AOF: sleep then write")
        _wait_for_line(f, "sleep start 2")
        f.redis.kill()
        with pytest.raises(StoreUnavailable) as failed:
            f.relay.status(run_id)
        assert "127.0.0.1" in str(failed.value)
        time.sleep(1)
        f.redis.start()
        outcome = f.relay.wait(run_id, timeout=120)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.ledger().count("write_note r.txt") == 1


def test_outcomes_that_finish_while_redis_is_down_are_saved_once_it_is_back(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, appendonly=True, recovery=15) as f:
        f.brain.script("OUT-ONCE", {0: call("once", label="w", seconds=3), 1: final("wrote")})
        f.brain.script("OUT-SAFE", {0: call("sleep", seconds=3), 1: final("slept")})
        f.brain.script(
            "OUT-THINK",
            {0: call("read_note", name="a"), 1: Reply(text=final("thought"), delay=3)},
        )
        f.worker("--concurrency", "4", "--pool", "threads")
        runs = {
            marker: f.relay.start(f"{marker}: finish while Redis is away")
            for marker in ("OUT-ONCE", "OUT-SAFE", "OUT-THINK")
        }
        f.until(
            lambda: (
                {"once start w", "sleep start 3"} <= set(f.ledger())
                and len(calls_for(f, "OUT-THINK")) == 2
            ),
            30,
            what="all three calls under way",
        )
        f.redis.kill()
        time.sleep(4.5)  # each call finishes while Redis is down
        assert {"once end w", "sleep end 3"} <= set(f.ledger())
        f.redis.start()
        outcomes = {m: f.relay.wait(r, timeout=90) for m, r in runs.items()}
        assert all(o.stop is Stop.DONE for o in outcomes.values()), f.logs()
        # Each ran once, and each outcome is the real one, not "unknown".
        assert f.ledger().count("once start w") == 1
        assert f.ledger().count("sleep start 3") == 1
        for marker in ("OUT-ONCE", "OUT-SAFE"):
            results = [e for e in f.relay.trace(runs[marker]) if e.kind == "result"]
            assert [r.status for r in results] == ["ok"], (marker, f.relay.trace(runs[marker]))
        # The model was paid once for each turn: no call was made again.
        assert len(calls_for(f, "OUT-THINK")) == 2
        assert len(calls_for(f, "OUT-ONCE")) == 2
        logs = f.full_logs()
        assert logs.count("holding the outcome of tool call call-1") == 2
        assert "holding the outcome of model call" in logs


def test_a_worker_stopped_while_holding_an_outcome_says_what_it_loses(tmp_path: Path) -> None:
    with fleet(tmp_path, appendonly=True, recovery=8) as f:
        f.brain.script("HELD", {0: call("once", label="h", seconds=1), 1: final("handled")})
        worker = f.worker("--concurrency", "2", "--pool", "threads")
        run_id = f.relay.start("HELD: do it once")
        _wait_for_line(f, "once start h")
        f.redis.kill()
        f.until(lambda: "holding the outcome of" in worker.output(), 30, what="the hold")
        worker.stop()  # SIGTERM: a warm shutdown while the outcome is held
        said = worker.output()
        assert "stopping while holding 1 outcome(s) not yet saved" in said
        assert f"tool call call-1 of run {run_id}" in said.split("stopping while holding")[1]
        f.redis.start()
        f.worker("--concurrency", "2", "--pool", "threads", name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        # The outcome was lost with the worker: the call is not run again, and the
        # model is told its outcome is unknown.
        assert f.ledger().count("once start h") == 1
        results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert [r.status for r in results] == ["unknown"]
