"""A scheduler.TickHost that records what the tick asks of it, the schedule stores it
ticks on (a single private Redis, or the session's Redis Cluster in shards), and
schedules to put there: what the tick tests share."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_core import Every, Policy, Recipe, Trigger
from scheduler import Schedule, ScheduleStore, StoreUnreachable
from scheduler.history import Firing
from scheduler.store import Due, SlotOutcome, fire_id
from tests.support.redis_cluster import Cluster
from tests.support.redis_server import RedisServer
from workers.store.runs import RunStore
from workers.store.schedule_shards import ClusterSchedules

__all__ = [
    "DAY",
    "HOUR",
    "MINUTE",
    "PREFIX",
    "RECIPE",
    "T0",
    "RecordingHost",
    "Started",
    "claim",
    "host",
    "make",
    "stores",
]

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC, a Tuesday
PREFIX = "t:"

RECIPE = (
    Recipe("check", "Check {thing} and report.")
    .param("thing", "what to check")
    .only_tools(["read_note"])
)


@dataclass
class Started:
    task: str
    tools: tuple[str, ...] | None
    notes: tuple[str, ...] | None
    recipe: str | None
    schedule: str | None
    run_id: str | None = None
    policy: Policy | None = None
    approve_plan: bool = False
    fired_ms: int | None = None


@dataclass
class RecordingHost:
    """Implements `scheduler.TickHost`: records starts and heals instead of running anything."""

    schedule_store: ScheduleStore
    notes: dict[str, list[str]] = field(default_factory=dict)
    starts: list[Started] = field(default_factory=list)
    heals: list[int] = field(default_factory=list)
    started_before_heal: list[int] = field(default_factory=list)
    """How many runs had started when each heal came (the tick heals before it fires)."""
    refuse: set[str] = field(default_factory=set)
    """Schedules whose runs cannot start: `start` raises RuntimeError(refusal)."""
    refusal: str = "unknown tools: read_note"
    unreachable: int = 0
    """How many more starts fail as if the store were away (StoreUnreachable)."""
    ids: dict[str, str] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    """Run id -> state; a run started here and not listed has finished."""
    cancelled: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run_states(self, run_ids: Sequence[str]) -> list[str | None]:
        with self.lock:
            return [self.states.get(r, "finished") if r in self.ids else None for r in run_ids]

    def cancel(self, run_id: str, reason: str = "") -> bool:
        del reason
        with self.lock:
            self.cancelled.append(run_id)
            going = self.states.get(run_id) in ("running", "waiting")
            self.states[run_id] = "finished"
        return going

    def schedule_notes(self, name: str) -> list[str]:
        return list(self.notes.get(name, []))

    def start(
        self,
        task: str,
        context: str = "",
        *,
        tools: Sequence[str] | None = None,
        notes: Sequence[str] | None = None,
        recipe: str | None = None,
        schedule: str | None = None,
        run_id: str | None = None,
        budget: Any = None,
        policy: Policy | None = None,
        approve_plan: bool = False,
        fired_ms: int | None = None,
        on_wait: str = "wait",
    ) -> str:
        del context, budget, on_wait  # the tick gives no context; the rest is the Relay's
        if schedule in self.refuse:
            raise RuntimeError(self.refusal)
        with self.lock:
            if self.unreachable > 0:
                self.unreachable -= 1
                raise StoreUnreachable("the store is away")
            if run_id is not None and run_id in self.ids:
                return self.ids[run_id]  # that run exists: starting it again does nothing
            self.starts.append(
                Started(
                    task,
                    None if tools is None else tuple(tools),
                    None if notes is None else tuple(notes),
                    recipe,
                    schedule,
                    run_id,
                    policy,
                    approve_plan,
                    fired_ms,
                )
            )
            label = f"run-{len(self.starts)}"
            if run_id is not None:
                self.ids[run_id] = label
            return label

    def heal(self, now: int) -> int:
        with self.lock:
            self.heals.append(now)
            self.started_before_heal.append(len(self.starts))
        return 0


@pytest.fixture(params=["redis", "cluster"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], ScheduleStore]]:
    """Makes schedule stores of one Relay, each with a connection of its own (as each
    worker process has)."""
    made: list[Any] = []
    with ExitStack() as stack:
        if request.param == "redis":
            server = stack.enter_context(RedisServer(tmp_path))

            def make_store() -> ScheduleStore:
                made.append(server.client())
                return ScheduleStore(made[-1], PREFIX)

        else:
            cluster: Cluster = request.getfixturevalue("redis_cluster")
            prefix = f"t{uuid.uuid4().hex[:8]}:"

            def make_store() -> ScheduleStore:
                run_store = RunStore(cluster.url, prefix, cluster=True)
                made.append(run_store.redis)
                return ScheduleStore(
                    run_store.redis,
                    prefix,
                    ClusterSchedules(run_store.connection, run_store.shards),
                )

        yield make_store
        for connection in made:
            connection.close()


@pytest.fixture
def host(stores: Callable[[], ScheduleStore]) -> RecordingHost:
    return RecordingHost(stores())


def make(
    name: str = "daily-check",
    trigger: Trigger | None = None,
    *,
    at: int = T0,
    offset: int = 0,
    thing: str = "the ledger",
    mode: str = "run",
    **options: Any,
) -> Schedule:
    return Schedule.create(
        name,
        RECIPE,
        {"thing": thing},
        trigger or Every(5),
        offset,
        mode=mode,  # type: ignore[arg-type]
        now_ms=at,
        **options,
    )


def claim(store: ScheduleStore, due: Due, now_ms: int) -> bool:
    """Claim the due slot as a tick that fires it would."""
    run_id = fire_id(due.schedule.name, due.slot_ms)
    firing = Firing(kind="fired", slot_ms=due.slot_ms, at_ms=now_ms, run_id=run_id)
    return store.claim(due, due.slot_ms, now_ms, SlotOutcome(firing))
