"""10. Model routes: keeping a fleet inside a provider's rate limit, and what admission costs.

A. The bench's model server enforces a rate limit itself, as a provider does
   (LIMIT calls in any 6 s: 600 per minute, counted in tenths of a minute). Two
   `relay worker`s (threads, 8 each) run N one-call runs on one route, twice, side
   by side: once with the route's `rpm` set to the provider's limit (the fleet
   spaces its calls in Redis), once without (each worker's client retries the
   429s after their Retry-After). Goals with the limit: at most 1% of calls
   answered 429, at least 90% of the limit used.
B. Admission itself: `RouteLimits.admit` and `done` for M calls against the
   bench's Redis, in this process, on a route with rpm, tpm and a concurrency
   cap (each call admitted at once: the clock passed in moves on a step per call).
   Goal: one round trip each, under 0.3 ms.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.cluster import Counters, relay_worker
from bench.context import Bench, median
from bench.model import Task
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteLimits
from workers.store.runs import RunStore

__all__ = ["run"]

WINDOW_S = 6.0
LIMIT = 60
"""Calls the server takes in any WINDOW_S: 600 per minute."""
RPM = int(LIMIT * 60 / WINDOW_S)
GOAL_REFUSED = 0.01
GOAL_USED = 0.90
GOAL_ADMIT_MS = 0.3


def _fleet_round(b: Bench, label: str, runs: int, rpm: int | None) -> dict[str, Any]:
    """N one-call runs on two workers through one route (with `rpm`, or none)."""
    path = b.directory / f"routes-{label}.json"
    route = {"name": "provider", "url": b.model.url, "model": "m"}
    path.write_text(json.dumps([{**route, "rpm": rpm} if rpm else route]))
    env = {**b.env, "RELAY_MODELS": str(path)}
    b.model.limit_rate(LIMIT, per_seconds=WINDOW_S)
    b.model.refused = 0
    before = len(b.model.calls)
    workers = []
    for n in range(2):
        log = b.directory / f"routes-{label}-{n}.log"
        name = f"routes-{label}-{n}"
        workers.append(relay_worker(env, log, name, "--pool", "threads", "-c", "8").start())
    try:
        started = time.monotonic()
        run_ids = [b.relay.start(Task(f"route-{label}-{k}").text()) for k in range(runs)]
        for run_id in run_ids:
            b.relay.wait(run_id, timeout=600)
        took = time.monotonic() - started
    finally:
        for worker in workers:
            worker.stop()
        b.model.limit_rate(None)
    answered = [c.at for c in b.model.calls[before:]]
    refused = b.model.refused
    served = len(answered) - refused
    rate = (served - 1) / (answered[-1] - answered[0])
    b.clear()
    return {
        "runs": runs,
        "requests": len(answered),
        "refused_429": refused,
        "refused_share": refused / len(answered),
        "served_per_s": rate,
        "limit_per_s": RPM / 60,
        "used_share": rate / (RPM / 60),
        "seconds": took,
    }


def _admission(b: Bench, calls: int) -> dict[str, Any]:
    limits = RouteLimits(RunStore(b.redis_server.url, "bench-routes:").connection)
    route = ModelRoute("fast", url=b.model.url, model="m", rpm=10**7, tpm=10**12,
                       max_concurrency=10**6)  # fmt: skip
    admit_ms, done_ms = [], []
    before = Counters.read(b.redis)
    now = 10**12
    for k in range(calls):
        now += 10
        started = time.perf_counter()
        answer = limits.admit(route, key="bench", holder=f"c{k}", tokens=100,
                              key_concurrency=100, lease_ms=60_000, now_ms=now)  # fmt: skip
        between = time.perf_counter()
        limits.done(route, key="bench", holder=f"c{k}", outcome="ok", now_ms=now,
                    charged=answer.charged, used=50)  # fmt: skip
        admit_ms.append((between - started) * 1000)
        done_ms.append((time.perf_counter() - between) * 1000)
        if not answer.admitted:
            raise AssertionError(f"routes: call {k} was not admitted: {answer}")
    spent = Counters.read(b.redis).since(before)
    return {
        "calls": calls,
        "admit_ms": median(admit_ms),
        "done_ms": median(done_ms),
        "round_trips_per_call": spent.calls.get("evalsha", 0) / calls,
        "redis_usec_per_call": spent.total_usec / calls,
    }


def run(b: Bench) -> dict[str, Any]:
    runs = b.pick(600, 200)
    limited = _fleet_round(b, "spaced", runs, RPM)
    unlimited = _fleet_round(b, "unspaced", runs, None)
    return {
        "window_s": WINDOW_S,
        "limit": LIMIT,
        "with_route_limit": limited,
        "without": unlimited,
        "admission": _admission(b, b.pick(5_000, 1_000)),
        "goal_refused_share": GOAL_REFUSED,
        "goal_used_share": GOAL_USED,
        "goal_admit_ms": GOAL_ADMIT_MS,
    }
