"""`async def` tools on a real fleet: they run on the worker process's event loop.

The task body hands the coroutine to the loop and waits under the call's lease;
the run's cancel and the tool's time limit cancel the coroutine itself, and a
worker killed mid-call leaves a non-idempotent async tool "unknown", exactly as
a sync one. Real Redis, real `relay worker` processes, a real model server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import prompts_for, shared_fleet, wait_state


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # Threads: four calls of a batch are carried at once by one worker process.
    args = ("--pool", "threads", "--concurrency", "4")
    with shared_fleet(tmp_path_factory.mktemp("async"), *args) as running:
        yield running


def _lines(f: Fleet, start: str) -> list[str]:
    return [line for line in f.ledger() if line.startswith(start)]


def test_an_async_tool_runs_once_on_the_event_loop(f: Fleet) -> None:
    f.brain.script(
        "ASYNC-ONE:", {0: call("async_once", label="one", seconds=0.2), 1: final("done")}
    )
    run_id = f.relay.start("ASYNC-ONE: do it")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    # It ran on the worker's loop thread, not on the task's (or a pool) thread.
    assert _lines(f, "async_once start one") == ["async_once start one on relay-loop"]
    assert _lines(f, "async_once end one") == ["async_once end one"]
    [result] = [e for e in f.relay.trace(run_id) if e.kind == "result"]
    assert (result.status, result.text) == ("ok", "did one asynchronously")


def test_a_batch_of_async_calls_waits_together_not_in_turn(f: Fleet) -> None:
    calls = [("async_once", {"label": f"b{n}", "seconds": 1.5}) for n in range(4)]
    f.brain.script("ASYNC-BATCH:", {0: batch(*calls), 4: final("all four")})
    run_id = f.relay.start("ASYNC-BATCH: four at once")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    order = [line.split()[1] for line in f.ledger() if " b" in line and "async_once" in line]
    # All four started before any ended: they shared the loop.
    assert order[:4] == ["start"] * 4, f.ledger()


def test_an_async_tool_past_its_time_limit_is_cancelled_and_unknown(f: Fleet) -> None:
    f.brain.script(
        "ASYNC-LATE:", {0: call("async_wait", label="late", seconds=30), 1: final("gave up")}
    )
    run_id = f.relay.start("ASYNC-LATE: wait long")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    [result] = [e for e in f.relay.trace(run_id) if e.kind == "result"]
    assert result.status == "unknown"
    assert "did not finish within 2 s; it was cancelled" in result.text
    # The coroutine itself was cancelled at its await, not left running.
    f.until(lambda: "async_once cancelled late" in f.ledger(), 10, what="the cancel")
    assert "async_once end late" not in f.ledger()


def test_cancelling_the_run_cancels_the_coroutine(f: Fleet) -> None:
    f.brain.script("ASYNC-STOP:", {0: call("async_once", label="stop", seconds=60)})
    run_id = f.relay.start("ASYNC-STOP: start something long")
    f.until(lambda: _lines(f, "async_once start stop"), 30, what="the call to start")
    asked = time.monotonic()
    assert f.relay.cancel(run_id, reason="no longer needed")
    f.until(lambda: "async_once cancelled stop" in f.ledger(), 30, what="the coroutine's cancel")
    # Seen at the lease's next renewal (a third of it), not at the end of its 60 s.
    assert time.monotonic() - asked < 20
    assert f.relay.wait(run_id, 60).stop is Stop.CANCELLED
    assert "async_once end stop" not in f.ledger()


def test_an_interrupting_reply_cancels_the_coroutine(f: Fleet) -> None:
    f.brain.script(
        "ASYNC-INTERRUPT:",
        {0: call("async_once", label="interrupted", seconds=60), 1: final("said hi instead")},
    )
    run_id = f.relay.start("ASYNC-INTERRUPT: start something long")
    f.until(lambda: _lines(f, "async_once start interrupted"), 30, what="the call to start")
    f.relay.reply(run_id, "Forget that, say hi", strategy="interrupt")
    # Its lease is fenced off: the next renewal fails, and the coroutine is cancelled.
    f.until(lambda: "async_once cancelled interrupted" in f.ledger(), 30, what="the cancel")
    assert f.relay.wait(run_id, 60).summary == "said hi instead"
    assert "async_once end interrupted" not in f.ledger()


def test_a_worker_killed_during_an_async_call_leaves_it_unknown(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script(
            "ASYNC-KILL:", {0: call("async_once", label="charge", seconds=5), 1: final("handled")}
        )
        first = f.worker("--concurrency", "2")
        run_id = f.relay.start("ASYNC-KILL: charge once")
        f.until(lambda: _lines(f, "async_once start charge"), 30, what="the call to start")
        first.kill()
        f.worker("--concurrency", "2", name="second")
        outcome = f.relay.wait(run_id, 90)
        assert outcome.stop is Stop.DONE, f.logs()
        # Started once, never again; the model was told its outcome is unknown.
        assert len(_lines(f, "async_once start charge")) == 1, f.ledger()
        assert "async_once end charge" not in f.ledger()
        [result] = [e for e in f.relay.trace(run_id) if e.kind == "result"]
        assert result.status == "unknown"
        wait_state(f, run_id, "finished")


def test_an_async_tool_that_raises_is_an_error_to_the_model_not_ok(f: Fleet) -> None:
    f.brain.script("ASYNC-RAISE:", {0: call("async_boom", label="fails"), 1: final("saw it fail")})
    run_id = f.relay.start("ASYNC-RAISE: try the failing one")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert _lines(f, "async_boom start fails") == ["async_boom start fails"]  # it did run
    [result] = [e for e in f.relay.trace(run_id) if e.kind == "result"]
    assert (result.status, result.text) == ("error", "ValueError: async kaboom fails")
    # What the model was shown next: the tool's failure, named as one.
    [_, after] = prompts_for(f, "ASYNC-RAISE:")
    assert "→ error: ValueError: async kaboom fails\n" in after
    assert "→ ok" not in after
