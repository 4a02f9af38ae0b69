"""What a tick reads on Redis Cluster, and schedules in one slot vs a shard per slot.

`python -m bench.cluster_tick [--counts 0,100,1000,16384]`: on a private
three-master cluster (one replica each, loopback), for each N:
- N slots with index shards in use (one outbox entry each, none due): the tick's
  reads of the indexes (expired approvals, deadlines, pruning a window, the
  outbox), as `Runtime.heal` makes them;
- N schedules, none due, stored both ways side by side: all in the one slot
  `{schedules}` (how Relay kept them before), and sharded, each in the shard of
  its name's slot (names picked so each lands in a slot of its own): the tick's
  schedule reads (the due index, the unconfirmed firing slots), their ratio, and
  the share of the schedules the busiest master holds.
Times are the best of five, from the client. Everything is started and stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from agent_core import Every, Recipe
from scheduler import Schedule, ScheduleStore
from tests.support.redis_cluster import Cluster
from workers.store.runs import RunStore
from workers.store.schedule_shards import ClusterSchedules

__all__ = ["main"]

T0 = 1_700_000_000_000
RECIPE = Recipe("check", "Check {thing}.").param("thing")


def _names(count: int) -> list[str]:
    """`count` schedule names, each hashing to a slot none of the others has."""
    names, slots, number = [], set[int](), 0
    while len(names) < count:
        name = f"sched{number}"
        number += 1
        if key_slot(name.encode()) not in slots:
            slots.add(key_slot(name.encode()))
            names.append(name)
    return names


def _best_ms(read: Callable[[], object]) -> float:
    """The best of five, in ms."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _schedule_reads(store: ScheduleStore) -> None:
    assert store.due(T0) == []
    assert store.stale_firings(T0) == []


def _index_reads(store: RunStore) -> None:
    assert store.people.expired_pending(T0) == []
    assert store.upkeep.deadlines_due(T0) == []
    store.upkeep.prune_runs(0)
    assert store.upkeep.due_messages(T0) == []


def _fill_index_shards(store: RunStore, count: int) -> None:
    """`count` slots listed, each shard's outbox with one entry due long after T0."""
    pipe = store.redis.pipeline(transaction=False)
    for slot in range(count):
        store.shards.slots.add(slot)
        pipe.zadd(store.keys.shard(slot).outbox, {f"a|r{slot}": 2 * T0})
    pipe.execute()


def _busiest_share(cluster: Cluster, pattern: str) -> float:
    """The share of the keys matching `pattern` on the master holding most of them."""
    counts = []
    for node in cluster.nodes:
        client = node.client()
        try:
            if client.execute_command("ROLE")[0] in (b"master", "master"):
                counts.append(sum(1 for _ in client.scan_iter(match=pattern, count=1_000)))
        finally:
            client.close()
    return max(counts) / sum(counts) if sum(counts) else 0.0


def _measure(cluster: Cluster, count: int) -> dict[str, Any]:
    run_store = RunStore(cluster.url, f"n{count}:", cluster=True)
    one_slot = ScheduleStore(run_store.redis, f"n{count}:{{schedules}}")
    sharded = ScheduleStore(
        run_store.redis, f"n{count}:", ClusterSchedules(run_store.connection, run_store.shards)
    )
    for name in _names(count):
        made = Schedule.create(name, RECIPE, {"thing": name}, Every(60), now_ms=T0)
        one_slot.put(made)
        sharded.put(made)
    one_ms = _best_ms(lambda: _schedule_reads(one_slot))
    sharded_ms = _best_ms(lambda: _schedule_reads(sharded))
    _fill_index_shards(run_store, count)
    index_ms = _best_ms(lambda: _index_reads(run_store))
    run_store.redis.close()
    return {
        "slots": count,
        "index reads (ms)": round(index_ms, 2),
        "schedule reads, one slot (ms)": round(one_ms, 2),
        "schedule reads, sharded (ms)": round(sharded_ms, 2),
        "schedule reads, sharded / one slot": round(sharded_ms / one_ms, 2),
        "busiest master's share of the schedules, one slot": 1.0 if count else 0.0,
        "busiest master's share of the schedules, sharded": round(
            _busiest_share(cluster, f"n{count}:schedules{{*"), 2
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_tick", description=__doc__)
    parser.add_argument("--counts", default="0,100,1000,16384")
    args = parser.parse_args(argv)
    counts = [int(count) for count in args.counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="cluster-tick-") as work:
        cluster = Cluster(Path(work)).start()
        try:
            results = [_measure(cluster, count) for count in counts]
        finally:
            cluster.stop()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
