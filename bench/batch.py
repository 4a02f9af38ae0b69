"""2. Batch: eight 200 ms tool calls in one reply run side by side; how close to 200 ms?

A run asks for several batches of 8 `wait(200 ms)` calls, one after another.
A batch's time is the gap between the model call that asked for it and the
next model call (which sees all eight results): 200 ms of tool time plus two
Celery hops (tool messages out, the next model call's message back) plus what
eight results arriving together cost (each records and advances the run; only
the last finds the batch complete; saves may lose compare-and-set races and
retry). Each `wait` notes when it ran, so the gap is split into: dispatch
(model call → first tool starts), stagger (first → last tool start), the
tools, and fan-in (last tool ends → next model call). The first batch of a
run is left out (the pool warms up).
"""

from __future__ import annotations

import itertools
from typing import Any

from bench.app import waits_key
from bench.context import Bench, median
from bench.model import Task
from bench.monitor import Monitor, Tally, tally

__all__ = ["run"]

CALLS = 8
TOOL_MS = 200
GOAL = 1.15


def _one_run(b: Bench, marker: str, batches: int) -> list[dict[str, float]]:
    """Run `batches` batches; return each batch's parts in ms (the first batch left out)."""
    run_id = b.relay.start(Task(marker, batches=batches, batch=CALLS, ms=TOOL_MS).text())
    b.brain.wait_for(marker, batches + 1, timeout=120)
    b.relay.wait(run_id, timeout=60)
    asked = [t for t, _ in b.brain.arrivals[marker]]
    notes = [line.decode().split() for line in b.redis.lrange(waits_key(run_id), 0, -1)]
    ran = {int(i): (float(start), float(end)) for i, start, end in notes}
    parts = []
    for k, (began, next_call) in enumerate(itertools.pairwise(asked)):
        calls = [ran[i] for i in range(k * CALLS, (k + 1) * CALLS)]
        starts, ends = [s for s, _ in calls], [e for _, e in calls]
        parts.append(
            {
                "total": (next_call - began) * 1000,
                "dispatch": (min(starts) - began) * 1000,
                "stagger": (max(starts) - min(starts)) * 1000,
                "tools": median([e - s for s, e in calls]) * 1000,
                "fan_in": (next_call - max(ends)) * 1000,
            }
        )
    return parts[1:]


def _counted(b: Bench, batches: int) -> Tally:
    path = b.directory / f"monitor-batch-{batches}.txt"
    with Monitor(b.redis_server.port, path):
        _one_run(b, f"batch-counted-{batches}", batches)
    return tally(path)


def run(b: Bench) -> dict[str, Any]:
    """Measure batches of 8 x 200 ms tools; return the figures."""
    batches, runs = b.pick(6, 4), b.pick(3, 2)
    parts: list[dict[str, float]] = []
    with b.relay_worker("batch", "--concurrency", str(CALLS + 2)):
        _one_run(b, "batch-warm", 2)
        for r in range(runs):
            parts += _one_run(b, f"batch-{r}", batches)
        per_batch = _counted(b, 3).minus(_counted(b, 1))
    hop = b.results.get("turns", {}).get("timing", {}).get("bare_hop_ms_one_chain")
    wall = median([p["total"] for p in parts])
    return {
        "calls": CALLS,
        "tool_ms": TOOL_MS,
        "batch_ms_median": wall,
        "parts_ms_median": {k: median([p[k] for p in parts]) for k in parts[0]},
        "batch_ms_all": [round(p["total"], 1) for p in parts],
        "ratio": wall / TOOL_MS,
        "hop_ms": hop,
        "goal": GOAL,
        "goal_with_one_hop": None if hop is None else GOAL + hop / TOOL_MS,
        "per_batch": {
            "saves": per_batch.commands.get("store: EVALSHA SAVE", 0) / 2,
            "lost_saves": per_batch.lost_saves / 2,
            "messages": {k: v / 2 for k, v in per_batch.messages.items() if v},
            "commands": sum(v for k, v in per_batch.commands.items() if not k.startswith("driver"))
            / 2,
            "commands_in_lua": sum(per_batch.inner.values()) / 2,
        },
    }
