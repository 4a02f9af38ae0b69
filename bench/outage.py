"""8. Redis outage: how soon after Redis returns do runs whose calls finished meanwhile move on?

A private Redis with AOF (`appendfsync always`), one `relay worker`, and runs
each in the middle of a 2 s `wait` call. Redis is killed, stays down 4 s (every
call finishes while it is away, and its worker holds the outcome), and is
started again. For each run the clock runs from the restart to the model call
that sees the call's result. Goal: within one tick interval (5 s): the workers
that hold outcomes save them as soon as Redis answers, without waiting for the
tick.
"""

from __future__ import annotations

import time
from typing import Any

from bench.app import build
from bench.cluster import relay_worker
from bench.context import Bench, median
from bench.model import Task
from tests.support.redis_server import RedisServer
from workers import Settings

__all__ = ["run"]

DOWN_S = 4.0
TOOL_MS = 2_000
GOAL_S = 5.0


def run(b: Bench) -> dict[str, Any]:
    runs = b.pick(8, 4)
    directory = b.directory / "outage"
    directory.mkdir(exist_ok=True)
    with RedisServer(directory, appendonly=True) as server:
        env = {**b.env, "RELAY_REDIS_URL": server.url, "RELAY_RECOVERY_SECONDS": "15"}
        relay = build(Settings.from_env(env))
        worker = relay_worker(
            env, directory / "worker.log", "outage", "--pool", "threads", "-c", str(2 * runs)
        )
        worker.start()
        try:
            markers = [f"outage-{k}" for k in range(runs)]
            started = [relay.start(Task(m, batches=1, batch=1, ms=TOOL_MS).text()) for m in markers]
            leases = [f"relay:lease:{run_id}:call-1" for run_id in started]
            client = server.client()
            deadline = time.monotonic() + 60
            while client.exists(*leases) < runs:  # every call under way
                if time.monotonic() > deadline:
                    raise TimeoutError("outage: the calls did not start")
                time.sleep(0.01)
            client.close()
            server.kill()
            time.sleep(DOWN_S)
            server.start()
            back = time.monotonic()
            moved = [b.brain.wait_for(m, 2, timeout=120) - back for m in markers]
        finally:
            worker.stop()
    held = worker.output().count("holding the outcome of")
    return {
        "runs": runs,
        "down_s": DOWN_S,
        "held": held,
        "moved_s": [round(s, 2) for s in moved],
        "median_s": median(moved),
        "max_s": max(moved),
        "goal_s": GOAL_S,
    }
