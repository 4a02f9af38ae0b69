"""Run state on Redis Cluster: the keys, the index shards, and a master failing over.

The broker matrix (tests/test_runtime_brokers.py) runs the runtime's scenarios on
RabbitMQ + Redis Cluster; here is what only a cluster has. Keys first (no server):
every key of a tree in its root's slot, and the single-Redis names unchanged.
Then on the session's private cluster (three masters, one replica each): index
shards spread over the masters and read back by the tick, the per-node SWEEP
handing back a shard it does not serve, and a run whose master is killed
finishing on the replica that took its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from agent_core import Config, Every, Recipe, Stop
from scheduler import Schedule, ScheduleKeys, ScheduleStore, tick
from scheduler.store import Queued
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet, on_cluster
from tests.support.rabbitmq import require_rabbitmq
from tests.support.redis_cluster import Cluster, redis_cluster
from tests.support.redis_server import RedisServer
from tests.support.schedule_host import RecordingHost
from workers import AsyncRelay, ModelRoute, Relay
from workers.engine.effects import Advanced, Effects, OwnOutcome
from workers.engine.records import CallTrack, RunRecord, TraceEntry
from workers.model.limits import RouteLimits
from workers.settings import now_ms
from workers.store import scripts
from workers.store.durability import Durability
from workers.store.layout import Keys
from workers.store.runs import RunStore
from workers.store.schedule_shards import ClusterSchedules
from workers.store.scripts import ClaimStatus, Saved, lua
from workers.store.shards import SlotSet

__all__ = ["redis_cluster"]  # the session's cluster fixture, used here


def _slot(key: str) -> int:
    return key_slot(key.encode())


# --- keys (no server) -------------------------------------------------------------------------


def test_on_a_single_redis_the_keys_are_named_as_before() -> None:
    keys = Keys("relay:")
    assert keys.run("a1.m2.c3") == "relay:run:a1.m2.c3"
    assert keys.lease("a1", "m0") == "relay:lease:a1:m0"
    assert keys.live("a1.m2") == "relay:live:a1"
    index = keys.index("a1.m2")
    assert (index.runs, index.outbox, index.pending) == (
        "relay:runs",
        "relay:outbox",
        "relay:pending",
    )
    assert (index.pending_data, index.deadlines) == ("relay:pending:data", "relay:deadlines")
    assert (index.activity, index.prune_cursor) == ("relay:activity", "relay:prune-cursor")
    assert keys.tick_lock == "relay:tick-lock"
    assert keys.route("fast", "queue") == "relay:route:fast:queue"
    assert keys.key_inflight("k1", "fast") == "relay:key-inflight:k1"
    assert keys.schedules("daily").due == "relay:schedule-due"


@pytest.mark.parametrize("run_id", ["a1", "a1.m2", "a1.m2.c3", "sched-7}x{"])
def test_on_a_cluster_every_key_of_a_tree_is_in_its_roots_slot(run_id: str) -> None:
    keys = Keys("relay:", cluster=True)
    root = run_id.split(".", 1)[0]
    slot = _slot(keys.run(root))
    index = keys.index(run_id)
    tree = [keys.run(run_id), keys.inbox(run_id), keys.trace(run_id), keys.lease(run_id, "m0")]
    tree += [keys.history(run_id), keys.journal(run_id)]
    tree += [keys.live(run_id), index.runs, index.outbox, index.pending, index.pending_data]
    tree += [index.deadlines, index.activity, index.prune_cursor]
    assert {_slot(key) for key in tree} == {slot}
    assert index.slot == slot


def test_on_a_cluster_the_other_scripts_keys_share_a_slot_too() -> None:
    keys = Keys("relay:", cluster=True)
    route = [keys.route("fast", part) for part in ("", "inflight", "queue", "tags", "told")]
    assert len({_slot(key) for key in [*route, keys.key_inflight("k1", "fast")]}) == 1
    assert _slot(keys.tick_lock) == _slot(keys.tick_stats)
    schedules = keys.schedules("daily")
    named = [schedules.schedules, schedules.due, schedules.firing, schedules.notifications]
    named += [schedules.slot("daily", 123)]
    assert {_slot(key) for key in named} == {_slot("daily")}  # the shard of its name's slot
    # Schedules spread too: a hundred names, (nearly) a hundred shards.
    assert len({_slot(keys.schedules(f"s{n}").due) for n in range(100)}) > 95
    # Trees spread: a hundred roots land in (nearly) a hundred slots.
    assert len({keys.slot(f"r{n}") for n in range(100)}) > 95
    with pytest.raises(ValueError, match="no braces"):
        Keys("relay{x}:", cluster=True)


# --- on the cluster ---------------------------------------------------------------------------


@pytest.fixture
def on_the_cluster(redis_cluster: Cluster, tmp_path: Path) -> Iterator[Fleet]:
    require_rabbitmq()
    with on_cluster(redis_cluster), fleet(tmp_path, broker="amqp") as running:
        assert running.relay.store.keys.cluster
        yield running


def test_index_shards_spread_over_the_masters_and_the_tick_reads_every_one(
    on_the_cluster: Fleet, redis_cluster: Cluster
) -> None:
    f = on_the_cluster
    store = f.relay.store
    before = now_ms()
    started = [f.relay.start(f"SHARDS: run {n}") for n in range(59)]  # no worker: they wait
    time.sleep(0.01)  # the newest is alone in its millisecond
    started.append(f.relay.start("SHARDS: the newest"))
    shards = store.shards.all()
    assert {shard.slot for shard in shards} == {store.keys.slot(run_id) for run_id in started}
    masters = {redis_cluster.master_of(shard.outbox).port for shard in shards}
    assert len(masters) == 3  # no node holds the whole outbox
    due = store.upkeep.due_messages(now_ms() + 3_600_000, limit=1_000)
    assert sorted(due) == sorted(f"a|{run_id}" for run_id in started)
    assert sorted(store.runs(limit=1_000)) == sorted(started)
    assert store.runs(limit=1) == [started[-1]]  # newest first, across shards
    # The lists are sharded with the runs: read across shards, counted, listed once anew.
    assert sorted(store.runs(limit=1_000, lists=("running",))) == sorted(started)
    assert f.relay.count_runs("running") == 60
    assert f.relay.count_runs("finished") == 0
    for shard in shards:  # as an older Relay left them: no lists
        store.redis.delete(*shard.lists, shard.lists_built, shard.lists_cursor)
    assert f.relay.count_runs("running") == 0
    while store.upkeep.list_old_runs() > 0:
        pass
    assert f.relay.count_runs("running") == 60
    assert f.relay.runs(limit=1, state="running")[0].id == started[-1]
    # AsyncRelay lists the shards `index-slots` names, the same pages.
    pages = asyncio.run(_async_pages(f.relay))
    assert pages == ([s.id for s in f.relay.runs(limit=25, state="running")], 60)
    assert pages[0][0] == started[-1]
    started_at = time.perf_counter()
    # What each tick reads, as of the first start (later, on a busy machine, the
    # first runs' grace may have passed already).
    runtime_heal_reads = store.upkeep.due_messages(before)
    print(
        f"a tick's outbox read over {len(shards)} shards: {time.perf_counter() - started_at:.4f} s"
    )
    assert runtime_heal_reads == []  # nothing is due yet: the grace has not passed


def test_a_sweep_hands_back_a_shard_its_node_does_not_serve(
    on_the_cluster: Fleet, redis_cluster: Cluster
) -> None:
    store = on_the_cluster.relay.store
    here, there = store.keys.shard(0).outbox, store.keys.shard(16383).outbox
    node = redis_cluster.master_of(here)
    assert redis_cluster.master_of(there) is not node  # slot 0 and 16383: first and last master
    store.redis.zadd(here, {"a|near": 5})
    store.redis.zadd(there, {"a|far": 6})
    client = node.client()
    try:
        sweep = client.register_script(lua("sweep"))
        found, missed = sweep(keys=[], args=["due", "-inf", "+inf", 10, here, there])
    finally:
        client.close()
    assert found == [b"a|near", b"5"]
    assert missed == [2]
    # Through the store, the shard missed by its sweep is read on its own.
    store.redis.sadd(store.keys.index_slots, 0, 16383)
    assert store.shards.in_range("outbox", 0, 10, 10) == [("a|near", 5.0), ("a|far", 6.0)]


def _run_id_away_from(cluster: Cluster, keys: Keys) -> str:
    """A run id whose slot's master is not the node the fleet's URL names."""
    for n in range(1_000):
        run_id = f"failover{n}"
        if cluster.master_of(keys.run(run_id)) is not cluster.nodes[0]:
            return run_id
    raise AssertionError("every slot is on the first node")


def test_a_run_finishes_when_its_master_fails_over_to_the_replica(
    on_the_cluster: Fleet, redis_cluster: Cluster
) -> None:
    f = on_the_cluster
    store = f.relay.store
    f.brain.script("FAILOVER", {0: call("sleep", seconds=3), 1: final("slept through it")})
    f.worker("--concurrency", "2")
    run_id = f.relay.start("FAILOVER: sleep", run_id=_run_id_away_from(redis_cluster, store.keys))
    f.until(lambda: "sleep start 3" in f.ledger(), 30, what="the tool to start")
    master = redis_cluster.master_of(store.keys.run(run_id))
    master.kill()  # as a crash would: its replica is elected after cluster-node-timeout
    try:
        outcome = f.relay.wait(run_id, timeout=90)
        assert outcome.stop is Stop.DONE, f.logs()
        assert outcome.summary == "slept through it"
        assert "sleep end 3" in f.ledger()
        assert redis_cluster.master_of(store.keys.run(run_id)) is not master  # the replica
        # The journal, in the tree's slot, came through the failover whole with the run.
        report = f.relay.replay(run_id)
        assert report.identical, report
        assert report.steps >= 4
    finally:
        master.start()  # back as a replica of the new master: the next test has six nodes
        redis_cluster.wait_ok()
        redis_cluster.wait_synced()


def test_a_durable_claim_waits_for_the_replica_of_its_runs_master(on_the_cluster: Fleet) -> None:
    store = on_the_cluster.relay.store
    run_id = on_the_cluster.relay.start("DURABLE: no worker takes it")
    assert store.durability() is Durability.REPLICA  # each master has a replica
    # WAIT runs on the connection of the run's master, after a write there: it returns
    # once the replica has it (on another node it would wait for nothing).
    assert store.make_durable(run_id, "t1", 2_000)
    assert store.redis.hget(store.keys.run(run_id), "a:t1") == b"0"


# --- schedules in shards ----------------------------------------------------------------------

RECIPE = Recipe("hello", "Say hello to {who}.").param("who")
T0 = 1_700_000_000_000


def _schedules(cluster: Cluster, prefix: str) -> tuple[RunStore, ScheduleStore]:
    run_store = RunStore(cluster.url, prefix, cluster=True)
    return run_store, ScheduleStore(
        run_store.redis, prefix, ClusterSchedules(run_store.connection, run_store.shards)
    )


def test_schedules_spread_over_the_masters_and_each_fires_once(redis_cluster: Cluster) -> None:
    run_store, store = _schedules(redis_cluster, "spread:")
    names = [f"daily{n}" for n in range(30)]
    for name in names:
        store.put(Schedule.create(name, RECIPE, {"who": name}, Every(5), now_ms=T0))
    shards = store.shards.all()
    assert len(shards) == len({_slot(name) for name in names})
    masters = {redis_cluster.master_of(shard.due).port for shard in shards}
    assert len(masters) == 3  # no node holds every schedule
    host = RecordingHost(store)
    started = tick(host, T0 + 5 * 60_000)
    assert sorted(str(s.schedule) for s in host.starts) == sorted(names)
    assert len(started) == len(names)
    assert tick(host, T0 + 5 * 60_000 + 1) == []  # each slot once
    run_store.redis.close()


def _one_slot_layout(redis: Any, prefix: str, *names: str) -> ScheduleKeys:
    """Write what a Relay before schedule shards left on a cluster: every schedule,
    firing slot and notification under {schedules}."""
    old = ScheduleKeys.under(f"{prefix}{{schedules}}")
    for name in names:
        made = Schedule.create(name, RECIPE, {"who": name}, Every(5), now_ms=T0)
        redis.hset(old.schedules, name, made.model_dump_json())
        redis.zadd(old.due, {name: made.next_due_ms})
    return old


def test_schedules_of_the_one_slot_layout_move_into_their_shards(redis_cluster: Cluster) -> None:
    run_store, store = _schedules(redis_cluster, "moved:")
    redis = run_store.redis
    old = _one_slot_layout(redis, "moved:", "legacy")
    redis.zadd(old.firing, {"legacy|123": T0})
    notices = [f'{{"schedule":"legacy","task":"t","slot_ms":{n},"at_ms":{n}}}' for n in (1, 2)]
    redis.lpush(old.notifications, *notices, "not json")  # newest first: "not json", 2, 1
    newer = '{"schedule":"legacy","task":"t","slot_ms":3,"at_ms":3}'  # made since the upgrade
    redis.rpush(run_store.keys.schedules("legacy").notifications, newer)
    assert [s.name for s in store.all()] == ["legacy"]  # the first use moves them
    assert redis.exists(old.schedules, old.due, old.firing, old.notifications) == 0
    assert [n.slot_ms for n in store.notifications()] == [3, 2, 1]  # newest first
    assert store.stale_firings(T0 + 1) == [("legacy", Queued("schedule", 123))]
    host = RecordingHost(store)
    next_due = T0 + 5 * 60_000
    assert len(tick(host, next_due)) == 2  # the firing slot, then the due one
    assert [s.schedule for s in host.starts] == ["legacy", "legacy"]
    # Moving again (another process, or one that died midway) changes nothing.
    assert ClusterSchedules(run_store.connection, run_store.shards).adopt_one_slot(old) == 0
    assert [s.name for s in store.all()] == ["legacy"]
    run_store.redis.close()


def test_a_move_cut_off_after_the_copy_still_fires_and_a_removal_waits_for_it(
    redis_cluster: Cluster,
) -> None:
    run_store, store = _schedules(redis_cluster, "cut:")
    redis = run_store.redis
    old = _one_slot_layout(redis, "cut:", "copied", "gone")
    # A process copied "copied" into its shard, then died before indexing it; and it
    # left its lock behind, which lapses in half a second.
    shard = run_store.keys.schedules("copied")
    redis.hset(shard.schedules, "copied", redis.hget(old.schedules, "copied"))
    redis.set(old.slot_prefix + "moving", "dead", px=500)
    # A new process's first call removes a schedule: it waits for the move, then
    # removes the moved one (not a copy the move would bring back).
    assert store.remove("gone") is True
    assert redis.exists(old.schedules, old.slot_prefix + "moving") == 0
    assert [s.name for s in store.all()] == ["copied"]
    host = RecordingHost(store)
    assert len(tick(host, T0 + 5 * 60_000)) == 1
    assert [s.schedule for s in host.starts] == ["copied"]
    run_store.redis.close()


def test_the_listed_slots_are_read_again_when_they_grow_or_are_lost(
    redis_cluster: Cluster,
) -> None:
    run_store = RunStore(redis_cluster.url, "listed:", cluster=True)
    here, there = (SlotSet(run_store.connection, "listed:slots{fleet}") for _ in range(2))
    here.add(5)
    here.add(7)
    assert here.all() == [5, 7]
    there.add(9)  # another process lists a slot: this one sees it at its next read
    assert here.all() == [5, 7, 9]
    run_store.redis.delete(here.key)  # lost (a Redis restarted without its data) ...
    assert here.all() == [5, 7, 9]  # ... and put back by the next read
    assert run_store.redis.smembers(here.key) == {b"5", b"7", b"9"}
    # An add lost in a failover (nobody read it yet) is put back by its writer within
    # REFRESH_S (here: at once).
    later = SlotSet(run_store.connection, here.key)
    later.add(11)
    run_store.redis.srem(here.key, 11)
    later.REFRESH_S = 0
    later.all()
    assert here.all() == [5, 7, 9, 11]
    run_store.redis.close()


async def _async_pages(relay: Relay) -> tuple[list[str], int]:
    async with AsyncRelay(relay) as arelay:
        found = await arelay.runs(limit=25, state="running")
        return [status.id for status in found], await arelay.count_runs("running")


# --- the keys the scripts spell themselves ----------------------------------------------------


@pytest.mark.parametrize("where", ["single", "cluster"])
@pytest.mark.parametrize("run_id", ["r1", "r1.call-2"])
def test_a_saved_call_frees_its_lease_and_message_and_its_trace_wakes_the_watchers(
    where: str, run_id: str, redis_cluster: Cluster, tmp_path: Path
) -> None:
    """SAVE is sent the call, not its lease key or outbox member, and no activity stream
    on a single Redis: it spells them from the run's key. Spelled wrong, the call's lease
    would stay till it lapsed, its message would be sent again, and `relay wait` would
    not wake. (A prefix with `run:` in it, too.)"""
    with contextlib.ExitStack() as stack:
        if where == "cluster":
            store = RunStore(redis_cluster.url, "spelled:run:", cluster=True)
        else:
            server = stack.enter_context(RedisServer(tmp_path))
            store = RunStore(server.url, "spelled:run:")
        stack.callback(store.redis.close)
        stack.callback(_forget, store, "spelled:run:*")  # (the cluster is the session's)
        index = store.keys.index(run_id)
        root = run_id.split(".", 1)[0]
        base = {"id": run_id, "root": root, "task": "t", "created_ms": 1, "updated_ms": 1}
        base["config"] = Config()
        store.create(RunRecord.model_validate(base), "snap", due_ms=5_000)
        calls = {"call-1": CallTrack(status="running", tool="read_note", created_ms=1)}
        for call, seq, asked in (
            ("m3", 3, {"asked": 3, "seq": 3}),
            ("call-1", None, {"calls": calls}),
        ):
            loaded = store.load(run_id)
            assert loaded is not None
            step = Advanced(RunRecord.model_validate({**base, **asked}), "snap", Effects())
            assert store.save(step, loaded.version) is Saved.SAVED
            claim = store.claim(run_id, call, seq=seq, token="tok", lease_ms=60_000, now_ms=0)
            assert claim.status is ClaimStatus.CLAIMED
            member = f"m|{run_id}|3" if seq else f"t|{run_id}|{call}"
            assert store.redis.zscore(index.outbox, member) is not None
            lease = store.keys.lease(run_id, call)
            assert store.redis.get(lease) == b"tok"
            line = TraceEntry(at_ms=1, run=run_id, kind="note", text=call)
            done = Advanced(RunRecord.model_validate(base), "snap", Effects(trace=(line,)))
            own = OwnOutcome(run_id, call, 1, "tok", member)
            assert store.save(done, str(int(loaded.version) + 1), own) is Saved.SAVED
            assert store.redis.get(lease) is None
            assert store.redis.zscore(index.outbox, member) is None
            newest = store.redis.xrevrange(index.activity, count=1)
            assert newest[0][1] == {b"r": run_id.encode()}


@pytest.mark.parametrize("where", ["single", "cluster"])
def test_a_routes_admission_keeps_its_calls_and_queue_under_the_layouts_names(
    where: str, redis_cluster: Cluster, tmp_path: Path
) -> None:
    """ROUTE_ADMIT and ROUTE_DONE are sent every key they touch on a cluster (a slot being
    moved redirects them before they write) and spell the route's parts on a single
    Redis: either way the calls in flight and the queue are where layout names them."""
    with contextlib.ExitStack() as stack:
        url = redis_cluster.url if where == "cluster" else ""
        if not url:
            url = stack.enter_context(RedisServer(tmp_path)).url
        store = RunStore(url, f"route-{where}:", cluster=where == "cluster")
        stack.callback(store.redis.close)
        stack.callback(_forget, store, f"route-{where}:*")
        limits, keys = RouteLimits(store.connection), store.keys
        sent = scripts.route_admit(keys, route="fast", key="k", holder="h", now_ms=0).keys
        assert len(sent) == (7 if where == "cluster" else 2)
        route = ModelRoute("fast", url="http://127.0.0.1:9/v1", model="m", rpm=1)
        terms: dict[str, Any] = {"key": "k", "tokens": 10, "key_concurrency": None}
        first = limits.admit(route, holder="r|1", now_ms=1_000, lease_ms=60_000, **terms)
        assert first.verdict == "admitted"
        second = limits.admit(route, holder="r|2", now_ms=1_000, lease_ms=60_000, **terms)
        assert second.verdict == "wait"  # its turn is a minute off: it waits in the queue
        assert store.redis.zrange(keys.route("fast", "inflight"), 0, -1) == [b"r|1"]
        assert store.redis.zrange(keys.key_inflight("k", "fast"), 0, -1) == [b"r|1"]
        assert store.redis.zrange(keys.route("fast", "queue"), 0, -1) == [b"r|2"]
        assert store.redis.hget(keys.route("fast", "queue-keys"), "r|2") == b"k"
        assert store.redis.zscore(keys.route("fast", "told"), "r|2") is not None
        assert limits.done(route, key="k", holder="r|1", outcome="ok", now_ms=2_000) == "closed"
        assert store.redis.zcard(keys.route("fast", "inflight")) == 0
        assert store.redis.zcard(keys.key_inflight("k", "fast")) == 0


def _forget(store: RunStore, pattern: str) -> None:
    """Delete a test's keys (one at a time: on a cluster they are in many slots)."""
    for key in list(store.redis.scan_iter(match=pattern)):
        store.redis.delete(key)
