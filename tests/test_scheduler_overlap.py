"""What a firing does while the schedule's last run still goes, and the firings asked for
outside its times (run now, backfill, buffered), with pause, resume, the catch-up window,
jitter and the end: the tick with an injected clock against a real Redis (and the
session's Redis Cluster), and a host that says which runs still run or wait."""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent_core import Cron, Daily, Every, Policy, Risk
from scheduler import ScheduleStore, tick
from scheduler.history import Firing
from scheduler.schedules import NEVER_MS
from scheduler.store import Queued, fire_id
from tests.support.redis_cluster import redis_cluster
from tests.support.schedule_host import (
    DAY,
    HOUR,
    MINUTE,
    T0,
    RecordingHost,
    host,
    make,
    stores,
)

__all__ = ["host", "redis_cluster", "stores"]  # the fixtures, used here


def waiting(host: RecordingHost) -> None:
    """Every run started so far waits for a person until the test says otherwise."""
    for run_id in host.ids:
        host.states.setdefault(run_id, "waiting")


def finish_all(host: RecordingHost) -> None:
    for run_id in host.ids:
        host.states[run_id] = "finished"


def kinds(history: list[Firing]) -> list[str]:
    return [entry.kind for entry in reversed(history)]  # oldest first


def tick_minutes(host: RecordingHost, first: int, last: int, *, hold: bool = True) -> None:
    for minute in range(first, last + 1):
        tick(host, T0 + minute * MINUTE)
        if hold:
            waiting(host)


def test_skip_leaves_one_run_waiting_and_records_each_skipped_firing(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(1)))
    tick_minutes(host, 1, 10)
    assert len(host.starts) == 1
    first = fire_id("daily-check", T0 + MINUTE)
    history = host.schedule_store.history("daily-check")
    assert kinds(history) == ["fired"] + ["skipped"] * 9
    assert {entry.why for entry in history[:-1]} == {f"run {first} is still waiting"}
    assert history[-1].run_id == first

    finish_all(host)
    tick(host, T0 + 11 * MINUTE)
    assert [s.fired_ms for s in host.starts] == [T0 + MINUTE, T0 + 11 * MINUTE]


def test_buffer_one_keeps_one_firing_for_when_the_run_ends(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(1), overlap="buffer_one"))
    tick_minutes(host, 1, 4)
    assert len(host.starts) == 1
    assert kinds(host.schedule_store.history("daily-check")) == [
        "fired",
        "buffered",
        "skipped",
        "skipped",
    ]
    finish_all(host)
    tick(host, T0 + 4 * MINUTE + 10_000)  # no slot due: the buffered one starts
    assert [s.run_id for s in host.starts] == [
        fire_id("daily-check", T0 + MINUTE),
        fire_id("daily-check", T0 + 2 * MINUTE),  # the buffered slot's own run
    ]
    latest = host.schedule_store.history("daily-check")[0]
    assert (latest.kind, latest.source) == ("fired", "buffer")
    tick(host, T0 + 4 * MINUTE + 20_000)
    assert len(host.starts) == 2  # taken once


def test_allow_all_starts_every_firing(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(1), overlap="allow_all"))
    tick_minutes(host, 1, 5)
    assert len(host.starts) == 5


def test_cancel_previous_cancels_the_run_still_going_and_starts_the_new_one(
    host: RecordingHost,
) -> None:
    host.schedule_store.put(make(trigger=Every(1), overlap="cancel_previous"))
    tick_minutes(host, 1, 3)
    runs = [fire_id("daily-check", T0 + m * MINUTE) for m in (1, 2, 3)]
    assert [s.run_id for s in host.starts] == runs
    assert host.cancelled == runs[:2]
    assert (
        host.schedule_store.history("daily-check")[0].why
        == f"cancelled: run {runs[1]} is still waiting"
    )


def test_a_backfill_under_two_racing_ticks_starts_each_firing_once(
    stores: Callable[[], ScheduleStore],
) -> None:
    ids: dict[str, str] = {}
    lock = threading.Lock()
    hosts = [RecordingHost(stores(), ids=ids, lock=lock) for _ in range(2)]
    hosts[0].schedule_store.put(make("hourly", Every(60), overlap="allow_all", at=T0))
    slots = [T0 - DAY + h * HOUR for h in range(24)]
    for slot in slots:
        hosts[0].schedule_store.enqueue("hourly", [_backfilled(slot)])
    barrier = threading.Barrier(2)

    def ticker(host: RecordingHost) -> None:
        for second in range(3):
            barrier.wait(timeout=30)
            tick(host, T0 + second * 1_000)

    threads = [threading.Thread(target=ticker, args=(h,)) for h in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    started = [s.fired_ms or 0 for h in hosts for s in h.starts]
    assert sorted(started) == slots  # 24 runs, once each
    assert len({s.run_id for h in hosts for s in h.starts}) == 24
    history = hosts[0].schedule_store.history("hourly")
    assert sum(1 for e in history if e.kind == "fired" and e.source == "backfill") == 24


def test_a_backfill_under_skip_runs_its_firings_one_after_the_other(host: RecordingHost) -> None:
    host.schedule_store.put(make("hourly", Every(60), at=T0))
    for slot in (T0 - 3 * HOUR, T0 - 2 * HOUR, T0 - HOUR):
        host.schedule_store.enqueue("hourly", [_backfilled(slot)])
    for step in range(1, 4):
        tick(host, T0 + step * 1_000)
        waiting(host)
        assert len(host.starts) == step  # the next waits for this one
        tick(host, T0 + step * 1_000 + 500)
        assert len(host.starts) == step
        finish_all(host)
    tick(host, T0 + 10_000)
    assert len(host.starts) == 3
    assert not host.schedule_store.queue("hourly", 10)


def test_run_now_meets_the_overlap_policy(host: RecordingHost) -> None:
    scheduling = host.schedule_store
    scheduling.put(make(trigger=Every(60)))
    scheduling.enqueue("daily-check", [Queued("run now", T0 + 1_000)])
    tick(host, T0 + 2_000)
    assert [s.run_id for s in host.starts] == [fire_id("daily-check", T0 + 1_000, "run now")]
    waiting(host)
    scheduling.enqueue("daily-check", [Queued("run now", T0 + 3_000)])
    tick(host, T0 + 4_000)
    assert len(host.starts) == 1
    latest = scheduling.history("daily-check")[0]
    assert (latest.kind, latest.source) == ("skipped", "run now")
    assert scheduling.queue("daily-check", 10) == []


def test_a_paused_schedule_fires_nothing_and_resumes_from_now(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make(trigger=Every(5)))
    read = store.read("daily-check")
    assert read is not None
    paused = read.schedule.model_copy(update={"paused": True, "pause_note": "holidays"})
    assert store.update(read, paused, Firing(kind="paused", slot_ms=T0, at_ms=T0, why="holidays"))
    tick_minutes(host, 1, 30, hold=False)
    assert host.starts == []
    read = store.read("daily-check")
    assert read is not None
    assert read.schedule.paused
    now = T0 + 30 * MINUTE
    resumed = read.schedule.model_copy(update={"paused": False, "last_run_ms": now})
    assert store.update(read, resumed, Firing(kind="resumed", slot_ms=now, at_ms=now))
    # A second writer that read the paused text changes nothing.
    assert not store.update(read, paused, Firing(kind="paused", slot_ms=now, at_ms=now))
    tick_minutes(host, 31, 35, hold=False)
    assert [s.fired_ms for s in host.starts] == [now + 5 * MINUTE]  # nothing made up
    assert kinds(store.history("daily-check")) == ["paused", "resumed", "fired"]


def test_the_catch_up_window_records_old_firings_as_missed(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Daily(9, 0), catch_up_ms=HOUR, at=T0))
    nine = 1_700_038_800_000  # 2023-11-15 09:00 UTC
    tick(host, nine + 3 * HOUR)  # everything was down from before 09:00 until 12:00
    assert host.starts == []
    [missed] = host.schedule_store.history("daily-check")
    assert (missed.kind, missed.slot_ms) == ("missed", nine)
    assert "older than the catch-up window" in missed.why
    tick(host, nine + DAY + 30 * MINUTE)  # the next day, within the window: it fires
    assert [s.fired_ms for s in host.starts] == [nine + DAY]


def test_an_every_schedule_catches_up_on_its_own_rhythm(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(60), catch_up_ms=30 * MINUTE, at=T0))
    tick(host, T0 + 3 * HOUR + 10 * MINUTE)  # slots at +1h, +2h, +3h; +3h is within 30 minutes
    assert [s.fired_ms for s in host.starts] == [T0 + 3 * HOUR]
    assert "missed from" in host.schedule_store.history("daily-check")[0].why


def test_jitter_is_fixed_per_schedule_and_within_its_window() -> None:
    offsets = {
        make(f"daily-{i}", Daily(9, 0), jitter_ms=10 * MINUTE).jitter_offset_ms for i in range(1000)
    }
    assert all(0 <= offset < 10 * MINUTE for offset in offsets)
    assert len(offsets) > 900  # spread, not bunched
    again = make("daily-7", Daily(9, 0), jitter_ms=10 * MINUTE)
    assert (
        again.jitter_offset_ms
        == make("daily-7", Daily(9, 0), jitter_ms=10 * MINUTE).jitter_offset_ms
    )


def test_a_jittered_firing_waits_for_its_offset(host: RecordingHost) -> None:
    schedule = make(trigger=Every(5), jitter_ms=2 * MINUTE)
    host.schedule_store.put(schedule)
    slot = T0 + 5 * MINUTE
    if schedule.jitter_offset_ms:
        tick(host, slot + schedule.jitter_offset_ms - 1)
        assert host.starts == []
    tick(host, slot + schedule.jitter_offset_ms)
    assert [s.fired_ms for s in host.starts] == [slot]  # the run belongs to its slot


def test_nothing_fires_after_the_end(host: RecordingHost) -> None:
    host.schedule_store.put(make(trigger=Every(5), end_ms=T0 + 12 * MINUTE, overlap="allow_all"))
    tick_minutes(host, 1, 60, hold=False)
    assert [s.fired_ms for s in host.starts] == [T0 + 5 * MINUTE, T0 + 10 * MINUTE]


def test_unattended_runs_start_with_the_schedules_policy_and_plan_approval(
    host: RecordingHost,
) -> None:
    host.schedule_store.put(make(trigger=Every(5), approve_plan=True, ask=["outside"]))
    tick(host, T0 + 5 * MINUTE)
    [started] = host.starts
    assert started.approve_plan is True
    assert started.policy == Policy(ask=frozenset({Risk.OUTSIDE}))


def test_a_schedule_removed_with_queued_firings_starts_none_of_them(host: RecordingHost) -> None:
    store = host.schedule_store
    store.put(make(trigger=Every(60)))
    for slot in (T0 - 2 * HOUR, T0 - HOUR):
        store.enqueue("daily-check", [_backfilled(slot)])
    assert store.remove("daily-check")
    tick(host, T0 + 1_000)
    assert host.starts == []
    assert store.queued_names(T0 + 1_000) == []


def _backfilled(slot: int) -> Queued:
    return Queued("backfill", slot)


def test_a_cron_whose_next_firing_is_years_away_fires_then_ends(host: RecordingHost) -> None:
    # New Year's Day on a Sunday (a day of week starting "*" ANDs with the day of month):
    # 2051, then not until 2062, beyond the 8-year search: the schedule has ended.
    new_year_2051 = 2_556_144_000_000  # 2051-01-01T00:00:00Z, a Sunday
    host.schedule_store.put(make(trigger=Cron("0 0 1 1 */7"), at=new_year_2051 - HOUR))
    assert tick(host, new_year_2051 + 1_000) == ["run-1"]
    stored = host.schedule_store.get("daily-check")
    assert stored is not None  # still readable, and ended
    assert (stored.next_due_ms, stored.fire_at_ms) == (NEVER_MS, NEVER_MS)
    assert tick(host, new_year_2051 + 400 * DAY) == []


def test_a_clock_that_jumps_back_fires_nothing_early_and_nothing_twice(
    host: RecordingHost,
) -> None:
    host.schedule_store.put(make(trigger=Every(5), overlap="allow_all"))
    tick(host, T0 + 5 * MINUTE)  # fires the +5 slot
    tick(host, T0 + MINUTE)  # the clock jumped back four minutes
    tick(host, T0 + 5 * MINUTE)  # and forward again: the +5 slot fired already
    assert [s.fired_ms for s in host.starts] == [T0 + 5 * MINUTE]
    tick(host, T0 + 10 * MINUTE)
    assert [s.fired_ms for s in host.starts] == [T0 + 5 * MINUTE, T0 + 10 * MINUTE]
