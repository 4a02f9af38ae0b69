"""7. Recovery: how soon a plain fleet picks up the call of a worker that died mid-call.

Two `relay worker`s with Relay's defaults (RELAY_RECOVERY_SECONDS and
RELAY_TICK_SECONDS unset, no beat). A run asks for one long `wait`; once a
worker holds the call's lease, and a random part of a lease later (so the kill
falls anywhere between two renewals, and anywhere in the tick's interval), that
worker's whole process group is killed with SIGKILL, and the clock runs until
the other worker has claimed the call again (the lease key names a new holder).
The promise is 15 s at worst: the lease lapses (9 s after the last renewal at
most), the next tick (every 5 s) sends the call again, and 1 s is kept for a
live worker to take it. The max over the kills is what is checked.
"""

from __future__ import annotations

import random
import time
from typing import Any

from bench.context import Bench, median
from bench.model import Task
from workers.processes import kill_group

__all__ = ["run"]

GOAL_S = 15.0
LEASE_S = 9.0
"""The lease at Relay's defaults (workers.settings.Timing)."""


def _holder(b: Bench, run_id: str) -> str | None:
    token = b.redis.get(f"relay:lease:{run_id}:call-1")
    return None if token is None else token.decode()


def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("recovery: a condition did not come in time")
        time.sleep(0.01)


def _one_round(b: Bench, k: int) -> float:
    """Kill the worker holding a long call; return seconds until the other claims it."""
    workers = [b.relay_worker(f"recovery-{k}-{n}", "--pool", "threads") for n in range(2)]
    try:
        run_id = b.relay.start(Task(f"recover-{k}", batches=1, batch=1, ms=120_000).text())
        _until(lambda: _holder(b, run_id) is not None, 60)
        first = _holder(b, run_id)
        assert first is not None
        time.sleep(random.uniform(0, LEASE_S))  # anywhere between renewals and ticks
        pid = int(first.split("-")[0])
        victim = next(w for w in workers if w.pid == pid)
        killed = time.monotonic()
        assert victim.process is not None
        kill_group(victim.process)
        _until(lambda: _holder(b, run_id) not in (None, first), 120)
        took = time.monotonic() - killed
        b.relay.cancel(run_id)
        return took
    finally:
        for worker in workers:
            worker.stop()
        b.clear()


def run(b: Bench) -> dict[str, Any]:
    rounds = b.pick(12, 2)
    seconds = [_one_round(b, k) for k in range(rounds)]
    return {
        "rounds": rounds,
        "each_s": [round(s, 2) for s in seconds],
        "median_s": median(seconds),
        "max_s": max(seconds),
        "goal_s": GOAL_S,
    }
