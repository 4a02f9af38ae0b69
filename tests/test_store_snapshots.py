"""Snapshots stored apart (a head plus history entries), old runs stored whole, hot agents.

The agent is played by a script (no model, no workers); the store is a real
private Redis. What a save writes is checked against the list Redis holds, so a
step that changed the history in any way (appended, trimmed, folded into a
summary) must leave Redis holding exactly the agent's snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Agent, Ask, Config, Kind, Risk, Run, Summarize, Tool, ToolOutput
from agent_core.state import dump, load
from tests.support import snapshots_v1
from tests.support.redis_server import RedisServer
from tests.support.scripted import call
from workers.engine.effects import KEEP, Advanced, Effects
from workers.engine.journal import read_start
from workers.engine.records import RunRecord
from workers.store import scripts
from workers.store.codec import Loaded
from workers.store.hot_agents import HotAgent, HotAgents
from workers.store.runs import RunStore
from workers.store.scripts import Saved
from workers.store.snapshots import join, split, write

TOOLS = [Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ)]
TRIMMED = Config(require_plan=False, history_chars=2_000, max_calls=10_000)
SUMMARIZED = Config(require_plan=False, history_chars=2_000, max_calls=10_000, summarize=True)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RedisServer(tmp_path) as server:
        yield RunStore(server.url, "t:")


def _record(config: Config = TRIMMED, run_id: str = "r1") -> RunRecord:
    return RunRecord(
        id=run_id, root=run_id, task="read", created_ms=1_000, updated_ms=1_000, config=config
    )


def _started(config: Config = TRIMMED) -> Agent:
    agent = Agent(config, TOOLS)
    agent.start("read the files")
    return agent


def _move(agent: Agent, n: int) -> None:
    """One step of a long run: a model call asking for a file, or the file's text."""
    step = agent.resume()
    if isinstance(step, Summarize):
        agent.reply(f"summary {n}")
    elif isinstance(step, Ask):
        agent.reply(call("read_file", path=f"file-{n}.txt"))
    elif isinstance(step, Run):
        agent.result(step.call.id, ToolOutput.ok(f"text {n} " + "x" * 300))
    else:  # pragma: no cover - the script never ends a run
        raise AssertionError(step)
    agent.take_trace()  # as the runtime does each step (its lines go to the run's trace)


def _stored(store: RunStore, run_id: str = "r1") -> object:
    """The snapshot Redis holds for the run, as JSON (the start and history go back in)."""
    k = store.keys
    head = store.redis.hget(k.run(run_id), "head").decode()
    start = (store.redis.hget(k.run(run_id), "start") or b"").decode()
    loops = (store.redis.hget(k.run(run_id), "lp") or b"").decode()
    entries = [e.decode() for e in store.redis.lrange(k.history(run_id), 0, -1)]
    return _parsed(join(head, entries, start, loops))


def _of(agent: Agent) -> object:
    return _parsed(agent.snapshot())


def _parsed(snapshot: str) -> object:
    """A snapshot as JSON, every field in place (a head leaves out those at their default)."""
    return json.loads(dump(load(snapshot)))


def _advance(store: RunStore, agent: Agent, record: RunRecord, moves: int, at: int = 0) -> None:
    """Advance the agent `moves` steps, saving each as the runtime does (delta writes)."""
    for n in range(at, at + moves):
        loaded = store.load(record.id, hot=False)
        assert loaded is not None
        before = agent.history() if loaded.apart else None
        loops = agent.loops() if loaded.loops_stored else None  # (as steps.decide does)
        _move(agent, n)
        step = Advanced(record, agent.snapshot(), Effects(), stored=write(before, agent, loops))
        assert store.save(step, loaded.version) is Saved.SAVED
        assert _stored(store, record.id) == _of(agent)


@pytest.mark.parametrize("config", [TRIMMED, SUMMARIZED], ids=["trimmed", "summarized"])
def test_every_save_leaves_redis_holding_the_agents_snapshot(
    store: RunStore, config: Config
) -> None:
    agent = _started(config)
    assert store.create(_record(config), agent.snapshot(), due_ms=5_000)
    _advance(store, agent, _record(config), 120)
    assert store.redis.hget(store.keys.run("r1"), "snap") is None
    assert store.redis.hget(store.keys.run("r1"), "head")  # (form 2: no `sf` field needed)
    restored = Agent.restore(config, TOOLS, store.snapshot("r1") or "")
    assert restored.snapshot() == agent.snapshot()


def test_a_step_writes_only_its_new_entries_however_long_the_history(store: RunStore) -> None:
    def step_bytes(moves: int) -> tuple[int, int]:
        """(bytes a save of two more moves sends besides the head and the loop counters,
        the bytes of those two)"""
        agent = _started(Config(require_plan=False, max_calls=10_000))
        _advance_locally(agent, moves)
        before, loops = agent.history(), agent.loops()
        _move(agent, moves)
        _move(agent, moves + 1)
        stored = write(before, agent, loops)
        assert (stored.drop, len(stored.append), stored.rewrite) == (0, 1, False)
        step = Advanced(_record(), agent.snapshot(), Effects(), stored=stored)
        args = scripts.save(store.keys, advanced=step, version="1", own=None).args
        kept = len(stored.head) + len(json.dumps(stored.loops))  # (escaped in the effects)
        return sum(len(str(a)) for a in args) - kept, kept

    (short, _), (long, long_head) = step_bytes(4), step_bytes(60)
    assert len(_history_of(60)) > 5 * len(_history_of(4))  # the long history is much longer
    assert long < short + 100  # but what a step adds to it weighs the same
    # (The loop counters hold the last 64 calls' digests: bounded, not history.)
    assert long_head < 4_000


def _advance_locally(agent: Agent, moves: int) -> None:
    for n in range(moves):
        _move(agent, n)


def _history_of(moves: int) -> tuple[object, ...]:
    agent = _started(Config(require_plan=False, max_calls=10_000))
    _advance_locally(agent, moves)
    return agent.history()


def test_the_loop_counters_are_written_only_by_the_steps_that_count_a_call(
    store: RunStore,
) -> None:
    agent, record = _started(), _record()
    assert store.create(record, agent.snapshot(), due_ms=5_000)
    written = []
    for n in range(40):
        loaded = store.load("r1", hot=False)
        assert loaded is not None
        before, counted = agent.history(), agent.loops()
        _move(agent, n)
        stored = write(before, agent, counted if loaded.loops_stored else None)
        # (The first save keeps them apart; after it, only a step that counted writes.)
        assert bool(stored.loops) == (n == 0 or agent.loops() is not counted), n
        written.append(bool(stored.loops))
        step = Advanced(record, agent.snapshot(), Effects(), stored=stored)
        assert store.save(step, loaded.version) is Saved.SAVED
        assert _stored(store) == _of(agent)  # what Redis holds is still the agent
        assert b'"loops":' not in store.redis.hget(store.keys.run("r1"), "head")
    assert 18 <= sum(written) <= 22  # once a turn (a call and its result), not each step


def _stored_with_loops_in_its_head(store: RunStore) -> tuple[Agent, RunRecord]:
    """A run whose head holds its loop counters, as every head did before they went
    apart: made from a snapshot, its next step a model call (which counts nothing)."""
    agent, record = _started(), _record()
    for n in range(8):
        _move(agent, n)
    assert isinstance(agent.resume(), Ask)
    assert agent.snapshot_loops() != "{}"
    assert store.create(record, agent.snapshot(), due_ms=5_000)
    assert b'"loops":' in store.redis.hget(store.keys.run("r1"), "head")
    return agent, record


def _save_a_step_that_counts_nothing(store: RunStore, agent: Agent, record: RunRecord) -> None:
    loaded = store.load("r1", hot=False)
    assert loaded is not None
    before, counted = agent.history(), agent.loops()
    _move(agent, 8)
    assert agent.loops() is counted
    stored = write(before, agent, counted if loaded.loops_stored else None)
    step = Advanced(record, agent.snapshot(), Effects(), stored=stored)
    assert store.save(step, loaded.version) is Saved.SAVED
    assert b'"loops":' not in store.redis.hget(store.keys.run("r1"), "head")
    assert _stored(store) == _of(agent)  # the counters were written apart, not lost


def test_a_head_that_holds_the_loop_counters_has_them_written_apart_by_its_next_save(
    store: RunStore,
) -> None:
    agent, record = _stored_with_loops_in_its_head(store)
    assert store.redis.hget(store.keys.run("r1"), "lp") is None
    _save_a_step_that_counts_nothing(store, agent, record)
    restored = Agent.restore(TRIMMED, TOOLS, store.snapshot("r1") or "")
    assert restored.snapshot_loops() == agent.snapshot_loops()


def test_a_head_that_holds_the_loop_counters_has_the_last_word_over_older_ones_apart(
    store: RunStore,
) -> None:
    # (A run's end saves its snapshot whole, loop counters in the head; a follow-up may
    # reopen it later, with older counters still kept apart.)
    agent, record = _stored_with_loops_in_its_head(store)
    store.redis.hset(store.keys.run("r1"), "lp", '{"loops":{"seen":"AAAAAAAA"}}')
    _save_a_step_that_counts_nothing(store, agent, record)


def test_a_trimmed_history_drops_from_the_front_and_appends(store: RunStore) -> None:
    agent = _started()
    _advance_locally(agent, 40)  # history is full: each entry added trims the oldest
    before = agent.history()
    _move(agent, 40)
    _move(agent, 41)
    stored = write(before, agent)
    assert not stored.rewrite
    assert stored.drop >= 1
    assert len(stored.append) == 1
    assert stored.agent is not None
    assert stored.agent is not agent  # a copy: advancing the agent leaves the kept one


def test_a_summary_folding_entries_is_written_as_a_drop() -> None:
    agent = _started(SUMMARIZED)
    moves = 0
    while not isinstance(agent.resume(), Summarize):
        _move(agent, moves)
        moves += 1
    before = agent.history()
    _move(agent, moves)  # the summary folds the oldest entries
    stored = write(before, agent)
    assert (stored.rewrite, stored.append) == (False, ())
    assert stored.drop == len(before) - len(agent.history()) > 0


def test_split_and_join_are_inverse_on_real_snapshots() -> None:
    agent = _started()
    _advance_locally(agent, 12)
    head, entries, _ = split(agent.snapshot())
    assert '"history"' not in head
    assert len(entries) == len(agent.history())
    texts = [e.model_dump_json() for e in agent.history()]
    assert _parsed(join(head, entries)) == _parsed(join(agent.snapshot_head(), texts))
    assert Agent.restore(TRIMMED, TOOLS, join(head, entries)).snapshot() == agent.snapshot()
    assert split("not a snapshot") == ("not a snapshot", [], "")
    # Stored without the format tag, which joining puts back; a tagged head still joins.
    assert head.startswith('{"version":')
    assert json.loads(join(head, entries))["format"] == "relay.agent"
    tagged = agent.snapshot_head()
    assert _parsed(join(tagged, texts)) == _parsed(agent.snapshot())
    # The start apart: the head leaves the task out, and joining puts it back.
    bare, entries, start = split(agent.snapshot(), start_apart=True)
    assert "read the files" not in bare
    assert json.loads(start)["task"] == "read the files"
    assert _parsed(join(bare, entries, start)) == _parsed(agent.snapshot())
    written = agent.snapshot_head(without_start=True)
    assert "read the files" not in written
    rebuilt = join(written, texts, agent.snapshot_start())
    assert Agent.restore(TRIMMED, TOOLS, rebuilt).snapshot() == agent.snapshot()
    # A head that holds its start too (written before it was apart) keeps its own.
    assert _parsed(join(head, entries, '{"task":"older"}')) == _parsed(agent.snapshot())
    fresh = Agent(TRIMMED, TOOLS)  # never started: nothing to put back, nothing lost
    assert join(fresh.snapshot_head(without_start=True), [], fresh.snapshot_start()) == (
        fresh.snapshot_head()
    )


def test_the_start_is_stored_without_the_task_the_record_holds() -> None:
    agent = _started()
    _advance_locally(agent, 3)
    bare, entries, start = split(agent.snapshot(), start_apart=True, task="read the files")
    assert start == "{}"  # nothing at its default, and the task is the record's
    assert _parsed(join(bare, entries, start, task="read the files")) == _parsed(agent.snapshot())
    # Another task than the record's is kept, and wins over the record's.
    _, _, own = split(agent.snapshot(), start_apart=True, task="something else")
    assert json.loads(own) == {"task": "read the files"}
    assert _parsed(join(bare, entries, own, task="something else")) == _parsed(agent.snapshot())
    # A start stored before (the task in it) loads as it did.
    _, _, older = split(agent.snapshot(), start_apart=True)
    assert _parsed(join(bare, entries, older, task="the record's")) == _parsed(agent.snapshot())
    # An agent started without a task is not given the record's.
    fresh = Agent(TRIMMED, TOOLS)
    fresh.start("")
    head, _, empty = split(fresh.snapshot(), start_apart=True, task="the record's")
    assert json.loads(empty) == {"task": ""}
    assert Agent.restore(TRIMMED, TOOLS, join(head, [], empty, task="the record's")).snapshot() == (
        fresh.snapshot()
    )


# --- a run saved before the history was stored apart -----------------------------------------


@pytest.mark.parametrize("name", ["MAIN_READING", "RICH"])
def test_a_run_stored_whole_loads_and_its_next_save_stores_it_apart(
    store: RunStore, name: str
) -> None:
    whole = getattr(snapshots_v1, name)
    record = _record(Config(require_plan=False))
    key = store.keys.run("r1")
    # Written as the previous code wrote runs: one `snap`, no `sf`, no history list.
    store.redis.hset(key, mapping={"v": 3, "meta": record.model_dump_json(), "snap": whole})
    loaded = store.load("r1")
    assert loaded is not None
    assert (loaded.version, loaded.apart, loaded.snapshot) == ("3", False, whole)
    agent = Agent.restore(record.config, _tools_of(name), loaded.snapshot)
    stored = write(agent.history() if loaded.apart else None, agent)
    assert stored.rewrite  # its list is written whole, once
    step = Advanced(record, agent.snapshot(), Effects(), stored=stored)
    assert store.save(step, loaded.version) is Saved.SAVED
    assert store.redis.hget(key, "snap") is None
    assert store.redis.hget(key, "head")
    assert store.redis.hget(key, "sf") is None  # form 2 is its head: no field says it
    assert store.redis.llen(store.keys.history("r1")) == len(agent.history()) > 0
    again = store.load("r1", hot=False)
    assert again is not None
    assert again.apart
    assert Agent.restore(record.config, _tools_of(name), again.snapshot).snapshot() == (
        agent.snapshot()
    )


def _tools_of(name: str) -> list[Tool]:
    write_file = Tool("write_file", "Write").arg("path", Kind.TEXT).arg("text", Kind.TEXT)
    return [*TOOLS, write_file.risk(Risk.WRITE)] if name == "RICH" else []


# --- hot agents -------------------------------------------------------------------------------


def _saved_here(store: RunStore, moves: int) -> tuple[Agent, RunRecord, Loaded]:
    """A run this process created and advanced `moves` times, loaded back (hot)."""
    agent = _started()
    record = _record()
    store.create(record, agent.snapshot(), due_ms=5_000)
    _advance(store, agent, record, moves)
    loaded = store.load("r1")
    assert loaded is not None
    assert loaded.hot is not None
    return agent, record, loaded


def test_a_run_this_process_saved_loads_without_its_snapshot(store: RunStore) -> None:
    agent, _, loaded = _saved_here(store, 6)
    assert loaded.hot is not None
    assert loaded.snapshot == ""  # not read
    assert loaded.hot.snapshot() == agent.snapshot()
    twin = loaded.agent(lambda *_: pytest.fail("a hot agent is not restored"))
    _move(twin, 6)
    assert loaded.hot.snapshot() == agent.snapshot()  # the kept agent is not advanced


def test_a_run_saved_elsewhere_since_is_read_and_restored(store: RunStore) -> None:
    agent, record, _ = _saved_here(store, 3)
    # Another process saves the next step: this one's agent is now a version behind.
    elsewhere = RunStore(store.url, "t:")
    _advance(elsewhere, agent, record, 1, at=3)
    fresh = store.load("r1")
    assert fresh is not None
    assert fresh.hot is None
    assert _parsed(fresh.snapshot) == _of(agent)
    # A record changed by hand at the same version is not trusted either.
    assert elsewhere.hot.version("r1") == fresh.version
    changed = _record().model_copy(update={"updated_ms": 2_000})
    store.redis.hset(store.keys.run("r1"), "meta", changed.model_dump_json())
    by_hand = elsewhere.load("r1")
    assert by_hand is not None
    assert by_hand.hot is None
    assert _parsed(by_hand.snapshot) == _of(agent)
    assert by_hand.record == changed


def test_ending_without_advancing_keeps_the_stored_snapshot(store: RunStore) -> None:
    agent = _started()
    record = _record()
    store.create(record, agent.snapshot(), due_ms=5_000)
    _advance(store, agent, record, 4)
    loaded = store.load("r1")
    assert loaded is not None
    ended = Advanced(record, loaded.snapshot, Effects(retention_s=60), stored=KEEP)
    assert store.save(ended, loaded.version) is Saved.SAVED
    assert _stored(store) == _of(agent)
    assert 0 < store.redis.ttl(store.keys.history("r1")) <= 60  # it expires with the run
    assert store.hot.version("r1") == ""


def test_hot_agents_keep_the_most_recently_used_runs() -> None:
    hot = HotAgents(size=2)
    agent = _started()
    for run_id in ("a", "b", "c"):
        hot.put(run_id, HotAgent("1", b"{}", _record(run_id=run_id), agent))
    assert [hot.version(r) for r in ("a", "b", "c")] == ["", "1", "1"]
    assert hot.get("b", "2", b"{}") is None  # another version never uses it
    assert hot.get("b", "1", b"{ }") is None  # nor another record
    assert hot.get("b", "1", b"{}") is not None


# --- the record's fixed fields, kept apart ---------------------------------------------------


def _bytes_in(store: RunStore) -> int:
    return int(store.redis.info("stats")["total_net_input_bytes"])


def test_a_step_writes_the_fields_that_change_and_not_the_fixed_ones_again(
    store: RunStore,
) -> None:
    long_task = "Summarise the attached report. " * 4_000  # ~120 KB
    record = _record().model_copy(update={"task": long_task, "key": "tenant-a", "memory": "m"})
    agent = Agent(TRIMMED, TOOLS)
    agent.start(long_task)
    assert store.create(record, agent.snapshot(), due_ms=5_000)
    key = store.keys.run("r1")
    assert len(store.redis.hget(key, "fixed") or b"") > len(long_task)
    assert not store.redis.hexists(key, "start")  # the task is the record's: kept once
    assert b"Summarise" not in (store.redis.hget(key, "meta") or b"")
    journal = read_start(store.redis.lindex(store.keys.journal("r1"), 0) or b"")
    assert (journal.record, journal.snapshot) == (record, agent.snapshot())  # the whole start

    for n in range(3):
        loaded = store.load("r1")
        assert loaded is not None
        assert loaded.record is not None
        assert loaded.record.task == long_task  # read back whole
        assert loaded.fixed_stored
        restored = Agent.restore(TRIMMED, TOOLS, loaded.snapshot)  # the agent's task too
        assert restored.snapshot() == agent.snapshot()
        was = agent.history()  # as stored: the write is worked out from it
        _move(agent, n)
        step = Advanced(
            loaded.record.model_copy(update={"seq": n + 1, "updated_ms": 2_000 + n}),
            agent.snapshot(),
            Effects(),
            stored=write(was, agent),
            fixed_stored=loaded.fixed_stored,
        )
        before = _bytes_in(store)
        assert store.save(step, loaded.version) is Saved.SAVED
        assert _bytes_in(store) - before < 20_000  # the task is not sent again
        for changing in ("meta", "head"):  # (the start's trace line was taken: `_move`)
            assert b"Summarise" not in (store.redis.hget(key, changing) or b"")
        store.hot.forget("r1")  # read it back from Redis, not from this process
    again = store.read("r1")
    assert again is not None
    assert again[0].task == long_task
    assert (again[0].seq, again[0].key, again[0].memory) == (3, "tenant-a", "m")


def test_a_start_that_is_only_the_records_task_is_no_field_and_a_head_holding_one_is_read_whole(
    store: RunStore,
) -> None:
    record = _record().model_copy(update={"task": "read the files"})  # the agent's task
    agent = _started()
    assert store.create(record, agent.snapshot(), due_ms=5_000)
    key = store.keys.run("r1")
    assert not store.redis.hexists(key, "start")
    loaded = store.load("r1", hot=False)
    assert loaded is not None
    assert loaded.fixed_stored
    assert Agent.restore(TRIMMED, TOOLS, loaded.snapshot).snapshot() == agent.snapshot()
    # A head that holds its start and has no `start` beside it (as a save of an older
    # version could leave it) is read whole, and its next save keeps the start apart.
    head, _, _ = split(agent.snapshot())
    store.redis.hset(key, "head", head.replace("read the files", "its own task"))
    loaded = store.load("r1", hot=False)
    assert loaded is not None
    assert not loaded.fixed_stored
    assert json.loads(loaded.snapshot)["state"]["task"] == "its own task"
    was = Agent.restore(TRIMMED, TOOLS, loaded.snapshot)
    moved = was.copy()
    _move(moved, 0)
    step = Advanced(
        record.model_copy(update={"seq": 1, "updated_ms": 2_000}),
        moved.snapshot(),
        Effects(),
        stored=write(was.history(), moved),
        fixed_stored=False,
    )
    assert store.save(step, loaded.version) is Saved.SAVED
    assert json.loads(store.redis.hget(key, "start") or b"") == {"task": "its own task"}
    again = store.load("r1", hot=False)
    assert again is not None
    assert again.fixed_stored
    assert Agent.restore(TRIMMED, TOOLS, again.snapshot).snapshot() == moved.snapshot()


def test_a_head_with_a_task_argument_keeps_the_runs_task(store: RunStore) -> None:
    # A delegate's call has a `task` argument: the head holds that key, nested, and
    # no start of its own. The run's task is still the record's, saved and loaded.
    tools = [Tool("hand_on", "Hand a part on").arg("task", Kind.TEXT).risk(Risk.READ)]
    agent = Agent(TRIMMED, tools)
    agent.start("the whole job")
    assert isinstance(agent.resume(), Ask)
    agent.reply(call("hand_on", task="a part"))
    record = _record().model_copy(update={"task": "the whole job"})
    assert store.create(record, agent.snapshot(), due_ms=5_000)
    key = store.keys.run("r1")
    assert b'"task":"a part"' in (store.redis.hget(key, "head") or b"")
    for _ in range(2):  # read as created, then after a save
        loaded = store.load("r1", hot=False)
        assert loaded is not None
        restored = Agent.restore(TRIMMED, tools, loaded.snapshot)
        assert restored.snapshot() == agent.snapshot()
        step = Advanced(
            record.model_copy(update={"seq": 1, "updated_ms": 2_000}),
            agent.snapshot(),
            Effects(),
            stored=write(restored.history(), agent),
            fixed_stored=loaded.fixed_stored,
        )
        assert store.save(step, loaded.version) is Saved.SAVED
    assert json.loads(store.redis.hget(key, "start") or b"") == {}  # apart from now on


def test_a_run_from_before_the_fixed_fields_were_apart_keeps_them_apart_from_its_next_save(
    store: RunStore,
) -> None:
    record = _record().model_copy(update={"key": "tenant-a", "app": "shop"})
    agent = _started()
    key = store.keys.run("r1")
    # As the previous code wrote runs: the whole record in `meta`, no `fixed`.
    head, entries, _ = split(agent.snapshot())  # its head holding its task
    store.redis.hset(key, mapping={"v": 4, "meta": record.model_dump_json(), "sf": 2, "head": head})
    if entries:
        store.redis.rpush(store.keys.history("r1"), *entries)
    loaded = store.load("r1")
    assert loaded is not None
    assert loaded.record == record
    assert not loaded.fixed_stored
    _move(agent, 0)
    changed = record.model_copy(update={"seq": 1, "updated_ms": 2_000})
    stored = write(agent.history(), agent)
    step = Advanced(changed, agent.snapshot(), Effects(), stored=stored, fixed_stored=False)
    assert store.save(step, loaded.version) is Saved.SAVED
    meta = json.loads(store.redis.hget(key, "meta") or b"{}")
    fixed = json.loads(store.redis.hget(key, "fixed") or b"{}")
    assert (fixed["task"], fixed["key"], fixed["app"]) == ("read", "tenant-a", "shop")
    assert not {"id", "task", "key", "app", "config"} & set(meta)
    assert json.loads(store.redis.hget(key, "start") or b"{}")["task"] == "read the files"
    assert b"read the files" not in (store.redis.hget(key, "head") or b"")
    again = store.load("r1", hot=False)
    assert again is not None
    assert again.record == changed
    assert again.fixed_stored
    assert Agent.restore(TRIMMED, TOOLS, again.snapshot).snapshot() == agent.snapshot()
