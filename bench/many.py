"""3. Many runs: 1,000 runs at once, 5 steps each, a 50 ms model, two worker processes.

A step is one model call or one tool call (each is one Celery task); a run is
model → tool → model → tool → model (final), plus the `advance` that starts
it. Steps per second over the whole batch are set beside bare Celery no-op
tasks per second on the same two workers, in chains of five as long as the
runs, measured just before and just after the Relay runs (the mean of the two
is used, so drift on a shared machine hits both sides alike). Both are
measured for each pool setting in `POOLS`, with the latency of one hop on
the same pool when nothing else runs, and the CPU the workers used (all their
processes, from /proc) per Relay step and per bare task: a figure that moves less
than the rates when the machine is shared.
"""

from __future__ import annotations

import time
from typing import Any

from bench.cluster import Worker
from bench.context import Bench, median
from bench.model import Task

__all__ = ["run"]

STEPS = 5
MODEL_MS = 50
GOAL = 0.6
"""Issue 31's row: steps/s ÷ bare no-op tasks/s, on both pools."""
LONE_HOPS = 40
"""Hops of one bare chain on an otherwise idle pool: the latency a lone message sees."""
POOLS: dict[str, tuple[str, ...]] = {
    "prefork -c 4": ("--concurrency", "4"),
    "threads -c 32": ("--pool", "threads", "--concurrency", "32"),
}


def _cpu_s(workers: list[Worker]) -> float:
    """The CPU seconds the workers (all their processes) have used so far."""
    return sum(worker.cpu_s() for worker in workers)


def _cpu_ms(workers: list[Worker], since: float, count: int) -> float:
    """The workers' CPU since `since` (their `_cpu_s` then), in ms per `count`."""
    return (_cpu_s(workers) - since) * 1000 / count


def _relay(b: Bench, runs: int, name: str, workers: list[Worker]) -> dict[str, Any]:
    markers = [f"many-{name}-{i}" for i in range(runs)]
    cpu = _cpu_s(workers)
    started = time.monotonic()
    for marker in markers:
        b.relay.start(Task(marker, turns=2, delay_ms=MODEL_MS).text())
    sent = time.monotonic()
    ends = [b.brain.wait_for(marker, 3, timeout=900) for marker in markers]
    wall = max(ends) - started
    return {
        "runs": runs,
        "seconds": wall,
        "start_calls_seconds": sent - started,
        "steps_per_s": runs * STEPS / wall,
        "tasks_per_s": runs * (STEPS + 1) / wall,
        "worker_cpu_ms_per_step": _cpu_ms(workers, cpu, runs * STEPS),
    }


def _bare(b: Bench, chains: int, prefix: str, workers: list[Worker]) -> dict[str, Any]:
    cpu = _cpu_s(workers)
    started = time.monotonic()
    b.chains(chains, STEPS, prefix)
    wall = time.monotonic() - started
    return {
        "chains": chains,
        "seconds": wall,
        "tasks_per_s": chains * STEPS / wall,
        "worker_cpu_ms_per_task": _cpu_ms(workers, cpu, chains * STEPS),
    }


def _pool(b: Bench, runs: int, name: str, args: tuple[str, ...]) -> dict[str, Any]:
    """Relay runs between two bare measurements on the same worker settings (drift brackets)."""
    tag = name.replace(" ", "").replace("-", "")
    relays = [b.relay_worker(f"many-{tag}-{i}", *args) for i in range(2)]
    bares = [b.bare_worker(f"many-bare-{tag}-{i}", *args) for i in range(2)]
    try:
        b.relay.wait(b.relay.start(Task(f"warm-{tag}", turns=2).text()), timeout=60)
        b.chains(4, 5, f"warm-{tag}")
        before = _bare(b, runs, f"{tag}-before", bares)
        relay = _relay(b, runs, tag, relays)
        after = _bare(b, runs, f"{tag}-after", bares)
        lone_hop = median(b.chains(1, LONE_HOPS, f"{tag}-lone"))
    finally:
        for worker in relays + bares:
            worker.stop()
    bare_rate = (before["tasks_per_s"] + after["tasks_per_s"]) / 2
    bare_cpu = (before["worker_cpu_ms_per_task"] + after["worker_cpu_ms_per_task"]) / 2
    return {
        "bare_worker_cpu_ms_per_task": bare_cpu,
        "relay": relay,
        "bare_before": before,
        "bare_after": after,
        "bare_tasks_per_s": bare_rate,
        "ratio": relay["steps_per_s"] / bare_rate,
        "bare_hop_ms_one_chain_alone": lone_hop,
    }


def run(b: Bench) -> dict[str, Any]:
    """Measure throughput of many concurrent runs against bare Celery; return the figures."""
    runs = b.pick(1_000, 150)
    out: dict[str, Any] = {"model_ms": MODEL_MS, "steps_per_run": STEPS, "pools": {}}
    for name, args in POOLS.items():
        out["pools"][name] = _pool(b, runs, name, args)
        b.clear()
    out["ratio"] = max(pool["ratio"] for pool in out["pools"].values())
    out["goal"] = GOAL
    return out
