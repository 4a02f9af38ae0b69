"""8. Redis outage longer than the recovery time: is any finished call's outcome lost or
its call made again, and how soon after Redis returns do the runs move on?

A private Redis with AOF (`appendfsync always`) holds the run state; the broker is
the bench's own Redis, which stays up (so the workers take at once whatever a tick
sends, the worst case for a held outcome). Two `relay worker`s, RELAY_RECOVERY_SECONDS
15, and runs each in the middle of a 2 s `wait` call. Redis is killed, stays down
60 s (20 s with --quick: either way past the recovery time, so every lease lapses),
and is started again. Every call finishes while it is away (the `wait` tool's own
note to Redis fails then: its outcome is an error, held like any other).

Counted: outcomes held, saved and given up (the workers' logs), results reported
"unknown" (the traces), calls made again (a run's attempt count past 1) and model
calls made again (the model server's). Goal: none lost, none unknown, none again;
and, from the restart to the model call that sees each call's result, within one
tick interval (5 s): the holders save as soon as Redis answers, before any tick.

`python -m bench.outage [--quick]` runs it alone (it is also part of `bench.run`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.app import build
from bench.cluster import relay_worker
from bench.context import Bench, bench, median
from bench.model import Task
from tests.support.redis_server import RedisServer
from workers import Settings

__all__ = ["run"]

TOOL_MS = 2_000
GOAL_S = 5.0


def run(b: Bench) -> dict[str, Any]:
    runs = b.pick(8, 4)
    down_s = b.pick(60, 20)
    directory = b.directory / "outage"
    directory.mkdir(exist_ok=True)
    with RedisServer(directory, appendonly=True) as server:
        env = {
            **b.env,
            "RELAY_REDIS_URL": server.url,
            "RELAY_BROKER_URL": b.redis_server.url,
            "RELAY_RECOVERY_SECONDS": "15",
        }
        relay = build(Settings.from_env(env))
        workers = [
            relay_worker(
                env,
                directory / f"worker-{n}.log",
                f"outage-{n}",
                "--pool",
                "threads",
                "-c",
                str(runs),
            )
            for n in range(2)
        ]
        for worker in workers:
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
            time.sleep(down_s)
            server.start()
            back = time.monotonic()
            moved = [b.brain.wait_for(m, 2, timeout=120) - back for m in markers]
            for run_id in started:
                relay.wait(run_id, timeout=120)
            client = server.client()
            attempts = [int(client.hget(relay.store.keys.run(r), "a:call-1") or 0) for r in started]
            client.close()
            results = [e.status for r in started for e in relay.trace(r) if e.kind == "result"]
        finally:
            for worker in workers:
                worker.stop()
    logs = "".join(worker.output() for worker in workers)
    return {
        "runs": runs,
        "down_s": down_s,
        "held": logs.count("holding the outcome of"),
        "saved": logs.count("saved the held outcome of"),
        "lost": logs.count("gave up saving the outcome of"),
        "unknown": results.count("unknown"),
        "calls_again": sum(1 for a in attempts if a > 1),
        "model_calls_again": sum(max(0, len(b.brain.arrivals[m]) - 2) for m in markers),
        "moved_s": [round(s, 2) for s in moved],
        "median_s": median(moved),
        "max_s": max(moved),
        "goal_s": GOAL_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.outage", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="4 runs, 20 s down")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, bench(Path(work), quick=args.quick) as b:
        r = run(b)
    print(f"{r['runs']} calls finished while Redis was down {r['down_s']} s")
    print(f"  outcomes held {r['held']}, saved {r['saved']}, lost {r['lost']}")
    print(f"  reported unknown {r['unknown']}, calls made again {r['calls_again']},")
    print(f"  model calls made again {r['model_calls_again']}")
    print(
        f"  runs moved on after Redis was back: median {r['median_s']:.2f} s,"
        f" max {r['max_s']:.2f} s"
    )
    bad = r["lost"] + r["unknown"] + r["calls_again"] + r["model_calls_again"]
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
