"""People in the loop, end to end: plans, calls and questions that wait on a person.

Real Redis, real `relay worker` processes, a real HTTP model server. Most tests
share one worker of concurrency 1 (each with its own task marker), which also
shows that parked runs hold no worker: every run here parks on that one process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Config, Policy, Risk, Stop
from tests.apps.notes import build
from tests.support.brain import batch, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import pending_for, prompts_for, shared_fleet, wait_state
from workers import DecisionRefused, Relay, Settings
from workers.settings import now_ms

WEEK_MS = 7 * 24 * 60 * 60 * 1000
"""The default approval time limit (RELAY_APPROVAL_TTL unset)."""


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with shared_fleet(tmp_path_factory.mktemp("people"), "--concurrency", "1") as running:
        yield running


def _inbox_length(f: Fleet, run_id: str) -> int:
    store = f.relay.store  # its keys, whichever Redis (or cluster) the fleet is on
    return int(store.redis.xlen(store.keys.inbox(run_id)))


# --- plans ---------------------------------------------------------------------------


def test_an_approved_plan_runs(f: Fleet) -> None:
    f.brain.script(
        "PLAN-YES:",
        {0: call("read_note", name="plan.txt"), 1: final("read it")},
        plan=["Read plan.txt."],
    )
    before = now_ms()
    run_id = f.relay.start("PLAN-YES: read a note", config=Config(require_plan=True))
    plan = pending_for(f, run_id, "plan")
    assert plan.kind == "plan"
    assert plan.run_id == run_id
    assert plan.root_id == run_id
    assert plan.call_id is None
    assert plan.tool is None
    assert plan.summary == "Read plan.txt."
    assert before <= plan.created_ms <= now_ms()
    assert plan.expires_ms == plan.created_ms + WEEK_MS
    status = f.relay.status(run_id)
    assert (status.state, status.waiting_for) == ("waiting", "plan")
    assert [p.kind for p in status.pending] == ["plan"]

    f.relay.approve_plan(run_id, yes=True)
    with pytest.raises(DecisionRefused, match=f"run {run_id}"):
        f.relay.approve_plan(run_id, yes=False)  # used once: a second decision is refused
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert outcome.summary == "read it"
    assert not [p for p in f.relay.pending() if p.run_id == run_id]
    assert "plan_approved" in [e.kind for e in f.relay.trace(run_id)]


def test_a_declined_plan_stops_the_run(f: Fleet) -> None:
    f.brain.script("PLAN-NO:", {0: call("write_note", name="never.txt", text="no")})
    run_id = f.relay.start("PLAN-NO: write a note", config=Config(require_plan=True))
    pending_for(f, run_id, "plan")
    f.relay.approve_plan(run_id, yes=False)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.PLAN_DECLINED, f.logs()
    assert "write_note never.txt" not in f.ledger()
    assert not [p for p in f.relay.pending() if p.run_id == run_id]
    # Only the plan was asked for: nothing ran after the no.
    assert len(prompts_for(f, "PLAN-NO:")) == 1


# --- calls ---------------------------------------------------------------------------


def test_a_call_waits_for_approval_then_runs(f: Fleet) -> None:
    f.brain.script(
        "CALL-YES:", {0: call("delete_note", name="approve-me.txt"), 1: final("deleted")}
    )
    before = now_ms()
    run_id = f.relay.start("CALL-YES: delete a note")
    pending = pending_for(f, run_id)
    seen = now_ms()
    assert pending.kind == "call"
    assert pending.run_id == run_id
    assert pending.root_id == run_id
    assert pending.call_id == "call-1"
    assert pending.tool == "delete_note"
    assert pending.summary == 'delete_note(name="approve-me.txt")'
    assert pending.args == {"name": "approve-me.txt"}
    assert pending.risk is Risk.WRITE
    assert before <= pending.created_ms <= seen
    assert pending.expires_ms == pending.created_ms + WEEK_MS
    status = f.relay.status(run_id)
    assert (status.state, status.waiting_for) == ("waiting", "call")
    assert status.pending == (pending,)
    assert "delete_note approve-me.txt" not in f.ledger()

    f.relay.approve(run_id, "call-1", yes=True)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert f.ledger().count("delete_note approve-me.txt") == 1
    assert "→ ok: deleted approve-me.txt" in prompts_for(f, "CALL-YES:")[-1]
    assert not [p for p in f.relay.pending() if p.run_id == run_id]


@pytest.mark.parametrize("how", ["approve-no", "deny"])
def test_a_denied_call_is_told_to_the_model(f: Fleet, how: str) -> None:
    marker = f"DENY-{how}:"
    name = f"keep-{how}.txt"
    f.brain.script(marker, {0: call("delete_note", name=name), 1: final("left it alone")})
    run_id = f.relay.start(f"{marker} delete a note")
    pending = pending_for(f, run_id)
    assert pending.call_id is not None
    if how == "deny":
        f.relay.deny(run_id, pending.call_id, reason="we still need it")
    else:
        f.relay.approve(run_id, pending.call_id, yes=False, reason="we still need it")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert f"delete_note {name}" not in f.ledger()
    told = prompts_for(f, marker)[-1]
    assert "declined" in told
    assert "we still need it" in told
    declined = [e for e in f.relay.trace(run_id) if e.kind == "declined"]
    assert [(e.call_id, e.text) for e in declined] == [("call-1", "we still need it")]


def test_a_money_call_asks_even_when_trusting(f: Fleet) -> None:
    f.brain.script(
        "MONEY:",
        {
            0: batch(("delete_note", {"name": "trusted.txt"}), ("pay", {"amount": 12.5})),
            2: final("paid"),
        },
    )
    trusting = Config(require_plan=False, max_batch=2, policy=Policy.TRUSTING)
    run_id = f.relay.start("MONEY: tidy up and pay", config=trusting)
    pending = pending_for(f, run_id)
    assert (pending.tool, pending.risk, pending.args) == ("pay", Risk.MONEY, {"amount": 12.5})
    # The WRITE call of the same batch needed no one under TRUSTING.
    f.until(lambda: "delete_note trusted.txt" in f.ledger(), 60, what="the WRITE call to run")
    assert [p.tool for p in f.relay.status(run_id).pending] == ["pay"]
    assert "pay 12.5" not in f.ledger()

    f.relay.approve(run_id, pending.call_id or "")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert f.ledger().count("pay 12.5") == 1


def test_calls_needing_no_approval_run_while_another_waits(f: Fleet) -> None:
    f.brain.script(
        "BATCH:",
        {
            0: batch(
                ("delete_note", {"name": "batch-del.txt"}),
                ("write_note", {"name": "batch-new.txt", "text": "new"}),
                ("once", {"label": "batch-once"}),
            ),
            3: final("all three settled"),
        },
    )
    run_id = f.relay.start("BATCH: three things at once")
    pending = pending_for(f, run_id)
    assert pending.tool == "delete_note"

    def others_done_and_parked() -> bool:
        ledger = f.ledger()
        ran = "write_note batch-new.txt" in ledger and "once end batch-once" in ledger
        return ran and f.relay.status(run_id).state == "waiting"

    f.until(others_done_and_parked, 60, what="the other two calls to finish while one waits")
    assert "delete_note batch-del.txt" not in f.ledger()
    assert len(prompts_for(f, "BATCH:")) == 1  # the model sees all three results together

    f.relay.approve(run_id, "call-1")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    last = prompts_for(f, "BATCH:")[-1]
    assert last.count("\n→ ok: ") == 3
    assert f.ledger().count("once end batch-once") == 1


# --- stale and repeated decisions -------------------------------------------------------


def test_a_decision_for_a_call_that_is_not_pending_is_refused(f: Fleet) -> None:
    f.brain.script("STALE:", {0: call("delete_note", name="stale.txt"), 1: final("done")})
    run_id = f.relay.start("STALE: delete a note")
    pending = pending_for(f, run_id)
    before = f.relay.status(run_id)
    with pytest.raises(DecisionRefused, match=r"call-7 .* is not waiting for a decision"):
        f.relay.approve(run_id, "call-7")
    with pytest.raises(DecisionRefused, match="not waiting"):
        f.relay.answer(run_id, "an answer nobody asked for")
    with pytest.raises(DecisionRefused, match="not waiting"):
        f.relay.approve_plan(run_id)
    # Nothing changed: the same call waits, nothing was appended to the run's inbox.
    after = f.relay.status(run_id)
    assert after.pending == (pending,)
    assert (after.state, after.updated_ms) == (before.state, before.updated_ms)
    assert _inbox_length(f, run_id) == 0
    assert f.relay.cancel(run_id)
    assert f.relay.wait(run_id, 60).stop is Stop.CANCELLED


def test_a_repeated_decision_is_refused_and_the_call_runs_once(f: Fleet) -> None:
    f.brain.script("TWICE:", {0: call("delete_note", name="twice.txt"), 1: final("done")})
    run_id = f.relay.start("TWICE: delete a note")
    pending_for(f, run_id)
    f.relay.approve(run_id, "call-1")
    with pytest.raises(DecisionRefused, match="call-1"):
        f.relay.approve(run_id, "call-1")
    with pytest.raises(DecisionRefused, match="call-1"):
        f.relay.deny(run_id, "call-1", reason="changed my mind")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert f.ledger().count("delete_note twice.txt") == 1
    assert "declined" not in prompts_for(f, "TWICE:")[-1]


RACES = 40
DECISIONS = [(True, True), (True, False), (False, True), (False, False)]


def _race(clients: list[Relay], run_id: str, decisions: tuple[bool, bool]) -> list[object]:
    """Decide call-1 of the run from two threads at the same moment; return what each got."""
    start = threading.Barrier(2)
    got: list[object] = [None, None]

    def decide(index: int) -> None:
        start.wait()
        try:
            clients[index].approve(run_id, "call-1", decisions[index], reason="raced")
            got[index] = "won"
        except DecisionRefused as error:
            got[index] = error

    threads = [threading.Thread(target=decide, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return got


def test_two_decisions_at_once_one_wins_and_the_call_runs_at_most_once(f: Fleet) -> None:
    runs = []
    for race in range(RACES):
        marker = f"RACE-{race}:"
        f.brain.script(marker, {0: call("delete_note", name=f"race-{race}.txt"), 1: final("over")})
        runs.append(f.relay.start(f"{marker} delete a note"))
    f.until(
        lambda: sum(p.run_id in runs and p.call_id == "call-1" for p in f.relay.pending()) == RACES,
        60,
        what=f"{RACES} runs to wait for a decision",
    )
    other = build(Settings.from_env(f.env))  # a second person, with a client of their own
    winners = {}
    for race, run_id in enumerate(runs):
        decisions = DECISIONS[race % len(DECISIONS)]
        got = _race([f.relay, other], run_id, decisions)
        assert got.count("won") == 1, got  # exactly one wins...
        [lost] = [g for g in got if g != "won"]
        assert isinstance(lost, DecisionRefused), got  # ...the other is refused
        assert "call call-1 of run" in str(lost)
        winners[run_id] = decisions[got.index("won")]
    ledger_lines = []
    for race, run_id in enumerate(runs):
        assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
        yes = winners[run_id]
        kinds = [e.kind for e in f.relay.trace(run_id)]
        assert kinds.count("approved" if yes else "declined") == 1, kinds
        assert ("declined" if yes else "approved") not in kinds
        ledger_lines.append((f"delete_note race-{race}.txt", 1 if yes else 0))
    ledger = f.ledger()
    for line, times in ledger_lines:
        assert ledger.count(line) == times, line  # once when approved, never when declined
    assert any(winners.values())
    assert not all(winners.values())


def test_a_decision_for_a_finished_run_is_refused(f: Fleet) -> None:
    f.brain.script("OVER:", {0: call("read_note", name="over.txt"), 1: final("read")})
    run_id = f.relay.start("OVER: read a note")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    trace_length = len(f.relay.trace(run_id))
    with pytest.raises(DecisionRefused, match="not waiting"):
        f.relay.approve(run_id, "call-1")
    with pytest.raises(DecisionRefused, match="finished"):
        f.relay.approve_plan(run_id, yes=False)
    with pytest.raises(DecisionRefused, match="finished"):
        f.relay.answer(run_id, "too late")
    assert f.relay.cancel(run_id) is False
    status = f.relay.status(run_id)
    assert status.outcome == outcome
    assert len(f.relay.trace(run_id)) == trace_length


# --- questions -----------------------------------------------------------------------


def test_a_question_is_answered(f: Fleet) -> None:
    f.brain.script(
        "ASK:",
        {0: json.dumps({"ask_user": "Which month?"}), 1: final("the September report")},
    )
    run_id = f.relay.start("ASK: write the monthly report")
    question = pending_for(f, run_id, "question")
    assert (question.kind, question.summary) == ("question", "Which month?")
    assert question.call_id is None
    assert question.root_id == run_id
    assert f.relay.status(run_id).waiting_for == "question"

    f.relay.answer(run_id, "September")
    with pytest.raises(DecisionRefused):
        f.relay.answer(run_id, "October")
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert outcome.summary == "the September report"
    last = prompts_for(f, "ASK:")[-1]
    assert "→ they answered: September" in last
    assert "October" not in last


# --- parked runs hold no worker ---------------------------------------------------------


def test_ten_parked_runs_do_not_stop_an_eleventh(f: Fleet) -> None:
    # The shared worker has --concurrency 1: one process for every queue.
    parked = []
    for index in range(10):
        marker = f"PARKED-{index}:"
        f.brain.script(marker, {0: call("delete_note", name=f"parked-{index}.txt")})
        parked.append(f.relay.start(f"{marker} delete a note"))
    for run_id in parked:
        wait_state(f, run_id, "waiting")
    f.brain.script("ELEVENTH:", {0: call("read_note", name="x.txt"), 1: final("eleventh done")})
    eleventh = f.relay.start("ELEVENTH: read a note")
    outcome = f.relay.wait(eleventh, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert outcome.summary == "eleventh done"
    assert [f.relay.status(r).state for r in parked] == ["waiting"] * 10
    for run_id in parked:
        f.relay.cancel(run_id)
    for run_id in parked:
        assert f.relay.wait(run_id, 60).stop is Stop.CANCELLED


def test_a_parked_run_is_cancelled(f: Fleet) -> None:
    f.brain.script("PARK-CANCEL:", {0: call("delete_note", name="cancel-me.txt")})
    run_id = f.relay.start("PARK-CANCEL: delete a note")
    pending_for(f, run_id)
    assert f.relay.cancel(run_id, reason="not needed any more") is True
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.CANCELLED, f.logs()
    assert "not needed any more" in outcome.summary
    assert not [p for p in f.relay.pending() if p.run_id == run_id]
    assert f.relay.status(run_id).pending == ()
    assert "delete_note cancel-me.txt" not in f.ledger()
    with pytest.raises(DecisionRefused):
        f.relay.approve(run_id, "call-1")
    assert f.relay.cancel(run_id) is False


# --- expiry (its own fleet: the time limit is a worker setting) ---------------------------


def test_a_late_approval_is_refused_whatever_the_deciders_clock_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The decider's machine is an hour behind, and no tick ran to decline the call:
    # DECIDE still sees, by Redis's clock, that the approval came after its expiry.
    with fleet(tmp_path, extra_env={"RELAY_APPROVAL_TTL": "1"}) as g:
        g.brain.script("SLOW-CLOCK:", {0: call("pay", amount=900), 1: final("not paid")})
        g.worker("--concurrency", "1", "--no-tick")
        run_id = g.relay.start("SLOW-CLOCK: pay the invoice")
        pending = pending_for(g, run_id)
        assert pending.expires_ms is not None
        while now_ms() <= pending.expires_ms + 50:
            time.sleep(0.05)
        hour_behind = now_ms() - 3_600_000
        monkeypatch.setattr("workers.client.runs.now_ms", lambda: hour_behind)
        with pytest.raises(DecisionRefused, match="waited too long"):
            g.relay.approve(run_id, pending.call_id or "")
        outcome = g.relay.wait(run_id, 30)
        assert outcome.stop is Stop.DONE, g.logs()
        assert not [line for line in g.ledger() if line.startswith("pay")]
        assert "no decision came in time" in prompts_for(g, "SLOW-CLOCK:")[-1]


def test_an_approval_that_expires_is_declined_and_the_model_told(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env={"RELAY_APPROVAL_TTL": "1"}) as g:
        g.brain.script(
            "EXPIRE:", {0: call("delete_note", name="expire.txt"), 1: final("nobody answered")}
        )
        g.worker("--concurrency", "1")
        run_id = g.relay.start("EXPIRE: delete a note")
        pending = pending_for(g, run_id)
        assert pending.expires_ms == pending.created_ms + 1_000
        assert pending.expires_ms is not None
        while now_ms() <= pending.expires_ms:
            time.sleep(0.05)
        g.relay.tick()  # what the beat does every 5 s
        assert not [p for p in g.relay.pending() if p.run_id == run_id]
        # The tick wakes the run with the decline at once (not a grace period later).
        outcome = g.relay.wait(run_id, 30)
        assert outcome.stop is Stop.DONE, g.logs()
        assert "delete_note expire.txt" not in g.ledger()
        told = prompts_for(g, "EXPIRE:")[-1]
        assert "declined" in told
        assert "no decision came in time" in told
