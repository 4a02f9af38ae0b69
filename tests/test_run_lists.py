"""The lists of runs (running, waiting, done, failed, cancelled, declined): indexes kept by
CREATE and SAVE, so a filter is applied before the limit, paged, and built once for runs
from before they existed. Against a real private Redis (no workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Config, Outcome, Stop
from tests.support.redis_server import RedisServer
from workers import Settings
from workers.client.runs import RunsClient, page_cursor, parse_cursor
from workers.engine.effects import Advanced
from workers.engine.records import RUN_LISTS, RunList, RunRecord, ending_of, lists_of, run_list
from workers.engine.working import Surroundings, Working
from workers.store.runs import RunStore
from workers.store.scripts import Saved


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RedisServer(tmp_path) as server:
        yield RunStore(server.url, "t:")


def _client(store: RunStore) -> RunsClient:
    return RunsClient(store, lambda _messages: None, Settings.from_env({}).timing)


def _record(run_id: str, created_ms: int, **changes: object) -> RunRecord:
    fields: dict[str, object] = {
        "id": run_id,
        "root": run_id.split(".", maxsplit=1)[0],
        "task": "a task",
        "created_ms": created_ms,
        "updated_ms": created_ms,
        "config": Config(),
    }
    return RunRecord.model_validate({**fields, **changes})


def _ended(stop: Stop) -> dict[str, object]:
    return {"state": "finished", "outcome": Outcome(stop=stop, summary=stop.label())}


def _move(store: RunStore, was: RunRecord, **changes: object) -> RunRecord:
    """Save the run `was` changed by `changes`, the way a worker's step writes it (the
    list move worked out by `Working`)."""
    now = was.model_copy(update=changes)
    working = Working(was, None, Surroundings(now_ms=1, grace_ms=1, approval_ttl_ms=None,
                                              retention_s=0))  # fmt: skip
    working.set_state(now.state, now.waiting_for)
    working.outcome = now.outcome
    decided = working.decided("snap")
    loaded = store.load(was.id)
    assert loaded is not None
    step = Advanced(decided.record, "snap", decided.effects)
    assert store.save(step, loaded.version) is Saved.SAVED
    return decided.record


def _listed(store: RunStore, which: RunList) -> set[str]:
    key = store.keys.index("").listed(which)
    return {m.decode() for m in store.redis.zrange(key, 0, -1)}


def test_every_stop_has_one_class_and_only_done_is_done() -> None:
    assert ending_of(Stop.DONE) == "done"
    assert ending_of(Stop.CANCELLED) == "cancelled"
    assert ending_of(Stop.PLAN_DECLINED) == "declined"
    others = set(Stop) - {Stop.DONE, Stop.CANCELLED, Stop.PLAN_DECLINED}
    assert {ending_of(stop) for stop in others} == {"failed"}
    assert run_list("finished", None) == "failed"  # a finished run with no outcome is no success
    assert lists_of("finished") == ("done", "failed", "cancelled", "declined")
    with pytest.raises(ValueError, match="not 'green'"):
        lists_of("green")


def test_a_run_moves_between_lists_as_it_goes(store: RunStore) -> None:
    record = _record("r1", 1_000)
    assert store.create(record, "snap", due_ms=5_000)
    assert _listed(store, "running") == {"r1"}
    record = _move(store, record, state="waiting", waiting_for="call")
    assert _listed(store, "running") == set()
    assert _listed(store, "waiting") == {"r1"}
    record = _move(store, record, state="running", waiting_for=None)
    record = _move(store, record, **_ended(Stop.NO_PROGRESS))
    assert {which: _listed(store, which) for which in RUN_LISTS} == {
        "running": set(), "waiting": set(), "done": set(), "failed": {"r1"},
        "cancelled": set(), "declined": set(),
    }  # fmt: skip


def test_waiting_runs_are_found_however_many_newer_runs_finished(store: RunStore) -> None:
    # 20 runs park for a person, then 600 newer ones finish: the filter is applied
    # before the limit, so all 20 are on the first page of the waiting list.
    parked = []
    for n in range(20):
        record = _record(f"w{n:02}", 1_000 + n)
        store.create(record, "snap", due_ms=5_000)
        _move(store, record, state="waiting", waiting_for="call")
        parked.append(record.id)
    for n in range(600):
        record = _record(f"d{n:03}", 10_000 + n)
        store.create(record, "snap", due_ms=5_000)
        _move(store, record, **_ended(Stop.DONE if n % 3 else Stop.MODEL_FAILED))
    client = _client(store)
    waiting = client.runs(limit=20, state="waiting")
    assert sorted(s.id for s in waiting) == parked
    assert [s.id for s in waiting] == sorted(parked, reverse=True)  # newest first
    assert client.count_runs("waiting") == 20
    assert client.count_runs("failed") == 200
    assert client.count_runs("done") == 400
    assert client.count_runs("finished") == 600
    assert client.count_runs() == 620
    failed = client.runs(limit=1_000, state="failed")
    assert len(failed) == 200
    assert all(s.ending == "failed" for s in failed)
    assert [s.id for s in client.runs(limit=1, state="waiting")] == ["w19"]
    assert client.runs(limit=5, state="running") == []


def test_pages_go_through_every_run_once_even_in_one_millisecond(store: RunStore) -> None:
    for n in range(10):  # all made in the same millisecond
        store.create(_record(f"s{n}", 7_000), "snap", due_ms=5_000)
    store.create(_record("older", 6_999), "snap", due_ms=5_000)
    client, seen, before = _client(store), list[str](), ""
    for _ in range(10):
        page = client.runs(limit=3, state="running", before=before)
        seen += [status.id for status in page]
        if len(page) < 3:
            break
        before = page_cursor(page[-1])
    assert seen == [*(f"s{n}" for n in range(9, -1, -1)), "older"]


def test_a_bad_state_or_cursor_is_refused(store: RunStore) -> None:
    client = _client(store)
    with pytest.raises(ValueError, match="one of running, waiting, finished"):
        client.runs(state="green")
    for bad in ("x", "12", ":r1", "²:r1", "1" * 17 + ":r1", "-5:r1"):
        with pytest.raises(ValueError, match="page cursor"):
            parse_cursor(bad)
    assert parse_cursor("1700000000000:r1.call-2") == (1_700_000_000_000, "r1.call-2")


def test_runs_from_before_the_lists_are_listed_once_by_the_tick(store: RunStore) -> None:
    stops = {
        "a": Stop.DONE, "b": Stop.BUDGET_EXCEEDED, "c": Stop.PLAN_DECLINED, "d": Stop.CANCELLED
    }  # fmt: skip
    for n, (name, stop) in enumerate(stops.items()):
        record = _record(name, 1_000 + n)
        store.create(record, "snap", due_ms=5_000)
        _move(store, record, **_ended(stop))
    parked = _record("p", 2_000)
    store.create(parked, "snap", due_ms=5_000)
    _move(store, parked, state="waiting", waiting_for="plan")
    store.create(_record("q", 2_000), "snap", due_ms=5_000)  # same millisecond as p
    store.redis.delete(*store.keys.index("").lists)  # as an older Relay left them
    store.redis.hset(store.keys.run("q"), "meta", b"{not json")  # a corrupt record: skipped
    built, listed = store.keys.index("").lists_built, list[int]()
    while store.redis.get(built) is None:
        listed.append(store.upkeep.list_old_runs(limit=2))
        assert len(listed) <= 7, "the tick never gets through"
    assert sum(listed) == 5, listed  # each run once, q (corrupt) left out
    assert {which: _listed(store, which) for which in RUN_LISTS} == {
        "running": set(), "waiting": {"p"}, "done": {"a"}, "failed": {"b"},
        "cancelled": {"d"}, "declined": {"c"},
    }  # fmt: skip
    # Once through, it lists nothing more (SAVE keeps the lists).
    assert store.upkeep.list_old_runs(limit=2) == 0


def test_pruning_takes_expired_runs_off_their_lists(store: RunStore) -> None:
    record = _record("r1", 1_000)
    store.create(record, "snap", due_ms=5_000)
    _move(store, record, **_ended(Stop.CALL_LIMIT))
    assert _listed(store, "failed") == {"r1"}
    store.redis.delete(store.keys.run("r1"))  # what expiry does
    assert store.upkeep.prune_runs(older_than_ms=10**15) == 1
    assert _listed(store, "failed") == set()
    assert _client(store).count_runs("failed") == 0
