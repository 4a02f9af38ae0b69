"""What the tick costs with many schedules: `python -m bench.schedule_tick [--count 10000]`.

On a private Redis and on a private three-master Redis Cluster (loopback), side by side:
`count` daily 09:00 schedules in Europe/Berlin with a 30-minute jitter are stored, then
- a tick with none of them due (what every tick pays all day): the best and the worst
  of twenty, in ms;
- the ticks of 09:00 to 09:30, one a minute: how many firings each minute takes (the
  jitter's spread: the busiest minute against an even share), and the worst tick;
- the same firings with every schedule due at once, under the default overlap policy
  (skip: each firing asks which of the schedule's runs still go) and under allow_all
  (no such read), the ticks it takes (a tick fires at most READ_MAX) and the seconds per
  thousand firings, and their ratio: what the overlap policy costs.
The host starts nothing (it records run ids): this measures the scheduler and Redis,
not the runs. Everything it starts it stops, by pid.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_core import Daily, Recipe
from scheduler import Schedule, ScheduleStore, tick
from scheduler.store import READ_MAX
from tests.support.redis_cluster import Cluster
from tests.support.redis_server import RedisServer
from workers.store.runs import RunStore

__all__ = ["main"]

NINE = 1_800_000_000_000  # 2027-01-15T09:00:00+01:00 (08:00 UTC), a Friday
MINUTE = 60_000
RECIPE = Recipe("check", "Check {thing}.").param("thing")


@dataclass
class CountingHost:
    """A TickHost that starts nothing: it counts the runs the tick asks for."""

    schedule_store: ScheduleStore
    started: list[str] = field(default_factory=list)

    def schedule_notes(self, name: str) -> list[str]:
        del name
        return []

    def start(self, task: str, context: str = "", **given: Any) -> str:
        del task, context
        self.started.append(str(given["run_id"]))
        return str(given["run_id"])

    def run_states(self, run_ids: Sequence[str]) -> list[str | None]:
        return ["finished"] * len(run_ids)

    def cancel(self, run_id: str, reason: str = "") -> bool:
        del run_id, reason
        return False

    def heal(self, now: int) -> int:
        del now
        return 0


def _fill(store: ScheduleStore, count: int, **options: Any) -> None:
    made_at = NINE - 12 * 60 * MINUTE
    trigger = Daily(9, 0, tz="Europe/Berlin")
    for number in range(count):
        name = f"daily-{number}"
        store.put(
            Schedule.create(name, RECIPE, {"thing": name}, trigger, now_ms=made_at, **options)
        )


def _idle_ms(host: CountingHost) -> tuple[float, float]:
    times = []
    for index in range(20):
        began = time.perf_counter()
        tick(host, NINE - 60 * MINUTE + index * 1_000)
        times.append(time.perf_counter() - began)
    assert host.started == []
    return min(times) * 1000, max(times) * 1000


def _spread(host: CountingHost, count: int) -> dict[str, Any]:
    per_minute, worst = [], 0.0
    for minute in range(31):
        before = len(host.started)
        began = time.perf_counter()
        tick(host, NINE + minute * MINUTE)
        worst = max(worst, time.perf_counter() - began)
        per_minute.append(len(host.started) - before)
    while len(host.started) < count:  # any minute above READ_MAX finishes here
        tick(host, NINE + 31 * MINUTE)
    return {
        "firings": len(host.started),
        "busiest minute": max(per_minute),
        "even share a minute": round(count / 30),
        "worst tick (ms)": round(worst * 1000, 1),
    }


def _burst(store: ScheduleStore, count: int) -> tuple[int, float]:
    host = CountingHost(store)
    ticks, began = 0, time.perf_counter()
    while len(host.started) < count:
        tick(host, NINE + 10 * MINUTE + ticks)
        ticks += 1
    return ticks, (time.perf_counter() - began) / count * 1000


def _measure(store_for: Callable[[str], ScheduleStore], count: int) -> dict[str, Any]:
    jittered = store_for("j:")
    _fill(jittered, count, jitter_ms=30 * MINUTE)
    best, worst = _idle_ms(CountingHost(jittered))
    found: dict[str, Any] = {
        "idle tick, best (ms)": round(best, 2),
        "idle tick, worst (ms)": round(worst, 2),
    }
    found.update(_spread(CountingHost(jittered), count))
    skip, allow = store_for("s:"), store_for("a:")
    _fill(skip, count)
    _fill(allow, count, overlap="allow_all")
    skip_ticks, skip_ms = _burst(skip, count)
    _, allow_ms = _burst(allow, count)
    found.update(
        {
            "all due at once: ticks": skip_ticks,
            "s per 1,000 firings, skip": round(skip_ms, 2),
            "s per 1,000 firings, allow_all": round(allow_ms, 2),
            "skip / allow_all": round(skip_ms / allow_ms, 2),
        }
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.schedule_tick", description=__doc__)
    parser.add_argument("--count", type=int, default=10_000)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"schedules": args.count, "read max a tick": READ_MAX}
    with tempfile.TemporaryDirectory(prefix="schedule-tick-") as work, ExitStack() as stack:
        server = stack.enter_context(RedisServer(Path(work)))
        single = server.client()
        results["one Redis"] = _measure(lambda p: ScheduleStore(single, p), args.count)
        (Path(work) / "cluster").mkdir()
        cluster = Cluster(Path(work) / "cluster").start()
        stack.callback(cluster.stop)
        stores: list[RunStore] = []

        def on_cluster(prefix: str) -> ScheduleStore:
            stores.append(RunStore(cluster.url, prefix, cluster=True))
            return stores[-1].schedules

        results["Redis Cluster"] = _measure(on_cluster, args.count)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
