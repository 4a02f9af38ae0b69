"""12. The journal: what it adds per turn, and how long the upgrade check takes.

One run of many turns (tool outputs padded to `SIZE` characters): the bytes sent
to Redis per turn, the journal's own bytes per turn (its entries as stored), and
Redis time per turn. The journal entry is one more argument (and key) of the SAVE
each step makes anyway, so "without it" is the same run's bytes less those; its
Redis time is measured by pushing the same entries again into a scratch list.

Then many runs parked at an approval, and `Relay.replay_waiting()` (what `relay
replay --waiting` runs) over all of them, three times: the slowest of the three.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Bench, median
from bench.model import Task
from bench.waiting import park
from workers.engine.journal import read_entry

__all__ = ["run"]

SIZE = 200
RESP_FRAMING = 16
"""Bytes RESP adds around one bulk argument: `$<length>\\r\\n...\\r\\n`."""


def _per_turn(b: Bench, turns: int) -> dict[str, Any]:
    before = b.counters()
    run_id = b.relay.start(Task("journal-long", turns=turns, size=SIZE).text())
    b.relay.wait(run_id, timeout=600)
    b.settle()
    spent = b.counters().since(before)
    keys = b.relay.store.keys
    stored = b.relay.store.journal(run_id)
    entries = stored[1:]
    steps = len(entries)
    journal_bytes = sum(len(e) for e in entries)
    key_bytes = len(keys.journal(run_id)) + RESP_FRAMING
    added = journal_bytes + steps * (key_bytes + RESP_FRAMING)
    kinds: dict[str, int] = {}
    for index, text in enumerate(entries, start=1):
        kind = read_entry(index, text).step.kind
        kinds[kind] = kinds.get(kind, 0) + 1
    # The journal's own Redis time: the same entries pushed again, one RPUSH each.
    scratch = "bench-journal-scratch"
    pushed = b.counters()
    for text in entries:
        b.redis.rpush(scratch, text)
    rpush = b.counters().since(pushed)
    b.redis.delete(scratch)
    redis_usec = sum(spent.usec.values())
    return {
        "turns": turns,
        "journal_steps": steps,
        "steps_by_kind": kinds,
        "start_bytes": len(stored[0]),
        "journal_bytes_per_turn": journal_bytes / turns,
        "bytes_in_per_turn_with": spent.bytes_in / turns,
        "bytes_in_per_turn_without": (spent.bytes_in - added) / turns,
        "redis_usec_per_turn_with": redis_usec / turns,
        "journal_rpush_usec_per_turn": rpush.usec.get("rpush", 0) / turns,
        "journal_memory_bytes": b.redis.memory_usage(keys.journal(run_id), samples=0) or 0,
    }


def _replay_waiting(b: Bench, count: int) -> dict[str, Any]:
    runs = list(park(b, count, prefix="journal-park"))  # (the waiting benchmark's way)
    seconds = []
    reports = []
    for _ in range(3):
        began = time.monotonic()
        reports = b.relay.replay_waiting()
        seconds.append(time.monotonic() - began)
    parked = [r for r in reports if r.run_id in set(runs)]
    return {
        "parked_runs": count,
        "replayed": len(reports),
        "identical": sum(r.identical for r in parked),
        "seconds_max": max(seconds),
        "seconds_median": median(seconds),
        "ms_per_run_max": max(seconds) * 1000 / max(len(reports), 1),
        "journal_memory_bytes_parked_run": b.redis.memory_usage(
            b.relay.store.keys.journal(runs[0]), samples=0
        )
        or 0,
    }


def run(b: Bench) -> dict[str, Any]:
    """Measure the journal's bytes and time per turn, and the upgrade check's time."""
    turns, parked = b.pick(200, 40), b.pick(200, 200)
    with b.relay_worker("journal", "--concurrency", "4"):
        b.relay.wait(b.relay.start(Task("warm", turns=1).text()), timeout=60)
        b.settle()
        per_turn = _per_turn(b, turns)
        waiting = _replay_waiting(b, parked)
    return {"per_turn": per_turn, "replay_waiting": waiting}
