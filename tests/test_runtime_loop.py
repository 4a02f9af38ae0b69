"""Model calls held on the worker process's event loop past their tasks
(`RELAY_MODEL_CARRIED`, `workers.runtime.on_loop`): a worker holds more calls in flight
than its pool has slots and no thread per call, a crash loses none of them, a cancel or a
lost lease reaches the call at its next await and nothing it finds is saved, and a worker
that stops lets its calls end first, or gives them back. Real Redis, real workers, a real
model server whose replies take their time.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.worker_process import RelayProcess
from workers.runtime.metrics import FleetMetrics
from workers.settings import now_ms

HELD = "held on the event loop"


def _slow(f: Fleet, marker: str, seconds: float) -> None:
    f.brain.script(marker, {0: Reply(text=final("answered slowly"), delay=seconds)})


def _holding(
    f: Fleet, marker: str, seconds: float, count: int, env: dict[str, str] | None = None
) -> tuple[RelayProcess, list[str]]:
    """A worker that holds model calls on its loop, with `count` runs' calls in flight."""
    env = {"RELAY_MODEL_CARRIED": "100", **(env or {})}
    worker = f.worker("--pool", "prefork", "-c", "2", env=env)
    _slow(f, marker, seconds)
    runs = [f.relay.start(f"{marker}-{n}: answer") for n in range(count)]
    f.until(lambda: f.model.delaying >= count, 30, what=f"{count} calls in flight")
    return worker, runs


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def _resent(f: Fleet, run_id: str) -> int:
    return sum(entry.kind == "resent" for entry in f.relay.trace(run_id))


def test_a_worker_holds_more_calls_than_its_pool_has_slots(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        worker = f.worker("--pool", "prefork", "-c", "2", env={"RELAY_MODEL_CARRIED": "100"})
        _slow(f, "CARRIED", 1.5)
        runs = [f.relay.start(f"CARRIED-{n}: answer") for n in range(30)]
        outcomes = [f.relay.wait(run_id, timeout=120) for run_id in runs]
        assert [o.summary for o in outcomes] == ["answered slowly"] * 30, f.logs()
        # Two slots, yet the calls waited on the model side by side.
        assert f.model.most_delaying >= 20
        status = f.relay.status(runs[0])
        assert status.total_usage.total_tokens > 0  # its usage saved with the run
        assert HELD in f.full_logs()
        assert all(_resent(f, run_id) == 0 for run_id in runs)
        worker.stop()
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
    # Each call counted once, when it ended (not again for its hand-off).
    assert sum(n for labels, n in totals.calls.items() if labels[-1] == "ok") == 30
    assert sum(n for (task, _), n in totals.steps.items() if task == "call_model") == 30


def test_a_quick_reply_is_kept_by_the_task_that_handed_it_over(tmp_path: Path) -> None:
    """While replies come at once, the task of a threads pool that handed a call to the
    loop waits for it and keeps it itself, and its run goes on in that task: the tool too,
    which a keeper never runs. Once replies slow down, the tasks stop waiting within a call
    or two, and the loop holds the calls again."""
    with fleet(tmp_path) as f:
        f.worker("--pool", "threads", "-c", "4", env={"RELAY_MODEL_CARRIED": "100"})
        f.brain.script("WARM", {0: final("warm")})
        assert f.relay.wait(f.relay.start("WARM: once"), timeout=60).summary == "warm"
        f.until(lambda: "ended with the call it carried" in f.full_logs(), 30, what="its end")
        warmed = len(f.full_logs())  # (the first call is held: nothing is known of replies yet)
        f.brain.script("QUICK", {0: call("read_note", name="a"), 1: final("read it")})
        run_id = f.relay.start("QUICK: read a note")
        assert f.relay.wait(run_id, timeout=60).summary == "read it"
        # One task ran it all: the advance, both model calls and the tool between them.
        assert f.messages() == {"relay.advance": 2, "relay.call_model": 0, "relay.run_tool": 0}
        assert HELD not in f.full_logs()[warmed:]
        _slow(f, "SLOWER", 3.0)
        runs = [f.relay.start(f"SLOWER-{n}: answer") for n in range(8)]
        f.until(lambda: f.model.delaying >= 8, 30, what="8 calls in flight on one process")
        assert all(f.relay.wait(run, timeout=60).summary == "answered slowly" for run in runs)
        assert HELD in f.full_logs()


def test_a_solo_worker_never_waits_for_a_reply_however_quick(tmp_path: Path) -> None:
    """Its one task is the process's only slot: the call is held on the loop, and the tool
    after the reply is a message of its own, for whichever slot is free."""
    with fleet(tmp_path) as f:
        f.worker("--pool", "solo", env={"RELAY_MODEL_CARRIED": "100"})
        f.brain.script("WARM", {0: final("warm")})
        assert f.relay.wait(f.relay.start("WARM: once"), timeout=60).summary == "warm"
        f.until(lambda: "ended with the call it carried" in f.full_logs(), 30, what="its end")
        warmed = len(f.full_logs())
        f.brain.script("QUICK", {0: call("read_note", name="a"), 1: final("read it")})
        run_id = f.relay.start("QUICK: read a note")
        assert f.relay.wait(run_id, timeout=60).summary == "read it"
        assert f.messages()["relay.run_tool"] == 1
        assert HELD in f.full_logs()[warmed:]


def test_without_holding_the_slots_bound_the_calls_in_flight(tmp_path: Path) -> None:
    # The control for the test above: the same load, RELAY_MODEL_CARRIED off.
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "2", env={"RELAY_MODEL_CARRIED": "0"})
        _slow(f, "SLOTTED", 0.5)
        runs = [f.relay.start(f"SLOTTED-{n}: answer") for n in range(8)]
        assert all(f.relay.wait(run_id, timeout=120).stop is Stop.DONE for run_id in runs)
        assert f.model.most_delaying <= 2
        assert HELD not in f.full_logs()


def test_three_hundred_calls_in_flight_take_no_thread_each(tmp_path: Path) -> None:
    """One process (a solo pool) holds 300 calls whose replies stream slowly: its threads
    stay a small constant (the loop, its keepers and renewer, Celery's own), not one a
    call; its gauges say it holds 300 of its 1,000; and every run ends with its reply,
    each call made once."""
    with fleet(tmp_path) as f:
        env = {"RELAY_MODEL_CARRIED": "1000", "RELAY_MODEL_TIMEOUT": "60"}
        worker = f.worker("--pool", "solo", env=env)
        assert worker.process is not None
        pid = worker.process.pid
        f.brain.script("WARM", {0: final("warm")})
        assert f.relay.wait(f.relay.start("WARM: once"), timeout=60).summary == "warm"
        before = _threads(pid)
        slow = Reply(text=final("answered slowly"), delay=12.0, gap=0.05)  # (300 starts first)
        f.brain.script("MANY", {0: slow})
        runs = [f.relay.start(f"MANY-{n}: answer") for n in range(300)]
        f.until(lambda: f.model.delaying >= 300, 90, what="300 calls in flight")
        during = _threads(pid)
        # What an autoscaler reads (/metrics' source): this process holds 300 of 1,000.
        store = f.relay.store
        metrics = FleetMetrics(store.connection, store.shards, store.people)

        def gauged() -> list[tuple[str, int, int]]:
            return [(g.worker, g.in_flight, g.capacity) for g in metrics.worker_gauges(now_ms())]

        f.until(lambda: gauged() == [(f"w0@test:{pid}", 300, 1000)], 30,
                what="the worker's gauges")  # fmt: skip
        outcomes = [f.relay.wait(run_id, timeout=180) for run_id in runs]
        assert [o.summary for o in outcomes] == ["answered slowly"] * 300, f.logs()
        assert during <= before + 8, (before, during)
        assert during < 40, during
        assert all(_resent(f, run_id) == 0 for run_id in runs[:20])


def test_calls_held_by_a_worker_that_dies_are_made_again_and_no_tool_runs_twice(
    tmp_path: Path,
) -> None:
    turns = {
        0: Reply(text=call("sleep", seconds=0.01), delay=3.0, gap=0.05),
        1: Reply(text=final("slept")),
    }
    with fleet(tmp_path) as f:
        first = f.worker("--pool", "prefork", "-c", "2", env={"RELAY_MODEL_CARRIED": "100"})
        f.brain.script("ORPHANED", turns)
        runs = [f.relay.start(f"ORPHANED-{n}: sleep") for n in range(10)]
        f.until(lambda: f.model.delaying >= 10, 30, what="10 calls in flight")
        first.kill()  # SIGKILL mid-stream, with ten calls held and two slots
        f.worker("--pool", "threads", "-c", "2", name="second")
        outcomes = [f.relay.wait(run_id, timeout=120) for run_id in runs]
        assert [o.summary for o in outcomes] == ["slept"] * 10, f.logs()
        # Each call's lease lapsed; the tick sent it again; the trace says so.
        assert [_resent(f, run_id) for run_id in runs] == [1] * 10
        assert f.ledger().count("sleep end 0.01") == 10  # each tool ran once


def test_a_worker_that_stops_lets_its_held_calls_end_first(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        worker, runs = _holding(f, "STOPPING", 2.0, 6)
        began = time.monotonic()
        worker.stop()  # a warm shutdown (SIGTERM), with no other worker to take over
        assert time.monotonic() - began < 30
        for run_id in runs:  # each saved by the worker that held it, before it went
            status = f.relay.status(run_id)
            assert status.state == "finished", f.logs()
            assert status.outcome is not None
            assert status.outcome.summary == "answered slowly"
            assert _resent(f, run_id) == 0
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
        # Counted, and written as the worker went: no call's count lost with it.
        assert sum(n for labels, n in totals.calls.items() if labels[-1] == "ok") == 6


def test_a_worker_that_stops_gives_back_the_calls_that_outlast_its_model_timeout(
    tmp_path: Path,
) -> None:
    """The calls a stopping worker holds may go on for as long as a call may go without a
    byte (RELAY_MODEL_TIMEOUT); past that, each claim is given back, and the next worker
    makes the call again at once (no lease to wait out); nothing is saved twice."""
    turns = {0: Reply(text="still talking ", endless=True, gap=0.2)}
    with fleet(tmp_path) as f:
        env = {"RELAY_MODEL_CARRIED": "100", "RELAY_MODEL_TIMEOUT": "3"}
        worker = f.worker("--pool", "prefork", "-c", "1", env=env)
        f.brain.script("LONG", turns)
        runs = [f.relay.start(f"LONG-{n}: talk") for n in range(3)]
        f.until(lambda: len(f.model.calls) >= 3, 30, what="3 calls in flight")
        began = time.monotonic()
        worker.stop()
        assert time.monotonic() - began < 30
        assert f.full_logs().count("its claim was given back") >= 3, f.logs()
        for run_id in runs:
            assert f.relay.status(run_id).state != "finished"
        f.brain.script("LONG", {0: final("answered at last")})
        f.worker("--pool", "threads", "-c", "2", name="second")
        assert [f.relay.wait(r, timeout=60).summary for r in runs] == ["answered at last"] * 3


def test_a_run_cancelled_while_its_call_is_held_stops_the_call_and_frees_its_place(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "1", env={"RELAY_MODEL_CARRIED": "1"})
        f.brain.script("ENDLESS", {0: Reply(text="go on ", endless=True, gap=0.05)})
        run_id = f.relay.start("ENDLESS: talk")
        f.until(lambda: f.model.calls and HELD in f.full_logs(), 30, what="the call held")
        assert f.model.open_connections == 1
        f.relay.cancel(run_id)
        assert f.relay.wait(run_id, timeout=60).stop is Stop.CANCELLED, f.logs()
        # The worker hung up on the model: the stream does not go on past the run.
        f.until(lambda: f.model.open_connections == 0, 30, what="the model's stream to be cut")
        assert "model route default failed" not in f.full_logs()  # a cancel is no route's fault
        # The loop holds one call, and it was let go: the next run's call is held too.
        _slow(f, "AFTER", 0.5)
        assert f.relay.wait(f.relay.start("AFTER: answer"), timeout=60).summary == "answered slowly"
        f.until(lambda: f.full_logs().count("ended with the call it carried") == 2, 30,
                what="the second held call's end")  # fmt: skip
        assert f.full_logs().count(f"m1: {HELD} (1 in flight)") == 4  # (each: a task's two lines)


def test_a_call_whose_lease_is_lost_is_stopped_and_nothing_it_finds_is_saved(
    tmp_path: Path,
) -> None:
    """A person's interrupt stops the turn: the held call's lease is lost; the loop stops
    the call at its next await, and its reply is never saved; the new turn goes on."""
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "1", env={"RELAY_MODEL_CARRIED": "10"})
        endless = Reply(text="first turn ", endless=True, gap=0.05)
        f.brain.script("TALKY", {0: endless, 1: final("second turn")})  # (turn 1: the new one)
        run_id = f.relay.start("TALKY: talk")
        f.until(lambda: f.model.open_connections == 1 and HELD in f.full_logs(), 30,
                what="the call held")  # fmt: skip
        f.relay.reply(run_id, "stop and answer this", strategy="interrupt")
        assert f.relay.wait(run_id, timeout=60).summary == "second turn", f.logs()
        stopped = "(another attempt took it over, or its turn was stopped); nothing was saved"
        f.until(lambda: stopped in f.full_logs(), 30, what="the held call stopped")
        assert "lost its lease while it ran; it is stopped" in f.full_logs()
        saved = [e for e in f.relay.trace(run_id) if "first turn" in (e.text or "")]
        assert saved == [], saved


def test_a_run_of_slow_replies_goes_on_from_the_loop_without_a_model_message(
    tmp_path: Path,
) -> None:
    """Each reply is saved on a keeper thread, which goes on with the run: the tool is
    published (a keeper never runs a tool), the model call after it is handed straight
    back to the loop. No model call is ever a message; each step is counted once."""
    turns = {
        0: Reply(text=call("read_note", name="a"), delay=0.4),
        1: Reply(text=call("read_note", name="b"), delay=0.4),
        2: Reply(text=final("read both"), delay=0.4),
    }
    with fleet(tmp_path) as f:
        f.brain.script("CHAINED", turns)
        worker = f.worker("--pool", "prefork", "-c", "1", env={"RELAY_MODEL_CARRIED": "100"})
        run_id = f.relay.start("CHAINED: read two notes")
        assert f.relay.wait(run_id, timeout=60).summary == "read both"
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 2}
        f.until(lambda: f.full_logs().count("ended with the call it carried") >= 3, 30,
                what="the tasks' ends")  # fmt: skip
        worker.stop()
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
    steps = {task: n for (task, outcome), n in totals.steps.items() if outcome == "ok"}
    assert (steps.get("call_model"), steps.get("run_tool")) == (3, 2), totals.steps
