"""One Redis or a Redis Cluster for run state: steps per second and Redis time per step.

`python -m bench.scaleout [--runs N]`: the same batch of runs (model → tool →
model → tool → model, a 50 ms model), on the same two `relay worker` processes
(threads, 32 each) and the same broker (a vhost of its own on the machine's
RabbitMQ), once with the runs on one private Redis and once on a private
three-master cluster (one replica each). Reported: steps per second, the Redis
server time per step (INFO commandstats, summed over the masters), how that time
spreads over the masters, and, on paper, how many active agents each layout holds
at a 3 s model latency. Everything here is started and stopped by pid on loopback.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import redis

from bench.app import build
from bench.cluster import Counters, relay_worker
from bench.model import Brain, Task
from tests.support.model_server import ModelServer
from tests.support.rabbitmq import rabbit_vhost
from tests.support.redis_cluster import Cluster
from tests.support.redis_server import RedisServer
from workers import Settings

__all__ = ["main"]

STEPS = 5
MODEL_MS = 50
MODEL_S_ON_PAPER = 3.0
"""The model latency the capacity on paper is worked out for."""
BUSY = 0.7
"""The share of a Redis core a layout may spend before queues grow (on paper)."""


@contextmanager
def _state(layout: str, directory: Path) -> Iterator[tuple[str, list[redis.Redis]]]:
    """The run-state URL of `layout`, and a client of each node that does the work."""
    if layout == "redis":
        with RedisServer(directory) as server:
            yield server.url, [server.client()]
        return
    cluster = Cluster(directory).start()
    try:
        clients = [node.client() for node in cluster.nodes]
        yield cluster.url, [c for c in clients if c.info("replication")["role"] == "master"]
    finally:
        cluster.stop()


def _measure(layout: str, runs: int, directory: Path) -> dict[str, Any]:
    brain = Brain()
    with ExitStack() as stack:
        url, nodes = stack.enter_context(_state(layout, directory))
        model = stack.enter_context(ModelServer(brain))
        broker = stack.enter_context(rabbit_vhost())
        env = {"RELAY_REDIS_URL": url, "RELAY_BROKER_URL": broker, "RELAY_MODEL_URL": model.url}
        env["RELAY_PREFIX"] = "scaleout:"
        relay = build(Settings.from_env(env))
        for n in range(2):
            worker = relay_worker(env, directory / f"{layout}-w{n}.log", f"{layout}{n}")
            stack.enter_context(worker.start())  # stopped (by its process group) on exit
        warm = f"{layout}-warm"
        relay.start(Task(warm, turns=2, delay_ms=MODEL_MS).text())
        brain.wait_for(warm, 3, timeout=120)
        before = [Counters.read(node) for node in nodes]
        started = time.monotonic()
        markers = [f"{layout}-{i}" for i in range(runs)]
        for marker in markers:
            relay.start(Task(marker, turns=2, delay_ms=MODEL_MS).text())
        wall = max(brain.wait_for(marker, 3, timeout=900) for marker in markers) - started
        time.sleep(1)  # the last saves land
        spent = [Counters.read(node).since(b) for node, b in zip(nodes, before, strict=True)]
    steps = runs * STEPS
    usec = [s.total_usec for s in spent]
    per_step_ms = sum(usec) / steps / 1000
    busiest_ms = max(usec) / steps / 1000
    steps_per_core_s = 1000 / busiest_ms * BUSY / len(nodes) if busiest_ms else 0.0
    # An agent steps once per model reply (and once per tool call, which is quick):
    # about two steps per MODEL_S_ON_PAPER seconds.
    agents = steps_per_core_s * len(nodes) * MODEL_S_ON_PAPER / 2
    return {
        "layout": layout,
        "runs": runs,
        "steps_per_s": round(steps / wall, 1),
        "redis_ms_per_step": round(per_step_ms, 3),
        "share_per_node": [round(u / max(sum(usec), 1), 2) for u in usec],
        "commands_per_step": round(sum(s.total_calls for s in spent) / steps, 1),
        "active_agents_on_paper": int(agents),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="scaleout-") as work:
        for layout in ("redis", "cluster"):
            directory = Path(work) / layout
            directory.mkdir()
            print(f"-- {layout} ...", file=sys.stderr, flush=True)
            results.append(_measure(layout, args.runs, directory))
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
