"""11. Live runs: how soon a reader sees a streamed reply, and what streams cost in Redis.

Latency: one run at a time, its model streaming the final answer, 4 characters
an event, `GAP_MS` apart. The loopback model server (in this process) notes when
it writes the reply's first text event; the reader (`relay.stream`, in this
process too, blocking on Redis before the reply begins) notes when the first
"text" event reaches it. Both are `time.monotonic()`. The difference is the
path server → worker (httpx, the SSE parser, `on_text`) → Redis (STREAM) → the
reader's XREAD. Goal: under 20 ms.

Memory: `MEMORY USAGE` of a tree's live stream once a run streamed an answer of
400 and of 4,000 characters (a step, the text events, a done), its pieces
`GAP_MS` apart (a call's stream is written at most once every
`workers.runtime.streaming.WRITE_GAP_S`, what came meanwhile as one event) and all
at once; and the Redis
bytes per run of N runs parked at an approval after a streamed reply, with their
streams (they are kept STREAM_PARKED_S after a run parks) and once those are
gone (deleted here, as their expiry would).
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench, median, percentile
from bench.model import Task
from workers.store.layout import STREAM_PARKED_S

__all__ = ["GOAL_MS", "run"]

GOAL_MS = 20.0
GAP_MS = 5
WORKER_ARGS = ("--concurrency", "4", "--pool", "threads")


def _first_text_ms(b: Bench, index: int, answer: int) -> float:
    """Start one streaming run; return server's first text event → reader's first "text"."""
    served = len(b.model.first_events)
    run_id = b.relay.start(Task(f"live-{index}", answer=answer, gap_ms=GAP_MS).text())
    read_at = None
    for event in b.relay.stream(run_id, timeout=60):
        if event.kind == "text" and read_at is None:
            read_at = time.monotonic()
    if read_at is None:
        raise RuntimeError(f"run {run_id} streamed no text")
    return (read_at - b.model.first_events[served]) * 1000


def _stream_bytes(b: Bench, answer: int, gap_ms: int) -> dict[str, int]:
    task = Task(f"live-size-{answer}-{gap_ms}", answer=answer, gap_ms=gap_ms)
    run_id = b.relay.start(task.text())
    events = list(b.relay.stream(run_id, timeout=60))
    key = b.relay.store.keys.live(run_id)
    return {
        "answer_chars": answer,
        "gap_ms": gap_ms,
        "events": len(events),
        "memory_usage": int(b.redis.memory_usage(key, samples=0) or 0),
    }


def _parked(b: Bench, count: int) -> dict[str, Any]:
    """Park `count` runs after a streamed reply; bytes per run with and without streams."""
    keys = b.relay.store.keys
    b.settle()
    time.sleep(0.5)
    before = b.counters().used_memory
    runs = [b.relay.start(Task(f"live-park-{i}", park=1).text()) for i in range(count)]
    deadline = time.monotonic() + 600
    while b.redis.zcard(keys.index("").pending) < count:
        if time.monotonic() > deadline:
            raise TimeoutError("the runs did not all park")
        time.sleep(0.2)
    b.settle()
    time.sleep(0.5)
    with_streams = b.counters().used_memory
    ttl = int(b.redis.ttl(keys.live(runs[0])))
    streams = [keys.live(run_id) for run_id in runs]
    alive = sum(int(b.redis.exists(key)) for key in streams)
    b.redis.delete(*streams)
    time.sleep(0.5)
    without = b.counters().used_memory
    return {
        "runs": count,
        "streams_alive_after_parking": alive,
        "stream_ttl_s_after_parking": ttl,
        "bytes_per_run_with_stream": (with_streams - before) / count,
        "bytes_per_run_once_expired": (without - before) / count,
    }


def run(b: Bench) -> dict[str, Any]:
    """Measure first-text latency and the memory of streams (see the module docstring)."""
    samples, parked = b.pick(50, 15), b.pick(2_000, 300)
    workers = [b.relay_worker(f"live-{i}", *WORKER_ARGS) for i in range(2)]
    try:
        _first_text_ms(b, -1, 200)  # warm: connections, imports, scripts loaded
        waits = [_first_text_ms(b, i, 200) for i in range(samples)]
        sizes = [_stream_bytes(b, n, gap) for gap in (GAP_MS, 0) for n in (400, 4_000)]
        parking = _parked(b, parked)
    finally:
        for worker in workers:
            worker.stop()
    return {
        "first_text_ms": {
            "samples": len(waits),
            "median": median(waits),
            "p90": percentile(waits, 90),
            "max": max(waits),
        },
        "goal_ms": GOAL_MS,
        "gap_ms": GAP_MS,
        "stream_bytes": sizes,
        "parked": parking,
        "stream_parked_s": STREAM_PARKED_S,
    }
