"""5. Growth: does a turn cost more, and a snapshot weigh more, late in a long run?

One run of many turns, each tool output padded to `SIZE` characters so history
reaches `history_chars` (24,000 by default) after about a hundred turns. Per-turn
time is the gap between model calls around each sampled turn (from workers,
and from the runtime in this process with no Celery); snapshot and record
sizes are read from Redis when the model is called at that turn.
"""

from __future__ import annotations

import itertools
from typing import Any

from bench.context import Bench, median
from bench.inprocess import LocalModel, LocalRuntime, local_turn_ms
from bench.model import Task
from workers import Settings

__all__ = ["SIZE", "run"]

SIZE = 200
WINDOW = 5


def _snapshot_chars(b: Bench, run_id: str) -> int:
    """The agent's snapshot as stored: its head, start, loop counters and history entries
    (or, stored whole, the `snap` of runs saved before the history was kept apart)."""
    keys = b.relay.store.keys
    parts = ("snap", "head", "start", "lp")
    whole = sum(b.redis.hstrlen(keys.run(run_id), f) for f in parts)
    return whole + sum(len(e) for e in b.redis.lrange(keys.history(run_id), 0, -1))


def _sizes(b: Bench, run_id: str) -> dict[str, int]:
    keys = b.relay.store.keys
    return {
        "snapshot_chars": _snapshot_chars(b, run_id),
        "bytes_in_so_far": b.counters().bytes_in,
        "record_chars": sum(b.redis.hstrlen(keys.run(run_id), f) for f in ("meta", "fixed")),
        "run_hash_bytes": b.redis.memory_usage(keys.run(run_id), samples=0) or 0,
        "run_hash_fields": b.redis.hlen(keys.run(run_id)),
        "trace_entries": b.redis.llen(keys.trace(run_id)),
        "trace_bytes": b.redis.memory_usage(keys.trace(run_id), samples=0) or 0,
    }


def _around(gaps: list[float | None], turn: int) -> float:
    """The median turn near `turn` (gap i is turn i+1: model call i to model call i+1)."""
    near = gaps[max(0, turn - WINDOW) : turn + WINDOW]
    return median([g for g in near if g is not None])


def _workers(b: Bench, turns: int, samples: list[int]) -> dict[str, Any]:
    seen: dict[int, dict[str, int]] = {}
    box: list[str] = []

    def sample(marker: str, turn: int) -> None:
        if marker == "grow" and turn in samples and box and turn not in seen:
            seen[turn] = _sizes(b, box[0])

    with b.relay_worker("growth", "--concurrency", "2"):
        b.relay.wait(b.relay.start(Task("warm", turns=2).text()), timeout=60)
        b.brain.on_call = sample
        box.append(b.relay.start(Task("grow", turns=turns, size=SIZE).text()))
        b.brain.wait_for("grow", turns + 1, timeout=1_800)
        b.relay.wait(box[0], timeout=60)
        b.brain.on_call = None
    times = [t for t, _ in b.brain.arrivals["grow"]]
    # The gap after a sampled call carries the sampling's Redis reads: leave those out.
    gaps: list[float | None] = [
        None if i in samples else (later - earlier) * 1000
        for i, (earlier, later) in enumerate(itertools.pairwise(times))
    ]
    out: dict[str, Any] = {
        str(t): {"turn_ms": _around(gaps, t), **seen.get(t, {})} for t in samples
    }
    out["all_turns_median_ms"] = median([g for g in gaps if g is not None])
    # Bytes written to Redis per turn between samples (the samples' reads write little).
    for earlier, later in itertools.pairwise(sorted(seen)):
        written = seen[later]["bytes_in_so_far"] - seen[earlier]["bytes_in_so_far"]
        out[str(later)]["bytes_in_per_turn"] = round(written / (later - earlier))
    return out


def _in_process(b: Bench, turns: int, samples: list[int]) -> dict[str, float]:
    with LocalRuntime(Settings.from_env(b.env), LocalModel()) as local:
        gaps: list[float | None] = list(
            local_turn_ms(local, Task("grow-local", turns=turns, size=SIZE))
        )
    return {str(t): _around(gaps, t) for t in samples}


def run(b: Bench) -> dict[str, Any]:
    """Run one long run; return per-turn time and sizes at sampled turns."""
    turns = b.pick(500, 150)
    samples = [t for t in (10, 50, 100, 200, 300, 400, 500) if t <= turns]
    if turns not in samples:
        samples.append(turns)
    workers = _workers(b, turns, samples)
    local = _in_process(b, turns, samples)
    first, last = str(samples[0]), str(samples[-1])
    return {
        "turns": turns,
        "tool_output_chars": SIZE,
        "workers": workers,
        "in_process_turn_ms": local,
        "turn_ratio_last_over_first": workers[last]["turn_ms"] / workers[first]["turn_ms"],
        "snapshot_ratio_last_over_first": workers[last]["snapshot_chars"]
        / max(1, workers[first]["snapshot_chars"]),
        "in_process_ratio_last_over_first": local[last] / local[first],
    }
