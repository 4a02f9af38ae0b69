"""Steering runs, end to end: a person's messages, pause and resume, follow-ups, memory.

Real Redis, real `relay worker` processes, the loopback model server. Each
person's act is an event in the run's inbox, applied once by the run's next step,
however often the step's messages are delivered.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.waiting import pending_for, prompts_for, shared_fleet
from workers import DecisionRefused, RelayError
from workers.engine.effects import Message

TOLD = "A message from the person, sent while you worked:\n"


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with shared_fleet(tmp_path_factory.mktemp("steer"), "--concurrency", "4") as running:
        yield running


def _line(f: Fleet, line: str, timeout: float = 30) -> None:
    f.until(lambda: line in f.ledger(), timeout, what=line)


def _kinds(f: Fleet, run_id: str) -> list[str]:
    return [entry.kind for entry in f.relay.trace(run_id)]


def _waits_for(f: Fleet, run_id: str, what: str, timeout: float = 30) -> None:
    f.until(lambda: f.relay.status(run_id).waiting_for == what, timeout, f"{run_id} {what}")


# --- send: a person's message, seen at the next model call ------------------------------------


def test_a_message_sent_while_a_tool_runs_is_shown_at_the_next_call(f: Fleet) -> None:
    f.brain.script("SEND-1:", {0: call("sleep", seconds=1.51), 1: final("used March")})
    run_id = f.relay.start("SEND-1: sum the figures")
    _line(f, "sleep start 1.51")
    f.relay.send(run_id, "Use the March figures instead")
    assert f.relay.wait(run_id, 60).summary == "used March"
    first, second = prompts_for(f, "SEND-1:")
    assert "Use the March figures" not in first
    assert f"{TOLD}Use the March figures instead" in second


def test_a_message_sent_to_a_parked_run_is_kept_for_its_next_call(f: Fleet) -> None:
    f.brain.script("SEND-2:", {0: call("delete_note", name="old.txt"), 1: final("deleted")})
    run_id = f.relay.start("SEND-2: tidy up")
    parked = pending_for(f, run_id)
    f.relay.send(run_id, "Also check April")
    time.sleep(0.5)  # the message is applied; the run stays parked on its call
    assert f.relay.status(run_id).waiting_for == "call"
    assert parked.call_id is not None
    f.relay.approve(run_id, parked.call_id)
    assert f.relay.wait(run_id, 60).summary == "deleted"
    assert f"{TOLD}Also check April" in prompts_for(f, "SEND-2:")[-1]


def test_a_message_to_a_finished_run_is_refused(f: Fleet) -> None:
    f.brain.script("SEND-3:", {0: final("done")})
    run_id = f.relay.start("SEND-3: quick")
    f.relay.wait(run_id, 60)
    with pytest.raises(DecisionRefused, match="has finished"):
        f.relay.send(run_id, "too late")
    with pytest.raises(RelayError, match="non-empty"):
        f.relay.send(run_id, "  ")


# --- pause and resume --------------------------------------------------------------------


def test_a_pause_parks_the_run_after_the_call_under_way(f: Fleet) -> None:
    f.brain.script("PAUSE-1:", {0: call("sleep", seconds=1.52), 1: final("slept")})
    run_id = f.relay.start("PAUSE-1: sleep")
    _line(f, "sleep start 1.52")
    assert f.relay.pause(run_id) is True
    _line(f, "sleep end 1.52")  # the call under way finishes
    _waits_for(f, run_id, "pause")
    status = f.relay.status(run_id)
    assert (status.state, status.paused) == ("waiting", True)
    time.sleep(1.0)
    assert len(prompts_for(f, "PAUSE-1:")) == 1  # no new model call while paused
    assert f.relay.resume(run_id) is True
    assert f.relay.wait(run_id, 60).summary == "slept"
    assert len(prompts_for(f, "PAUSE-1:")) == 2
    assert "→ ok: slept 1.52" in prompts_for(f, "PAUSE-1:")[-1]
    kinds = _kinds(f, run_id)
    assert kinds.index("paused") < kinds.index("resumed")


def test_a_pause_during_a_model_call_holds_the_tool_call_it_asks_for(f: Fleet) -> None:
    slow = Reply(call("sleep", seconds=0.2), piece_chars=2, gap=0.05)
    f.brain.script("PAUSE-2:", {0: slow, 1: final("done after resuming")})
    run_id = f.relay.start("PAUSE-2: sleep a moment")
    f.until(lambda: len(prompts_for(f, "PAUSE-2:")) == 1, 30, "the model call")
    f.relay.pause(run_id)
    _waits_for(f, run_id, "pause")
    assert "sleep start 0.2" not in f.ledger()  # the call it asked for is held
    assert [t.status for t in f.relay.store.read(run_id)[0].calls.values()] == ["held"]
    f.relay.resume(run_id)
    assert f.relay.wait(run_id, 60).summary == "done after resuming"
    assert f.ledger().count("sleep start 0.2") == 1


def test_a_pause_reaches_the_specialists_at_work(f: Fleet) -> None:
    f.brain.script(
        "PAUSE-3:",
        {
            0: call("delegate", specialist="sleeper", task="PAUSE-3-CHILD: nap"),
            1: final("all done"),
        },
    )
    f.brain.script("PAUSE-3-CHILD:", {0: call("sleep", seconds=1.2), 1: final("napped")})
    run_id = f.relay.start("PAUSE-3: have someone nap")
    _line(f, "sleep start 1.2")
    child = f"{run_id}.call-1"
    f.relay.pause(run_id)
    _waits_for(f, child, "pause")
    assert f.relay.status(run_id).paused
    assert len(prompts_for(f, "PAUSE-3-CHILD:")) == 1
    f.relay.resume(run_id)
    assert f.relay.wait(run_id, 60).summary == "all done"
    assert f.relay.status(child).outcome is not None


def test_pausing_a_finished_run_says_so(f: Fleet) -> None:
    f.brain.script("PAUSE-4:", {0: final("done")})
    run_id = f.relay.start("PAUSE-4: quick")
    f.relay.wait(run_id, 60)
    assert f.relay.pause(run_id) is False
    assert f.relay.resume(run_id) is False


# --- reply: a new turn ------------------------------------------------------------------------


def test_a_reply_to_a_finished_run_is_a_new_turn_with_its_history(f: Fleet) -> None:
    f.brain.script(
        "REPLY-1:",
        {0: final("March: 42"), 1: call("sleep", seconds=2), 2: final("April: 7")},
    )
    run_id = f.relay.start("REPLY-1: total March")
    assert f.relay.wait(run_id, 60).summary == "March: 42"
    redis, key = f.redis.client(), f.relay.store.keys.run(run_id)
    assert redis.ttl(key) > 0
    f.relay.reply(run_id, "Now do the same for April")
    _line(f, "sleep start 2")
    assert redis.ttl(key) == -1  # reopened: it lives until this turn ends
    assert f.relay.status(run_id).outcome is None
    assert f.relay.wait(run_id, 60).summary == "April: 7"
    assert redis.ttl(key) > 0
    assert redis.ttl(f.relay.store.keys.history(run_id)) > 0  # its history goes with it
    second = prompts_for(f, "REPLY-1:")[1]
    assert "Your turn ended (done): March: 42\n→ then the person asked: Now do the same" in second
    kinds = _kinds(f, run_id)
    assert kinds.count("finished") == 2
    assert kinds.index("follow_up") > kinds.index("finished")


def test_a_reply_while_the_run_works_waits_for_its_turn_to_end(f: Fleet) -> None:
    f.brain.script(
        "REPLY-2:", {0: call("sleep", seconds=1.53), 1: final("March: 42"), 2: final("April: 7")}
    )
    run_id = f.relay.start("REPLY-2: total March")
    _line(f, "sleep start 1.53")
    f.relay.reply(run_id, "Then April", strategy="enqueue")
    f.until(lambda: f.relay.status(run_id).queued == ("Then April",), 10, "the queued turn")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.summary == "April: 7"
    kinds = _kinds(f, run_id)
    assert kinds.count("finished") == 1
    assert kinds.index("turn_ended") < kinds.index("follow_up") < kinds.index("finished")


def test_a_rejecting_reply_is_refused_while_the_run_works(f: Fleet) -> None:
    f.brain.script(
        "REPLY-3:", {0: call("sleep", seconds=1.0), 1: final("first"), 2: final("second")}
    )
    run_id = f.relay.start("REPLY-3: work")
    _line(f, "sleep start 1.0")
    with pytest.raises(DecisionRefused, match="still working"):
        f.relay.reply(run_id, "Not now?", strategy="reject")
    assert f.relay.wait(run_id, 60).summary == "first"
    f.relay.reply(run_id, "Now then", strategy="reject")
    with pytest.raises(DecisionRefused, match="still working"):
        f.relay.reply(run_id, "And again", strategy="reject")  # one is on its way already
    assert f.relay.wait(run_id, 60).summary == "second"  # the new turn's: a reply was on its way


def test_an_interrupting_reply_stops_the_turn_and_its_calls(f: Fleet) -> None:
    f.brain.script(
        "REPLY-4:", {0: call("until_cancelled", seconds=60), 1: final("said hi instead")}
    )
    run_id = f.relay.start("REPLY-4: work forever")
    f.until(lambda: any("until_cancelled start" in line for line in f.ledger()), 30, "the tool")
    started = time.monotonic()
    f.relay.reply(run_id, "Forget that, say hi", strategy="interrupt")
    assert f.relay.wait(run_id, 60).summary == "said hi instead"
    _line(f, "until_cancelled saw cancel")  # the call was told to stop, as cancel does
    assert time.monotonic() - started < 30
    second = prompts_for(f, "REPLY-4:")[-1]
    assert "Your turn ended (cancelled): Stopped: the person asked for something else." in second
    kinds = _kinds(f, run_id)
    assert "interrupted" in kinds
    assert kinds.count("finished") == 1


def test_an_interrupting_reply_stops_a_reply_being_written(f: Fleet) -> None:
    endless = Reply(final("x" * 2_000), piece_chars=4, gap=0.05)  # 25 s of writing
    f.brain.script("REPLY-5:", {0: endless, 1: final("short")})
    run_id = f.relay.start("REPLY-5: write a lot")
    events = []
    for event in f.relay.stream(run_id, timeout=60):
        events.append(event)
        if len(events) == 5:
            break
    started = time.monotonic()
    f.relay.reply(run_id, "Stop, be brief", strategy="interrupt")
    assert f.relay.wait(run_id, 60).summary == "short"
    assert time.monotonic() - started < 15
    rest = list(f.relay.stream(run_id, after=events[-1].id, timeout=30))
    steps = [e for e in rest if e.kind == "step"]
    assert len(steps) == 1  # the new turn's reply begins as a reply of its own
    assert rest[-1].kind == "done"


def test_a_reply_is_refused_for_a_specialist_and_checked(f: Fleet) -> None:
    f.brain.script(
        "REPLY-6:",
        {0: call("delegate", specialist="reader", task="REPLY-6-CHILD: read"), 1: final("ok")},
    )
    f.brain.script("REPLY-6-CHILD:", {0: final("read")})
    run_id = f.relay.start("REPLY-6: delegate")
    f.relay.wait(run_id, 60)
    with pytest.raises(RelayError, match="specialist"):
        f.relay.reply(f"{run_id}.call-1", "more")
    with pytest.raises(RelayError, match="strategy"):
        f.relay.reply(run_id, "more", strategy="later")  # type: ignore[arg-type]


# --- memory under a name -----------------------------------------------------------------------


def test_notes_are_kept_under_a_memory_for_the_next_runs_that_name_it(f: Fleet) -> None:
    remember = call("remember", note="Alice wants CSV files")
    f.brain.script("MEMORY-1:", {0: [remember, final("noted")], 1: final("still noted")})
    f.brain.script("MEMORY-2:", {0: final("used the note")})
    first = f.relay.start("MEMORY-1: learn", memory="team")
    assert f.relay.wait(first, 60).summary == "noted"
    assert f.relay.memory("team") == ["Alice wants CSV files"]
    second = f.relay.start("MEMORY-2: work", memory="team")
    f.relay.wait(second, 60)
    assert "Alice wants CSV files" in prompts_for(f, "MEMORY-2:")[0]
    f.relay.reply(first, "Carry on")  # its next turn keeps no note twice
    assert f.relay.wait(first, 60).summary == "still noted"
    assert f.relay.memory("team") == ["Alice wants CSV files"]
    with pytest.raises(RelayError, match="memory"):
        f.relay.start("MEMORY-3: x", memory="")


# --- under duplicate delivery -------------------------------------------------------------------


def test_steering_is_applied_once_however_often_it_is_delivered(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env={"RELAY_TEST_DUPLICATES": "1"}) as f:
        f.brain.script(
            "DUP-STEER:",
            {0: call("sleep", seconds=1.5), 1: final("March"), 2: final("April")},
        )
        f.worker("--concurrency", "4", "--pool", "threads")
        f.worker("--concurrency", "2", name="second")
        run_id = f.relay.start("DUP-STEER: work")

        def wake() -> None:  # the client's wake-ups, delivered three times over
            f.relay.runtime.send([Message("advance", run_id)] * 3)

        _line(f, "sleep start 1.5")
        for act in (lambda: f.relay.send(run_id, "Use March"), lambda: f.relay.pause(run_id)):
            act()
            act()  # a person who clicks twice: the second pause changes nothing
            wake()
        _waits_for(f, run_id, "pause")
        f.relay.resume(run_id)
        wake()
        assert f.relay.wait(run_id, 60).summary == "March"
        f.relay.reply(run_id, "Now April")
        wake()
        assert f.relay.wait(run_id, 60).summary == "April"
        prompts = prompts_for(f, "DUP-STEER:")
        assert len(prompts) == 3, [p[-300:] for p in prompts]
        assert prompts[1].count("Use March") == 2  # the person sent it twice
        kinds = _kinds(f, run_id)
        assert (kinds.count("paused"), kinds.count("resumed")) == (1, 1)
        assert kinds.count("follow_up") == 1
        assert f.ledger().count("sleep start 1.5") == 1


# --- a reply cut by the length limit ----------------------------------------------------------


def test_a_reply_cut_by_the_length_limit_is_continued_not_retried(tmp_path: Path) -> None:
    whole = final("The March total is 1,234.50, checked twice.")
    with fleet(tmp_path, extra_env={"RELAY_MODEL_MAX_TOKENS": "10"}) as f:
        # The server cuts at 10 tokens (40 characters) and says finish_reason "length";
        # the rest, asked for, fits.
        f.brain.script("CUT:", {0: [whole, whole[40:]]})
        f.worker("--concurrency", "2")
        run_id = f.relay.start("CUT: total March")
        outcome = f.relay.wait(run_id, 60)
        assert outcome.stop is Stop.DONE
        assert outcome.summary == "The March total is 1,234.50, checked twice."
        first, second = prompts_for(f, "CUT:")
        assert "--- your reply so far ---\n" + whole[:40] + "\n--- cut off here ---" in second
        assert "cut off" not in first
        assert "continued" in _kinds(f, run_id)


def test_wait_right_after_reply_returns_the_new_turns_outcome_every_time(f: Fleet) -> None:
    # `wait` straight after `reply`, turn after turn: a worker's save reopening the run can
    # land at any moment around the read, and the previous turn's outcome must never come.
    turns = 120
    # Turn k's prompt holds k earlier turns: the script answers each with its number.
    f.brain.script("RACE-TURNS:", {k: final(f"turn {k}") for k in range(turns + 1)})
    run_id = f.relay.start("RACE-TURNS: count")
    assert f.relay.wait(run_id, 60).summary == "turn 0"
    jitter = random.Random(30)
    for k in range(1, turns + 1):
        f.relay.reply(run_id, f"Now turn {k}")
        time.sleep(jitter.uniform(0, 0.003))  # somewhere around the save that reopens it
        outcome = f.relay.wait(run_id, 60)
        assert outcome.summary == f"turn {k}", (k, outcome)
