"""The tick with an injected clock, against a real private Redis and a small host that records
what it was asked to start.

Each test runs twice: on a single Redis (one set of schedule keys), and on the
session's private Redis Cluster with the schedules in shards by hash slot
(workers.store.schedule_shards), each test under a key prefix of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from agent_core import Daily, Every, Trigger, Weekly
from scheduler import ScheduleStore, StoreUnreachable, tick
from scheduler.store import READ_MAX, UNREADABLE_RETRY_MS, Queued, fire_id
from scheduler.tick import REFIRE_AFTER_MS
from tests.support.redis_cluster import redis_cluster
from tests.support.schedule_host import (
    DAY,
    HOUR,
    MINUTE,
    T0,
    RecordingHost,
    Started,
    claim,
    host,
    make,
    stores,
)

__all__ = ["host", "redis_cluster", "stores"]  # the fixtures, used here


def fired_slots(host: RecordingHost) -> list[str | None]:
    return [s.schedule for s in host.starts]


@pytest.mark.parametrize(
    ("trigger", "made", "offset", "first_slot"),
    [
        (Every(5), T0, 0, T0 + 5 * MINUTE),
        # 2023-11-14 22:13:20 UTC; 09:00 UTC next is 2023-11-15 09:00.
        (Daily(9, 0), T0, 0, 1_700_038_800_000),
        # At +05:45 it is 2023-11-15 03:58:20 local; 09:00 local is 03:15 UTC that day.
        (Daily(9, 0), T0, 345, 1_700_018_100_000),
        # Weekly on Wednesday 00:00 at -07:00: 2023-11-15 07:00 UTC.
        (Weekly(2, 0, 0), T0, -420, 1_700_031_600_000),
    ],
)
def test_a_schedule_does_not_fire_early_and_fires_at_its_slot(
    host: RecordingHost, trigger: Trigger, made: int, offset: int, first_slot: int
) -> None:
    schedule = make(trigger=trigger, at=made, offset=offset)
    host.schedule_store.put(schedule)
    assert schedule.next_due_ms == first_slot

    assert tick(host, made) == []
    assert tick(host, first_slot - 1) == []
    assert host.starts == []

    assert tick(host, first_slot) == ["run-1"]
    assert host.heals == [made, first_slot - 1, first_slot]
    # It healed before it fired: lapsed calls are not kept waiting behind firings.
    assert host.started_before_heal == [0, 0, 0]


def test_each_slot_fires_once_however_often_the_tick_comes(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(5)))
    slot = T0 + 5 * MINUTE
    started = []
    for now in (slot, slot, slot + 1, slot + 4_000, slot + 2 * MINUTE, slot + 5 * MINUTE - 1):
        started += tick(host, now)  # a retried tick, a late tick, many ticks
    assert started == ["run-1"]
    stored = host.schedule_store.get("daily-check")
    assert stored is not None
    # Fired late, it keeps its rhythm: the next slot is five minutes after the slot.
    assert stored.last_run_ms == slot
    assert stored.next_due_ms == slot + 5 * MINUTE

    assert tick(host, slot + 5 * MINUTE) == ["run-2"]
    assert tick(host, slot + 5 * MINUTE + 3_000) == []
    assert len(host.starts) == 2


@pytest.mark.parametrize(
    ("trigger", "down_for"),
    [(Every(1), 10 * HOUR), (Daily(9, 30), 5 * DAY), (Weekly(0, 8, 0), 30 * DAY)],
)
def test_slots_missed_while_down_fire_once(
    host: RecordingHost, trigger: Trigger, down_for: int
) -> None:
    host.schedule_store.put(make(trigger=trigger))
    back = T0 + down_for
    assert tick(host, back) == ["run-1"]
    assert tick(host, back + 1) == []
    assert tick(host, back + 30_000) == []
    stored = host.schedule_store.get("daily-check")
    assert stored is not None
    assert stored.last_run_ms == back
    assert stored.next_due_ms == trigger.next_after(back, 0) > back
    assert len(host.starts) == 1


def test_six_concurrent_ticks_at_one_moment_fire_each_slot_once(
    stores: Callable[[], ScheduleStore],
) -> None:
    """Six threads, each with its own Redis connection (as six worker processes would
    have), tick at the same instant, slot after slot, over several schedules."""
    names = [f"s{i}" for i in range(5)]
    seed = stores()
    for name in names:
        seed.put(make(name, Every(1), thing=name))
    # One fleet: the runs any of them started are the runs all of them see.
    ids: dict[str, str] = {}
    lock = threading.Lock()
    hosts = [RecordingHost(stores(), ids=ids, lock=lock) for _ in range(6)]
    rounds = 25
    barrier = threading.Barrier(len(hosts))
    errors: list[BaseException] = []

    def ticker(host: RecordingHost) -> None:
        try:
            for index in range(1, rounds + 1):
                barrier.wait(timeout=30)
                tick(host, T0 + index * MINUTE)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=ticker, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    fired = [start.schedule for h in hosts for start in h.starts]
    assert sorted(map(str, fired)) == sorted(names * rounds)
    for name in names:
        stored = seed.get(name)
        assert stored is not None
        assert stored.last_run_ms == T0 + rounds * MINUTE


def test_a_schedule_removed_while_due_does_not_fire(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make())
    slot = T0 + 5 * MINUTE
    [seen] = store.due(slot)  # a tick has read it ...
    assert store.remove("daily-check") is True  # ... when it is removed
    assert claim(store, seen, slot) is False
    assert tick(host, slot) == []
    assert tick(host, slot + DAY) == []
    assert host.starts == []
    assert store.remove("daily-check") is False


def test_a_schedule_replaced_while_due_fires_the_replacement_on_its_own_times(
    host: RecordingHost,
) -> None:
    store = host.schedule_store
    store.put(make(thing="the old ledger"))
    slot = T0 + 5 * MINUTE
    [seen] = store.due(slot)  # a tick has read the old one ...
    replaced = store.put(make(thing="the new ledger", at=slot + 1_000))  # ... when it is replaced
    assert replaced is True
    assert claim(store, seen, slot + 2_000) is False  # the old one's slot does not fire
    assert tick(host, slot + 2_000) == []  # the new one was made a moment ago: not due
    assert [s.name for s in store.all()] == ["daily-check"]

    assert tick(host, slot + 1_000 + 5 * MINUTE) == ["run-1"]
    assert host.starts[0].task == "Check the new ledger and report."


def test_a_slow_tick_that_read_a_schedule_long_ago_fires_nothing(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make(trigger=Every(1)))
    slot = T0 + MINUTE
    [slow] = store.due(slot)
    assert tick(host, slot) == ["run-1"]  # a quick tick fires the slot
    assert tick(host, slot + MINUTE) == ["run-2"]  # and the next
    assert claim(store, slow, slot + 3 * MINUTE) is False  # the slow one wakes up
    assert len(host.starts) == 2


def test_a_fired_run_has_the_filled_task_the_recipe_tools_and_the_schedule_notes(
    host: RecordingHost,
) -> None:
    host.schedule_store.put(make(thing="notes/today.txt"))
    host.notes["daily-check"] = ["first note", "second note"]
    tick(host, T0 + 5 * MINUTE)
    assert host.starts == [
        Started(
            task="Check notes/today.txt and report.",
            tools=("read_note",),
            notes=("first note", "second note"),
            recipe="check",
            schedule="daily-check",
            run_id=fire_id("daily-check", T0 + 5 * MINUTE),
            fired_ms=T0 + 5 * MINUTE,
        )
    ]


def test_a_schedule_without_notes_still_gets_memory(host: RecordingHost) -> None:
    # An empty list, not None: the run may `remember` even before any note exists.
    host.schedule_store.put(make())
    tick(host, T0 + 5 * MINUTE)
    assert host.starts[0].notes == ()


def test_a_notify_only_schedule_records_a_notification_once_instead_of_a_run(
    host: RecordingHost,
) -> None:
    store = host.schedule_store
    store.put(make("remind", Every(5), mode="notify", thing="the backups"))
    slot = T0 + 5 * MINUTE
    for now in (slot, slot, slot + 1_000):
        assert tick(host, now) == []
    assert host.starts == []
    [notice] = store.notifications()
    assert (notice.schedule, notice.task, notice.slot_ms, notice.at_ms, notice.problem) == (
        "remind",
        "Check the backups and report.",
        slot,
        slot,
        "",
    )
    tick(host, slot + 5 * MINUTE)
    assert [n.slot_ms for n in store.notifications()] == [slot + 5 * MINUTE, slot]


def test_a_run_that_cannot_start_is_recorded_as_failed_and_others_still_fire(
    host: RecordingHost,
) -> None:
    store = host.schedule_store
    store.put(make("broken"))
    store.put(make("fine"))
    host.refuse.add("broken")
    slot = T0 + 5 * MINUTE
    assert tick(host, slot) == ["run-1"]
    assert fired_slots(host) == ["fine"]
    [entry] = store.history("broken")  # its `fired` entry, replaced: told once, as it went
    assert (entry.kind, entry.slot_ms, entry.at_ms, entry.source, entry.run_id) == (
        "failed", slot, slot, "schedule", None,
    )  # fmt: skip
    assert entry.why == "the run could not start: unknown tools: read_note"
    assert [e.kind for e in store.history("fine")] == ["fired"]
    [notice] = store.notifications()
    assert (notice.schedule, notice.slot_ms, notice.problem, notice.task) == (
        "broken", slot, entry.why, "",
    )  # fmt: skip
    assert tick(host, slot + 1) == []  # the slot is spent, not retried every tick
    assert store.stale_firings(slot + DAY) == []  # nor started by a later tick
    assert store.recent_runs("broken") == []  # nor a run its overlap policy waits for


def test_a_failed_start_does_not_make_the_next_firing_wait_for_it(host: RecordingHost) -> None:
    """Under overlap skip, a run that never started is not one still going: a run-now
    firing right after it starts (it was skipped as "starting" before)."""
    store = host.schedule_store
    store.put(make("broken"))
    host.refuse.add("broken")
    slot = T0 + 5 * MINUTE
    assert tick(host, slot) == []
    host.refuse.clear()
    store.enqueue("broken", [Queued("run now", slot + 1_000)])
    assert tick(host, slot + 1_000) == ["run-1"]
    assert [e.kind for e in store.history("broken")] == ["fired", "failed"]


def test_a_queued_or_refired_firing_that_cannot_start_is_failed_too(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make("broken"))
    host.refuse.add("broken")
    store.enqueue("broken", [Queued("run now", T0 + MINUTE)])
    assert tick(host, T0 + MINUTE) == []
    # A slot claimed by a tick that died before starting its run: a later tick tries it.
    due = store.due(T0 + 5 * MINUTE)[0]
    assert claim(store, due, T0 + 5 * MINUTE)
    assert tick(host, T0 + 5 * MINUTE + REFIRE_AFTER_MS + 1) == []
    entries = store.history("broken")
    assert [(e.kind, e.source, e.slot_ms) for e in entries] == [
        ("failed", "schedule", T0 + 5 * MINUTE),
        ("failed", "run now", T0 + MINUTE),
    ]
    assert all(e.why == "the run could not start: unknown tools: read_note" for e in entries)
    assert store.stale_firings(T0 + DAY) == []


def test_a_failing_schedule_stores_its_reason_cut_short_and_never_its_task(
    host: RecordingHost,
) -> None:
    """The issue's case: each firing of a schedule whose task no run takes fails. What it
    leaves per firing stays small, however long the task and the error quoting it."""
    store = host.schedule_store
    long_task = "y" * 9_990  # the longest value; a schedule stored before the bounds was 10 MB
    store.put(make("broken", thing=long_task))
    host.refuse.add("broken")
    host.refusal = f"the task is too long: {'Check ' + long_task * 100}"  # 1 MB of error
    firings = 5
    for n in range(1, firings + 1):
        assert tick(host, T0 + n * 5 * MINUTE) == []
    keys = store.shards.of("broken")
    history = store.redis.lrange(keys.history("broken"), 0, -1)
    notices = store.redis.lrange(keys.notifications, 0, -1)
    assert len(history) == len(notices) == firings
    for stored in history + notices:
        assert len(stored) < 900, len(stored)  # REASON_MAX characters and the JSON around them
        assert b"y" * 1_000 not in stored
    [entry, *_] = store.history("broken")
    assert entry.kind == "failed"
    assert entry.why.startswith("the run could not start: the task is too long: Check yyy")
    assert "[… cut: " in entry.why


def test_an_unreadable_stored_schedule_is_skipped_and_the_others_fire(
    host: RecordingHost,
) -> None:
    store = host.schedule_store
    store.put(make("good"))
    store.put(make("bad"))
    store.redis.hset(store.shards.of("bad").schedules, "bad", '{"name": "bad", "recipe": 1}')
    assert tick(host, T0 + 5 * MINUTE) == ["run-1"]
    assert fired_slots(host) == ["good"]
    assert [s.name for s in store.all()] == ["good"]
    assert store.get("bad") is None


def test_a_stale_due_index_never_fires_early(host: RecordingHost) -> None:
    # The stored schedule decides, not the index: a wrong score cannot fire a slot early.
    store = host.schedule_store
    store.put(make())
    store.redis.zadd(store.shards.of("daily-check").due, {"daily-check": 0})
    assert tick(host, T0 + MINUTE) == []
    assert tick(host, T0 + 5 * MINUTE) == ["run-1"]


def test_two_schedules_due_together_both_fire(host: RecordingHost) -> None:
    host.schedule_store.put(make("a", Every(2)))
    host.schedule_store.put(make("b", Every(3)))
    assert tick(host, T0 + 3 * MINUTE) == ["run-1", "run-2"]
    assert sorted(fired_slots(host)) == ["a", "b"]  # type: ignore[type-var]


def test_a_slot_whose_tick_stopped_before_the_run_is_started_later_once(
    host: RecordingHost,
) -> None:
    schedule = make("retry")
    host.schedule_store.put(schedule)
    slot = schedule.next_due_ms
    # The tick wins the slot, then cannot start the run (say Redis went away).
    host.unreachable = 1
    with pytest.raises(StoreUnreachable):
        tick(host, slot)
    assert host.starts == []
    # Not before its time: the claiming tick may still be on its way.
    assert tick(host, slot + 1_000) == []
    # Then a later tick starts it, once, however many ticks look at it.
    later = slot + REFIRE_AFTER_MS + 1
    assert tick(host, later) == ["run-1"]
    assert tick(host, later + 1) == []
    assert len(host.starts) == 1
    assert host.starts[0].schedule == "retry"


def test_every_try_at_a_slot_names_the_same_run(host: RecordingHost) -> None:
    schedule = make("same")
    host.schedule_store.put(schedule)
    slot = schedule.next_due_ms
    assert fire_id("same", slot) == fire_id("same", slot)
    assert fire_id("same", slot) != fire_id("same", slot + 1)
    assert fire_id("same", slot) != fire_id("other", slot)
    assert tick(host, slot) == ["run-1"]
    assert list(host.ids) == [fire_id("same", slot)]
    # A retry with that id (a tick that found the slot still firing) starts nothing new.
    assert host.start("task", run_id=fire_id("same", slot)) == "run-1"
    assert len(host.starts) == 1


def test_a_firing_entry_no_claim_wrote_is_dropped_and_fires_nothing(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make("real"))
    # A stranger with Redis access writes entries of no schedule into a firing index.
    store.redis.zadd(store.shards.of("real").firing, {"no-slot-here": 0, "ghost|12": 0})
    assert tick(host, T0 + MINUTE) == []  # ghost: no such schedule, so nothing to start
    assert host.starts == []
    assert store.stale_firings(T0 + DAY) == []  # both gone
    assert tick(host, T0 + 5 * MINUTE) == ["run-1"]  # the real one still fires


def test_notifications_of_many_schedules_come_back_newest_first(host: RecordingHost) -> None:
    store = host.schedule_store
    names = [f"n{i}" for i in range(12)]  # on a cluster, a dozen shards
    for index, name in enumerate(names):
        store.put(make(name, Every(5 + index), mode="notify"))
    for minute in range(5, 20):
        tick(host, T0 + minute * MINUTE)
    notices = store.notifications(limit=1_000)
    fired = sum(len(range(5 + i, 20, 5 + i)) for i in range(12))
    assert len(notices) == fired
    times = [notice.at_ms for notice in notices]
    assert times == sorted(times, reverse=True)
    assert {notice.schedule for notice in notices} == set(names)
    assert store.notifications(limit=3) == notices[:3]
    assert [s.name for s in store.all()] == sorted(names)


def test_due_entries_of_no_schedule_never_hold_back_the_others(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make("real"))
    # More index entries than a tick reads, all due before it: names of no schedule,
    # and one schedule that cannot be read.
    junk = [f"junk{n}" for n in range(READ_MAX)]
    pipe = store.redis.pipeline(transaction=False)
    for name in junk:
        store.shards.enlist(name)
        pipe.zadd(store.shards.of(name).due, {name: 0})
    pipe.execute()
    store.put(make("unreadable"))
    store.redis.hset(store.shards.of("unreadable").schedules, "unreadable", "{")
    store.redis.zadd(store.shards.of("unreadable").due, {"unreadable": 0})
    slot = T0 + 5 * MINUTE
    started = [*tick(host, slot), *tick(host, slot + 1)]
    assert fired_slots(host) == ["real"]
    assert len(started) == 1
    # The junk went; the unreadable one is looked at again in an hour, not every tick.
    assert store.shards.lowest("due", slot + 1, READ_MAX) == []
    indexed = dict(store.shards.lowest("due", slot + 2 * UNREADABLE_RETRY_MS, 10))
    assert set(indexed) == {"real", "unreadable"}
    assert indexed["unreadable"] >= slot + UNREADABLE_RETRY_MS
