"""The tick: everything the beat does every few seconds, with the clock passed in.

For each due schedule the tick claims its slot (`ScheduleStore.claim`: exactly
one claimer per schedule and slot, however many ticks run at once), then the
winner starts the run — the filled recipe, only the recipe's tools, and the
notes the schedule's earlier runs remembered — or, for a notify-only schedule,
its claim has already recorded the notification. Then it heals the runtime
(re-sends what was never sent, declines expired approvals).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from scheduler.errors import StoreUnreachable
from scheduler.schedules import Schedule
from scheduler.store import Due, Notification, ScheduleStore, fire_id

__all__ = ["TickHost", "tick"]

log = logging.getLogger(__name__)

REFIRE_AFTER_MS = 60_000
"""A claimed slot whose run is not confirmed after this long is started by a later tick."""


class TickHost(Protocol):
    """What the tick needs from a Relay."""

    @property
    def schedule_store(self) -> ScheduleStore:
        """Where the schedules live."""
        ...

    def schedule_notes(self, name: str) -> list[str]:
        """Return the notes the schedule's earlier runs remembered, oldest first."""
        ...

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
    ) -> str:
        """Start a run and return its id; with `run_id`, a run of that id that exists
        already is left as it is (starting it again does nothing)."""
        ...

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals."""
        ...


def tick(relay: TickHost, now_ms: int) -> list[str]:
    """Fire every schedule due at `now_ms`, then heal; return the ids of runs it started.

    A run that cannot be started (say a tool was unregistered since) loses its
    slot and leaves a notification saying why; the other schedules still fire.

    Raises:
        whatever the Redis client raises when Redis cannot be reached.
    """
    store = relay.schedule_store
    started = [
        r
        for r in (_refire(relay, store, n, slot, now_ms) for n, slot in _stale(store, now_ms))
        if r
    ]
    for due in store.due(now_ms):
        run_id = _fire(relay, store, due, now_ms)
        if run_id is not None:
            started.append(run_id)
    relay.heal(now_ms)
    return started


def _stale(store: ScheduleStore, now_ms: int) -> list[tuple[str, int]]:
    return store.stale_firings(now_ms - REFIRE_AFTER_MS)


def _refire(
    relay: TickHost, store: ScheduleStore, name: str, slot_ms: int, now_ms: int
) -> str | None:
    """Start the run of a slot whose claiming tick stopped before it started it."""
    schedule = store.get(name)
    if schedule is None:  # removed since: nothing to start
        store.forget_firing(name, slot_ms)
        return None
    log.warning(
        "schedule %r: starting the run of slot %d, which its tick never started", name, slot_ms
    )
    return _start(relay, store, schedule, slot_ms, now_ms)


def _fire(relay: TickHost, store: ScheduleStore, due: Due, now_ms: int) -> str | None:
    """Claim the slot and, if this tick won it, start the run; return its id."""
    schedule = due.schedule
    task = schedule.task()
    notice = Notification(schedule=schedule.name, task=task, slot_ms=due.slot_ms, at_ms=now_ms)
    if not store.claim(due, now_ms, notice if schedule.mode == "notify" else None):
        return None
    if schedule.mode == "notify":
        return None
    return _start(relay, store, schedule, due.slot_ms, now_ms)


def _start(
    relay: TickHost, store: ScheduleStore, schedule: Schedule, slot_ms: int, now_ms: int
) -> str | None:
    """Start the slot's run under the slot's own run id, then forget the slot as firing."""
    try:
        # Notes are read after the claim: only the run that fires needs them.
        run_id = relay.start(
            schedule.task(),
            tools=schedule.tools,
            notes=relay.schedule_notes(schedule.name),
            recipe=schedule.recipe.name,
            schedule=schedule.name,
            run_id=fire_id(schedule.name, slot_ms),
            budget=schedule.budget,
        )
    except StoreUnreachable:
        raise  # the store is away: the slot stays firing, and a later tick starts it
    except Exception as error:  # noqa: BLE001 - one schedule's failure must not stop the others
        log.warning("schedule %r: could not start its run: %s", schedule.name, error)
        problem = f"the run could not start: {error}"
        notice = Notification(
            schedule=schedule.name, task=schedule.task(), slot_ms=slot_ms, at_ms=now_ms
        )
        store.notify(notice.model_copy(update={"problem": problem[:2_000]}))
        run_id = None
    store.fired(schedule.name, slot_ms)
    return run_id
