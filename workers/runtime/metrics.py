"""The fleet's numbers, kept in Redis so one exporter (`relay web`'s /metrics) sees them all.

Counters are added up by every worker process as its tasks end (`FleetMetrics.count`)
and written at most RELAY_METRICS_FLUSH_MS later (500), each process's in one
pipelined round trip, into the `metrics` hash (`workers.store.layout`): a step makes
no round trip of its own for them. A worker that stops writes what it holds; one
killed loses what it counted in its last flush interval (counts, never a run's state):

    steps|<task>|<outcome>                        tasks by name: ok, failed, idle (nothing
                                                  to do) or waiting (for a route's capacity)
    calls|<model>|<route>|<key>|<ok|failed>       model calls
    tokens|<model>|<route>|<key>|<input|output>   tokens
    cost|<model>|<route>|<key>                    micro-dollars, where the model has a price
    latency|<model>|<route>|<i>                   model calls whose time fell in bucket i
    latency_sum|<model>|<route>                   seconds, summed
    waits|<task>                                  calls sent again later: no route had room
    tools|<tool>|<ok|failed>                      tool calls
    held|<saved|lost>                             outcomes held through a Redis outage
                                                  (`leases.save_holding`), by their end

What is a state rather than a count (runs by state, what waits on a person and
for how long) is read when scraped (`fleet_state`). A metrics write that fails
is logged and dropped: it never fails a task.

Each process also says what it holds now, for an autoscaler: the model calls its loop
holds and how many it may (`FleetMetrics.held`, told by the runtime), and its loop's
lag (`workers.loop`). With each flush, and every GAUGES_EVERY_S even when no task
ended, it writes them to its own field of the `worker-gauges` hash (`WorkerGauges`),
which it deletes as it stops. A process killed leaves its field behind: a reader
skips fields older than GAUGES_FRESH_MS and deletes those older than GAUGES_KEPT_MS.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent_core import Stop
from workers.engine.records import ending_of
from workers.errors import StoreUnavailable
from workers.loop import started_loop
from workers.runtime.leases import held_tally
from workers.runtime.reports import CallFacts, Report
from workers.store.codec import as_text
from workers.store.connection import Connection
from workers.store.layout import RunFields
from workers.store.people import People
from workers.store.shards import Shards

__all__ = [
    "GAUGES_EVERY_S",
    "GAUGES_FRESH_MS",
    "GAUGES_KEPT_MS",
    "LATENCY_BUCKETS",
    "FleetMetrics",
    "FleetState",
    "Totals",
    "WorkerGauges",
]

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds, in seconds, of the model-call latency histogram (then +Inf)."""

MAX_RUNS_SCANNED = 10_000
"""Runs whose state a scrape reads, the newest first (a scrape reads each one's record)."""
CHUNK = 500

GAUGES_EVERY_S = 2.0
"""The longest a process goes without writing its gauges (more often: with each flush)."""
GAUGES_FRESH_MS = 30_000
"""A process's gauges older than this are not its state now (it was killed, or is stuck)."""
GAUGES_KEPT_MS = 3_600_000
"""Gauges older than this are deleted when read: a killed process's field does not stay."""


def _label(value: str) -> str:
    return value.replace("|", "/") or "-"


@dataclass
class Totals:
    """The counters as read back: each keyed by its labels."""

    steps: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    tokens: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    cost_usd: dict[tuple[str, str, str], float] = field(default_factory=dict)
    latency: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """Per (model, route), the count in each bucket (not cumulative), +Inf last."""
    latency_sum: dict[tuple[str, str], float] = field(default_factory=dict)
    waits: Counter[str] = field(default_factory=Counter)
    tools: Counter[tuple[str, str]] = field(default_factory=Counter)
    held: Counter[str] = field(default_factory=Counter)
    """Outcomes held through a Redis outage, by what became of them: saved or lost."""


@dataclass
class FleetState:
    """What the runs look like now."""

    runs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Runs by (state, waiting for, how a finished one ended: `engine.records.Ending`)."""
    waiting_on_person: Counter[str] = field(default_factory=Counter)
    """Pending plans, calls and questions, by kind."""
    oldest_wait_s: float = 0.0
    scanned: int = 0


@dataclass(frozen=True)
class WorkerGauges:
    """What one worker process holds, as it last said (one field of `worker-gauges`)."""

    worker: str
    """`<host>:<pid>`."""
    in_flight: int
    """Model calls its loop holds."""
    capacity: int
    """The most it may hold."""
    lag_p99_s: float
    lag_max_s: float
    at_ms: int
    """When it wrote them, by its clock (ms since the epoch)."""


class FleetMetrics:
    """Adds to the fleet's counters after each task, and reads them back."""

    def __init__(
        self, connection: Connection, shards: Shards, people: People, flush_ms: int = 500
    ) -> None:
        self._connection = connection
        self._flush_s = flush_ms / 1000
        """How long counts are held before they are written (0: at once)."""
        self._shards = shards
        self._people = people
        self._lock = threading.Lock()
        self._adds: Counter[str] = Counter()
        self._sums: Counter[str] = Counter()
        self._flusher: tuple[int, threading.Thread] | None = None
        """(pid, thread) of the thread that flushes: a forked child starts its own."""
        self._held: tuple[int, int] | None = None
        """(calls in flight, capacity), as `held` last said: None, no gauges to write."""
        self._writing = threading.Lock()
        """One write at a time, so the one that deletes the gauges (`stop`) comes last."""
        self._stopped = False
        self._name = socket.gethostname()
        """What names this process on /metrics, with its pid (`held`)."""

    def held(self, in_flight: int, capacity: int, worker: str = "") -> None:
        """Say how many model calls this process's loop holds now, and the most it may:
        written with the next flush (within GAUGES_EVERY_S), never here. Told by the
        process that holds the calls (a prefork pool's child, not its parent); `worker`:
        its Celery hostname (`name@host`), which names it on /metrics with its pid (else
        the machine's hostname does)."""
        with self._lock:
            self._held = (in_flight, capacity)
            self._name = worker or self._name
            if self._flusher is None or self._flusher[0] != os.getpid():
                self._start_flusher()

    def count(self, task: str, report: Report) -> None:
        """Count one task (`advance`, `call_model`, `run_tool`) and its call, if it made
        one: held in this process, written within the flush interval."""
        outcome = "failed" if report.failed else "idle" if report.idle else "ok"
        outcome = "waiting" if report.waited else outcome
        adds: dict[str, int] = {f"steps|{task}|{outcome}": 1}
        if report.waited:
            adds[f"waits|{task}"] = 1
        sums: dict[str, float] = {}
        if report.call is not None:
            _add_call(report.call, adds, sums)
        with self._lock:
            self._adds.update(adds)
            self._sums.update(sums)
            if self._flush_s and (self._flusher is None or self._flusher[0] != os.getpid()):
                self._start_flusher()
        if not self._flush_s:
            self.flush()

    def _start_flusher(self) -> None:
        thread = threading.Thread(target=self._flush_often, name="relay-metrics", daemon=True)
        self._flusher = (os.getpid(), thread)
        thread.start()
        atexit.register(self.stop)

    def _flush_often(self) -> None:
        """Write the counts every flush interval, and the gauges at least every
        GAUGES_EVERY_S (a process that holds calls and ends none still says so)."""
        me = os.getpid()
        every = min(self._flush_s or GAUGES_EVERY_S, GAUGES_EVERY_S)
        counts_due = time.monotonic() + self._flush_s
        while self._flusher is not None and self._flusher[0] == me and not self._stopped:
            time.sleep(every)
            if time.monotonic() >= counts_due:
                counts_due = time.monotonic() + self._flush_s
                self.flush()
            else:
                self._write(Counter(), Counter())

    def flush(self) -> None:
        """Write the counts this process holds, and its gauges, now."""
        self._write(*self._take_counts())

    def stop(self) -> None:
        """This process stops: write the counts it holds, and delete its gauges (it
        holds no call any more). Nothing writes them again after."""
        adds, sums = self._take_counts()
        self._write(adds, sums, last=True)

    def _take_counts(self) -> tuple[Counter[str], Counter[str]]:
        with self._lock:
            adds, sums = self._adds, self._sums
            for outcome, amount in held_tally().items():
                adds[f"held|{outcome}"] += amount
            self._adds, self._sums = Counter(), Counter()
        return adds, sums

    def _write(self, adds: Counter[str], sums: Counter[str], *, last: bool = False) -> None:
        """Write `adds` and `sums` and this process's gauges (with `last`: delete them),
        in one round trip."""
        with self._writing:
            # After the stop, counts still go (a task may end after it), gauges never.
            gauges = None if self._stopped else self._gauges()
            self._stopped = self._stopped or last
            if not adds and not sums and gauges is None:
                return
            connection = self._connection
            try:
                with connection.errors():
                    pipe = connection.redis.pipeline(transaction=False)
                    key = connection.keys.metrics
                    for name, amount in adds.items():
                        pipe.hincrby(key, name, amount)
                    for name, total in sums.items():
                        pipe.hincrbyfloat(key, name, total)
                    if gauges is not None:
                        worker, value = gauges
                        if last:
                            pipe.hdel(connection.keys.worker_gauges, worker)
                        else:
                            pipe.hset(connection.keys.worker_gauges, worker, value)
                    pipe.execute()
            except StoreUnavailable as error:  # (sent again, a write that landed would count twice)
                if adds or sums:  # (the gauges alone are written again in a moment)
                    log.warning(
                        "could not write %d metrics counts: %s", len(adds) + len(sums), error
                    )

    def _gauges(self) -> tuple[str, str] | None:
        """This process's field of `worker-gauges` and its value now (None: `held` was
        never told, so it holds no call and says nothing)."""
        held = self._held
        if held is None:
            return None
        loop = started_loop()
        value = {
            "in_flight": held[0],
            "capacity": held[1],
            "lag_p99_s": loop.lag_p99() if loop is not None else 0.0,
            "lag_max_s": loop.lag_max() if loop is not None else 0.0,
            "at_ms": int(time.time() * 1000),
        }
        return f"{self._name}:{os.getpid()}", json.dumps(value)

    def worker_gauges(self, now_ms: int) -> list[WorkerGauges]:
        """Each worker process's gauges as it last wrote them, by worker, but those older
        than GAUGES_FRESH_MS (by `now_ms`); deletes those older than GAUGES_KEPT_MS, and
        any a worker would not write."""
        connection = self._connection
        key = connection.keys.worker_gauges
        with connection.errors():
            raw = connection.redis.hgetall(key)
        fresh, old = [], []
        for field_name, value in raw.items():
            worker = as_text(field_name)
            gauges = _gauges_of(worker, as_text(value))
            if gauges is None or now_ms - gauges.at_ms > GAUGES_KEPT_MS:
                old.append(worker)
            elif now_ms - gauges.at_ms <= GAUGES_FRESH_MS:
                fresh.append(gauges)
        if old:
            with connection.errors():
                connection.redis.hdel(key, *old)
        return sorted(fresh, key=lambda gauges: gauges.worker)

    def totals(self) -> Totals:
        """Return every counter."""
        connection = self._connection
        with connection.errors():
            raw = connection.redis.hgetall(connection.keys.metrics)
        totals = Totals()
        for name, value in raw.items():
            _read_into(totals, as_text(name).split("|"), as_text(value))
        return totals

    def state(self, now_ms: int) -> FleetState:
        """Return the runs by state (the newest MAX_RUNS_SCANNED) and what waits on a person.

        A scrape reads each run's record, in pipelined chunks (relay web caches it
        briefly): what a run waits for is in its record only.
        """
        connection, keys = self._connection, self._connection.keys
        found = FleetState()
        metas: list[Any] = []
        with connection.errors():
            ids = [run_id for run_id, _ in self._shards.newest_runs(MAX_RUNS_SCANNED)]
            for start in range(0, len(ids), CHUNK):
                pipe = connection.redis.pipeline(transaction=False)
                for run_id in ids[start : start + CHUNK]:
                    pipe.hget(keys.run(run_id), RunFields.RECORD)
                metas.extend(pipe.execute())
        for meta in metas:
            record = _loads(meta)
            if record is not None:
                found.scanned += 1
                state = str(record.get("state", "running"))
                waiting_for = str(record.get("waiting_for") or "")
                found.runs[(state, waiting_for, _ending(record))] += 1
        for pending in self._people.pending():
            found.waiting_on_person[pending.kind] += 1
            found.oldest_wait_s = max(found.oldest_wait_s, (now_ms - pending.created_ms) / 1000)
        return found


def _add_call(facts: CallFacts, adds: dict[str, int], sums: dict[str, float]) -> None:
    outcome = "ok" if facts.ok else "failed"
    name = _label(facts.name)
    if facts.kind == "tool":
        adds[f"tools|{name}|{outcome}"] = 1
        return
    labels = f"{name}|{_label(facts.route)}"
    spent = f"{labels}|{_label(facts.key)}"
    adds[f"calls|{spent}|{outcome}"] = 1
    bucket = next((i for i, top in enumerate(LATENCY_BUCKETS) if facts.seconds <= top), None)
    adds[f"latency|{labels}|{len(LATENCY_BUCKETS) if bucket is None else bucket}"] = 1
    sums[f"latency_sum|{labels}"] = facts.seconds
    if facts.usage is not None:
        adds[f"tokens|{spent}|input"] = facts.usage.prompt_tokens
        adds[f"tokens|{spent}|output"] = facts.usage.completion_tokens
        if facts.usage.cost_micro:  # exact, where the model has a price
            adds[f"cost|{spent}"] = facts.usage.cost_micro


def _read_into(totals: Totals, parts: list[str], value: str) -> None:
    """Add one field of the metrics hash to `totals` (a field it does not know is skipped)."""
    try:
        match parts:
            case ["steps", task, outcome]:
                totals.steps[(task, outcome)] += int(value)
            case ["calls", model, route, key, outcome]:
                totals.calls[(model, route, key, outcome)] += int(value)
            case ["tokens", model, route, key, direction]:
                totals.tokens[(model, route, key, direction)] += int(value)
            case ["cost", model, route, key]:
                totals.cost_usd[(model, route, key)] = int(value) / 1_000_000
            case ["latency", model, route, index]:
                counts = totals.latency.setdefault((model, route), [0] * (len(LATENCY_BUCKETS) + 1))
                counts[min(int(index), len(LATENCY_BUCKETS))] += int(value)
            case ["latency_sum", model, route]:
                totals.latency_sum[(model, route)] = float(value)
            case [("waits" | "held") as family, label]:  # the counters with one label
                getattr(totals, family)[label] += int(value)
            case ["tools", tool, outcome]:
                totals.tools[(tool, outcome)] += int(value)
    except ValueError:
        log.warning("skipped a metrics field that is not a number: %s", "|".join(parts))


def _gauges_of(worker: str, value: str) -> WorkerGauges | None:
    """One field of `worker-gauges`, read (None: not what a worker writes)."""
    try:
        found = json.loads(value)
        return WorkerGauges(
            worker,
            int(found["in_flight"]),
            int(found["capacity"]),
            float(found["lag_p99_s"]),
            float(found["lag_max_s"]),
            int(found["at_ms"]),
        )
    except (ValueError, TypeError, KeyError):
        return None


def _ending(record: dict[str, Any]) -> str:
    """How the finished run whose record is `record` ended ("" if it has not)."""
    outcome = record.get("outcome")
    if record.get("state") != "finished" or not isinstance(outcome, dict):
        return ""
    try:
        return ending_of(Stop(str(outcome.get("stop"))))
    except ValueError:
        return "failed"  # a stop this version does not know is no success


def _loads(meta: Any) -> dict[str, Any] | None:
    if meta is None:
        return None
    try:
        record = json.loads(meta)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
