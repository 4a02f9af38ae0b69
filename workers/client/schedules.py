"""The Relay side of recurring recipes: `schedule`, `schedules`, `unschedule` (see scheduler/).

    relay.schedule("monthly-spend", recipe, {"month": "last month", "limit": "50,000"},
                   Daily(hour=9), utc_offset_minutes=420)
    relay.schedule("standup", recipe, {}, Cron("0 9 * * 1-5", tz="Europe/Berlin"))
    relay.schedules()            # each with its next_due_ms
    relay.unschedule("monthly-spend")
    relay.notifications()        # what notify-only schedules (and failed starts) recorded

The schedules themselves live in `scheduler.ScheduleStore`, on this Relay's
Redis and key prefix (on a cluster, in shards: workers.store.schedule_shards); the beat's
tick (`scheduler.tick`) fires them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property

from agent_core import Recipe, Tool, Trigger
from scheduler import Notification, Schedule, ScheduleStore
from scheduler.schedules import Mode
from workers.engine.budget import Budget
from workers.settings import now_ms as clock
from workers.store.runs import RunStore
from workers.store.schedule_shards import ClusterSchedules

__all__ = ["Scheduling"]


class Scheduling:
    """The schedule methods of the Relay's client API. Redis errors come out as
    `StoreUnavailable`."""

    def __init__(self, store: Callable[[], RunStore], tools: Callable[[], list[Tool]]) -> None:
        self._store = store
        self._tools = tools

    @property
    def store(self) -> RunStore:
        return self._store()

    @cached_property
    def schedule_store(self) -> ScheduleStore:
        """The schedules of this Relay (its Redis, its key prefix)."""
        store = self.store
        cluster = store.keys.cluster
        shards = ClusterSchedules(store.connection, store.shards) if cluster else None
        return ScheduleStore(store.redis, store.keys.prefix, shards)

    def schedule(
        self,
        name: str,
        recipe: Recipe,
        values: Mapping[str, str],
        trigger: Trigger,
        utc_offset_minutes: int = 0,
        *,
        mode: Mode = "run",
        budget: Budget | None = None,
        now_ms: int | None = None,
    ) -> Schedule:
        """Schedule `recipe`, filled with `values`, to fire on `trigger`; return the schedule.

        A schedule of the same name is replaced (its notes are kept; a tick that
        read the old one fires nothing). `now_ms` is when it counts as made, its
        first last run (default: now), so a daily 09:00 made at 10:00 first fires
        tomorrow. `mode="notify"` records a notification at each slot instead of
        starting a run. A `Daily`, `Weekly` or `Cron` trigger with `tz` fires on
        that zone's clock, summer time and all; it takes no `utc_offset_minutes`.

        Raises:
            RecipeError: `values` name a blank the recipe lacks or miss one it has.
            DefinitionError: a bad name, trigger, offset or mode, a time zone
                the zone data does not know, or the recipe names a tool this
                Relay has not registered.
            StoreUnavailable: Redis cannot be reached.
        """
        made = Schedule.create(
            name,
            recipe,
            values,
            trigger,
            utc_offset_minutes,
            mode=mode,
            budget=None if budget is None else budget.model_dump(exclude_none=True),
            now_ms=clock() if now_ms is None else now_ms,
        )
        recipe.tools_for(self._tools())  # refuses a tool that is not registered
        with self.store.errors():
            self.schedule_store.put(made)
        return made

    def schedules(self) -> list[Schedule]:
        """Return every schedule by name, each with its `next_due_ms`."""
        with self.store.errors():
            return self.schedule_store.all()

    def unschedule(self, name: str) -> bool:
        """Remove a schedule and its notes; return False if there was none.

        A tick that already read it fires nothing. A run it started earlier goes
        on; if that run remembers notes, they are kept for a schedule made again
        under this name.
        """
        with self.store.errors():
            removed = self.schedule_store.remove(name)
            if removed:
                self.store.redis.delete(self.store.keys.schedule_notes(name))
        return removed

    def notifications(self, limit: int = 50) -> list[Notification]:
        """Return notifications, newest first: notify-only slots and runs that could not start."""
        with self.store.errors():
            return self.schedule_store.notifications(limit)

    def schedule_notes(self, name: str) -> list[str]:
        """Return the notes the schedule's runs remembered, oldest first: its next run sees them."""
        with self.store.errors():
            found = self.store.redis.lrange(self.store.keys.schedule_notes(name), 0, -1)
        return [n.decode() if isinstance(n, bytes) else str(n) for n in found]
