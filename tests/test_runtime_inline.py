"""Continuation in place (RELAY_INLINE_MS): a worker runs its run's next step in the same
task, and that changes nothing a run can tell, a crash included.

Real Redis, real `relay worker` processes (SIGKILLed by process group), a real
HTTP model server. Each test sets RELAY_INLINE_MS on its workers itself, so it
means the same in CI's pass with continuation off.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent_core import Stop
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply

ON = {"RELAY_INLINE_MS": "5000", "RELAY_MODEL_CARRIED": "0"}
"""A slice long enough that a loaded CI machine never ends it mid-run. Carrying is off:
a reply a loaded machine took more than RELAY_MODEL_CARRIED_AFTER_MS over would be
carried, and the step after it published (test_runtime_carried has the two together)."""
OFF = {"RELAY_INLINE_MS": "0", "RELAY_MODEL_CARRIED": "0"}


def _succeeded(f: Fleet) -> str:
    return "\n".join(line for line in f.full_logs().splitlines() if "succeeded" in line)


def _turn(f: Fleet, marker: str) -> str:
    f.brain.script(marker, {0: call("read_note", name="a"), 1: final(f"{marker} done")})
    return f.relay.start(f"{marker}: read a note")


def test_a_run_continues_in_place_and_takes_fewer_messages(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.worker("--concurrency", "2", env=ON, name="inline")
        run_id = _turn(f, "IN-ON")
        outcome = f.relay.wait(run_id, timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        # One message started the run; the model call, the tool call and the second model
        # call were run by the same task, and its result line names them.
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 0}
        f.until(lambda: "succeeded" in f.full_logs(), 10, what="the task's result line")
        succeeded = [line for line in f.full_logs().splitlines() if "succeeded" in line]
        assert len(succeeded) == 1, succeeded
        line = succeeded[0]
        assert "continued model call m1" in line, line
        assert "continued call-1" in line, line
        assert "continued model call m3" in line, line
        # Each step was saved as if its message had come: the trace is a normal one, and
        # nothing is left in the outbox for the tick to send.
        kinds = [e.kind for e in f.relay.trace(run_id)]
        assert kinds.count("call") == 1, kinds
        assert kinds.count("result") == 1, kinds
        assert f.relay.store.redis.zcard(f.relay.store.keys.index(run_id).outbox) == 0


def test_with_continuation_off_every_step_is_a_message(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.worker("--concurrency", "2", env=OFF, name="plain")
        outcome = f.relay.wait(_turn(f, "IN-OFF"), timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 2, "relay.run_tool": 1}
        assert "continued" not in f.full_logs()


def test_a_tool_calls_task_goes_on_through_the_turns_after_it(tmp_path: Path) -> None:
    """On prefork a tool's task has a hard time limit, and a step is continued only if its
    own limit fits in what is left of the task's. That limit leaves room for the slice, so
    the task runs the next tool call too, not one turn a message."""
    with fleet(tmp_path) as f:
        # The first reply outlasts the slice: the advance's task ends after it, the first
        # tool call is published, and its task runs every turn after it.
        slow = Reply(text=call("read_note", name="a"), delay=2.5)
        notes = {1: call("read_note", name="b"), 2: call("read_note", name="c")}
        f.brain.script("IN-TOOLS", {0: slow, **notes, 3: final("read three notes")})
        f.worker("--concurrency", "2", env={**ON, "RELAY_INLINE_MS": "1500"}, name="tools")
        outcome = f.relay.wait(f.relay.start("IN-TOOLS: read three notes"), timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 0, "relay.run_tool": 1}
        # The run is done before its task's result line is written.
        f.until(lambda: "relay.run_tool" in _succeeded(f), 10, what="the tool task's result line")
        lines = [line for line in f.full_logs().splitlines() if "succeeded" in line]
        tool_task = [line for line in lines if "relay.run_tool" in line]
        assert len(tool_task) == 1, lines
        assert "continued call-3" in tool_task[0], tool_task


def test_a_batch_still_fans_out(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        three = batch(*[("sleep", {"seconds": 1}) for _ in range(3)])
        f.brain.script("IN-BATCH", {0: three, 3: final("slept three times")})
        f.worker("--concurrency", "4", "--pool", "threads", env=ON)
        started = time.monotonic()
        outcome = f.relay.wait(f.relay.start("IN-BATCH: sleep three times"), timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        # Three tool messages, run side by side, not one after another in one task.
        assert f.messages()["relay.run_tool"] == 3, f.messages()
        lines = f.ledger()
        assert lines.index("sleep end 1") >= 2, lines
        assert time.monotonic() - started < 2.9, "the batch ran one call after another"


def test_a_step_for_a_queue_the_worker_does_not_consume_is_published(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.worker("--concurrency", "2", "--queues", "advance,model", env=ON, name="models")
        f.worker("--concurrency", "2", "--queues", "tools", env=ON, name="tools")
        outcome = f.relay.wait(_turn(f, "IN-QUEUES"), timeout=60)
        assert outcome.stop is Stop.DONE, f.logs()
        # The tool call went to the tools worker; its result's model call stayed there
        # only if that worker consumed the model queue, which it does not.
        assert f.messages() == {"relay.advance": 1, "relay.call_model": 1, "relay.run_tool": 1}


def test_a_worker_killed_mid_slice_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("IN-ONCE", {0: call("once", label="charge", seconds=3), 1: final("handled")})
        first = f.worker("--concurrency", "2", env=ON, name="first")
        run_id = f.relay.start("IN-ONCE: do it once")
        f.until(lambda: "once start charge" in f.ledger(), 30, what="the tool under way")
        # The tool runs inside the task that started the run: no tool message was sent.
        assert f.messages()["relay.run_tool"] == 0, f.logs()
        first.kill()
        f.worker("--concurrency", "2", env=ON, name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        assert outcome.summary == "handled"
        # The outbox sent the tool call again; its second attempt did not run it.
        assert f.ledger().count("once start charge") == 1, f.ledger()
        assert "once end charge" not in f.ledger()
        results = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert [r.status for r in results] == ["unknown"]
        # The model was asked once per step: the first call's reply was not paid twice.
        asked = [c for c in f.model.calls if "IN-ONCE" in c.prompt]
        assert len(asked) == 2, [c.prompt[-200:] for c in asked]


def test_a_worker_killed_mid_slice_runs_an_idempotent_tool_again_once(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("IN-SAFE", {0: call("sleep", seconds=3), 1: final("slept")})
        first = f.worker("--concurrency", "2", env=ON, name="first")
        run_id = f.relay.start("IN-SAFE: sleep")
        f.until(lambda: "sleep start 3" in f.ledger(), 30, what="the tool under way")
        first.kill()
        f.worker("--concurrency", "2", env=ON, name="second")
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.ledger() == ["sleep start 3", "sleep start 3", "sleep end 3"], f.ledger()
