"""End to end: real Redis, real worker processes, a real HTTP model server."""

from __future__ import annotations

from pathlib import Path

from agent_core import Stop
from tests.apps.notes import build
from tests.support.brain import Brain, call, final
from tests.support.fleet import fleet
from tests.support.model_server import ModelServer
from tests.support.redis_server import RedisServer
from tests.support.worker_process import RelayProcess
from workers import Settings


def test_a_run_goes_end_to_end(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script(
            "TASK-A", {0: call("write_note", name="a.txt", text="hello"), 1: final("wrote it")}
        )
        f.worker("--concurrency", "2")
        run_id = f.relay.start("TASK-A: write a note")
        outcome = f.relay.wait(run_id, timeout=30)
        assert outcome.stop is Stop.DONE, f.logs()
        assert outcome.summary == "wrote it"
        assert (tmp_path / "notes" / "a.txt").read_text() == "hello"
        assert f.ledger() == ["write_note a.txt"]
        status = f.relay.status(run_id)
        assert status.state == "finished"
        assert status.usage.total_tokens > 0
        kinds = [e.kind for e in f.relay.trace(run_id)]
        assert kinds[0] == "started", kinds
        assert kinds[-1] == "finished", kinds
        # Two model calls: each task's line says how its call ended; httpx's own line for
        # each request is left out at INFO (`relay worker --loglevel`).
        # (The task's line comes once it returns, a moment after the save that ended the run.)
        f.until(lambda: "succeeded in" in f.processes[0].output(), 30, what="the task's line")
        log = f.processes[0].output()
        assert "HTTP Request:" not in log, log[-3000:]


def test_a_plain_celery_worker_runs_relay_too(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("CELERY-A:", {0: call("read_note", name="a.txt"), 1: final("read it")})
        args = [
            "-m",
            "celery",
            "-A",
            "tests.apps.notes:app",
            "worker",
            "--loglevel=INFO",
            "-P",
            "threads",
        ]
        process = RelayProcess(args, f.env, tmp_path / "celery.log", python_args=True)
        f.processes.append(process)
        process.start()
        outcome = f.relay.wait(f.relay.start("CELERY-A: read a note"), timeout=30)
        assert outcome.stop is Stop.DONE, process.output()[-3000:]
        assert outcome.summary == "read it"


def test_a_redis_password_given_in_the_query_string_works_for_the_broker_too(
    tmp_path: Path,
) -> None:
    # redis-py takes ?password=; kombu, handed the same URL as the broker, saw the
    # password twice and the worker died with a traceback as it started.
    brain = Brain()
    with (
        RedisServer(tmp_path, password="s3cret-pw") as server,
        ModelServer(brain) as model,
    ):
        env = {
            "RELAY_REDIS_URL": f"redis://127.0.0.1:{server.port}/0?password=s3cret-pw",
            "RELAY_MODEL_URL": model.url,
            "RELAY_TEST_DIR": str(tmp_path),
        }
        worker = RelayProcess(
            ["--app", "tests.apps.notes:relay", "worker", "--pool", "threads"],
            env,
            tmp_path / "worker.log",
        )
        with worker:
            brain.script("QUERY-PW:", {0: final("through")})
            relay = build(Settings.from_env(env))
            outcome = relay.wait(relay.start("QUERY-PW: say so"), timeout=30)
            assert outcome.summary == "through", worker.output()[-3000:]
        assert "Traceback" not in worker.output()
