"""Scheduled runs end to end: real Redis, real worker processes, the scripted model server.
The tick is called with an injected clock, so the test says which slot fires when."""

from __future__ import annotations

import json
from pathlib import Path

from agent_core import Config, Every, Recipe, Stop
from scheduler import Schedule
from scheduler.store import fire_id
from tests.apps.notes import build
from tests.support.brain import call, final
from tests.support.cli import clean_env
from tests.support.cli import relay as cli
from tests.support.fleet import fleet
from workers import Settings
from workers.settings import now_ms

MINUTE = 60_000
NOTE = "the ledger balanced on the first try"


def test_scheduled_runs_get_the_filled_task_only_the_recipe_tools_and_earlier_notes(
    tmp_path: Path,
) -> None:
    recipe = (
        Recipe("audit", "SCHED-NOTES: audit {book} carefully.")
        .param("book", "which book")
        .only_tools(["read_note"])
    )
    remember = json.dumps({"tool": "remember", "args": {"note": NOTE}})
    with fleet(tmp_path) as f:
        # Turn 0 of the first run remembers; every later turn (and the second run) finishes.
        f.brain.script("SCHED-NOTES", {0: [remember, final("second run done")], 1: final("done")})
        f.worker("--concurrency", "2")
        made = now_ms() - 2 * MINUTE
        f.relay.schedule("audit-daily", recipe, {"book": "the ledger"}, Every(1), now_ms=made)

        first_tick = now_ms()
        [first] = f.relay.tick(first_tick)
        assert f.relay.wait(first, timeout=30).stop is Stop.DONE, f.logs()
        assert f.relay.schedule_notes("audit-daily") == [NOTE]

        assert f.relay.tick(first_tick + 1_000) == []  # the next slot is a minute away
        [second] = f.relay.tick(first_tick + MINUTE)
        outcome = f.relay.wait(second, timeout=30)
        assert outcome.summary == "second run done", f.logs()

        for run_id in (first, second):
            status = f.relay.status(run_id)
            assert status.task == "SCHED-NOTES: audit the ledger carefully."
            assert (status.schedule, status.recipe) == ("audit-daily", "audit")

        calls = [c for c in f.model.calls if "SCHED-NOTES" in c.prompt]
        assert len(calls) == 3  # remember, final; final
        for call in calls:
            assert "- read_note:" in call.system
            for other in ("write_note", "delete_note", "pay", "sleep", "once", "delegate"):
                assert f"- {other}:" not in call.system, call.system
            assert call.prompt.startswith("Task:\nSCHED-NOTES: audit the ledger carefully.")
        assert "Notes saved from earlier tasks" not in calls[0].prompt
        assert f"Notes saved from earlier tasks (oldest first):\n- {NOTE}" in calls[2].prompt


def test_an_unattended_schedule_finishes_without_a_person_and_skips_while_one_waits(
    tmp_path: Path,
) -> None:
    """The app asks for a plan and asks before WRITE calls. A schedule with --approve plan
    and a trusting policy finishes its runs alone; one without waits, and its every-minute
    firings leave that one run waiting, each later firing recorded as skipped."""
    write = call("delete_note", name="b.txt")  # WRITE: asks under the app's cautious policy
    with fleet(tmp_path) as f:
        relay = build(Settings.from_env(f.env), name="careful", config=Config())
        f.brain.script("UNATTENDED", {0: write, 1: final("copied b.txt")}, plan=["rm b.txt"])
        f.brain.script("ATTENDED", {0: write, 1: final("never")}, plan=["rm b.txt"])
        f.worker("--concurrency", "2", app="tests.apps.notes:careful")
        made = now_ms() - 30_000
        unattended = Recipe("copy", "UNATTENDED copy {src}").param("src", "a note")
        relay.schedule(
            "copy", unattended, {"src": "a.txt"}, Every(1), now_ms=made,
            approve_plan=True, ask=["outside"],
        )  # fmt: skip
        attended = Recipe("copy2", "ATTENDED copy {src}").param("src", "a note")
        relay.schedule("copy2", attended, {"src": "a.txt"}, Every(1), now_ms=made)

        first = now_ms() + MINUTE
        started = relay.tick(first)
        assert len(started) == 2
        done = relay.wait(fire_id("copy", made + MINUTE), timeout=30)
        assert done.stop is Stop.DONE, f.logs()
        assert done.summary == "copied b.txt"
        assert "delete_note b.txt" in f.ledger()  # ran: the trusting policy did not ask
        waiting = fire_id("copy2", made + MINUTE)
        f.until(lambda: relay.status(waiting).waiting_for == "plan", what="a plan to approve")
        status = relay.status(fire_id("copy", made + MINUTE))
        assert (status.schedule, status.fired_ms) == ("copy", made + MINUTE)
        trace = [entry.text for entry in relay.trace(fire_id("copy", made + MINUTE))]
        assert any("plan approved by schedule copy" in text for text in trace)

        for minute in range(2, 7):  # five more firings while copy2's run waits
            relay.tick(made + minute * MINUTE)
            ran = relay.wait(fire_id("copy", made + minute * MINUTE), timeout=30)
            assert ran.stop is Stop.DONE, f.logs()  # nobody was asked
        waiting_runs = [r for r in relay.runs(state="waiting") if r.schedule == "copy2"]
        assert [r.id for r in waiting_runs] == [waiting]
        history = relay.scheduling.history("copy2")
        assert [v.firing.kind for v in history] == ["skipped"] * 5 + ["fired"]
        assert history[-1].state == "waiting"
        copies = relay.scheduling.history("copy")
        assert sum(1 for v in copies if v.firing.kind == "fired") == 6  # none waited
        assert {v.stop for v in copies if v.firing.kind == "fired"} == {"done"}


def test_on_wait_skip_declines_what_would_wait_money_still_waits_and_notify_says_so(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        relay = build(Settings.from_env(f.env), name="careful", config=Config())
        delete = call("delete_note", name="c.txt")  # WRITE: the app's cautious policy asks
        f.brain.script("SKIPPY", {0: delete, 1: final("could not delete c.txt")}, plan=["rm"])
        f.brain.script("PAYDAY", {0: call("pay", amount=5), 1: final("paid")}, plan=["pay"])
        f.brain.script("WATCHED", {0: final("never")}, plan=["look"])
        f.worker("--concurrency", "2", app="tests.apps.notes:careful")
        made = now_ms() - 30_000
        for name, marker, on_wait in (
            ("skippy", "SKIPPY", "skip"),
            ("payday", "PAYDAY", "skip"),
            ("watched", "WATCHED", "notify"),
        ):
            recipe = Recipe(name, f"{marker} {{what}}").param("what", "what")
            relay.schedule(
                name, recipe, {"what": "now"}, Every(60), now_ms=made,
                approve_plan=name != "watched", on_wait=on_wait,
            )  # fmt: skip
        relay.tick(made + 60 * MINUTE)
        skippy, payday, watched = (
            fire_id(n, made + 60 * MINUTE) for n in ("skippy", "payday", "watched")
        )

        done = relay.wait(skippy, timeout=30)
        assert (done.stop, done.summary) == (Stop.DONE, "could not delete c.txt"), f.logs()
        declined = [e for e in relay.trace(skippy) if e.kind == "declined"]
        assert [e.tool for e in declined] == ["delete_note"]
        assert "nobody is there to approve it: schedule skippy" in declined[0].text
        assert "delete_note c.txt" not in f.ledger()

        f.until(lambda: relay.status(payday).waiting_for == "call", what="the money call to wait")
        assert [p.tool for p in relay.pending() if p.run_id == payday] == ["pay"]

        f.until(lambda: relay.status(watched).waiting_for == "plan", what="the plan to wait")
        f.until(relay.notifications, what="a notification")
        [notice] = relay.notifications()
        assert (notice.schedule, notice.run_id) == ("watched", watched)
        assert notice.waits == "plan: look"


def test_a_schedule_whose_runs_cannot_start_says_failed_and_why_and_stores_little(
    tmp_path: Path,
) -> None:
    """The issue's case: a schedule stored before the bounds, with a 10 MB template. Each
    firing fails (no run takes a task that long): its history says failed and why, as
    `relay schedule history` prints it, each entry small; a schedule beside it still fires
    and its run finishes on a real worker; `relay schedule show` says it never ran."""
    huge = Recipe("huge", "HUGE " + "x" * 10 * 2**20)
    with fleet(tmp_path) as f:
        f.brain.script("SCHED-FINE", {0: final("fine done")})
        f.worker("--concurrency", "2")
        made = now_ms() - 2 * MINUTE
        # As stored before the bounds: `Schedule.create` refuses it now.
        old = Schedule(
            name="huge",
            recipe=huge,
            values={},
            trigger=Every(1),
            created_ms=made,
            last_run_ms=made,
        )
        f.relay.schedule_store.put(old)
        fine = Recipe("fine", "SCHED-FINE {x}").param("x")
        f.relay.schedule("fine", fine, {"x": "a"}, Every(1), now_ms=made)

        first = now_ms()
        [run_id] = f.relay.tick(first)
        assert run_id == fire_id("fine", made + MINUTE)
        assert f.relay.wait(run_id, timeout=30).stop is Stop.DONE, f.logs()
        assert f.relay.tick(first + MINUTE) == [fire_id("fine", first + MINUTE)]
        assert {s.schedule for s in f.relay.runs()} == {"fine"}  # huge started none

        env = {**clean_env(), **f.env}
        shown = cli("schedule", "history", "huge", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        entries = [json.loads(line)["firing"] for line in shown.stdout.splitlines()]
        assert [(e["kind"], e["run_id"]) for e in entries] == [("failed", None)] * 2
        reason = "the run could not start: the task is longer than 100000 characters"
        assert {e["why"] for e in entries} == {reason}
        table = cli("schedule", "history", "huge", env=env).stdout.splitlines()
        assert table[0].split() == ["TIME", "WHAT", "BY", "RUN", "OUTCOME", "WHY"]
        assert [line.split()[1:3] for line in table[1:]] == [["failed", "schedule"]] * 2
        assert all(line.endswith(f"  {reason}") for line in table[1:])
        notices = cli("schedule", "notifications", env=env).stdout
        assert notices.count("huge  could not start: the run could not start") == 2

        last = [line for line in cli("schedule", "show", "huge", env=env).stdout.splitlines()
                if line.startswith("last run:")]  # fmt: skip
        assert last == ["last run:  never"]

        keys = f.relay.schedule_store.shards.of("huge")
        redis = f.relay.store.redis
        for key in (keys.history("huge"), keys.notifications):
            sizes = [len(stored) for stored in redis.lrange(key, 0, -1)]
            assert len(sizes) == 2
            assert max(sizes) < 400, (key, sizes)  # not the 10 MB task each time
