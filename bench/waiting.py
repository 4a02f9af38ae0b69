"""4. Waiting: many runs parked on an approval cost Redis memory only, no worker.

Runs are started with `Relay.start`; workers take each to its first model call,
whose reply asks for `approve_me` (a WRITE tool, so the default policy asks a
person) and the run parks. Then: Redis memory per parked run (the growth of
`used_memory` ÷ N, and `MEMORY USAGE` of one run's keys), worker slots held
(messages unacknowledged or running: 0 is the goal), and the latency from
`approve()` to the next model call of that run. One run is also parked after
many turns, to show its bytes stay bounded by `history_chars`.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench, median, percentile
from bench.model import Task

__all__ = ["GOAL_BYTES", "park", "run"]

GOAL_BYTES = 4 * 1024
WORKER_ARGS = ("--concurrency", "4")


def park(b: Bench, count: int, prefix: str = "park") -> dict[str, str]:
    """Start `count` runs that park at their first approval; return run id -> marker."""
    markers = {}
    waiting = b.redis.zcard(b.relay.store.keys.index("").pending)
    for i in range(count):
        marker = f"{prefix}-{i}"
        markers[b.relay.start(Task(marker, park=1).text())] = marker
    deadline = time.monotonic() + 1_800
    while b.redis.zcard(b.relay.store.keys.index("").pending) < waiting + count:
        if time.monotonic() > deadline:
            raise TimeoutError("the runs did not all park")
        time.sleep(0.2)
    b.settle()
    return markers


def _keys_of(b: Bench, run_id: str) -> dict[str, Any]:
    keys = b.relay.store.keys
    member = next(iter(b.relay.status(run_id).pending)).call_id
    sizes = {
        "run hash": b.redis.memory_usage(keys.run(run_id), samples=0) or 0,
        "inbox stream": b.redis.memory_usage(keys.inbox(run_id), samples=0) or 0,
        "trace list": b.redis.memory_usage(keys.trace(run_id), samples=0) or 0,
        "history list": b.redis.memory_usage(keys.history(run_id), samples=0) or 0,
        "journal list": b.redis.memory_usage(keys.journal(run_id), samples=0) or 0,
        "live stream": b.redis.memory_usage(keys.live(run_id), samples=0) or 0,
    }
    pending = b.redis.hstrlen(keys.index(run_id).pending_data, f"{run_id}|call|{member}")
    return {
        "memory_usage": sizes,
        "memory_usage_total": sum(sizes.values()),
        "snapshot_chars": b.redis.hstrlen(keys.run(run_id), "snap")
        + b.redis.hstrlen(keys.run(run_id), "head")
        + sum(len(e) for e in b.redis.lrange(keys.history(run_id), 0, -1)),
        "record_chars": b.redis.hstrlen(keys.run(run_id), "meta"),
        "pending_entry_chars": pending,
        "trace_entries": b.redis.llen(keys.trace(run_id)),
        "run_hash_fields": b.redis.hlen(keys.run(run_id)),
    }


def _drop_streams(b: Bench, markers: dict[str, str]) -> None:
    """Delete the parked runs' live streams, as their expiry will."""
    keys = [b.relay.store.keys.live(run_id) for run_id in markers]
    for start in range(0, len(keys), 1_000):
        b.redis.delete(*keys[start : start + 1_000])


def _slots_held(b: Bench) -> dict[str, int]:
    active = b.relay.celery.control.inspect(timeout=2).active() or {}
    return {
        "tasks_running": sum(len(tasks) for tasks in active.values()),
        "messages_in_flight": b.in_flight(),
    }


def _approve(b: Bench, markers: dict[str, str], count: int) -> list[float]:
    """Approve `count` parked runs one at a time; return each approve → model call in ms."""
    waits = []
    for pending in b.relay.store.people.pending(limit=count):
        assert pending.call_id is not None
        marker = markers[pending.run_id]
        began = time.monotonic()
        b.relay.approve(pending.run_id, pending.call_id)
        arrived = b.brain.wait_for(marker, 2, timeout=60)
        waits.append((arrived - began) * 1000)
    return waits


def _long_run(b: Bench, turns: int, size: int = 200) -> dict[str, Any]:
    run_id = b.relay.start(Task(f"park-long-{turns}", turns=turns, size=size, park=1).text())
    deadline = time.monotonic() + 600
    while b.relay.status(run_id).state != "waiting":
        if time.monotonic() > deadline:
            raise TimeoutError("the long run did not park")
        time.sleep(0.2)
    return {"turns": turns, "tool_output_chars": size, **_keys_of(b, run_id)}


def run(b: Bench) -> dict[str, Any]:
    """Park many runs; measure their memory, the workers they hold, and approval latency."""
    count, sample, long_turns = b.pick(10_000, 1_000), b.pick(300, 100), b.pick(300, 120)
    workers = [b.relay_worker(f"waiting-{i}", *WORKER_ARGS) for i in range(2)]
    try:
        b.relay.wait(b.relay.start(Task("warm", turns=1).text()), timeout=60)
        b.settle()
        time.sleep(0.5)
        before = b.counters().used_memory
        started = time.monotonic()
        markers = park(b, count)
        parked_s = time.monotonic() - started
        time.sleep(0.5)
        with_streams = b.counters().used_memory
        one = _keys_of(b, next(iter(markers)))
        # Each run's model streamed the reply it parked on: its tree's live stream is kept
        # STREAM_PARKED_S more, then expires. What stays is measured once they are gone.
        _drop_streams(b, markers)
        time.sleep(0.5)
        after = b.counters().used_memory
        slots = _slots_held(b)
        waits = _approve(b, markers, sample)
        four = _long_run(b, 4, 0)
        long_run = _long_run(b, long_turns)
    finally:
        for worker in workers:
            worker.stop()
    per_run = (after - before) / count
    return {
        "runs": count,
        "seconds_to_park_all": parked_s,
        "bytes_per_run": per_run,
        "bytes_per_run_streams_kept": (with_streams - before) / count,
        "goal_bytes": GOAL_BYTES,
        "one_run": one,
        "slots_held": slots,
        "approve_to_model_ms": {
            "samples": len(waits),
            "median": median(waits),
            "p99": percentile(waits, 99),
            "max": max(waits),
        },
        "after_four_turns": four,
        "long_run": long_run,
    }
