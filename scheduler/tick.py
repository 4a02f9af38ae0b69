"""The tick: everything the fleet does every few seconds, with the clock passed in.

For each due schedule the tick decides what its slot does, then claims it
(`ScheduleStore.claim`: exactly one claimer per schedule and slot, however many
ticks run at once) with that decision, which the claim writes to the history:

    the slot is ...                               it is recorded   and
    later than the catch-up window allows         missed           nothing starts
    of a notify-only schedule                     notified         a notification
    free: no run the schedule started still goes  fired            the run starts
    busy, overlap skip                            skipped          nothing starts
    busy, overlap buffer_one                      buffered         it starts when the
                                                  (or skipped if   run before it ends
                                                  one is already)
    busy, overlap allow_all                       fired            the run starts
    busy, overlap cancel_previous                 fired            the runs still going
                                                                   are cancelled first

A fired slot whose run then cannot start is recorded as failed, with why (not the task).

A tick first heals the runtime (re-sends what was never sent, declines expired
approvals): a dead worker's call is promised within the recovery time, whatever
is due. A run starts with the filled recipe, only the recipe's tools, the notes the
schedule's earlier runs remembered, the schedule's policy and, with
`approve_plan`, its plan approved by the schedule. Then the tick takes queued
firings (`relay schedule run`, backfill, buffered): each starts once no run of
the schedule goes (at once under allow_all; a run-now firing meets the policy
as a slot does: skipped under skip, cancelling under cancel_previous).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from agent_core import Every, Policy
from agent_core.text import cut
from scheduler.calendar import next_fire
from scheduler.errors import StoreUnreachable
from scheduler.history import Firing
from scheduler.schedules import Schedule
from scheduler.store import Due, Notification, Queued, ScheduleStore, SlotOutcome, fire_id

__all__ = ["GOING", "TickHost", "tick"]

log = logging.getLogger(__name__)

REFIRE_AFTER_MS = 60_000
"""A claimed slot whose run is not confirmed after this long is started by a later tick."""
QUEUE_PER_TICK = 100
"""Queued firings one tick takes of one schedule at most (under allow_all)."""
GOING = ("running", "waiting")
"""Run states that make a schedule busy for its overlap policy."""
REASON_MAX = 500
"""The longest reason a failed firing keeps (characters), in its history and notification."""


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
        policy: Policy | None = None,
        approve_plan: bool = False,
        fired_ms: int | None = None,
        on_wait: str = "wait",
    ) -> str:
        """Start a run and return its id; with `run_id`, a run of that id that exists
        already is left as it is (starting it again does nothing)."""
        ...

    def run_states(self, run_ids: Sequence[str]) -> list[str | None]:
        """Return each run's state ("running", "waiting", "finished"), None if unknown."""
        ...

    def cancel(self, run_id: str, reason: str = "") -> bool:
        """Cancel a run; False if it had ended."""
        ...

    def heal(self, now: int) -> int:
        """Re-send messages nobody dealt with and decline expired approvals."""
        ...


def tick(relay: TickHost, now_ms: int) -> list[str]:
    """Heal the runtime, then fire every schedule due at `now_ms` and take queued
    firings; return the ids of runs it started.

    A run that cannot be started (say a tool was unregistered since) loses its
    slot: its history says `failed` and why, and so does a notification; the other
    schedules still fire.

    Raises:
        whatever the Redis client raises when Redis cannot be reached.
    """
    # Heal first: a dead worker's call is promised within the recovery time, and a
    # fleet with many schedules due must not spend that time firing them first.
    relay.heal(now_ms)
    store = relay.schedule_store
    started = [
        r for r in (_refire(relay, store, n, q, now_ms) for n, q in _stale(store, now_ms)) if r
    ]
    for due in store.due(now_ms):
        started += _fire(relay, store, due, now_ms)
    for name in store.queued_names(now_ms):
        started += _drain(relay, store, name, now_ms)
    return started


def _stale(store: ScheduleStore, now_ms: int) -> list[tuple[str, Queued]]:
    return store.stale_firings(now_ms - REFIRE_AFTER_MS)


def _refire(
    relay: TickHost, store: ScheduleStore, name: str, firing: Queued, now_ms: int
) -> str | None:
    """Start the run of a slot whose claiming tick stopped before it started it."""
    schedule = store.get(name)
    if schedule is None:  # removed since: nothing to start
        store.forget_firing(name, firing)
        return None
    log.warning(
        "schedule %r: starting the run of slot %d, which its tick never started",
        name,
        firing.slot_ms,
    )
    return _start(relay, store, schedule, firing, now_ms)


def _fire(relay: TickHost, store: ScheduleStore, due: Due, now_ms: int) -> list[str]:
    """Decide what the due slot does, claim it so and, if this tick won a firing, start
    its run; return the run's id in a list (empty when nothing started here)."""
    schedule = due.schedule
    slot, missed = _catch_up(schedule, due.slot_ms, now_ms)
    if slot is None:
        outcome = SlotOutcome(Firing(kind="missed", slot_ms=due.slot_ms, at_ms=now_ms, why=missed))
        store.claim(due, due.slot_ms, now_ms, outcome)
        return []
    if schedule.mode == "notify":
        task = schedule.task()
        notice = Notification(schedule=schedule.name, task=task, slot_ms=slot, at_ms=now_ms)
        firing = Firing(kind="notified", slot_ms=slot, at_ms=now_ms, why=missed)
        store.claim(due, slot, now_ms, SlotOutcome(firing, notification=notice))
        return []
    going = _going(relay, store, schedule, now_ms)
    outcome = _decide(store, schedule, Queued("schedule", slot), now_ms, going=going, note=missed)
    if not store.claim(due, slot, now_ms, outcome) or not outcome.starts:
        return []
    return _replace(relay, store, schedule, Queued("schedule", slot), now_ms, going=going)


def _decide(
    store: ScheduleStore,
    schedule: Schedule,
    firing: Queued,
    now_ms: int,
    *,
    going: list[tuple[str, str]],
    note: str = "",
) -> SlotOutcome:
    """What a firing does under the schedule's overlap policy, `going` being its runs
    that still run or wait."""
    run_id = fire_id(schedule.name, firing.slot_ms, firing.source)
    entry = Firing(
        kind="fired",
        slot_ms=firing.slot_ms,
        at_ms=now_ms,
        source=firing.source,
        run_id=run_id,
        why=note,
    )
    if not going or schedule.overlap == "allow_all":
        return SlotOutcome(entry)
    busy = "; ".join(f"run {run} is still {state}" for run, state in going[:3])
    if schedule.overlap == "cancel_previous":
        return SlotOutcome(entry.model_copy(update={"why": f"cancelled: {busy}"}))
    skipped = entry.model_copy(update={"kind": "skipped", "run_id": None, "why": busy})
    if schedule.overlap == "buffer_one" and firing.source == "schedule":
        if any(q.source == "buffer" for q in store.queue(schedule.name, QUEUE_PER_TICK)):
            waits = f"one firing waits already; {busy}"
            return SlotOutcome(skipped.model_copy(update={"why": waits}))
        buffered = entry.model_copy(update={"kind": "buffered", "why": busy})
        return SlotOutcome(buffered, queue=Queued("buffer", firing.slot_ms))
    return SlotOutcome(skipped)


def _drain(relay: TickHost, store: ScheduleStore, name: str, now_ms: int) -> list[str]:
    """Take the schedule's queued firings that may start now; return the runs started."""
    schedule = store.get(name)
    if schedule is None:
        return []  # removed: its queue went with it, and the index entry with the next take
    going = _going(relay, store, schedule, now_ms)
    started: list[str] = []
    for queued in store.queue(name, QUEUE_PER_TICK):
        if queued.slot_ms > now_ms:
            break
        run_now = queued.source == "run now"
        if going and schedule.overlap != "allow_all" and not run_now:
            break  # backfilled and buffered firings wait for the run before them to end
        if going and run_now and schedule.overlap == "buffer_one":
            break  # it waits, as a buffered firing would
        outcome = _decide(store, schedule, queued, now_ms, going=going)
        if not store.take(name, queued, now_ms, outcome.firing) or not outcome.starts:
            continue
        started += _replace(relay, store, schedule, queued, now_ms, going=going)
        if schedule.overlap != "allow_all":
            going = [(fire_id(name, queued.slot_ms, queued.source), "running")]
    return started


def _replace(
    relay: TickHost,
    store: ScheduleStore,
    schedule: Schedule,
    firing: Queued,
    now_ms: int,
    *,
    going: list[tuple[str, str]],
) -> list[str]:
    """Start the firing's run, cancelling first what cancel_previous replaces."""
    if schedule.overlap == "cancel_previous":
        for previous, _ in going:
            relay.cancel(previous, f"schedule {schedule.name!r} fired again (cancel_previous)")
    run_id = _start(relay, store, schedule, firing, now_ms)
    return [] if run_id is None else [run_id]


def _going(
    relay: TickHost, store: ScheduleStore, schedule: Schedule, now_ms: int
) -> list[tuple[str, str]]:
    """The runs the schedule started that still run or wait (none asked under allow_all)."""
    if schedule.overlap == "allow_all":
        return []
    recent = store.recent_runs(schedule.name)
    if not recent:
        return []
    states = relay.run_states([run_id for run_id, _ in recent])
    going = []
    for (run_id, started_ms), state in zip(recent, states, strict=True):
        if state in GOING:
            going.append((run_id, state))
        elif state is None and now_ms - started_ms < 2 * REFIRE_AFTER_MS:
            # Claimed, but its start is not done yet (a later tick may still start it);
            # one unknown for longer is gone (expired, or never startable).
            going.append((run_id, "starting"))
    return going


def _catch_up(schedule: Schedule, slot_ms: int, now_ms: int) -> tuple[int | None, str]:
    """The slot to fire (None: none, it was missed) and what was missed, as history says it.

    Without a catch-up window every late slot fires (once, however many passed).
    With one, a slot later than the window is missed; the first slot within the
    window, if one has come, fires in its place.
    """
    window = schedule.catch_up_ms
    if window is None or now_ms - slot_ms <= window + schedule.jitter_offset_ms:
        return slot_ms, ""
    trigger, earliest = schedule.trigger, now_ms - window - schedule.jitter_offset_ms
    if isinstance(trigger, Every):  # its slots keep the rhythm of the missed one
        interval = trigger.minutes * 60_000
        within = slot_ms + -(-(earliest - slot_ms) // interval) * interval
    else:
        within = next_fire(trigger, earliest - 1, utc_offset_minutes=schedule.utc_offset_minutes)
    missed = f"missed from {schedule.local_time(slot_ms)}: older than the catch-up window"
    return (within if within <= now_ms else None), missed


def _start(
    relay: TickHost, store: ScheduleStore, schedule: Schedule, firing: Queued, now_ms: int
) -> str | None:
    """Start the firing's run under its own run id, then forget the slot as firing."""
    try:
        # Notes are read after the claim: only the run that fires needs them.
        run_id = relay.start(
            schedule.task(),
            tools=schedule.tools,
            notes=relay.schedule_notes(schedule.name),
            recipe=schedule.recipe.name,
            schedule=schedule.name,
            run_id=fire_id(schedule.name, firing.slot_ms, firing.source),
            budget=schedule.budget,
            policy=schedule.policy,
            approve_plan=schedule.approve_plan,
            fired_ms=firing.slot_ms,
            on_wait=schedule.on_wait,
        )
    except StoreUnreachable:
        raise  # the store is away: the slot stays firing, and a later tick starts it
    except Exception as error:  # noqa: BLE001 - one schedule's failure must not stop the others
        _failed(store, schedule.name, firing, now_ms, str(error))
        return None
    store.fired(schedule.name, firing)
    return run_id


def _failed(store: ScheduleStore, name: str, firing: Queued, now_ms: int, error: str) -> None:
    """Record a firing whose run could not start: failed in its history and a notification,
    each with the reason cut short (an error may quote the task), never the task."""
    reason = cut(f"the run could not start: {error}", REASON_MAX)
    log.warning("schedule %r: %s", name, reason)
    entry = Firing(
        kind="failed", slot_ms=firing.slot_ms, at_ms=now_ms, source=firing.source, why=reason
    )
    store.failed(name, firing, entry)
    store.notify(Notification(schedule=name, slot_ms=firing.slot_ms, at_ms=now_ms, problem=reason))
