"""A whole Relay on loopback for one test: private Redis, a scripted model server,
real `relay worker` processes, and a client-side Relay to drive it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.apps.notes import build
from tests.support.brain import Brain
from tests.support.model_server import ModelServer
from tests.support.redis_server import RedisServer
from tests.support.worker_process import RelayProcess
from workers import Relay, Settings

__all__ = ["Fleet", "fleet"]

APP = "tests.apps.notes:relay"


@dataclass
class Fleet:
    directory: Path
    redis: RedisServer
    model: ModelServer
    brain: Brain
    env: dict[str, str]
    relay: Relay
    processes: list[RelayProcess] = field(default_factory=list)

    def worker(
        self, *extra: str, name: str = "", env: dict[str, str] | None = None
    ) -> RelayProcess:
        """Start one more `relay worker` (all queues, unless `extra` says otherwise)."""
        index = len(self.processes)
        hostname = name or f"w{index}"
        args = [
            "--app",
            APP,
            "worker",
            "--loglevel",
            "INFO",
            "--hostname",
            f"{hostname}@test",
            *extra,
        ]
        process = RelayProcess(
            args, {**self.env, **(env or {})}, self.directory / f"{hostname}.log"
        )
        self.processes.append(process)
        return process.start()

    def beat(self) -> RelayProcess:
        args = ["--app", APP, "beat", "--loglevel", "INFO"]
        log = self.directory / f"beat{len(self.processes)}.log"
        process = RelayProcess(args, self.env, log, ready_text="beat: Starting")
        self.processes.append(process)
        return process.start()

    def ledger(self) -> list[str]:
        path = self.directory / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    def full_logs(self) -> str:
        """Everything every process of the fleet wrote so far."""
        return "\n".join(p.output() for p in self.processes)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.output()[-3000:]}" for p in self.processes)

    def until(
        self, check: Callable[[], object], timeout: float = 30, what: str = "a condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")


@contextmanager
def fleet(
    directory: Path,
    *,
    appendonly: bool = False,
    recovery: float | None = 4,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Fleet]:
    """Yield a Fleet with Redis and the model server up (start workers with `fleet.worker()`).

    `recovery` is RELAY_RECOVERY_SECONDS (None: Relay's default).
    """
    brain = Brain()
    with RedisServer(directory, appendonly=appendonly) as redis_server, ModelServer(brain) as model:
        env = {
            "RELAY_REDIS_URL": redis_server.url,
            "RELAY_MODEL_URL": model.url,
            "RELAY_TEST_DIR": str(directory),
            "RELAY_MODEL_TIMEOUT": "10",
            "RELAY_MODEL_RETRIES": "2",
            **({} if recovery is None else {"RELAY_RECOVERY_SECONDS": str(recovery)}),
            **(extra_env or {}),
        }
        settings = Settings.from_env(env)
        relay = build(settings, skills_dir=env.get("RELAY_TEST_SKILLS"))
        running = Fleet(directory, redis_server, model, brain, env, relay)
        try:
            yield running
        finally:
            for process in running.processes:
                process.stop()
