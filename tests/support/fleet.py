"""A whole Relay on loopback for one test: private Redis, a scripted model server,
real `relay worker` processes, and a client-side Relay to drive it.

The broker is the same Redis, or (`broker="amqp"`) a vhost of its own on the
machine's RabbitMQ, made for the fleet and deleted after it. `on_broker(...)`
changes the default for the fleets made inside it (so a test written for Redis
runs unchanged on RabbitMQ); RELAY_TEST_BROKER=amqp changes it for a whole run.
`on_cluster(cluster)` likewise puts the run state of the fleets made inside it on
a Redis Cluster (tests/support/redis_cluster.py), each under a key prefix of its
own; the fleet's private Redis is then still started, and unused.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from tests.apps.notes import build
from tests.support.brain import Brain
from tests.support.model_server import ModelServer
from tests.support.rabbitmq import rabbit_vhost
from tests.support.redis_cluster import Cluster
from tests.support.redis_server import RedisServer
from tests.support.worker_process import RelayProcess
from workers import Relay, Settings

__all__ = ["Broker", "Fleet", "fleet", "on_broker", "on_cluster"]

APP = "tests.apps.notes:relay"

Broker = Literal["redis", "amqp"]
_DEFAULT = os.environ.get("RELAY_TEST_BROKER") or "redis"
T = TypeVar("T")

_BROKER: ContextVar[str] = ContextVar("broker", default=_DEFAULT)
_CLUSTER: ContextVar[Cluster | None] = ContextVar("cluster", default=None)


@contextmanager
def _within(var: ContextVar[T], value: T) -> Iterator[None]:
    """Set `var` to `value` for the block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def on_broker(broker: Broker) -> AbstractContextManager[None]:
    """Make `broker` the default of every `fleet(...)` made inside the block."""
    return _within(_BROKER, broker)


def on_cluster(cluster: Cluster) -> AbstractContextManager[None]:
    """Put the run state of every `fleet(...)` made inside the block on `cluster`."""
    return _within(_CLUSTER, cluster)


@dataclass
class Fleet:
    directory: Path
    redis: RedisServer
    model: ModelServer
    brain: Brain
    env: dict[str, str]
    relay: Relay
    processes: list[RelayProcess] = field(default_factory=list)
    broker: str = "redis"
    cluster: Cluster | None = None
    """The Redis Cluster holding the run state, if not the private Redis."""

    def worker(
        self, *extra: str, name: str = "", env: dict[str, str] | None = None, app: str = APP
    ) -> RelayProcess:
        """Start one more `relay worker` (all queues, unless `extra` says otherwise) of
        `app` (module:attribute)."""
        index = len(self.processes)
        hostname = name or f"w{index}"
        args = [
            "--app",
            app,
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

    def messages(self) -> dict[str, int]:
        """How many messages of each step task the workers received, from their logs."""
        lines = self.full_logs().splitlines()
        return {
            task: sum(1 for line in lines if f"Task {task}[" in line and "received" in line)
            for task in ("relay.advance", "relay.call_model", "relay.run_tool")
        }

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
    broker: Broker | None = None,
) -> Iterator[Fleet]:
    """Yield a Fleet with Redis and the model server up (start workers with `fleet.worker()`).

    `recovery` is RELAY_RECOVERY_SECONDS (None: Relay's default); `broker` is
    "redis" or "amqp" (None: the default, see `on_broker`).
    """
    brain = Brain()
    with ExitStack() as stack:
        redis_server = stack.enter_context(RedisServer(directory, appendonly=appendonly))
        model = stack.enter_context(ModelServer(brain))
        chosen = broker or _BROKER.get()
        if chosen not in ("redis", "amqp"):
            raise ValueError(f"unknown broker {chosen!r}: redis or amqp")
        broker_url = stack.enter_context(rabbit_vhost()) if chosen == "amqp" else None
        cluster = _CLUSTER.get()
        state = {"RELAY_REDIS_URL": redis_server.url}
        if cluster is not None:
            # A prefix of its own on the shared cluster: the fleet sees nothing of the others.
            state = {"RELAY_REDIS_URL": cluster.url, "RELAY_PREFIX": f"c{secrets.token_hex(4)}:"}
        env = {
            **state,
            **({"RELAY_BROKER_URL": broker_url} if broker_url else {}),
            "RELAY_MODEL_URL": model.url,
            "RELAY_TEST_DIR": str(directory),
            "RELAY_MODEL_TIMEOUT": "10",
            "RELAY_MODEL_RETRIES": "2",
            **({} if recovery is None else {"RELAY_RECOVERY_SECONDS": str(recovery)}),
            **(extra_env or {}),
        }
        settings = Settings.from_env(env)
        relay = build(settings, skills_dir=env.get("RELAY_TEST_SKILLS"))
        running = Fleet(
            directory, redis_server, model, brain, env, relay, broker=chosen, cluster=cluster
        )
        try:
            yield running
        finally:
            for process in running.processes:
                process.stop()
