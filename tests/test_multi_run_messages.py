"""A Celery message that carries several runs (`relay.advances`, DESIGN §10.1): each run
in it is advanced, saved and ended as it would be alone, one corrupt run fails alone,
a message Relay never sends is refused, a lost one is sent again run by run, and
Flower and the trace still show each run's step.

Real Redis, real `relay worker` processes, a real HTTP model server, a real Flower.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agent_core import Every, Recipe, Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.flower import Flower, relay_tasks
from workers import AsyncRelay, RelayError
from workers.celery_app.sending import MOST_RUNS, grouped_advances
from workers.engine.effects import Message
from workers.settings import now_ms

SCRIPT = {0: call("read_note", name="a.txt"), 1: final("read it")}
NO_RESEND = 60
"""The recovery time of tests that start runs before their worker: the tick sends no
advance again (a second message) while the test runs."""


def _received(f: Fleet, task: str) -> int:
    """How many messages of `task` the workers received, from their logs."""
    return sum(
        1 for line in f.full_logs().splitlines() if f"Task {task}[" in line and "received" in line
    )


def _corrupt(f: Fleet, run_id: str) -> None:
    """Make the run's stored record unreadable (as a bad disk or a stray write would)."""
    f.relay.store.redis.hset(f"relay:run:{run_id}", "meta", "{this is not a record")


def _lose_advances(f: Fleet) -> int:
    """Drop every advance message waiting in the broker (as a broker that lost them);
    return how many there were."""
    queue = f.relay.queues.advance
    lost: int = f.redis.client().llen(queue)  # type: ignore[assignment]  # (a sync client)
    f.redis.client().delete(queue)
    return lost


@pytest.mark.timeout(180)
def test_many_starts_go_out_as_one_message_and_each_run_ends_as_alone(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("MANY-", SCRIPT)
        f.worker("--pool", "threads", "-c", "4")
        alone = f.relay.start("MANY-ALONE: read a note")
        assert f.relay.wait(alone, timeout=60).summary == "read it"
        ids = f.relay.start_many([f"MANY-{i}: read a note" for i in range(20)])
        assert len(set(ids)) == 20
        for run_id in ids:
            assert f.relay.wait(run_id, timeout=90).summary == "read it", f.logs()
        assert _received(f, "relay.advances") == 1, f.logs()
        f.until(lambda: "succeeded in" in _advances_lines(f), 30, what="the summary line")
        assert "20 runs (20 " in _advances_lines(f), _advances_lines(f)
        # Each run's trace shows its steps as a run started alone does, each call carried
        # by a task of its own run.
        shape = [e.kind for e in f.relay.trace(alone)]
        for run_id in ids:
            trace = f.relay.trace(run_id)
            assert [e.kind for e in trace] == shape, (run_id, trace)
            carriers = {e.data.get("task") for e in trace if e.kind in ("usage", "result")}
            assert carriers, trace
            assert all(str(t).startswith(f"{run_id}:") for t in carriers), carriers


def _advances_lines(f: Fleet) -> str:
    return "\n".join(line for line in f.full_logs().splitlines() if "relay.advances[" in line)


@pytest.mark.timeout(120)
def test_async_start_many_sends_its_runs_together(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("ASYNC-MANY-", SCRIPT)
        f.worker("--pool", "threads", "-c", "2")

        async def start() -> list[str]:
            async with AsyncRelay(f.relay) as arelay:
                return await arelay.start_many(
                    [f"ASYNC-MANY-{i}: read a note" for i in range(5)], key="team"
                )

        ids = asyncio.run(start())
        assert len(set(ids)) == 5
        for run_id in ids:
            assert f.relay.wait(run_id, timeout=60).summary == "read it", f.logs()
            assert f.relay.status(run_id).key == "team"
        assert _received(f, "relay.advances") == 1, f.logs()


def test_advances_sent_together_are_grouped_by_at_most_most_runs() -> None:
    quick = [Message("advance", f"r{i}") for i in range(2 * MOST_RUNS + 1)]
    model, later = Message("call_model", "r0", seq=1), Message("advance", "late", delay_ms=5)
    groups, alone = grouped_advances([model, *quick, quick[3], later])
    assert [len(g) for g in groups] == [MOST_RUNS, MOST_RUNS]  # (r3 once: one advance will do)
    assert [r for g in groups for r in g] == [f"r{i}" for i in range(2 * MOST_RUNS)]
    assert alone == [model, later, Message("advance", f"r{2 * MOST_RUNS}")]
    one = [Message("advance", "r0"), model]
    assert grouped_advances(one) == ([], one)  # a lone advance goes as today


@pytest.mark.timeout(120)
def test_a_tick_that_fires_several_schedules_sends_their_runs_together(tmp_path: Path) -> None:
    recipe = Recipe("fan", "FAN-OUT {n}: read a note").param("n", "which")
    with fleet(tmp_path) as f:
        f.brain.script("FAN-OUT", SCRIPT)
        f.worker("--pool", "threads", "-c", "2", "--no-tick")
        made = now_ms() - 2 * 60_000
        for n in range(4):
            f.relay.schedule(f"fan-{n}", recipe, {"n": str(n)}, Every(1), now_ms=made)
        started = f.relay.tick(now_ms())
        assert len(started) == 4
        for run_id in started:
            assert f.relay.wait(run_id, timeout=60).summary == "read it", f.logs()
        assert _received(f, "relay.advances") == 1, f.logs()
        assert _received(f, "relay.advance") == 0, f.logs()


def test_start_many_refuses_a_string_and_a_run_id(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        with pytest.raises(RelayError, match="a list of tasks"):
            f.relay.start_many("MANY: one task, not a list")
        with pytest.raises(RelayError, match="no run_id"):
            f.relay.start_many(["MANY: a", "MANY: b"], run_id="one")
        with pytest.raises(RelayError):  # one refused task: none is started
            f.relay.start_many(["MANY: fine", "MANY: fine", ""])
        assert f.relay.count_runs() == 0
        assert f.relay.start_many([]) == []


@pytest.mark.timeout(180)
def test_a_corrupt_run_in_a_message_fails_alone(tmp_path: Path) -> None:
    """One run's record is unreadable (its run fails, saying why); another's key is not
    even a record (its advance raises): each fails alone, and the runs after them go on."""
    with fleet(tmp_path, recovery=NO_RESEND) as f:
        f.brain.script("CORRUPT-ONE:", SCRIPT)
        ids = f.relay.start_many([f"CORRUPT-ONE: read note {i}" for i in range(6)])
        bad, broken = ids[1], ids[2]
        _corrupt(f, bad)
        f.relay.store.redis.delete(f"relay:run:{broken}")
        f.relay.store.redis.set(f"relay:run:{broken}", "not a record at all")
        f.worker("--pool", "threads", "-c", "2")
        for run_id in ids[3:] + ids[:1]:
            assert f.relay.wait(run_id, timeout=60).stop is Stop.DONE, f.logs()
        outcome = f.relay.wait(bad, timeout=60)
        assert outcome.stop is Stop.FAILED, outcome
        assert "record could not be read" in outcome.summary, outcome.summary
        assert _received(f, "relay.advances") == 1, f.logs()
        f.until(lambda: "succeeded in" in _advances_lines(f), 30, what="the summary line")
        summary = _advances_lines(f)
        assert "6 runs (" in summary, summary
        assert "2 failed" in summary, summary
        assert f"{bad} failed; {broken} failed" in summary, summary
        assert f"(run {broken}): its advance raised" in f.full_logs()


HOSTILE: list[Any] = [
    "not a list",
    {"runs": "a dict"},
    [1, 2],
    [f"run{i:05d}" for i in range(10_000)],
    [],
]


@pytest.mark.timeout(180)
def test_a_message_relay_never_sends_is_refused_and_a_lost_one_is_sent_again_run_by_run(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("LOST:", SCRIPT)
        first, second = f.relay.start_many(["LOST: read a note", "LOST: read it too"])
        assert _lose_advances(f) == 1  # the one grouped message, lost
        app, queue = f.relay.celery, f.relay.queues.advance
        for given in [*HOSTILE, [first, first], [first, *(["x"] * MOST_RUNS)]]:
            app.send_task("relay.advances", args=[given], queue=queue)
        worker = f.worker("--pool", "threads", "-c", "2", "--no-tick")
        hostile = len(HOSTILE) + 2
        f.until(lambda: worker.output().count("refused a relay.advances") == hostile, 30)
        log = worker.output()
        for why in ("not a list but str", "not a list but dict", "not a run id", "10000 runs"):
            assert why in log, log[-3000:]
        assert "a run named twice" in log
        assert "0 runs, not 1 to 100" in log
        assert f.model.calls == []  # nothing ran
        assert [f.relay.status(r).state for r in (first, second)] == ["running", "running"]

        # The tick sends each run's advance again from its own outbox entry: the first's
        # alone (the second's is not due yet), then the second's.
        later = now_ms() + 3_600_000
        f.relay.store.upkeep.postpone([Message("advance", second).member], later)
        assert f.relay.heal(later - 1) == 1
        assert f.relay.wait(first, timeout=60).summary == "read it", f.logs()
        assert f.relay.status(second).state == "running"
        assert f.relay.heal(later) == 1
        assert f.relay.wait(second, timeout=60).summary == "read it", f.logs()
        assert _received(f, "relay.advances") == hostile
        advanced = re.findall(r"relay\.advance\[(\w+):advance:\w+\] received", worker.output())
        assert advanced == [first, second]  # each alone, once


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inline", ["0", "5000"], ids=["each-step-a-task", "continued"])
def test_flower_lists_each_run_of_a_message_with_its_own_line_and_state(
    tmp_path: Path, inline: str
) -> None:
    """Five runs and a corrupt one in one message: Flower lists six `relay.advance` tasks,
    five SUCCESS with their own run's line, the corrupt one's FAILURE with its reason.
    Continued in place, each run's advance hands its model call to the event loop and
    ends in Flower when that call does."""
    with fleet(tmp_path, recovery=NO_RESEND, extra_env={"RELAY_INLINE_MS": inline}) as f:
        f.brain.script("FLOWER-MANY", SCRIPT)
        with Flower(f.env, tmp_path / "flower.log") as flower:
            ids = f.relay.start_many([f"FLOWER-MANY-{i}: read a note" for i in range(6)])
            bad, good = ids[0], ids[1:]
            _corrupt(f, bad)
            f.worker("--pool", "prefork", "-c", "2")
            for run_id in good:
                assert f.relay.wait(run_id, timeout=90).summary == "read it", f.logs()
            assert f.relay.wait(bad, timeout=60).stop is Stop.FAILED
            tasks = relay_tasks(flower, ids, expected=6 if inline == "0" else 11)
            advances = [t for t in tasks if t["name"] == "relay.advance"]
            states = Counter((t["args"].removeprefix("run="), t["state"]) for t in advances)
            assert states == Counter({(bad, "FAILURE"): 1, **{(r, "SUCCESS"): 1 for r in good}})
            for task in advances:
                run_id = task["args"].removeprefix("run=")
                assert task["uuid"].startswith(f"{run_id}:advance:"), task
                if run_id == bad:
                    assert "record could not be read" in str(task["exception"]), task
                    continue
                result = str(task["result"])
                if inline == "0":
                    assert "run waits for the model" in result, result
                else:  # ended once its call, held on the loop, did
                    assert "held on the event loop" in result, result
                    assert result.endswith("run waits for call-1'"), result
            known = {t["uuid"] for t in tasks}
            for run_id in good:
                made = [e for e in f.relay.trace(run_id) if e.kind in ("usage", "result")]
                assert {e.data.get("task") for e in made} <= known, made
            grouped = [t for t in flower.tasks().values() if t["name"] == "relay.advances"]
            assert [t["state"] for t in grouped] == ["SUCCESS"], grouped
            assert str(grouped[0]["result"]).startswith("'6 runs ("), grouped
