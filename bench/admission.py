"""9. Admission: what checking a model call against its tree's budget costs.

Admission is part of CLAIM (one Lua script, one Redis round trip): the call's
estimate is checked against the tree's token, dollar and model-call limits and
reserved. Here N child runs each ask for a model call; each is claimed once
in a tree with a budget and once in a tree without, side by side, in this
process against the bench's Redis. The difference is the admission's cost.
Goal: under 0.3 ms, and no extra round trip.
"""

from __future__ import annotations

import time
from typing import Any

from agent_core import Config
from bench.cluster import Counters
from bench.context import Bench, median
from workers.engine.budget import Admission, Budget
from workers.engine.records import RunRecord
from workers.store.runs import RunStore

__all__ = ["run"]

GOAL_MS = 0.3


def _tree(store: RunStore, root: str, budget: Budget | None, children: int) -> list[str]:
    now = 1_000
    store.create(
        RunRecord(id=root, root=root, task="t", created_ms=now, updated_ms=now, config=Config(),
                  budget=budget),
        "snap",
        10**15,
    )  # fmt: skip
    ids = []
    for n in range(children):
        child = f"{root}.call-{n}"
        record = RunRecord(
            id=child, parent=root, root=root, ancestors=(root,), task="t", created_ms=now,
            updated_ms=now, config=Config(), asked=1, seq=1, asked_bytes=20_000,
        )  # fmt: skip
        store.create(record, "snap", 10**15)
        ids.append(child)
    return ids


def _claims_ms(store: RunStore, ids: list[str], admission: Admission) -> list[float]:
    took = []
    for run_id in ids:
        started = time.perf_counter()
        store.claim(
            run_id, "m1", seq=1, token="t", lease_ms=60_000, now_ms=2_000, admission=admission
        )
        took.append((time.perf_counter() - started) * 1000)
    return took


def run(b: Bench) -> dict[str, Any]:
    count = b.pick(3_000, 600)
    store = RunStore(b.redis_server.url, "bench-admission:")
    admission = Admission(4_096, 3.0, 15.0)
    budget = Budget(tokens=10**12, usd=10**6, model_calls=10**8)
    with_budget = _tree(store, "limited", budget, count)
    without = _tree(store, "free", None, count)
    before = Counters.read(b.redis)
    limited = _claims_ms(store, with_budget, admission)
    between = Counters.read(b.redis)
    free = _claims_ms(store, without, admission)
    after = Counters.read(b.redis)
    # A script's own commands count in INFO too: a round trip is one EVALSHA.
    calls_limited = between.since(before).calls.get("evalsha", 0) / count
    calls_free = after.since(between).calls.get("evalsha", 0) / count
    usec_limited = between.since(before).total_usec / count
    usec_free = after.since(between).total_usec / count
    return {
        "claims": count,
        "claim_ms_with_budget": median(limited),
        "claim_ms_without": median(free),
        "admission_ms": median(limited) - median(free),
        "round_trips_per_claim": {"with_budget": calls_limited, "without": calls_free},
        "redis_usec_per_claim": {"with_budget": usec_limited, "without": usec_free},
        "goal_ms": GOAL_MS,
    }
