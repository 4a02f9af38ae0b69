"""End to end: real Redis, real worker processes, a real HTTP model server."""

from __future__ import annotations

from pathlib import Path

from agent_core import Stop
from tests.support.brain import call, final
from tests.support.fleet import fleet
from tests.support.worker_process import RelayProcess


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
