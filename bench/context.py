"""What every benchmark shares: one private Redis, one loopback model server, a client Relay.

`Bench` starts them, names the files, starts workers against them and clears
Redis between benchmarks (with no worker running), so each one starts clean.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import bare
from bench.app import build
from bench.cluster import Counters, Worker, bare_worker, relay_worker
from bench.model import Brain
from tests.support.model_server import ModelServer
from tests.support.redis_server import RedisServer
from workers import Relay, Settings

__all__ = ["BARE_QUEUES", "Bench", "bench", "median", "percentile"]

BARE_QUEUES = ("bare", "bare-quiet")
"""Queues of bare workers: with task events, and without."""


@dataclass
class Bench:
    quick: bool
    directory: Path
    redis_server: RedisServer
    model: ModelServer
    brain: Brain
    env: dict[str, str]
    relay: Relay
    redis: Any
    """A plain redis-py client on the private server (typed Any: redis-py's unions say little)."""
    results: dict[str, Any] = field(default_factory=dict)
    """Each benchmark's figures by its name, for the ones that come after it."""

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def relay_worker(self, name: str, *args: str) -> Worker:
        return relay_worker(self.env, self.directory / f"{name}.log", name, *args).start()

    def bare_worker(
        self, name: str, *args: str, events: bool = True, queue: str = "bare"
    ) -> Worker:
        """Start a bare Celery worker consuming `queue` (task events on or off)."""
        env = {**self.env, "BENCH_EVENTS": "1" if events else "0", "BENCH_QUEUE": queue}
        return bare_worker(env, self.directory / f"{name}.log", name, "-Q", queue, *args).start()

    def chains(self, count: int, hops: int, prefix: str, *, queue: str = "bare") -> list[float]:
        """Run `count` bare chains of `hops` no-op tasks at once; return each one's ms per hop."""
        app = bare.build_app(self.redis_server.url, events=True, queue=queue)
        starts = {}
        for i in range(count):
            chain = f"{prefix}-{i}"
            starts[chain] = time.monotonic()
            bare.send_hop(app, chain, hops - 1)
        per_hop = []
        for _ in range(count):
            popped = self.redis.blpop([bare.done_key(queue)], timeout=600)
            if popped is None:
                raise TimeoutError("a bare chain did not finish")
            chain, end = popped[1].decode().split()
            per_hop.append((float(end) - starts[chain]) * 1000 / hops)
        app.close()
        return per_hop

    def clear(self) -> None:
        """Empty Redis (call it with no worker running) and forget the model's calls."""
        self.redis.flushall()
        self.brain.reset()
        self.brain.on_call = None

    def counters(self) -> Counters:
        return Counters.read(self.redis)

    def background(self, seconds: float = 2.0) -> Counters:
        """Return what idle workers do to Redis in `seconds` (polls, heartbeats)."""
        before = self.counters()
        time.sleep(seconds)
        return self.counters().since(before)

    def settle(self, timeout: float = 120) -> None:
        """Wait until no message is queued or held unacknowledged by a worker."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.in_flight() == 0:
                return
            time.sleep(0.05)
        raise TimeoutError("messages are still in flight")

    def in_flight(self) -> int:
        queues = [*self.relay.queues.all(), *BARE_QUEUES]
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.llen(queue)
        pipe.hlen("unacked")
        return int(sum(pipe.execute()))


@contextmanager
def bench(directory: Path, *, quick: bool) -> Iterator[Bench]:
    """Yield a `Bench` with Redis and the model server up; both stop when the block ends."""
    brain = Brain()
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer(directory))
        model = stack.enter_context(ModelServer(brain))
        env = {
            "RELAY_REDIS_URL": server.url,
            "RELAY_MODEL_URL": model.url,
            "BENCH_BROKER_URL": server.url,
        }
        client = redis.Redis.from_url(server.url)
        stack.callback(client.close)
        relay = build(Settings.from_env(env))
        yield Bench(quick, directory, server, model, brain, env, relay, client)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]
