"""Bytes a turn writes to Redis, against the length of the run's task.

`python -m bench.stored_bytes [--turns 20]` (or item "15 stored" of `bench.run`): runs
in process (`bench.inprocess`, no Celery, the model a function call) on a private
Redis, one run per task length
(the bench task, then padded with 2,000 and 8,000 characters of context), and
prints the bytes Redis received per turn (`INFO stats` total_net_input_bytes,
the difference of a run of `turns` turns and one of half as many, per turn).
Nothing else talks to that Redis meanwhile but the run's own flushes. Not a
test, not in CI.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.context import Bench
from bench.inprocess import LocalModel, LocalRuntime
from bench.model import Task
from workers import Settings

PADDINGS = (0, 2_000, 8_000)


def _bytes_for(local: LocalRuntime, turns: int, padding: int, name: str) -> int:
    redis = local.relay.store.redis
    before = int(redis.info("stats")["total_net_input_bytes"])
    padded = "\n" + "Background: the quarterly report follows. " * (padding // 42)
    local.start(Task(name, turns=turns), padded)
    local.drain()
    return int(redis.info("stats")["total_net_input_bytes"]) - before


def measure(turns: int) -> dict[str, int]:
    from tests.support.redis_server import RedisServer  # noqa: PLC0415 - a bench-only import

    with tempfile.TemporaryDirectory() as work, RedisServer(Path(work)) as server:
        settings = Settings.from_env({"RELAY_REDIS_URL": server.url})
        with LocalRuntime(settings, LocalModel()) as local:
            _bytes_for(local, 3, 0, "warm")
            found = {}
            for padding in PADDINGS:
                long = _bytes_for(local, turns, padding, f"long-{padding}")
                short = _bytes_for(local, turns // 2, padding, f"short-{padding}")
                found[f"task +{padding:,} chars"] = round((long - short) / (turns - turns // 2))
            return found


def run(b: Bench) -> dict[str, Any]:
    """`bench.run`'s item: the same measure, on a Redis of its own (none of the bench's)."""
    found: dict[str, Any] = {"turns": b.pick(20, 10)}
    found["bytes_per_turn"] = measure(found["turns"])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stored_bytes", description=__doc__)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args(argv)
    found = measure(args.turns)
    for name, value in found.items():
        print(f"{name:>20}: {value:>8,} bytes a turn")
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/stored_bytes.json").write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
