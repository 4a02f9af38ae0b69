"""Flower tells the truth, read through Flower's own HTTP API against real workers:
every task reaches its final state on every pool, its result is one readable line,
a step that fails shows as FAILURE with the reason (and is neither redelivered
nor retried), the tick is not in the list, and /metrics needs credentials."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet, on_broker
from tests.support.flower import FINAL_STATES, Flower, relay_tasks
from tests.support.model_server import Reply
from tests.support.rabbitmq import VHOSTS_MADE, require_rabbitmq
from tests.support.worker_process import RelayProcess
from workers.celery_app.sending import model_task_id

ONE_TASK_A_STEP = {"RELAY_INLINE_MS": "0"}
"""Every step its own task (continuation in place off), as these tests count them; what a
task that continued steps shows is tested in `test_a_task_names_the_steps_it_continued`."""

POOLS = {
    # The threads pool used to lose a third of its task events (workers.celery_app.flower).
    "threads": (60, ["--pool", "threads", "-c", "8"]),
    "prefork": (20, ["--pool", "prefork", "-c", "2"]),
    "solo": (20, ["--pool", "solo"]),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_every_task_reaches_its_final_state_with_a_readable_result(
    tmp_path: Path, pool: str
) -> None:
    _every_task_final(tmp_path, pool)


@pytest.mark.timeout(240)
def test_on_rabbitmq_a_threads_pool_loses_no_task_event(tmp_path: Path) -> None:
    require_rabbitmq()
    made = len(VHOSTS_MADE)
    with on_broker("amqp"):
        _every_task_final(tmp_path, "threads")
    assert len(VHOSTS_MADE) > made  # it really ran on RabbitMQ


def _every_task_final(tmp_path: Path, pool: str) -> None:
    runs, pool_args = POOLS[pool]
    with fleet(tmp_path, extra_env={"RELAY_TICK_SECONDS": "1", **ONE_TASK_A_STEP}) as f:
        f.brain.script("TRUTH", {0: call("read_note", name="a.txt"), 1: final("read it")})
        with Flower(f.env, tmp_path / "flower.log") as flower:
            f.worker(*pool_args)
            if pool == "solo":
                f.beat()  # a beat's ticks must not reach Flower either
            ids = [f.relay.start(f"TRUTH-{i}: read a note") for i in range(runs)]
            for run_id in ids:
                assert f.relay.wait(run_id, timeout=90).summary == "read it"
            # advance, the first model call, the tool, the second model call: 4 a run
            tasks = relay_tasks(flower, ids, expected=4 * runs)
            states = Counter(task["state"] for task in tasks)
            assert set(states) == {"SUCCESS"}, (states, f.logs())
            assert len(tasks) >= 4 * runs
            by_name: dict[str, list[str]] = {}
            for task in tasks:
                by_name.setdefault(task["name"], []).append(str(task["result"]))
            tools = by_name["relay.run_tool"]
            assert all(r.strip("'").startswith("call-1 read_note ok, ") for r in tools), tools
            assert all(r.endswith("run waits for the model (step 3)'") for r in tools), tools
            model = by_name["relay.call_model"]
            asked = [r for r in model if "replied" in r and r.endswith("run waits for call-1'")]
            done = [r for r in model if "replied" in r and "run finished (done): read it" in r]
            assert (len(asked), len(done)) == (runs, runs), model
            assert all("\\n" not in r for results in by_name.values() for r in results)
            names = {task["name"] for task in flower.tasks().values()}
            assert "relay.tick" not in names
            _linked_tasks_resolve(f, flower, ids, {t["uuid"] for t in tasks})


def _linked_tasks_resolve(f: Fleet, flower: Flower, runs: list[str], known: set[str]) -> None:
    """Every call of `runs` names the Celery task that carried it (each model call's usage
    line, each tool's result line), and each is a task Flower knows, of these runs."""
    for run_id in runs:
        trace = f.relay.trace(run_id)
        made = [e for e in trace if e.kind in ("usage", "result")]
        assert len(made) == 3, trace  # m1, call-1, m3
        tasks = {e.data.get("task") for e in made}
        assert None not in tasks, made
        assert tasks <= known, (tasks, known)
        for task_id in tasks:
            page = flower.client.get(f"/task/{task_id}")
            assert page.status_code == 200, task_id
            assert "Unknown task" not in page.text, task_id


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_a_failed_step_shows_as_failure_and_is_acked_not_redelivered(
    tmp_path: Path, pool: str
) -> None:
    with fleet(tmp_path, extra_env={"RELAY_MODEL_RETRIES": "0", **ONE_TASK_A_STEP}) as f:
        f.brain.script("RAISES", {0: call("boom"), 1: final("it failed, as told")})
        with Flower(f.env, tmp_path / "flower.log") as flower:
            worker = f.worker(*POOLS[pool][1])
            tool_run = f.relay.start("RAISES: call the tool that fails")
            assert f.relay.wait(tool_run, timeout=60).summary == "it failed, as told"
            f.model.set_responder(lambda _: Reply(status=400, text="no such model"))
            dead_run = f.relay.start("UNREACHABLE: the model answers 400")
            outcome = f.relay.wait(dead_run, timeout=60)
            assert outcome.stop.value == "model_failed"

            tasks = relay_tasks(flower, [tool_run, dead_run], expected=6)
            assert {t["state"] for t in tasks} <= FINAL_STATES
            tool = next(t for t in tasks if t["name"] == "relay.run_tool")
            assert tool["state"] == "FAILURE"
            assert "call-1 boom error: RuntimeError: kaboom" in tool["exception"]
            assert "StepFailed" in tool["exception"]
            dead = [t for t in tasks if t["name"] == "relay.call_model" and dead_run in t["args"]]
            assert dead, tasks
            assert all(t["state"] == "FAILURE" for t in dead)
            assert any("run failed (the model call failed)" in t["exception"] for t in dead)
            failed = flower.client.get("/api/tasks", params={"state": "FAILURE"}).json()
            assert {t["uuid"] for t in dead} <= set(failed)

            _check_nothing_redelivered(f.redis.url, worker, tasks)
            _check_monitoring_needs_credentials(flower)


def _check_nothing_redelivered(url: str, worker: RelayProcess, tasks: list[dict[str, str]]) -> None:
    # Acked: kombu's Redis transport keeps a delivered message in `unacked` until its ack.
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while client.hlen("unacked") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.hgetall("unacked") == {}
    log = worker.output()
    for task in tasks:
        assert log.count(f"[{task['uuid']}] received") == 1, task["uuid"]
        assert int(task.get("retries") or 0) == 0
    assert "Retry in" not in log


def _check_monitoring_needs_credentials(flower: Flower) -> None:
    anonymous = httpx.Client(base_url=flower.url, timeout=10)
    wrong = httpx.Client(base_url=flower.url, auth=("watcher", "wrong"), timeout=10)
    with anonymous, wrong:
        for path in ("/metrics", "/healthcheck"):
            assert anonymous.get(path).status_code == 401, path
            assert wrong.get(path).status_code == 401, path
    metrics = flower.client.get("/metrics")
    assert metrics.status_code == 200
    assert "flower_events_total" in metrics.text
    assert flower.client.get("/healthcheck").text == "OK"


@pytest.mark.timeout(180)
def test_a_second_delivery_does_not_hide_what_the_call_did(tmp_path: Path) -> None:
    with fleet(tmp_path, extra_env=ONE_TASK_A_STEP) as f:
        f.brain.script("TWICE", {0: call("read_note", name="a.txt"), 1: final("read it")})
        with Flower(f.env, tmp_path / "flower.log") as flower:
            # Every message a worker sends goes to the broker twice (tests/apps/notes.py).
            worker = f.worker("--pool", "threads", "-c", "8", env={"RELAY_TEST_DUPLICATES": "1"})
            ids = [f.relay.start(f"TWICE-{i}: read a note") for i in range(10)]
            for run_id in ids:
                assert f.relay.wait(run_id, timeout=60).summary == "read it"
            f.until(
                lambda: worker.output().count("<no final event here: ") >= 10,
                what="the duplicates",
            )
            tasks = relay_tasks(flower, ids, expected=40)
            calls = [t for t in tasks if t["name"] in ("relay.call_model", "relay.run_tool")]
            assert len(calls) == 30
            assert {t["state"] for t in tasks} == {"SUCCESS"}
            results = [str(t["result"]) for t in calls]
            assert all(" replied, " in r or " read_note ok, " in r for r in results), results


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_task_names_the_steps_it_continued(tmp_path: Path, pool: str) -> None:
    # (Carrying off: a reply a loaded machine takes long over would be carried, and the
    # step after it published; the test below has carried calls.)
    inline = {"RELAY_INLINE_MS": "5000", "RELAY_MODEL_CARRIED": "0"}
    with fleet(tmp_path, extra_env=inline) as f:
        f.brain.script("INLINE", {0: call("read_note", name="a.txt"), 1: final("read it")})
        with Flower(f.env, tmp_path / "flower.log") as flower:
            f.worker(*POOLS[pool][1])
            ids = [f.relay.start(f"INLINE-{i}: read a note") for i in range(4)]
            for run_id in ids:
                assert f.relay.wait(run_id, timeout=60).summary == "read it"
            # One task a run: its advance went on with both model calls and the tool.
            tasks = relay_tasks(flower, ids, expected=4)
            assert {t["name"] for t in tasks} == {"relay.advance"}, tasks
            assert {t["state"] for t in tasks} == {"SUCCESS"}, tasks
            _linked_tasks_resolve(f, flower, ids, {t["uuid"] for t in tasks})
            for task in tasks:
                result = str(task["result"])
                assert "| continued model call m1: model call m1 replied" in result, result
                assert "| continued call-1 read_note: call-1 read_note ok, " in result, result
                assert result.endswith("run finished (done): read it'"), result


CARRYING = {
    "RELAY_MODEL_CARRIED": "50",
    "RELAY_MODEL_RETRIES": "0",
}


HANDED_M1 = "m1: held on the event loop (1 in flight); then model call m1 replied"


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("pool", "inline"),
    [("prefork", "0"), ("prefork", "5000"), ("threads", "5000")],
    ids=["each-step-a-task", "continued", "threads"],  # (threads: the compose model worker)
)
def test_a_task_whose_call_is_carried_ends_in_flower_when_the_call_does(
    tmp_path: Path, pool: str, inline: str
) -> None:
    """The task that handed its model call to the loop shows STARTED while the call is in
    flight, then SUCCESS with what the call did, or FAILURE if it failed: never SUCCESS
    for a call still under way, whether the call was the task's own or one it continued.
    Where steps continue in place, the tool's task goes on with the second call and ends
    with it."""
    with fleet(tmp_path, extra_env={"RELAY_INLINE_MS": inline, **CARRYING}) as f:
        slow_call = Reply(text=call("read_note", name="a.txt"), delay=3.0)
        f.brain.script("CARRIED-TRUTH", {0: slow_call, 1: final("read it")})
        with Flower(f.env, tmp_path / "flower.log") as flower:
            f.worker("--pool", pool, "-c", "1" if pool == "threads" else "2")
            run_id = f.relay.start("CARRIED-TRUTH: read a note")
            f.until(lambda: f.model.delaying >= 1, 30, what="the first call in flight")

            def handing(run: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
                """The task that carries m1: its own with every step a task, else the advance."""
                if inline == "0":
                    return [t for t in tasks if t["uuid"] == model_task_id(run, 1)]
                return [t for t in tasks if t["name"] == "relay.advance"]

            def states() -> list[str]:
                tasks = relay_tasks(flower, [run_id], expected=0, timeout=0)
                return [str(t["state"]) for t in handing(run_id, tasks)]

            f.until(lambda: states() == ["STARTED"], 20, what="Flower showing it under way")
            assert f.model.delaying >= 1  # (still in flight as Flower said so)
            assert f.relay.wait(run_id, timeout=60).summary == "read it"
            tasks = relay_tasks(flower, [run_id], expected=4 if inline == "0" else 2)
            assert {t["state"] for t in tasks} == {"SUCCESS"}, tasks
            [carried] = handing(run_id, tasks)
            result = str(carried["result"])
            assert HANDED_M1 in result, result
            assert result.endswith("run waits for call-1'"), result  # (a keeper runs no tool)
            if inline != "0":  # the tool's task went on with the second call, and ended with it
                [tool_task] = [t for t in tasks if t["name"] == "relay.run_tool"]
                after = str(tool_task["result"])
                assert "continued model call m3: m3: held on the event loop" in after
                assert "then model call m3 replied" in after, after
                assert after.endswith("run finished (done): read it'"), after
            _linked_tasks_resolve(f, flower, [run_id], {t["uuid"] for t in tasks})

            f.model.set_responder(lambda _: Reply(status=400, text="no such model"))
            dead_run = f.relay.start("UNREACHABLE: the model answers 400")
            assert f.relay.wait(dead_run, timeout=60).stop.value == "model_failed"
            dead = handing(dead_run, relay_tasks(flower, [dead_run], expected=1))
            assert [t["state"] for t in dead] == ["FAILURE"], dead
            assert "StepFailed" in str(dead[0]["exception"])
            assert "held on the event loop" in str(dead[0]["exception"])
            assert "run failed (the model call failed)" in str(dead[0]["exception"])
