"""The Relay side of recurring recipes: `schedule`, `schedules`, `unschedule` (see scheduler/).

    relay.schedule("monthly-spend", recipe, {"month": "last month", "limit": "50,000"},
                   Daily(hour=9), utc_offset_minutes=420)
    relay.schedule("standup", recipe, {}, Cron("0 9 * * 1-5", tz="Europe/Berlin"))
    relay.schedules()            # each with its next_due_ms
    relay.unschedule("monthly-spend")
    relay.notifications()        # what notify-only schedules (and failed starts) recorded
    relay.scheduling.pause("standup", note="holidays"); relay.scheduling.resume("standup")
    relay.scheduling.run_now("standup")                 # fire once now, under its overlap policy
    relay.scheduling.backfill("standup", start_ms, end_ms)  # the firings in the range
    relay.scheduling.history("standup")                 # what each firing did, newest first
    relay.scheduling.last("standup", "fired")           # its newest run, or None
    relay.scheduling.get("standup")                     # one schedule, or None

The schedules themselves live in `scheduler.ScheduleStore`, on this Relay's
Redis and key prefix (on a cluster, in shards: workers.store.schedule_shards); the fleet's
tick (`scheduler.tick`) fires them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent_core import Every, Recipe, Tool, Trigger
from scheduler import Notification, Schedule, ScheduleStore, calendar
from scheduler.history import HISTORY_MAX, Firing, FiringKind
from scheduler.schedules import Mode
from scheduler.store import Queued
from workers.engine.budget import Budget
from workers.errors import RelayError
from workers.settings import now_ms as clock
from workers.store.runs import RunStore

__all__ = ["BACKFILL_FORCED_MAX", "BACKFILL_MAX", "FiringView", "Scheduling"]

BACKFILL_MAX = 1_000
"""Firings one backfill starts at most, unless forced."""
BACKFILL_FORCED_MAX = 1_000_000
"""Firings a forced backfill starts at most (about two years of every minute)."""


class FiringView(BaseModel):
    """A history entry with what became of its run (`state` and `stop`, when it has one)."""

    model_config = ConfigDict(frozen=True)

    firing: Firing
    state: str | None = None
    """The run's state; None: no run, or it expired."""
    stop: str | None = None


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
        return self.store.schedules

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
        **options: Any,
    ) -> Schedule:
        """Schedule `recipe`, filled with `values`, to fire on `trigger`; return the schedule.

        A schedule of the same name is replaced (its notes are kept; a tick that
        read the old one fires nothing). `now_ms` is when it counts as made, its
        first last run (default: now), so a daily 09:00 made at 10:00 first fires
        tomorrow. `mode="notify"` records a notification at each slot instead of
        starting a run. A `Daily`, `Weekly` or `Cron` trigger with `tz` fires on
        that zone's clock, summer time and all; it takes no `utc_offset_minutes`.
        `options` are the schedule's other fields: `overlap` ("skip", "buffer_one",
        "allow_all", "cancel_previous"), `approve_plan`, `ask` (the risks that ask a
        person; MONEY always does), `catch_up_ms`, `jitter_ms`, `end_ms`.

        Raises:
            RecipeError: `values` name a blank the recipe lacks or miss one it has.
            DefinitionError: a bad name, trigger, offset or mode, a time zone
                the zone data does not know, the recipe names a tool this
                Relay has not registered, or the template, a value, the filled
                task or the whole schedule is over its bound (see
                `scheduler.schedules`; the message names it).
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
            **options,
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

    # --- pause, resume, run now, backfill, history ------------------------------------------

    def pause(self, name: str, note: str = "", *, now_ms: int | None = None) -> Schedule:
        """Pause a schedule: none of its times fire until `resume` (run now and backfill
        still do). Returns the paused schedule.

        Raises:
            RelayError: no such schedule, or the note is over 500 characters.
        """
        return self._change(name, paused=True, note=note, now_ms=now_ms)

    def resume(self, name: str, note: str = "", *, now_ms: int | None = None) -> Schedule:
        """Resume a paused schedule from now: times that passed while it was paused are
        not made up (backfill them if they should be)."""
        return self._change(name, paused=False, note=note, now_ms=now_ms)

    def _change(self, name: str, *, paused: bool, note: str, now_ms: int | None) -> Schedule:
        now = clock() if now_ms is None else now_ms
        if len(note) > 500:
            raise RelayError("a pause note is at most 500 characters")
        for _ in range(10):  # another writer (a tick's claim) may change it in between
            with self.store.errors():
                read = self.schedule_store.read(name)
                if read is None:
                    raise RelayError(f"no schedule named {name!r}")
                was = read.schedule
                changes: dict[str, object] = {"paused": paused, "pause_note": note}
                if was.paused and not paused:
                    changes["last_run_ms"] = max(was.last_run_ms, now)
                changed = was.model_copy(update=changes)
                kind = "paused" if paused else "resumed"
                entry = Firing(kind=kind, slot_ms=now, at_ms=now, source="person", why=note)
                if self.schedule_store.update(read, changed, entry):
                    return changed
        raise RelayError(f"schedule {name!r} kept changing; try again")

    def run_now(self, name: str, *, now_ms: int | None = None) -> int:
        """Fire the schedule once now, under its overlap policy (the next tick starts
        it); return the firing's time. Counted in its history as "run now".

        Raises:
            RelayError: no such schedule.
        """
        now = clock() if now_ms is None else now_ms
        self._known(name)
        with self.store.errors():
            self.schedule_store.enqueue(name, [Queued("run now", now)])
        return now

    def backfill(self, name: str, start_ms: int, end_ms: int, *, force: bool = False) -> list[int]:
        """Queue the schedule's firings from `start_ms` to `end_ms` (both included);
        return their times. The tick starts them one after another (each once the run
        before it has ended; all at once under allow_all), each exactly once.

        Raises:
            RelayError: no such schedule, the range is backwards, or it holds more
                than BACKFILL_MAX firings (BACKFILL_FORCED_MAX with `force`).
        """
        schedule = self._known(name)
        if end_ms < start_ms:
            raise RelayError("a backfill's --to comes before its --from")
        cap = BACKFILL_FORCED_MAX if force else BACKFILL_MAX
        slots = _firings_between(schedule, start_ms, end_ms, cap + 1)
        if len(slots) > cap:
            more = "" if force else f" (--force allows up to {BACKFILL_FORCED_MAX:,})"
            raise RelayError(f"the range holds more than {cap:,} firings of {name!r}{more}")
        with self.store.errors():
            for chunk in range(0, len(slots), 10_000):
                batch = [Queued("backfill", slot) for slot in slots[chunk : chunk + 10_000]]
                self.schedule_store.enqueue(name, batch)
        return slots

    def history(self, name: str, limit: int = 50) -> list[FiringView]:
        """Return what the schedule's firings did, newest first, each with its run's
        state and stop where it started one."""
        with self.store.errors():
            entries = self.schedule_store.history(name, limit)
            ids = [entry.run_id for entry in entries if entry.kind == "fired" and entry.run_id]
            briefs = dict(zip(ids, self.store.briefs(ids), strict=True))
        views = []
        for entry in entries:
            state, stop = briefs.get(entry.run_id or "") or (None, None)
            views.append(FiringView(firing=entry, state=state, stop=stop))
        return views

    def last(self, name: str, kind: FiringKind) -> tuple[Firing | None, int]:
        """Return the schedule's newest history entry of `kind` (None: there is none), and
        how many entries were looked through: HISTORY_MAX when the history is full, so
        "none" means none among them, not never."""
        with self.store.errors():
            entries = self.schedule_store.history(name, HISTORY_MAX)
        found = next((entry for entry in entries if entry.kind == kind), None)
        return found, len(entries)

    def get(self, name: str) -> Schedule | None:
        """Return the schedule called `name`, or None (also when its stored text is unusable)."""
        with self.store.errors():
            return self.schedule_store.get(name)

    def _known(self, name: str) -> Schedule:
        found = self.get(name)
        if found is None:
            raise RelayError(f"no schedule named {name!r}")
        return found


def _firings_between(schedule: Schedule, start_ms: int, end_ms: int, most: int) -> list[int]:
    """The schedule's firings from `start_ms` to `end_ms`, at most `most` of them. An
    `Every` schedule has no clock grid: its firings in a range start at the range's start."""
    trigger = schedule.trigger
    if isinstance(trigger, Every):
        step = trigger.minutes * 60_000
        return list(range(start_ms, end_ms + 1, step)[:most])
    slots: list[int] = []
    at = start_ms - 1
    offset = schedule.utc_offset_minutes
    while len(slots) < most:
        at = calendar.next_fire(trigger, at, utc_offset_minutes=offset)
        if at > end_ms:
            break
        slots.append(at)
    return slots
