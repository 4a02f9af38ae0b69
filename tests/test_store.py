"""The run store's atomic steps against a real private Redis (no workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Config, Outcome, Stop, ToolOutput
from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import RelayError, Settings
from workers.engine import Message, message_of
from workers.records import CallDecision, Pending, RunRecord, ToolDone
from workers.store import OwnOutcome, RunStore, SaveEffects, pending_member


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    with RedisServer(tmp_path) as server:
        yield RunStore(server.url, "t:")


def _record(run_id: str = "r1", **changes: object) -> RunRecord:
    fields: dict[str, object] = {
        "id": run_id,
        "root": run_id.split(".", maxsplit=1)[0],
        "task": "a task",
        "created_ms": 1_000,
        "updated_ms": 1_000,
        "config": Config(),
    }
    return RunRecord.model_validate({**fields, **changes})


def test_a_save_from_a_stale_version_is_refused(store: RunStore) -> None:
    assert store.create(_record(), "snap-0", due_ms=5_000, budget=None)
    assert not store.create(_record(), "snap-0", due_ms=5_000, budget=None)  # the id is taken
    loaded = store.load("r1")
    assert loaded is not None
    assert loaded.version == "1"
    assert store.save(_record(seq=1), loaded.version, "snap-1", SaveEffects()) == 1
    # A second writer that loaded version 1 too loses the race and must reload.
    assert store.save(_record(seq=9), loaded.version, "snap-9", SaveEffects()) == 0
    again = store.load("r1")
    assert again is not None
    assert again.version == "2"
    assert again.snapshot == "snap-1"
    assert again.record is not None
    assert again.record.seq == 1


def test_a_claim_is_taken_once_and_counts_attempts(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    first = store.claim(
        "r1", "call-1", member="t|r1|call-1", token="a", lease_ms=200, now_ms=0, root="r1"
    )
    assert (first.status, first.attempts) == ("claimed", 1)
    assert first.loaded is not None
    assert first.loaded.snapshot == "snap"
    assert first.loaded.version == "1"
    busy = store.claim(
        "r1", "call-1", member="t|r1|call-1", token="b", lease_ms=200, now_ms=0, root="r1"
    )
    assert busy.status == "busy"  # a duplicate delivery while the call runs does nothing
    # Once the lease lapses (a dead worker), the next claim is a second attempt.
    store.redis.delete(store.keys.lease("r1", "call-1"))
    second = store.claim(
        "r1", "call-1", member="t|r1|call-1", token="c", lease_ms=200, now_ms=0, root="r1"
    )
    assert (second.status, second.attempts) == ("claimed", 2)
    event = ToolDone(call="call-1", output=ToolOutput.ok("fine"))
    code, loaded = store.record(
        "r1", "call-1", event, member="t|r1|call-1", token="c", due_ms=9, counted=False
    )
    assert code == 1
    assert loaded is not None
    assert [e for _, e in loaded.inbox] == [event]
    # Recorded: later claims see it done, and a second record adds nothing.
    done = store.claim(
        "r1", "call-1", member="t|r1|call-1", token="d", lease_ms=200, now_ms=0, root="r1"
    )
    assert done.status == "done"
    again = store.record(
        "r1", "call-1", event, member="t|r1|call-1", token="c", due_ms=9, counted=False
    )
    assert again == (0, None)
    reloaded = store.load("r1")
    assert reloaded is not None
    assert len(reloaded.inbox) == 1
    gone = store.claim(
        "nope", "call-1", member="t|nope|call-1", token="e", lease_ms=200, now_ms=0, root="nope"
    )
    assert gone.status == "gone"


def test_a_claim_reports_the_root_budget(store: RunStore) -> None:
    store.create(_record("root"), "snap", due_ms=5_000, budget=1_000)
    store.create(
        _record("root.call-1", parent="root", root="root"), "snap", due_ms=5_000, budget=None
    )
    effects = SaveEffects(usage=[("root", 300, 100, 400)])
    loaded = store.load("root")
    assert loaded is not None
    store.save(_record("root"), loaded.version, "snap", effects)
    claim = store.claim(
        "root.call-1",
        "m1",
        member="m|root.call-1|1",
        token="a",
        lease_ms=500,
        now_ms=0,
        root="root",
    )
    assert (claim.root_tokens, claim.root_budget) == (400, 1_000)


def test_a_decision_is_used_once(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    pending = Pending(
        kind="call", run_id="r1", root_id="r1", call_id="call-1", summary="s", created_ms=1
    )
    loaded = store.load("r1")
    assert loaded is not None
    store.save(
        _record(pending=(pending_member(pending),)),
        loaded.version,
        "snap",
        SaveEffects(pending_add=[pending]),
    )
    assert store.pending() == [pending]
    decision = CallDecision(call="call-1", yes=True)
    assert store.decide("r1", pending_member(pending), "d:call-1", decision, 9) == 1
    assert store.pending() == []
    assert (
        store.decide("r1", pending_member(pending), "d:call-1", decision, 9) == -1
    )  # decided already
    other = "r1|call|call-2"
    assert (
        store.decide("r1", other, "d:call-2", CallDecision(call="call-2", yes=True), 9) == 0
    )  # never pending


def test_a_finished_run_expires_and_leaves_the_index(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    loaded = store.load("r1")
    assert loaded is not None
    finished = _record(state="finished", outcome=Outcome(stop=Stop.DONE, summary="ok"))
    store.save(finished, loaded.version, "snap", SaveEffects(retention=100))
    assert 0 < store.redis.ttl(store.keys.run("r1")) <= 100
    assert store.due_messages(10**15) == []  # nothing left to send for it
    assert store.prune_runs(older_than_ms=10**15) == 0  # still there: kept
    store.redis.delete(store.keys.run("r1"))  # what expiry does
    assert store.prune_runs(older_than_ms=10**15) == 1
    assert store.runs() == []


@pytest.mark.parametrize(
    "message",
    [
        Message("advance", "r1"),
        Message("call_model", "r1.call-2", seq=7),
        Message("run_tool", "r1", call="call-3"),
    ],
)
def test_an_outbox_member_reads_back_as_its_message(message: Message) -> None:
    again = message_of(message.member)
    assert again is not None
    assert (again.kind, again.run, again.seq, again.call) == (
        message.kind,
        message.run,
        message.seq,
        message.call,
    )


@pytest.mark.parametrize("member", ["", "x|r1", "m|r1|seven", "a", "t|r1"])
def test_an_unreadable_outbox_member_is_skipped(member: str) -> None:
    assert message_of(member) is None


def _claimed(store: RunStore, call: str, token: str) -> None:
    claim = store.claim(
        "r1", call, member=f"t|r1|{call}", token=token, lease_ms=5_000, now_ms=0, root="r1"
    )
    assert claim.status == "claimed"


def test_only_the_last_result_of_a_batch_asks_for_an_advance(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    loaded = store.load("r1")
    assert loaded is not None
    batch = ["call-1", "call-2", "call-3"]
    assert store.save(_record(seq=1), loaded.version, "snap", SaveEffects(running=batch)) == 1
    codes = []
    for call in batch:
        _claimed(store, call, "x")
        event = ToolDone(call=call, output=ToolOutput.ok(call))
        code, _ = store.record(
            "r1", call, event, member=f"t|r1|{call}", token="x", due_ms=9, counted=True
        )
        codes.append(code)
    assert codes == [2, 2, 1]
    # The others left a late advance in the outbox, in case the last one never comes.
    assert store.due_messages(10) == ["a|r1"]


def test_a_save_counts_what_is_still_out(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    _claimed(store, "call-1", "x")
    done = ToolDone(call="call-1", output=ToolOutput.ok("one"))
    store.record("r1", "call-1", done, member="t|r1|call-1", token="x", due_ms=9, counted=True)
    loaded = store.load("r1")
    assert loaded is not None
    # call-1 is recorded but not applied yet: only call-2 is still out.
    effects = SaveEffects(running=["call-1", "call-2"])
    assert store.save(_record(seq=1), loaded.version, "snap", effects) == 1
    assert store.redis.hget(store.keys.run("r1"), "out") == b"1"


def test_a_call_saving_its_own_outcome_is_refused_if_it_was_recorded(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000, budget=None)
    _claimed(store, "call-1", "x")
    loaded = store.load("r1")
    assert loaded is not None
    done = ToolDone(call="call-1", output=ToolOutput.ok("one"))
    store.record("r1", "call-1", done, member="t|r1|call-1", token="x", due_ms=9, counted=False)
    lease = store.keys.lease("r1", "call-1")
    own = SaveEffects(own=OwnOutcome("r:call-1", lease, "y", "t|r1|call-1"))
    assert store.save(_record(seq=1), loaded.version, "snap", own) == -1
    # Applied, the markers go: a late duplicate finds the call stale, not pending.
    forget = SaveEffects(forget=["r:call-1", "a:call-1"])
    assert store.save(_record(seq=1), loaded.version, "snap", forget) == 1
    assert not store.redis.hexists(store.keys.run("r1"), "r:call-1")
    assert not store.redis.hexists(store.keys.run("r1"), "a:call-1")


def test_a_run_started_twice_under_one_id_is_one_run(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        first = relay.start("A task", run_id="s0123abcd")
        again = relay.start("A task", run_id="s0123abcd")
        assert first == again == "s0123abcd"
        assert relay.store.runs() == ["s0123abcd"]
        # Only the start that created it sent its first wake-up.
        assert server.client().llen("relay:advance") == 1
        for bad in ("", "has.dot", "a|b", "x" * 65):
            with pytest.raises(RelayError):
                relay.start("A task", run_id=bad)
