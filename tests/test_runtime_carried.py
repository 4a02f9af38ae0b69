"""Model calls carried past their tasks (`RELAY_MODEL_CARRIED`): a worker holds more
calls in flight than its pool has slots, a crash loses none of them, and a worker
that stops lets them end first. Real Redis, real workers, a real model server whose
replies take their time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.worker_process import RelayProcess
from workers.runtime.metrics import FleetMetrics


def _slow(f: Fleet, marker: str, seconds: float) -> None:
    f.brain.script(marker, {0: Reply(text=final("answered slowly"), delay=seconds)})


def _carrying(
    f: Fleet, marker: str, seconds: float, count: int, env: dict[str, str] | None = None
) -> tuple[RelayProcess, list[str]]:
    """A worker that carries model calls, with `count` runs' calls in flight on it."""
    env = {"RELAY_MODEL_CARRIED": "100", **(env or {})}
    worker = f.worker("--pool", "prefork", "-c", "2", env=env)
    _slow(f, marker, seconds)
    runs = [f.relay.start(f"{marker}-{n}: answer") for n in range(count)]
    f.until(lambda: f.model.delaying >= count, 30, what=f"{count} calls in flight")
    return worker, runs


def _resent(f: Fleet, run_id: str) -> int:
    return sum(entry.kind == "resent" for entry in f.relay.trace(run_id))


def test_a_worker_carries_more_calls_than_its_pool_has_slots(tmp_path: Path) -> None:
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
        assert "carried by this worker" in f.full_logs()
        assert all(_resent(f, run_id) == 0 for run_id in runs)
        worker.stop()
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
    # Each call counted once, when it ended (not again for its hand-off).
    assert sum(n for labels, n in totals.calls.items() if labels[-1] == "ok") == 30
    assert sum(n for (task, _), n in totals.steps.items() if task == "call_model") == 30


def test_without_carrying_the_slots_bound_the_calls_in_flight(tmp_path: Path) -> None:
    # The control for the test above: the same load, RELAY_MODEL_CARRIED off.
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "2", env={"RELAY_MODEL_CARRIED": "0"})
        _slow(f, "SLOTTED", 0.5)
        runs = [f.relay.start(f"SLOTTED-{n}: answer") for n in range(8)]
        assert all(f.relay.wait(run_id, timeout=120).stop is Stop.DONE for run_id in runs)
        assert f.model.most_delaying <= 2
        assert "carried by this worker" not in f.full_logs()


def test_a_quick_reply_is_kept_by_its_task_and_a_slow_one_is_carried(tmp_path: Path) -> None:
    """The task waits RELAY_MODEL_CARRIED_AFTER_MS for the reply of the call it handed on: a
    reply within it is the task's to save, and the run goes on in place; a slower one is
    saved by the carrier's thread, which goes on with the run in the slot the task left
    free (the worker runs nothing else)."""
    waits = {"RELAY_MODEL_CARRIED_AFTER_MS": "1500", "RELAY_INLINE_MS": "10000"}
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "2", env={"RELAY_MODEL_CARRIED": "100", **waits})
        quick = {0: call("read_note", name="a"), 1: final("quick done")}
        f.brain.script("QUICK", quick)
        assert f.relay.wait(f.relay.start("QUICK: read a note"), timeout=60).stop is Stop.DONE
        # Both model calls and the tool call ran in the advance's task.
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 0}
        assert "carried by this worker" not in f.full_logs()
        slow = Reply(text=call("read_note", name="b"), delay=3.0)
        f.brain.script("SLOW", {0: slow, 1: final("slow done")})
        assert f.relay.wait(f.relay.start("SLOW: read a note"), timeout=60).stop is Stop.DONE
        # The first reply outlasted the wait: carried; its thread then ran the tool call and
        # the quick second reply in the free slot, as the task would have: no message.
        assert f.messages() == {"relay.advance": 2, "relay.call_model": 0, "relay.run_tool": 0}
        # Once: its task sent no final event, and the carrier told its end, and the rest
        # (once the run is saved: the line comes after the save that finished it).
        told = "carried by this worker (1 in flight); then model call m1"
        f.until(lambda: told in f.full_logs(), 30, what="the carried call's end")
        logs = f.full_logs()
        assert logs.count("<no final event here: ") == 1, f.logs()
        assert logs.count(told) == 1
        assert logs.count("| continued call-1 read_note: ") == 2, f.logs()  # (QUICK's, SLOW's)


def test_a_threads_pool_with_slots_to_spare_keeps_a_reply_within_its_slice(
    tmp_path: Path,
) -> None:
    """Waiting holds a slot: a prefork child has one, so its task waits only a moment for
    a 300 ms reply and the call is carried; a threads pool with slots free waits out its
    slice for it, and the run goes on in place as if nothing were carried."""
    waits = {"RELAY_MODEL_CARRIED": "100", "RELAY_INLINE_MS": "5000"}
    turn = {0: Reply(text=call("read_note", name="a"), delay=0.3), 1: final("done")}
    with fleet(tmp_path) as f:
        f.brain.script("SPARE", turn)
        threads = f.worker("--pool", "threads", "-c", "4", env=waits)
        assert f.relay.wait(f.relay.start("SPARE: read a note"), timeout=60).stop is Stop.DONE
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 0}
        assert "carried by this worker" not in f.full_logs()
        threads.stop()
        f.worker("--pool", "prefork", "-c", "1", env=waits, name="prefork")
        assert f.relay.wait(f.relay.start("SPARE: read b"), timeout=60).stop is Stop.DONE
        # Its first reply outlasted the moment: carried, and the tool call after it continued
        # by the carrier's thread in the child's free slot.
        assert f.messages() == {"relay.advance": 2, "relay.call_model": 0, "relay.run_tool": 0}
        f.until(lambda: "carried by this worker (1 in flight)" in f.full_logs(), 30,
                what="the carried call's end")  # fmt: skip


def test_calls_carried_by_a_worker_that_dies_are_made_again(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        first, runs = _carrying(f, "ORPHANED", 3.0, 10)
        first.kill()  # SIGKILL, with ten calls carried and two slots
        f.worker("--pool", "threads", "-c", "2", name="second")
        outcomes = [f.relay.wait(run_id, timeout=120) for run_id in runs]
        assert [o.summary for o in outcomes] == ["answered slowly"] * 10, f.logs()
        # Each call's lease lapsed; the tick sent it again; the trace says so.
        assert all(_resent(f, run_id) == 1 for run_id in runs)


@pytest.mark.parametrize("after_ms", ["10", "1000"])
def test_a_worker_that_stops_lets_its_carried_calls_end_first(
    tmp_path: Path, after_ms: str
) -> None:
    """SIGTERM to the worker's process group also raises in each child's running task: at
    1,000 ms, the last two tasks are waiting for their calls' replies as it comes."""
    with fleet(tmp_path) as f:
        env = {"RELAY_MODEL_CARRIED_AFTER_MS": after_ms}
        worker, runs = _carrying(f, "STOPPING", 2.0, 6, env)
        began = time.monotonic()
        worker.stop()  # a warm shutdown (SIGTERM), with no other worker to take over
        assert time.monotonic() - began < 30
        for run_id in runs:  # each saved by the worker that carried it, before it went
            status = f.relay.status(run_id)
            assert status.state == "finished", f.logs()
            assert status.outcome is not None
            assert status.outcome.summary == "answered slowly"
            assert _resent(f, run_id) == 0
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
        # Counted, and written as the worker went: no call's count lost with it.
        assert sum(n for labels, n in totals.calls.items() if labels[-1] == "ok") == 6


def test_a_run_cancelled_while_its_call_is_carried_stops_the_call_and_frees_the_carrier(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "1", env={"RELAY_MODEL_CARRIED": "1"})
        f.brain.script("ENDLESS", {0: Reply(text="go on ", endless=True, gap=0.05)})
        run_id = f.relay.start("ENDLESS: talk")
        # Its task let go of it (it sends no final event) while the model still talks.
        f.until(lambda: f.model.calls and "<no final event here: " in f.full_logs(), 30,
                what="the call to be carried")  # fmt: skip
        assert f.model.open_connections == 1
        f.relay.cancel(run_id)
        assert f.relay.wait(run_id, timeout=60).stop is Stop.CANCELLED, f.logs()
        # The worker hung up on the model: the stream does not go on past the run.
        f.until(lambda: f.model.open_connections == 0, 30, what="the model's stream to be cut")
        ended = "m1: carried by this worker (1 in flight); then model call m1"
        f.until(lambda: f"{ended} failed: model call stopped" in f.full_logs(), 30,
                what="the carried call's end")  # fmt: skip
        assert "model route default failed" not in f.full_logs()  # a cancel is no route's fault
        # The carrier holds one call, and it was let go: the next run's call is carried too.
        _slow(f, "AFTER", 0.5)
        assert f.relay.wait(f.relay.start("AFTER: answer"), timeout=60).summary == "answered slowly"
        f.until(lambda: f.full_logs().count(ended) == 2, 30, what="the second carried call's end")


def test_once_its_replies_come_slowly_a_task_hands_its_call_over_without_waiting(
    tmp_path: Path,
) -> None:
    """RELAY_MODEL_CARRIED_AFTER_MS is waited while it pays. After a run of slow replies
    (a remote model), even a reply that would have come within it is carried: the task
    no longer holds its slot waiting. (One process, so one carrier learns it all.)"""
    wait = {"RELAY_MODEL_CARRIED": "100", "RELAY_MODEL_CARRIED_AFTER_MS": "300"}
    with fleet(tmp_path) as f:
        f.worker("--pool", "prefork", "-c", "1", env=wait)
        _slow(f, "REMOTE", 0.8)
        slow = [f.relay.start(f"REMOTE-{n}: answer") for n in range(16)]
        assert all(f.relay.wait(run_id, timeout=120).stop is Stop.DONE for run_id in slow)
        f.brain.script("LOCAL", {0: final("answered at once")})
        quick = f.relay.start("LOCAL: answer")
        assert f.relay.wait(quick, timeout=60).summary == "answered at once"

        def ended() -> list[str]:  # (its line comes after the save that finished the run)
            return [line for line in f.full_logs().splitlines() if f"{quick}:" in line]

        f.until(lambda: any("ended with the call it carried" in line for line in ended()), 30,
                what="the carried call's end in the log")  # fmt: skip


def test_calls_that_end_while_the_slot_is_taken_wait_for_it_and_go_on(tmp_path: Path) -> None:
    """Six runs on one prefork child, their replies back together, each next step a 0.1 s
    tool: each call's thread finds the slot held by another's step, waits its turn (within
    its slice) and goes on there, rather than sending its tool call as a message."""
    turns = {
        0: Reply(text=call("sleep", seconds=0.1), delay=0.5),
        1: Reply(text=final("slept"), delay=0.2),
    }
    with fleet(tmp_path) as f:
        f.brain.script("TOGETHER", turns)
        env = {"RELAY_MODEL_CARRIED": "100", "RELAY_INLINE_MS": "10000"}
        f.worker("--pool", "prefork", "-c", "1", env=env)
        runs = [f.relay.start(f"TOGETHER-{n}: sleep a while") for n in range(6)]
        assert [f.relay.wait(run_id, timeout=60).summary for run_id in runs] == ["slept"] * 6
        assert f.messages() == {"relay.advance": 6, "relay.call_model": 0, "relay.run_tool": 0}
        assert f.ledger().count("sleep end 0.1") == 6  # (each tool ran once)


def test_a_run_of_slow_replies_goes_on_in_the_slot_its_calls_left_free(tmp_path: Path) -> None:
    """A prefork child with nothing else to run: each carried call's thread saves the reply
    and goes on with the run in the child's free slot (the tool, then the next call, which
    it hands to the carrier in turn), so the run is one Celery task, ended in the log (and
    Flower) with its last call. Every call's trace names that task; each step is counted
    once."""
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
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 0}
        f.until(lambda: "ended with the call it carried" in f.full_logs(), 30,
                what="the task's end")  # fmt: skip
        [ended] = [line for line in f.full_logs().splitlines() if "ended with the call" in line]
        for step in ("then model call m1 replied", "continued call-1 read_note",
                     "continued model call m3", "then model call m3 replied",
                     "continued call-2 read_note", "then model call m5 replied"):  # fmt: skip
            assert step in ended, ended
        assert ended.endswith("run finished (done): read both"), ended
        made = [e for e in f.relay.trace(run_id) if "task" in e.data]
        tasks = {e.data["task"] for e in made}
        assert len(made) >= 5, made  # (3 replies, 2 results)
        assert len(tasks) == 1, made  # (one task carried them all)
        worker.stop()
        store = f.relay.store
        totals = FleetMetrics(store.connection, store.shards, store.people).totals()
    steps = {task: n for (task, outcome), n in totals.steps.items() if outcome == "ok"}
    assert (steps.get("call_model"), steps.get("run_tool")) == (3, 2), totals.steps
