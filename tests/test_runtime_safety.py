"""No call without its decision, tried as a stranger with broker access would.

Real Redis, real `relay worker` processes, a real HTTP model server. Task
messages are sent straight to the broker with `send_task`, as a stranger (or
Flower's "apply") could: for calls waiting on a person, declined, finished,
never made, another run's, early, replayed, and with arguments Relay never
sends. Nothing runs that the run's record did not decide, and each refusal
leaves a warning in the worker's log. Decisions that come after their expiry are
refused and decline, whether or not a tick ran in between.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Config, Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import pending_for, prompts_for
from tests.support.worker_process import RelayProcess
from workers import DecisionRefused
from workers.settings import Settings, now_ms


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("safety")) as running:
        running.worker("--concurrency", "2", "--pool", "threads")
        yield running


def _forge(f: Fleet, task: str, *args: object) -> None:
    """Send a task message straight to the broker, as anyone with access to it could."""
    queue = {"relay.run_tool": "tools", "relay.call_model": "model"}.get(task, "advance")
    f.relay.celery.send_task(task, args=list(args), queue=f.relay.queues.named(queue))


def _paid(f: Fleet, amount: float) -> int:
    """How often `pay(amount)` really ran (its ledger lines)."""
    return sum(1 for line in f.ledger() if line.startswith("pay ") and float(line[4:]) == amount)


def _refusals(f: Fleet) -> int:
    return f.full_logs().count("refused ")


def _until_refused(f: Fleet, before: int, count: int = 1) -> None:
    f.until(lambda: _refusals(f) >= before + count, 30, what=f"{count} refusal(s) in the log")


def test_forged_messages_for_a_call_waiting_on_a_person_run_nothing(f: Fleet) -> None:
    f.brain.script("FORGE-PAY:", {0: call("pay", amount=1000), 1: final("paid")})
    run_id = f.relay.start("FORGE-PAY: pay the invoice")
    pending = pending_for(f, run_id)
    assert pending.call_id == "call-1"
    before = _refusals(f)
    # The waiting call itself, twice; a call never made; a model call not asked for.
    _forge(f, "relay.run_tool", run_id, "call-1")
    _forge(f, "relay.run_tool", run_id, "call-1")
    _forge(f, "relay.run_tool", run_id, "call-2")
    _forge(f, "relay.call_model", run_id, 0)
    _forge(f, "relay.call_model", run_id, 1)
    _until_refused(f, before, 5)
    assert _paid(f, 1000) == 0
    assert [p.call_id for p in f.relay.pending() if p.run_id == run_id] == ["call-1"]
    status = f.relay.status(run_id)
    assert (status.state, status.waiting_for) == ("waiting", "call")
    assert len(prompts_for(f, "FORGE-PAY:")) == 1  # no model call was paid for
    assert f"refused tool call call-1 of run {run_id}" in f.full_logs()

    # The person says yes: it runs once, and a replay of its message afterwards does nothing.
    f.relay.approve(run_id, "call-1")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert _paid(f, 1000) == 1
    before = _refusals(f)
    _forge(f, "relay.run_tool", run_id, "call-1")
    _forge(f, "relay.call_model", run_id, 1)
    _until_refused(f, before, 2)
    assert _paid(f, 1000) == 1
    assert len(prompts_for(f, "FORGE-PAY:")) == 2


def test_forged_messages_for_a_declined_call_run_nothing(f: Fleet) -> None:
    f.brain.script("FORGE-DENY:", {0: call("pay", amount=7), 1: final("did not pay")})
    run_id = f.relay.start("FORGE-DENY: pay")
    pending_for(f, run_id)
    f.relay.deny(run_id, "call-1", reason="no")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    before = _refusals(f)
    _forge(f, "relay.run_tool", run_id, "call-1")
    _until_refused(f, before)
    assert _paid(f, 7) == 0


def test_a_message_naming_another_runs_call_runs_nothing(f: Fleet) -> None:
    f.brain.script("FORGE-MINE:", {0: call("pay", amount=11), 1: final("paid")})
    f.brain.script("FORGE-OTHER:", {0: call("read_note", name="x.txt"), 1: final("read")})
    mine = f.relay.start("FORGE-MINE: pay")
    pending_for(f, mine)
    other = f.relay.start("FORGE-OTHER: read")
    assert f.relay.wait(other, 60).stop is Stop.DONE
    before = _refusals(f)
    # call-1 of `other` ran and is done; call-1 of `mine` waits. Swapped ids change nothing.
    _forge(f, "relay.run_tool", other, "call-1")
    _forge(f, "relay.run_tool", f"{mine}.call-1", "call-1")  # a child that does not exist
    _forge(f, "relay.run_tool", "0000000000000000", "call-1")  # a run that does not exist
    _until_refused(f, before, 3)
    assert _paid(f, 11) == 0
    f.relay.cancel(mine)


def test_an_early_message_for_a_call_not_yet_asked_for_runs_nothing(f: Fleet) -> None:
    f.brain.script(
        "FORGE-EARLY:",
        {0: call("read_note", name="a.txt"), 1: call("pay", amount=3), 2: final("paid")},
    )
    run_id = f.relay.start("FORGE-EARLY: read, then pay")
    before = _refusals(f)
    _forge(f, "relay.run_tool", run_id, "call-2")  # the pay the model will ask for next
    _until_refused(f, before)
    pending = pending_for(f, run_id)
    assert pending.call_id == "call-2"
    assert _paid(f, 3) == 0
    f.relay.deny(run_id, "call-2")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE
    assert _paid(f, 3) == 0


@pytest.mark.parametrize(
    ("task", "args"),
    [
        ("relay.run_tool", [123, "call-1"]),
        ("relay.run_tool", ["run", {"id": "call-1"}]),
        ("relay.run_tool", ["", "call-1"]),
        ("relay.run_tool", ["x" * 5_000, "call-1"]),
        ("relay.call_model", ["run", "7"]),
        ("relay.call_model", ["run", True]),
        ("relay.call_model", ["run", -1]),
        ("relay.advance", [None]),
    ],
)
def test_a_message_with_arguments_relay_never_sends_is_refused(
    f: Fleet, task: str, args: list[object]
) -> None:
    before = f.full_logs().count("with arguments Relay never sends")
    _forge(f, task, *args)
    f.until(
        lambda: f.full_logs().count("with arguments Relay never sends") > before,
        30,
        what="the refusal in the log",
    )


# --- decisions that come too late -------------------------------------------------------


@pytest.fixture(scope="module")
def untended(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fleet whose only worker takes no part in the tick: nothing expires on its own."""
    env = {"RELAY_APPROVAL_TTL": "2"}
    with fleet(tmp_path_factory.mktemp("late"), extra_env=env) as running:
        running.worker("--concurrency", "2", "--pool", "threads", "--no-tick")
        yield running


def _after(expires_ms: int | None) -> None:
    assert expires_ms is not None
    while now_ms() <= expires_ms:
        time.sleep(0.05)


def test_an_approval_after_its_expiry_is_refused_and_the_call_declined(untended: Fleet) -> None:
    f = untended
    f.brain.script("LATE-CALL:", {0: call("pay", amount=50), 1: final("not paid")})
    run_id = f.relay.start("LATE-CALL: pay")
    pending = pending_for(f, run_id)
    assert pending.expires_ms is not None
    assert pending.expires_ms - pending.created_ms == 2_000
    _after(pending.expires_ms)
    assert f.relay.status(run_id).waiting_for == "call"  # no tick ran: still listed
    with pytest.raises(DecisionRefused, match="time ran out"):
        f.relay.approve(run_id, "call-1")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()
    assert _paid(f, 50) == 0
    assert "no decision came in time" in prompts_for(f, "LATE-CALL:")[-1]
    with pytest.raises(DecisionRefused, match="time ran out"):
        f.relay.approve(run_id, "call-1")  # and it stays refused


def test_a_plan_approval_after_its_expiry_is_refused(untended: Fleet) -> None:
    f = untended
    f.brain.script("LATE-PLAN:", {0: call("pay", amount=60)}, plan=["Pay."])
    run_id = f.relay.start("LATE-PLAN: pay", config=Config(require_plan=True))
    plan = pending_for(f, run_id, "plan")
    _after(plan.expires_ms)
    with pytest.raises(DecisionRefused, match="time ran out"):
        f.relay.approve_plan(run_id, yes=True)
    assert f.relay.wait(run_id, 60).stop is Stop.PLAN_DECLINED, f.logs()
    assert len(prompts_for(f, "LATE-PLAN:")) == 1


def test_an_answer_after_its_expiry_is_refused(untended: Fleet) -> None:
    f = untended
    f.brain.script(
        "LATE-ASK:", {0: json.dumps({"ask_user": "Which month?"}), 1: final("assumed March")}
    )
    run_id = f.relay.start("LATE-ASK: the report")
    question = pending_for(f, run_id, "question")
    _after(question.expires_ms)
    with pytest.raises(DecisionRefused, match="time ran out"):
        f.relay.answer(run_id, "September")
    assert f.relay.wait(run_id, 60).summary == "assumed March", f.logs()
    told = prompts_for(f, "LATE-ASK:")[-1]
    assert "No answer came in time" in told
    assert "September" not in told


def test_a_decision_after_a_tick_declined_it_is_refused_as_too_late(tmp_path: Path) -> None:
    env = {"RELAY_APPROVAL_TTL": "1", "RELAY_TICK_SECONDS": "1"}
    with fleet(tmp_path, extra_env=env) as f:
        f.worker("--concurrency", "2", "--pool", "threads")
        f.brain.script("TICKED:", {0: call("pay", amount=70), 1: final("not paid")})
        run_id = f.relay.start("TICKED: pay")
        pending_for(f, run_id)
        assert f.relay.wait(run_id, 60).stop is Stop.DONE, f.logs()  # the tick declined it
        with pytest.raises(DecisionRefused, match="time ran out"):
            f.relay.approve(run_id, "call-1")
        assert _paid(f, 70) == 0


# --- a fleet of plain workers heals itself -------------------------------------------------


def test_a_fleet_of_plain_workers_ticks_once_per_interval(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env={"RELAY_TICK_SECONDS": "1"}) as f:
        workers = [f.worker("--pool", "threads", name=f"t{n}") for n in range(3)]
        store = f.relay.store
        f.until(lambda: store.upkeep.tick_stats()[0] >= 1, 30, what="a first tick")
        first, _, _ = store.upkeep.tick_stats()
        time.sleep(6)
        count, _, by = store.upkeep.tick_stats()
        # Three workers, one tick per second between them (not three).
        assert 4 <= count - first <= 8, (first, count)
        assert by is not None
        # The worker that ticked last dies: another takes over at the next interval.
        pid = int(by.split(":")[1])
        dead = next(w for w in workers if w.process is not None and w.process.pid == pid)
        dead.kill()
        f.until(lambda: (store.upkeep.tick_stats()[2] or "").split(":")[1] != str(pid), 30)
        before = store.upkeep.tick_stats()[0]
        time.sleep(3)
        assert store.upkeep.tick_stats()[0] - before >= 2


def _holder(f: Fleet, run_id: str, call_id: str) -> RelayProcess:
    """Return the worker process holding the call's lease (its token starts with its pid)."""
    token = f.redis.client().get(f"relay:lease:{run_id}:{call_id}")
    assert token is not None, "the call holds no lease"
    pid = int(token.decode().split("-")[0])
    return next(p for p in f.processes if p.process is not None and p.process.pid == pid)


def test_plain_workers_pick_up_a_dead_workers_call_within_the_recovery_time(
    tmp_path: Path,
) -> None:
    # Relay's defaults: RELAY_RECOVERY_SECONDS and RELAY_TICK_SECONDS unset, no beat.
    with fleet(tmp_path, recovery=None) as f:
        f.brain.script("RECOVER:", {0: call("sleep", seconds=60), 1: final("slept")})
        for name in ("first", "second"):
            f.worker("--concurrency", "2", "--pool", "threads", name=name)
        run_id = f.relay.start("RECOVER: sleep a minute")
        f.until(lambda: "sleep start 60" in f.ledger(), 30, what="the call to start")
        running = _holder(f, run_id, "call-1")
        client, keys = f.redis.client(), f.relay.store.keys
        killed_ms = int(client.time()[0] * 1000 + client.time()[1] // 1000)
        running.kill()
        # The promise's arithmetic, as Redis holds it at the kill: the lease lapses, and the
        # call is due again, within 8 s; the fleet ticks every 5 s; 2 s are left for a live
        # worker to take it: 15 s. (bench/recovery.py times the worst case.)
        assert 0 < client.pttl(keys.lease(run_id, "call-1")) <= 8_000
        due = [at for m, at in client.zrange(keys.index(run_id).outbox, 0, -1, withscores=True)
               if b"call-1" in m]  # fmt: skip
        assert len(due) == 1
        assert killed_ms < due[0] <= killed_ms + 8_000
        assert Settings.from_env(f.env).tick_interval == 5.0
        killed = time.monotonic()
        f.until(
            lambda: f.ledger().count("sleep start 60") == 2,
            75,  # five times the 15 s promised: a noisy machine's slack, not the promise
            what="the call to be picked up again",
        )
        assert _holder(f, run_id, "call-1") is not running
        assert time.monotonic() - killed > 0.5 * 8  # not before its lease could have lapsed
        f.relay.cancel(run_id)


def test_a_stranger_with_the_broker_cannot_stop_or_change_a_worker(tmp_path: Path) -> None:
    # Remote control commands go to every worker through the broker: a Relay worker
    # answers inspections (Flower's worker pages) and refuses everything else.
    with fleet(tmp_path) as g:
        plain = g.worker("--pool", "threads", name="plain")
        obeys = g.worker("--pool", "threads", "--remote-control", name="obeys")
        control = g.relay.celery.control
        # (A worker that says it is ready may not have joined the broadcast yet: asked until
        # both answer, the slack of a loaded machine.)
        both = {"plain@test", "obeys@test"}
        g.until(lambda: set(control.inspect(timeout=2).ping() or {}) == both, 30, what="pings")
        for command in ("pool_restart", "rate_limit", "shutdown"):
            control.broadcast(command, destination=["plain@test"])
        g.until(lambda: plain.output().count("refused the remote control command") >= 3, 30)
        stats = control.inspect(destination=["plain@test"], timeout=5).stats() or {}
        assert "plain@test" in stats  # still there, still inspectable
        g.brain.script("STILL:", {0: final("still here")})
        assert g.relay.wait(g.relay.start("STILL: say so"), 30).summary == "still here"
        assert plain.process is not None
        assert plain.process.poll() is None
        control.broadcast("shutdown", destination=["obeys@test"])  # it was told it may
        assert obeys.process is not None
        g.until(lambda: obeys.process is not None and obeys.process.poll() is not None, 30)


# --- two apps under one prefix ------------------------------------------------------------


def test_a_worker_of_another_app_under_the_same_prefix_runs_nothing_of_this_apps_runs(
    tmp_path: Path,
) -> None:
    # "billing" has the same queues (one RELAY_PREFIX) and even the same tool names; a
    # worker of it must neither advance a "notes" run nor run its tool calls.
    with fleet(tmp_path) as f:
        f.brain.script("TWO-APPS:", {0: call("write_note", name="a", text="x"), 1: final("ok")})
        billing = f.worker("--pool", "threads", app="tests.apps.notes:billing", name="billing")
        run_id = f.relay.start("TWO-APPS: write a note")
        f.until(lambda: "is the app 'notes''s" in billing.output(), 30, what="a refusal")
        assert f.relay.status(run_id).state == "running"
        assert not any("TWO-APPS:" in c.prompt for c in f.model.calls)  # it asked no model
        # The "notes" workers advance it and make its model call; only "billing" takes tools.
        f.worker("--pool", "threads", "--queues", "advance,model", name="notes-steps")
        f.until(lambda: "relay.run_tool" in billing.output(), 60, what="the tool call sent")
        time.sleep(3)  # the tick sends it again: "billing" keeps refusing it
        assert "write_note a" not in f.ledger()
        assert f.relay.status(run_id).state == "running"
        # Once a "notes" worker takes tools, the call runs once and the run finishes.
        f.worker("--pool", "threads", "--queues", "tools", name="notes-tools")
        outcome = f.relay.wait(run_id, 60)
        assert outcome.stop is Stop.DONE, f.logs()
        assert f.ledger().count("write_note a") == 1
        assert "billing" not in f.relay.status(run_id).model_dump_json()
