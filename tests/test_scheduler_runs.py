"""Scheduled runs end to end: real Redis, real worker processes, the scripted model server.
The tick is called with an injected clock, so the test says which slot fires when."""

from __future__ import annotations

import json
from pathlib import Path

from agent_core import Every, Recipe, Stop
from tests.support.brain import final
from tests.support.fleet import fleet
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
