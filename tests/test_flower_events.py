"""Flower's event toggles on real workers: answered from RELAY_EVENTS, and never a WARNING
in the worker's log every time Flower asks (it broadcasts `enable_events` every 5 s)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.support.brain import final
from tests.support.fleet import Fleet, fleet
from tests.support.flower import Flower, relay_tasks

REFUSED = "refused the remote control command"
FLOWER_INTERVAL_S = 5  # flower.events.Events.events_enable_interval, in seconds


def test_flower_beside_a_worker_leaves_no_refusal_in_its_log(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        with Flower(f.env, tmp_path / "flower.log") as flower:
            flower_up = time.monotonic()
            # Started after Flower, as the workers its `enable_events` is for; and so
            # Flower's event receiver listens before the run's tasks send their events.
            worker = f.worker("--pool", "threads", "-c", "2", name="watched")
            f.brain.script("EVENTS-1", {0: final("seen")})
            run_id = f.relay.start("EVENTS-1: say so")
            assert f.relay.wait(run_id, 30).summary == "seen"
            tasks = relay_tasks(flower, [run_id], expected=1)
            assert tasks, "Flower saw none of the run's tasks"
            assert {task["state"] for task in tasks} == {"SUCCESS"}
            # Flower has asked for events three times at least by now (the first after 5 s).
            time.sleep(max(0.0, flower_up + 3.5 * FLOWER_INTERVAL_S - time.monotonic()))
            assert "Visit me at" in flower.process.output()
        log = worker.output()
        assert log.count(REFUSED) == 0, log[-3000:]
        assert "WARNING" not in log, log[-3000:]


def _answer(f: Fleet, command: str, node: str) -> dict[str, Any]:
    """The worker `node`'s reply to `command`, broadcast to it alone."""
    hostname = f"{node}@test"
    control = f.relay.celery.control
    replies = control.broadcast(command, destination=[hostname], reply=True, timeout=10)
    answers = {name: answer for reply in replies or [] for name, answer in reply.items()}
    assert hostname in answers, (command, node, replies)
    return dict(answers[hostname])


def test_event_toggles_change_nothing_and_a_refusal_is_said_once(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        on = f.worker("--pool", "threads", name="on")
        off = f.worker("--pool", "threads", name="off", env={"RELAY_EVENTS": "0"})
        control = f.relay.celery.control
        both = {"on@test", "off@test"}
        f.until(lambda: set(control.inspect(timeout=2).ping() or {}) == both, 30, what="pings")
        for _ in range(3):
            assert _answer(f, "enable_events", "on") == {"ok": "task events already enabled"}
            refused = _answer(f, "disable_events", "on")
            assert refused == {
                "error": "disable_events refused: task events stay on, as RELAY_EVENTS says"
            }
            stays_off = _answer(f, "enable_events", "off")
            assert stays_off == {
                "error": "enable_events refused: task events stay off, as RELAY_EVENTS says"
            }
        # Three disables later the events are still on; three enables later, still off.
        assert _answer(f, "enable_events", "on") == {"ok": "task events already enabled"}
        assert "stay off" in _answer(f, "enable_events", "off")["error"]
        assert on.output().count(REFUSED) == 1, on.output()[-3000:]
        assert off.output().count(REFUSED) == 1, off.output()[-3000:]
        assert "Flower shows no tasks" in off.output()
        # Flower's wake-up call (sent as its event receiver connects) is obeyed, unsaid; the
        # answer to the command after it says the worker has handled it.
        control.broadcast("heartbeat", destination=["on@test"])
        assert _answer(f, "enable_events", "on") == {"ok": "task events already enabled"}
        assert "'heartbeat'" not in on.output()
        # Anything else is still refused, and said each time.
        for _ in range(2):
            assert "refused" in _answer(f, "pool_restart", "on")["error"]
        assert on.output().count(f"{REFUSED} 'pool_restart'") == 2
