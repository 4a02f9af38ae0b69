"""The run store's atomic steps against a real private Redis (no workers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent_core import Config, Outcome, Risk, Stop, ToolOutput
from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import RelayError, Settings, StoreUnavailable
from workers.client.runs import RunsClient
from workers.engine.budget import Admission, Budget
from workers.engine.effects import Advanced, Effects, Message, OwnOutcome, Reservation, UsageAdd
from workers.engine.events import BudgetExtended, CallDecision, FollowUp, ToolDone, expiry_event
from workers.engine.ids import pending_member as member_of
from workers.engine.journal import JOURNAL_MAX
from workers.engine.records import CallTrack, Pending, RunRecord, TraceEntry, Usage
from workers.engine.working import Surroundings, Working
from workers.errors import RunCorrupt
from workers.model.endpoints import ModelRoute
from workers.model.limits import RouteLimits
from workers.settings import now_ms
from workers.store import codec, scripts
from workers.store.layout import TRACE_MAX, Keys, RunFields
from workers.store.runs import CallClaim, Claim, HeldLease, RunStore
from workers.store.scripts import (
    Admitted,
    ClaimStatus,
    Decided,
    Recorded,
    Renewed,
    ReplyAnswer,
    Saved,
)


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


def _running(*calls: str, run_id: str = "r1", **changes: object) -> RunRecord:
    """A record whose batch has `calls` running (so they may be claimed)."""
    tracks = {c: CallTrack(status="running", tool="read_note", created_ms=1) for c in calls}
    return _record(run_id, calls=tracks, **changes)


def _step(record: RunRecord, snapshot: str = "snap", **effects: object) -> Advanced:
    return Advanced(record, snapshot, Effects(**effects))  # type: ignore[arg-type]


def pending_member(pending: Pending) -> str:
    what = pending.call_id if pending.call_id is not None else str(pending.seq)
    return member_of(pending.run_id, pending.kind, what)


def _save(store: RunStore, record: RunRecord, **effects: object) -> str:
    """Save `record` over the run as it stands; return the new version."""
    loaded = store.load(record.id)
    assert loaded is not None
    assert store.save(_step(record, **effects), loaded.version) is Saved.SAVED
    return str(int(loaded.version) + 1)


def _claim(
    store: RunStore,
    call: str,
    token: str,
    run_id: str = "r1",
    seq: int | None = None,
    *,
    task: str = "",
) -> Claim:
    return store.claim(
        run_id,
        call,
        seq=seq,
        token=token,
        lease_ms=5_000,
        now_ms=0,
        task=task,
    )


def _record_outcome(
    store: RunStore, call: str, token: str, attempt: int, *, counted: bool = False
) -> Recorded:
    event = ToolDone(call=call, output=ToolOutput.ok(call))
    recorded, _ = store.record(
        "r1",
        call,
        event,
        attempt=attempt,
        member=f"t|r1|{call}",
        token=token,
        due_ms=9,
        counted=counted,
    )
    return recorded


def test_a_save_from_a_stale_version_is_refused(store: RunStore) -> None:
    assert store.create(_record(), "snap-0", due_ms=5_000)
    assert not store.create(_record(), "snap-0", due_ms=5_000)  # the id is taken
    loaded = store.load("r1")
    assert loaded is not None
    assert loaded.version == "1"
    assert store.save(_step(_record(seq=1), "snap-1"), loaded.version) is Saved.SAVED
    # A second writer that loaded version 1 too loses the race and must reload.
    assert store.save(_step(_record(seq=9), "snap-9"), loaded.version) is Saved.STALE
    again = store.load("r1")
    assert again is not None
    assert again.version == "2"
    assert again.snapshot == "snap-1"
    assert again.record is not None
    assert again.record.seq == 1


def test_a_claim_is_taken_once_and_counts_attempts(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1"))
    first = _claim(store, "call-1", "a", task="task-1")
    assert (first.status, first.attempts, first.task_before) == (ClaimStatus.CLAIMED, 1, "")
    assert first.loaded is not None
    assert first.loaded.snapshot == "snap"
    assert first.loaded.version == "2"
    busy = _claim(store, "call-1", "b")
    assert busy.status is ClaimStatus.BUSY  # a duplicate delivery while the call runs does nothing
    # Once the lease lapses (a dead worker), the next claim is a second attempt.
    store.redis.delete(store.keys.lease("r1", "call-1"))
    # The tick says in the trace that attempt 1 was lost, naming its task (once).
    assert store.note_resent("r1", "call-1", now_ms=9) == 2
    assert store.note_resent("r1", "call-1", now_ms=9) is None
    [resent] = [e for e in store.trace("r1")[1] if e.kind == "resent"]
    assert (resent.call_id, resent.data["task"], resent.data["attempt"]) == ("call-1", "task-1", 2)
    second = _claim(store, "call-1", "c", task="task-2")
    assert (second.status, second.attempts) == (ClaimStatus.CLAIMED, 2)
    assert second.task_before == "task-1"  # the lost attempt's task, for the worker to name
    # The worker that took it over finds it said already: nothing twice.
    assert store.note_resent("r1", "call-1", now_ms=9, taken=2, lost_task="task-1") is None
    assert _record_outcome(store, "call-1", "c", attempt=2) is Recorded.ADVANCE
    reloaded = store.load("r1")
    assert reloaded is not None
    assert [e for _, e in reloaded.inbox] == [
        ToolDone(call="call-1", output=ToolOutput.ok("call-1"))
    ]
    # Recorded: later claims see it done, and a second record adds nothing.
    assert _claim(store, "call-1", "d").status is ClaimStatus.DONE
    assert _record_outcome(store, "call-1", "c", attempt=2) is Recorded.DUPLICATE
    reloaded = store.load("r1")
    assert reloaded is not None
    assert len(reloaded.inbox) == 1
    assert _claim(store, "call-1", "e", run_id="nope").status is ClaimStatus.GONE


def test_the_worker_that_takes_a_lost_call_over_says_so_if_the_tick_did_not(
    store: RunStore,
) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1"))
    _claim(store, "call-1", "a", task="task-1")
    store.redis.delete(store.keys.lease("r1", "call-1"))  # lapsed; no tick looked meanwhile
    second = _claim(store, "call-1", "b", task="task-2")
    taken = {"taken": second.attempts, "lost_task": second.task_before}
    assert store.note_resent("r1", "call-1", now_ms=9, **taken) == 2  # type: ignore[arg-type]
    assert store.note_resent("r1", "call-1", now_ms=9, **taken) is None  # type: ignore[arg-type]
    assert store.note_resent("r1", "call-1", now_ms=9) is None  # the tick: held, said already
    [resent] = [e for e in store.trace("r1")[1] if e.kind == "resent"]
    assert (resent.data["lost"], resent.data["task"]) == (1, "task-1")


@pytest.mark.parametrize(
    ("record", "call", "seq"),
    [
        pytest.param(
            _record(calls={"call-1": CallTrack(status="approval", tool="pay", created_ms=1)}),
            "call-1",
            None,
            id="waiting-for-approval",
        ),
        pytest.param(
            _record(calls={"call-1": CallTrack(status="child", tool="delegate", created_ms=1)}),
            "call-1",
            None,
            id="a-delegation",
        ),
        pytest.param(_running("call-2"), "call-1", None, id="not-in-the-batch"),
        pytest.param(_record(), "call-1", None, id="never-made"),
        pytest.param(
            _running("call-1", state="finished", outcome=Outcome(stop=Stop.DONE, summary="x")),
            "call-1",
            None,
            id="run-finished",
        ),
        pytest.param(_record(asked=3, seq=3), "m2", 2, id="model-call-not-asked"),
        pytest.param(_record(asked=3, seq=4), "m3", 3, id="model-call-answered-already"),
        pytest.param(_running("call-1", asked=None), "m0", 0, id="model-call-never-asked"),
        pytest.param(_running("call-1", "call-2"), "call-1 call-2", None, id="two-in-one-name"),
        pytest.param(_running("call-12"), "call-1", None, id="a-prefix-of-a-running-call"),
        pytest.param(_running("call-1", asked=3, seq=3), "call-1|3", None, id="a-forged-name"),
    ],
)
@pytest.mark.parametrize("due_kept", [True, False], ids=["due", "record-decoded"])
def test_a_claim_the_record_does_not_call_for_is_refused(
    store: RunStore, record: RunRecord, call: str, seq: int | None, *, due_kept: bool
) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, record)
    if not due_kept:  # as a run saved before `due` was kept: the record is decoded
        store.redis.hdel(store.keys.run("r1"), "due")
    refused = _claim(store, call, "a", seq=seq)
    assert refused.status is ClaimStatus.REFUSED
    assert refused.loaded is None
    # Nothing was counted and no lease was taken.
    run = store.redis.hgetall(store.keys.run("r1"))
    assert f"a:{call}".encode() not in run
    assert not store.redis.exists(store.keys.lease("r1", call))


@pytest.mark.parametrize("due_kept", [True, False], ids=["due", "record-decoded"])
def test_a_call_the_record_asked_for_is_claimed(store: RunStore, *, due_kept: bool) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1", "call-3", asked=4, seq=4))
    if not due_kept:
        store.redis.hdel(store.keys.run("r1"), "due")
    # (A record with a model call and two tool calls due at once, so both kinds of
    # claim are checked on one run; each is a claim of its own.)
    assert _claim(store, "m4", "a", seq=4).status is ClaimStatus.CLAIMED
    assert _claim(store, "call-3", "a").status is ClaimStatus.CLAIMED
    assert _claim(store, "call-1", "a").status is ClaimStatus.CLAIMED
    # Each call's message is due again when its lease ends (_claim's now 0, lease 5 s),
    # under the member the tick sends it by.
    outbox = store.redis.zrange(store.keys.index("r1").outbox, 0, -1, withscores=True)
    messages = [
        Message("call_model", "r1", seq=4),
        Message("run_tool", "r1", call="call-3"),
        Message("run_tool", "r1", call="call-1"),
    ]
    assert {m.decode(): s for m, s in outbox if m != b"a|r1"} == {m.member: 5_000 for m in messages}


def test_a_run_whose_usage_is_on_one_route_saves_it_once() -> None:
    """The record is saved every step: its usage on one route is not written twice. A
    second route, or usage from no route, splits it as before."""
    around = Surroundings(now_ms=1, grace_ms=1, approval_ttl_ms=None, retention_s=0)
    first, second = Usage(prompt_tokens=10, total_tokens=12), Usage(prompt_tokens=3)
    working = Working(_record(), None, around)
    working.add_usage(first, "default", "m1")
    working.add_usage(first, "default", "m3")
    one_route = working.decided("snap").record
    stored = json.loads(codec.record_json(one_route))
    assert stored["usage_route"] == "default"
    assert "usage_by_route" not in stored
    read = codec.record_of(codec.record_json(one_route), codec.fixed_json(one_route))
    assert read.route_usage() == {"default": first + first}
    assert read.usage == first + first
    # Read back, it goes on: a second route splits the usage by route.
    working = Working(read, None, around)
    working.add_usage(second, "backup", "m5")
    two_routes = working.decided("snap").record
    stored = json.loads(codec.record_json(two_routes))
    assert "usage_route" not in stored
    read = codec.record_of(codec.record_json(two_routes), codec.fixed_json(two_routes))
    assert read.route_usage() == {"default": first + first, "backup": second}
    # Usage from a model with no routes is in `usage` only: no route holds all of it.
    working = Working(_record(), None, around)
    working.add_usage(second, "", "m1")
    working.add_usage(first, "default", "m3")
    assert working.decided("snap").record.route_usage() == {"default": first}


def test_a_save_keeps_what_a_claim_may_take_beside_the_record(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    assert store.redis.hget(store.keys.run("r1"), "due") is None  # (the record is decoded)
    # "<the version it was written at>|<model call due>|<its request's bytes>|<tool calls>"
    _save(store, _running("call-1", "call-2", asked=4, seq=4, asked_bytes=900))
    assert store.redis.hget(store.keys.run("r1"), "due") == b"2|4|900|call-1 call-2"
    _save(store, _running("call-2", asked=4, seq=5))
    assert store.redis.hget(store.keys.run("r1"), "due") == b"3||0|call-2"
    finished = _running(
        "call-2", asked=6, seq=6, state="finished", outcome=Outcome(stop=Stop.DONE, summary="x")
    )
    _save(store, finished)
    assert store.redis.hget(store.keys.run("r1"), "due") == b"4|||"


def test_a_due_left_by_an_earlier_save_is_not_trusted(store: RunStore) -> None:
    """A worker of an older Relay saves the record without `due`: the one a newer save
    left behind names an earlier version, so a claim reads the record instead."""
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1", asked=4, seq=4))
    run = store.keys.run("r1")
    moved_on = _running("call-2", asked=5, seq=5)  # as an older worker's SAVE writes it
    store.redis.hset(run, mapping={"v": 3, "meta": codec.record_json(moved_on)})
    assert _claim(store, "call-1", "a").status is ClaimStatus.REFUSED
    assert _claim(store, "m4", "a", seq=4).status is ClaimStatus.REFUSED
    assert _claim(store, "call-2", "a").status is ClaimStatus.CLAIMED
    assert _claim(store, "m5", "a", seq=5).status is ClaimStatus.CLAIMED


def test_a_corrupt_record_refuses_every_claim(store: RunStore) -> None:
    store.create(_running("call-1"), "snap", due_ms=5_000)
    store.redis.hset(store.keys.run("r1"), "meta", "{not json")
    assert _claim(store, "call-1", "a").status is ClaimStatus.REFUSED


def test_an_outcome_from_an_attempt_that_was_taken_over_is_fenced(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    version = _save(store, _running("call-1"))
    assert _claim(store, "call-1", "first").attempts == 1
    store.redis.delete(store.keys.lease("r1", "call-1"))  # the first worker's lease lapsed
    assert _claim(store, "call-1", "second").attempts == 2
    # The first attempt finishes late: neither recording nor saving its outcome is taken.
    assert _record_outcome(store, "call-1", "first", attempt=1) is Recorded.FENCED
    lease = store.keys.lease("r1", "call-1")
    own = OwnOutcome("r1", "call-1", 1, "first", "t|r1|call-1")
    assert store.save(_step(_record(seq=1)), version, own) is Saved.FENCED
    loaded = store.load("r1")
    assert loaded is not None
    assert loaded.inbox == []
    assert loaded.version == version  # nothing was saved
    assert store.redis.get(lease) == b"second"  # the second attempt's lease is untouched
    # The attempt that holds the call records its outcome.
    assert _record_outcome(store, "call-1", "second", attempt=2) is Recorded.ADVANCE


def test_a_lapsed_lease_is_taken_back_unless_another_attempt_claimed(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1"))
    _claim(store, "call-1", "first")
    lease = store.keys.lease("r1", "call-1")

    def renew(token: str, attempt: int) -> Renewed:
        held = HeldLease("r1", "call-1", attempt, "t|r1|call-1", token, lease_ms=5_000)
        return store.renew(held, now_ms=0)

    assert renew("first", 1) is Renewed.KEPT
    store.redis.delete(lease)  # too busy to renew in time; nobody took over
    assert renew("first", 1) is Renewed.KEPT
    assert store.redis.get(lease) == b"first"
    store.redis.delete(lease)
    _claim(store, "call-1", "second")  # this time another worker took it over
    assert renew("first", 1) is Renewed.LOST
    assert store.redis.get(lease) == b"second"
    # The same round trip tells the holder that its run was cancelled.
    assert renew("second", 2) is Renewed.KEPT
    store.redis.hset(store.keys.run("r1"), RunFields.CANCEL, 1)
    assert renew("second", 2) is Renewed.CANCELLED
    assert store.redis.pttl(lease) > 0  # kept: the holder stops the call and gives it up


def test_a_claim_given_back_does_not_count(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1"))
    _claim(store, "call-1", "a")
    back = {"attempt": 1, "member": "t|r1|call-1", "due_ms": 77}
    assert not store.unclaim("r1", "call-1", token="a", attempt=2, member="t|r1|call-1", due_ms=77)
    store.redis.delete(store.keys.lease("r1", "call-1"))  # a slow wait: the lease lapsed
    assert store.unclaim("r1", "call-1", token="a", **back)  # type: ignore[arg-type]
    assert not store.redis.hexists(store.keys.run("r1"), "a:call-1")
    assert store.upkeep.due_messages(77) == ["t|r1|call-1"]
    assert _claim(store, "call-1", "b").attempts == 1  # the next claim is a first attempt


def _tree(store: RunStore, budget: Budget, asked_bytes: int = 400, created_ms: int = 1_000) -> None:
    """A root with `budget` and a child that asks the model for a request of that size."""
    store.create(_record("root", budget=budget, created_ms=created_ms), "snap", due_ms=5_000)
    child = _record("root.call-1", parent="root", root="root", ancestors=("root",))
    store.create(child, "snap", due_ms=5_000)
    _save(store, child.model_copy(update={"asked": 1, "seq": 1, "asked_bytes": asked_bytes}))


def _model_claim(store: RunStore, token: str, admission: Admission, now: int = 0) -> Claim:
    return store.claim(
        "root.call-1",
        "m1",
        seq=1,
        token=token,
        lease_ms=5_000,
        now_ms=now,
        admission=admission,
    )


@pytest.mark.parametrize("due_kept", [True, False], ids=["due", "record-decoded"])
def test_a_model_call_is_admitted_within_its_trees_budget_and_reserves_its_estimate(
    store: RunStore, *, due_kept: bool
) -> None:
    _tree(store, Budget(tokens=1_000, usd=0.01, model_calls=5))
    if not due_kept:  # the request's size is then read from the record
        store.redis.hdel(store.keys.run("root.call-1"), "due")
    # 400 bytes: up to 200 prompt tokens; a reply of up to 100; at $2 and $8 per M.
    claim = _model_claim(store, "a", Admission(100, 2.0, 8.0))
    assert (claim.status, claim.over) == (ClaimStatus.CLAIMED, None)
    limits = store.limits("root")
    assert limits is not None
    assert (limits.tokens, limits.cost_micro, limits.model_calls) == (1_000, 10_000, 5)
    assert limits.reserved == (300, 200 * 2 + 100 * 8, 1)
    # A second attempt (the first worker died) does not reserve twice.
    store.redis.delete(store.keys.lease("root.call-1", "m1"))
    assert _model_claim(store, "b", Admission(100, 2.0, 8.0)).attempts == 2
    assert store.limits("root").reserved == (300, 1_200, 1)  # type: ignore[union-attr]
    # The save that applies its outcome settles the reservation.
    settle = (Reservation("root", "root.call-1", "m1"),)
    _save(store, _record("root.call-1", parent="root", root="root"), settle=settle)
    assert store.limits("root").reserved == (0, 0, 0)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tokens", "cap"),
    [
        (10_000, 0),  # room for the whole max_tokens: the reply is not capped further
        (3_000, 2_800),  # 200 prompt tokens, and what is left of the tree for the reply
        (200 + 256, 256),  # just the smallest reply worth asking for
    ],
)
def test_a_model_calls_reply_is_capped_to_what_its_tree_has_left(
    store: RunStore, tokens: int, cap: int
) -> None:
    _tree(store, Budget(tokens=tokens))
    claim = _model_claim(store, "a", Admission(4_096, 0.0, 0.0))
    assert claim.over is None
    expected = cap or 4_096
    assert claim.reply_cap == expected
    assert store.limits("root").reserved[0] == 200 + expected  # type: ignore[union-attr]
    # Its next attempt (the first worker died) gets the same cap, reserved once.
    store.redis.delete(store.keys.lease("root.call-1", "m1"))
    again = _model_claim(store, "b", Admission(4_096, 0.0, 0.0))
    assert (again.attempts, again.reply_cap) == (2, expected)
    assert store.limits("root").reserved[0] == 200 + expected  # type: ignore[union-attr]


def test_a_tree_without_room_for_a_useful_reply_is_not_admitted(store: RunStore) -> None:
    _tree(store, Budget(tokens=200 + 255))
    over = _model_claim(store, "a", Admission(4_096, 0.0, 0.0)).over
    assert over is not None
    assert (over.limit, over.cap, over.estimate) == ("tokens", 455, 456)


def test_a_dollar_budget_caps_the_reply_too(store: RunStore) -> None:
    # $0.01 = 10,000 micro-dollars; the prompt's 200 tokens at 2 cost 400; at 8 a reply
    # token, 1,200 tokens are what is left.
    _tree(store, Budget(usd=0.01))
    claim = _model_claim(store, "a", Admission(4_096, 2.0, 8.0))
    assert claim.over is None
    assert claim.reply_cap == 1_200
    assert store.limits("root").reserved[1] <= 10_000  # type: ignore[union-attr]


def test_a_free_model_calls_reservation_settles_to_zero(store: RunStore) -> None:
    _tree(store, Budget(tokens=1_000))
    assert _model_claim(store, "a", Admission(100, 0.0, 0.0)).over is None
    settle = (Reservation("root", "root.call-1", "m1"),)
    _save(store, _record("root.call-1", parent="root", root="root"), settle=settle)
    assert store.limits("root").reserved == (0, 0, 0)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("budget", "limit"),
    [
        (Budget(tokens=299), "tokens"),
        (Budget(usd=0.001199), "usd"),
        (Budget(model_calls=1), "model_calls"),
    ],
)
def test_a_model_call_past_a_limit_is_claimed_but_not_admitted(
    store: RunStore, budget: Budget, limit: str
) -> None:
    _tree(store, budget)
    if limit == "model_calls":
        used = (UsageAdd("root", Usage(model_calls=1)),)
        _save(store, _record("root", budget=budget), usage_adds=used)
    claim = _model_claim(store, "a", Admission(100, 2.0, 8.0))
    assert claim.status is ClaimStatus.CLAIMED
    assert claim.over is not None
    assert claim.over.limit == limit
    limits = store.limits("root")
    assert limits is not None
    assert limits.reserved == (0, 0, 0)  # nothing reserved for a call that will not be made


def test_totals_kept_in_seven_fields_by_an_older_save_still_count_and_move_into_one(
    store: RunStore,
) -> None:
    budget = Budget(tokens=1_000, model_calls=5)
    _tree(store, budget)
    root = store.keys.run("root")
    # As saves before TOTALS left them: one field each (cached tokens and cost absent).
    store.redis.hdel(root, "u")
    store.redis.hset(root, mapping={"tp": 600, "tc": 200, "tt": 800, "mc": 5, "np": 5})
    total = store.read("root")
    assert total is not None
    assert (total[1].total_tokens, total[1].model_calls) == (800, 5)
    over = _model_claim(store, "a", Admission(100, 0.0, 0.0)).over
    assert over is not None  # 800 spent + 200 of prompt + a useful reply: past 1,000
    assert over.limit == "tokens"
    used = (UsageAdd("root", Usage(prompt_tokens=1, total_tokens=1, model_calls=1)),)
    _save(store, _record("root", budget=budget), usage_adds=used)
    assert store.redis.hget(root, "u") == b"601 200 801 0 0 6 5"
    assert not any(store.redis.hexists(root, field) for field in RunFields.USAGE)
    moved = store.read("root")
    assert moved is not None
    assert (moved[1].total_tokens, moved[1].model_calls, moved[1].unpriced_calls) == (801, 6, 5)
    store.redis.hset(root, "u", "601 two 801")  # written by hand: a clear error, not a crash
    with pytest.raises(RunCorrupt, match="usage totals"):
        store.read("root")


@pytest.mark.parametrize(("started_s_ago", "over"), [(1, False), (3, True)])
def test_a_tree_whose_time_is_up_admits_no_model_call(
    store: RunStore, started_s_ago: int, over: bool
) -> None:
    # Its time is up 2 s after it started, by Redis's clock (the caller's is not asked).
    started = now_ms() - started_s_ago * 1_000
    _tree(store, Budget(seconds=2), created_ms=started)
    claim = _model_claim(store, "a", Admission(0, 0.0, 0.0), now=0)
    assert (claim.over is not None and claim.over.limit == "deadline") is over
    assert store.upkeep.deadlines_due(started + 2_000) == ["root"]


def test_extending_raises_the_limits_it_has_and_wakes_the_parked_runs(store: RunStore) -> None:
    _tree(store, Budget(tokens=1_000, seconds=10))
    parked = Pending(
        kind="budget", run_id="root.call-1", root_id="root", summary="spent", created_ms=1, seq=1
    )
    child = _record("root.call-1", parent="root", root="root", pending=(pending_member(parked),))
    _save(store, child, pending_add=(parked,))
    assert store.people.pending_in_tree("root", "budget") == [parked]

    def extend(raise_by: Any, parked: list[Pending]) -> tuple[bool, int]:
        call = scripts.extend(store.keys, root="root", raise_by=raise_by, parked=parked, due_ms=9)
        extended = store.connection.run(call)
        assert extended is not None
        return extended.raised, extended.woken

    assert extend((500, 7_000, None, 5_000), [parked]) == (True, 1)
    limits = store.limits("root")
    assert limits is not None
    # The tokens and the deadline were raised; the tree had no dollar limit: still none.
    assert (limits.tokens, limits.cost_micro, limits.deadline_ms) == (1_500, None, 16_000)
    assert store.people.pending() == []
    loaded = store.load("root.call-1")
    assert loaded is not None
    assert [e for _, e in loaded.inbox] == [BudgetExtended(seq=1)]
    # Used once: a second extension raises the limits but wakes nobody.
    assert extend((1, None, None, None), [parked]) == (True, 0)
    assert extend((None, 1, None, None), []) == (False, 0)
    gone = scripts.extend(
        store.keys, root="nope", raise_by=(1, None, None, None), parked=[], due_ms=9
    )
    assert store.connection.run(gone) is None  # (extend_steps says RunNotFound first)


_PENDING_KINDS = [
    Pending(
        kind="call",
        run_id="r1",
        root_id="r1",
        call_id="call-1",
        tool="pay",
        summary="pay",
        args={"n": 10},
        risk=Risk.MONEY,
        created_ms=1,
        seq=2,
    ),
    Pending(kind="question", run_id="r1.c-2", root_id="r1", summary="why?", created_ms=1, seq=3),
    Pending(kind="plan", run_id="r1", root_id="r1", summary="plan", created_ms=1),  # (seq 0)
    Pending(kind="question", run_id="r1", root_id="r1", call_id="a-1", summary="?", created_ms=1),
]


@pytest.mark.parametrize("pending", _PENDING_KINDS)
def test_a_pending_entry_keeps_only_what_its_member_does_not_say(pending: Pending) -> None:
    member = pending_member(pending)
    stored = codec.pending_json(pending)
    assert pending.run_id not in stored
    assert codec.pending_read(member, stored) == pending
    # An entry written whole, before, reads as it did; a broken one is skipped.
    assert codec.pending_read(member, pending.model_dump_json(exclude_defaults=True)) == pending
    assert codec.pending_read(member, b"{not json") is None
    assert codec.pending_read("no-bars", stored) is None


def _pending_call(store: RunStore, expires_ms: int | None = None) -> Pending:
    store.create(_record(), "snap", due_ms=5_000)
    pending = Pending(
        kind="call",
        run_id="r1",
        root_id="r1",
        call_id="call-1",
        summary="s",
        created_ms=1,
        expires_ms=expires_ms,
    )
    _save(store, _record(pending=(pending_member(pending),)), pending_add=(pending,))
    return pending


def _decide(store: RunStore, call: str, yes: bool = True) -> Decided:
    return store.people.decide(
        "r1",
        "call",
        call,
        CallDecision(call=call, yes=yes),
        expired=expiry_event("call", call),
        due_ms=9,
    )


def test_a_decision_is_used_once(store: RunStore) -> None:
    pending = _pending_call(store)
    assert store.people.pending() == [pending]
    assert _decide(store, "call-1") is Decided.APPLIED
    assert store.people.pending() == []
    assert _decide(store, "call-1", yes=False) is Decided.DECIDED
    assert _decide(store, "call-2") is Decided.NOT_PENDING
    assert (
        store.people.decide(
            "gone",
            "call",
            "call-1",
            CallDecision(call="call-1", yes=True),
            expired=expiry_event("call", "call-1"),
            due_ms=9,
        )
        is Decided.GONE
    )
    loaded = store.load("r1")
    assert loaded is not None
    assert [e for _, e in loaded.inbox] == [CallDecision(call="call-1", yes=True)]


def test_a_decision_after_the_expiry_is_refused_and_declines(store: RunStore) -> None:
    _pending_call(store, expires_ms=now_ms() - 1)  # by Redis's clock, which is this one's
    assert _decide(store, "call-1") is Decided.EXPIRED
    assert store.people.pending() == []
    loaded = store.load("r1")
    assert loaded is not None
    declined = CallDecision(call="call-1", yes=False, reason="no decision came in time")
    assert [e for _, e in loaded.inbox] == [declined]
    # Any later decision, yes or no, is told it came too late.
    assert _decide(store, "call-1") is Decided.EXPIRED
    assert _decide(store, "call-1", yes=False) is Decided.EXPIRED


def test_a_decision_before_the_expiry_is_applied(store: RunStore) -> None:
    _pending_call(store, expires_ms=now_ms() + 60_000)
    assert _decide(store, "call-1") is Decided.APPLIED


def test_a_finished_run_expires_and_leaves_the_index(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    finished = _record(state="finished", outcome=Outcome(stop=Stop.DONE, summary="ok"))
    _save(store, finished, retention_s=100)
    assert 0 < store.redis.ttl(store.keys.run("r1")) <= 100
    assert store.upkeep.due_messages(10**15) == []  # nothing left to send for it
    assert store.upkeep.prune_runs(older_than_ms=10**15) == 0  # still there: kept
    store.upkeep.prune_runs(older_than_ms=10**15)  # (a full sweep starts again from the oldest)
    store.redis.delete(store.keys.run("r1"))  # what expiry does
    assert store.upkeep.prune_runs(older_than_ms=10**15) == 1
    assert store.runs() == []


def test_a_follow_up_sent_while_a_finished_run_is_saved_is_kept_for_its_advance(
    store: RunStore,
) -> None:
    """A finished run is woken (a late event, a duplicate advance) and its step reads an
    empty inbox; a person's follow-up lands before that step's save. The save must not
    drop it: the run is woken again, and the follow-up reopens it."""
    store.create(_record(), "snap", due_ms=5_000)
    done = _record(state="finished", outcome=Outcome(stop=Stop.DONE, summary="March"))
    version = _save(store, done, retention_s=100)
    woken = store.load("r1")
    assert woken is not None
    assert woken.inbox == []
    answer = store.live.reply("r1", FollowUp(text="Now April"), due_ms=7_000)
    assert answer is ReplyAnswer.SENT
    assert store.save(_step(done, retention_s=100), version) is Saved.SAVED
    again = store.load("r1")
    assert again is not None
    assert [e for _, e in again.inbox] == [FollowUp(text="Now April")]
    assert store.upkeep.due_messages(10**15) == ["a|r1"]  # its advance, to wake it again
    assert 0 < store.redis.ttl(store.keys.inbox("r1")) <= 100  # (gone with the run, at worst)
    # Applied (the step that reopens the run takes it), the inbox and its advance go.
    taken = [entry for entry, _ in again.inbox]
    _save(store, _record(state="running"), applied=taken, follow_up_taken=True)
    assert not store.redis.exists(store.keys.inbox("r1"))
    assert store.upkeep.due_messages(10**15) == []


def test_pruning_gets_past_runs_that_stay_alive(store: RunStore) -> None:
    for n in range(7):
        store.create(_record(f"r{n}", created_ms=1_000 + n), "snap", due_ms=5_000)
    for n in (5, 6):
        store.redis.delete(store.keys.run(f"r{n}"))  # expired; r0..r4 are parked for weeks
    pruned = [store.upkeep.prune_runs(older_than_ms=10**15, limit=2) for _ in range(4)]
    assert sum(pruned) == 2, pruned
    assert sorted(store.runs()) == ["r0", "r1", "r2", "r3", "r4"]


def test_usage_for_an_ancestor_that_expired_does_not_bring_it_back(store: RunStore) -> None:
    store.create(_record("root"), "snap", due_ms=5_000)
    store.create(_record("root.call-1", parent="root", root="root"), "snap", 5_000)
    store.redis.delete(store.keys.run("root"))  # finished and expired
    used = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    usage = (UsageAdd("root", used), UsageAdd("root.call-1", used))
    _save(store, _record("root.call-1", parent="root", root="root"), usage_adds=usage)
    assert not store.redis.exists(store.keys.run("root"))
    assert store.redis.hget(store.keys.run("root.call-1"), "u") == b"1 2 3 0 0 0 0"


@pytest.mark.parametrize(
    "message",
    [
        Message("advance", "r1"),
        Message("call_model", "r1.call-2", seq=7),
        Message("run_tool", "r1", call="call-3"),
    ],
)
def test_an_outbox_member_reads_back_as_its_message(message: Message) -> None:
    again = Message.of(message.member)
    assert again is not None
    assert (again.kind, again.run, again.seq, again.call) == (
        message.kind,
        message.run,
        message.seq,
        message.call,
    )


@pytest.mark.parametrize("member", ["", "x|r1", "m|r1|seven", "a", "t|r1"])
def test_an_unreadable_outbox_member_is_skipped(member: str) -> None:
    assert Message.of(member) is None


def test_only_the_last_result_of_a_batch_asks_for_an_advance(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    batch = ["call-1", "call-2", "call-3"]
    _save(store, _running(*batch, seq=1), running=tuple(batch))
    codes = []
    for call in batch:
        assert _claim(store, call, "x").status is ClaimStatus.CLAIMED
        codes.append(_record_outcome(store, call, "x", attempt=1, counted=True))
    assert codes == [Recorded.WAITING, Recorded.WAITING, Recorded.ADVANCE]
    # The others left a late advance in the outbox, in case the last one never comes.
    assert store.upkeep.due_messages(10) == ["a|r1"]


def test_a_save_counts_what_is_still_out(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _running("call-1", "call-2"))
    _claim(store, "call-1", "x")
    _record_outcome(store, "call-1", "x", attempt=1, counted=True)
    # call-1 is recorded but not applied yet: only call-2 is still out.
    _save(store, _running("call-1", "call-2", seq=1), running=("call-1", "call-2"))
    assert store.redis.hget(store.keys.run("r1"), "out") == b"1"


_MARKERS = (RunFields.result, RunFields.attempts, RunFields.noted, RunFields.carrier)
"""A call's markers in its run's hash, each dropped once its outcome is applied."""


def test_a_call_saving_its_own_outcome_is_refused_if_it_was_recorded(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    version = _save(store, _running("call-1"))
    _claim(store, "call-1", "x")
    _record_outcome(store, "call-1", "x", attempt=1)
    own = OwnOutcome("r1", "call-1", 1, "y", "t|r1|call-1")
    assert store.save(_step(_record(seq=1)), version, own) is Saved.DUPLICATE
    # Applied, the markers go: a late duplicate finds the call stale, not pending. Each of
    # them (the trace's note of a lost attempt and the carrier's task too), and only the
    # stale call's.
    run = store.keys.run("r1")
    markers = [f(c) for c in ("call-1", "call-2") for f in _MARKERS]
    store.redis.hset(run, mapping=dict.fromkeys(markers, "1"))
    stale = _step(_record(seq=1), stale_calls=("call-1",))
    assert store.save(stale, version) is Saved.SAVED
    assert [store.redis.hexists(run, m) for m in markers] == [False] * 4 + [True] * 4


def test_one_process_ticks_per_interval(store: RunStore) -> None:
    assert store.upkeep.elect_ticker("a", 60_000, now_ms=1) == 0
    wait = store.upkeep.elect_ticker("b", 60_000, now_ms=2)
    assert 0 < wait <= 60_000  # b is told when to ask again
    assert store.upkeep.elect_ticker("a", 60_000, now_ms=3) > 0  # one tick per interval, even for a
    assert store.upkeep.tick_stats() == (1, 1, "a")
    store.redis.delete(store.keys.tick_lock)  # the interval passed (or a lapsed on dying)
    assert store.upkeep.elect_ticker("b", 60_000, now_ms=4) == 0
    assert store.upkeep.tick_stats() == (2, 4, "b")


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


def test_wait_never_returns_the_turn_a_follow_up_is_reopening(store: RunStore) -> None:
    # `reply` leaves the finished run with its follow-up marker (`fu`); the save that
    # applies the follow-up reopens the run and clears the marker in one step. `wait`
    # must read the outcome and the marker as one: here that save lands right after
    # wait's first read, as a worker's can.
    march = Outcome(stop=Stop.DONE, summary="March")
    april = Outcome(stop=Stop.DONE, summary="April")
    store.create(_record(), "snap", due_ms=5_000)
    _save(store, _record(state="finished", outcome=march))
    store.redis.hset(store.keys.run("r1"), "fu", 1)  # as REPLY leaves it
    commands = store.redis.execute_command
    landed: list[str] = []

    def read_then_reopen(*args: object, **kwargs: object) -> object:
        found = commands(*args, **kwargs)
        if args[0] == "HMGET" and not landed:  # the follow-up's save, then its turn's end
            landed.append("reopened")
            _save(store, _record(state="running"), follow_up_taken=True)
            _save(store, _record(state="finished", outcome=april), trace=(_line(),))
        return found

    store.redis.execute_command = read_then_reopen
    client = RunsClient(store, lambda _messages: None, Settings.from_env({}).timing)
    assert client.wait("r1", timeout=10).summary == "April"
    assert landed == ["reopened"]


def _line() -> TraceEntry:
    return TraceEntry(at_ms=1, run="r1", kind="finished", text="April")


def test_live_events_of_many_runs_go_in_one_round_trip_each_answered_alone(
    store: RunStore,
) -> None:
    store.create(_record("r1"), "snap", due_ms=5_000)
    store.create(_record("r2"), "snap", due_ms=5_000)
    answers = store.live.add_many(
        [("r1", [("text", "one")]), ("gone", [("text", "lost")]), ("r2", [("text", "two")])]
    )
    assert answers == [True, False, True]  # a tree that is gone writes nothing
    assert [e.text for e in store.live.read("r1", "0", None)] == ["one"]
    store.redis.set(store.keys.live("r1"), "not a stream")  # this one's write fails alone
    first, second = store.live.add_many([("r1", [("text", "x")]), ("r2", [("text", "y")])])
    assert isinstance(first, StoreUnavailable)
    assert second is True
    assert [e.text for e in store.live.read("r2", "0", None)] == ["two", "y"]


def test_live_events_of_many_runs_ask_no_script_exists_and_survive_a_script_flush(
    store: RunStore,
) -> None:
    """One pipeline of EVALSHA (redis-py's pipelined scripts ask SCRIPT EXISTS first: a
    round trip more each time). A script Redis lost (a restart, SCRIPT FLUSH) is loaded
    again and its calls sent once more: they had not run, so each event is there once."""
    store.create(_record("r1"), "snap", due_ms=5_000)
    store.create(_record("r2"), "snap", due_ms=5_000)
    store.redis.script_flush()  # (the first pipeline loads the script)
    assert store.live.add_many([("r1", [("text", "one")]), ("r2", [("text", "two")])]) == [
        True,
        True,
    ]
    store.redis.config_resetstat()
    store.live.add_many([("r1", [("text", "more")]), ("r2", [("text", "more")])])
    stats = store.redis.info("commandstats")
    assert "cmdstat_script|exists" not in stats
    assert stats["cmdstat_evalsha"]["calls"] == 2
    store.redis.script_flush()
    answers = store.live.add_many([("r1", [("text", "three")]), ("r2", [("text", "four")])])
    assert answers == [True, True]
    assert [e.text for e in store.live.read("r1", "0", None)] == ["one", "more", "three"]
    assert [e.text for e in store.live.read("r2", "0", None)] == ["two", "more", "four"]


def test_a_save_keeps_the_newest_trace_lines_and_journal_entries_up_to_their_caps(
    store: RunStore,
) -> None:
    """The caps are the scripts' own (written in from TRACE_MAX and JOURNAL_MAX)."""
    store.create(_record(), "snap", due_ms=5_000)
    trace_key, journal_key = store.keys.trace("r1"), store.keys.journal("r1")
    # Full to the line: the save's two trace lines and one journal entry go one over each.
    store.redis.rpush(trace_key, *["{}"] * (TRACE_MAX - 1 - store.redis.llen(trace_key)))
    store.redis.rpush(journal_key, *["{}"] * (JOURNAL_MAX - store.redis.llen(journal_key)))
    newer = TraceEntry(at_ms=2, run="r1", kind="finished", text="May")
    _save(store, _record(), trace=(_line(), newer), journal='{"e":[]}')
    assert store.redis.llen(trace_key) == TRACE_MAX
    assert [json.loads(x) for x in store.redis.lrange(trace_key, -2, -1)] == [
        {"at_ms": 1, "kind": "finished", "text": "April"},
        {"at_ms": 2, "kind": "finished", "text": "May"},
    ]
    assert store.redis.llen(journal_key) == JOURNAL_MAX
    assert store.redis.lindex(journal_key, -1) == b'{"e":[]}'


def test_trace_lines_are_stored_without_their_run_and_read_back_with_it(
    store: RunStore,
) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    quoted = TraceEntry(at_ms=2, run="r1", kind="result", text='{"rows": ["a", "b"]}')
    other = TraceEntry(at_ms=3, run="r1.1", kind="started", text="a child's line")
    tasks = [
        TraceEntry(at_ms=5, run="r1", kind="result", data={"task": task, "ms": 1})
        for task in ("r1:advance:4f73a281", "r1.1:call-2", "r12:call-1", ":forged", "r1")
    ]
    _save(store, _record(), trace=(_line(), quoted, other, *tasks))
    trace_key = store.keys.trace("r1")
    stored = [json.loads(line) for line in store.redis.lrange(trace_key, 0, -1)]
    # The trace's key names its run, so its own lines leave it out; another run's keep it.
    assert [line.get("run") for line in stored] == [None, None, "r1.1", *[None] * 5]
    # So does a task id of the run's own (the rest kept apart); any other is kept whole.
    assert [line["data"] for line in stored[3:]] == [
        {"tk": ":advance:4f73a281", "ms": 1},
        *({"task": task, "ms": 1} for task in ("r1.1:call-2", "r12:call-1", ":forged", "r1")),
    ]
    store.redis.rpush(trace_key, json.dumps({"at_ms": 4, "run": "r1", "kind": "older"}))
    store.redis.hincrby(store.keys.run("r1"), "tn", 1)
    position, entries = store.trace("r1")
    assert position == 9
    older = TraceEntry(at_ms=4, run="r1", kind="older")
    assert entries == [_line(), quoted, other, *tasks, older]


def test_a_save_sent_another_runs_key_fails_rather_than_spell_keys_from_it(
    store: RunStore,
) -> None:
    """On a single Redis, SAVE, CLAIM and STREAM spell the run's other keys from its own
    (see workers.store.layout): a key that is not the run's is a caller's bug, refused."""
    store.create(_record(), "snap", due_ms=5_000)
    store.create(_record("r2"), "snap", due_ms=5_000)
    save = scripts.save(store.keys, advanced=_step(_record()), version="1", own=None)
    save.keys[0] = store.keys.run("r2")
    claim = scripts.claim(
        store.keys, run_id="r1", call="call-1", seq=None, token="t", lease_ms=1, now_ms=1,
        admission=Admission(0, 0.0, 0.0), known_version="",
    )  # fmt: skip
    for call in (save, scripts.save_claim(save, claim)):
        with pytest.raises(StoreUnavailable, match=r"SAVE: .* is not the key of run r1"):
            store.connection.run(call)  # type: ignore[arg-type]
    assert store.redis.hget(store.keys.run("r2"), "v") == b"1"  # nothing saved
    # CLAIM and STREAM spell their other keys from the run's (the root's) too.
    claim.keys[0] = store.keys.run("r2")
    with pytest.raises(StoreUnavailable, match=r"CLAIM: .* is not the key of run r1"):
        store.connection.run(claim)
    streamed = scripts.stream(store.keys, run_id="r1", events=[("text", "x")], keep=9, idle_s=9)
    streamed.keys[0] = store.keys.run("r2")
    with pytest.raises(StoreUnavailable, match=r"STREAM: .* is not the root of run r1"):
        store.connection.run(streamed)
    for run in ("r1", "r2"):
        assert store.redis.hget(store.keys.run(run), "a:call-1") is None  # nothing claimed
        assert not store.redis.exists(store.keys.lease(run, "call-1"), store.keys.live(run))


def test_a_step_with_neither_a_snapshot_nor_what_to_store_is_refused_before_redis(
    store: RunStore,
) -> None:
    """`decide(..., whole=False)` makes no snapshot text, for a caller that works out what
    to store itself: an Advanced that has neither would store an empty agent."""
    store.create(_record(), "snap", due_ms=5_000)
    with pytest.raises(ValueError, match="neither a snapshot nor what to store"):
        store.save(_step(_record(seq=1), ""), "1")
    loaded = store.load("r1")
    assert loaded is not None
    assert (loaded.version, loaded.snapshot) == ("1", "snap")  # nothing saved


@pytest.mark.parametrize(
    "own",
    [
        OwnOutcome("r1", "call-1", 1, "t", "t|r2|call-1"),  # another run's message
        OwnOutcome("r2", "call-1", 1, "t", "t|r1|call-1"),  # another run's call
        OwnOutcome("r1", "call-1", 1, "t", "t|r1|call-2"),  # another call's message
        OwnOutcome("r1", "m3", 1, "t", "m|r1|4"),  # another model call's
        OwnOutcome("r1", "m3", 1, "t", "a|r1"),  # not a call's message at all
    ],
)
def test_a_save_refuses_an_own_call_whose_message_is_not_its_own(own: OwnOutcome) -> None:
    """SAVE spells the call's lease and outbox member from the call: a member that is not
    the one the tick reads back as this call's is a caller's bug, refused before Redis."""
    with pytest.raises(ValueError, match="is not one of run r1's own"):
        codec.save_effects(Keys("t:"), _step(_record()), own)
    fine = OwnOutcome("r1", "m3", 1, "t", "m|r1|3")
    assert json.loads(codec.save_effects(Keys("t:"), _step(_record()), fine))["own"] == {
        "call": "m3",
        "kind": "m",
        "attempt": "1",
        "token": "t",
    }


def test_a_save_sends_trace_lines_as_arguments_not_escaped_inside_its_effects(
    store: RunStore,
) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    loaded = store.load("r1")
    assert loaded is not None
    quoted = TraceEntry(at_ms=2, run="r1", kind="result", text='{"rows": ["a", "b"]}')
    call = scripts.save(
        store.keys, advanced=_step(_record(), trace=(quoted,)), version=loaded.version, own=None
    )
    line = '{"at_ms":2,"kind":"result","text":"{\\"rows\\": [\\"a\\", \\"b\\"]}"}'
    assert call.args[8:10] == [1, line]
    assert "rows" not in call.args[3]  # the effects JSON
    assert store.connection.run(call) is Saved.SAVED
    assert store.redis.lrange(store.keys.trace("r1"), 0, -1) == [line.encode()]


@pytest.mark.parametrize(
    ("budget", "reserves"),
    [(None, False), (Budget(seconds=3_600), True), (Budget(model_calls=9), True)],
    ids=["no-limits", "a-deadline-only", "a-call-limit"],
)
def test_only_a_tree_with_limits_reserves_for_its_model_calls(
    store: RunStore, budget: Budget | None, *, reserves: bool
) -> None:
    made = now_ms()  # (a deadline counts from the run's creation)
    store.create(_record("root", budget=budget, created_ms=made), "snap", due_ms=5_000)
    _save(store, _record("root", budget=budget, created_ms=made, asked=1, seq=1, asked_bytes=400))
    root = store.keys.run("root")
    for attempt, token in enumerate(("a", "b"), start=1):  # (the second: its worker died)
        claim = store.claim(
            "root", "m1", seq=1, token=token, lease_ms=5_000, now_ms=0,
            admission=Admission(100, 2.0, 8.0),
        )  # fmt: skip
        assert (claim.status, claim.over, claim.attempts) == (ClaimStatus.CLAIMED, None, attempt)
        assert claim.reply_cap == 100  # max_tokens: no limit lowers it
        store.redis.delete(store.keys.lease("root", "m1"))
    held = store.redis.hget(root, "q:root|m1")
    assert (held is not None, store.redis.hget(root, "rc")) == (
        (True, b"1") if reserves else (False, None)
    )
    settle = (Reservation("root", "root", "m1"),)
    _save(store, _record("root", budget=budget, created_ms=made), settle=settle)
    assert store.redis.hget(root, "q:root|m1") is None
    assert store.redis.hget(root, "rc") in ((b"0",) if reserves else (None,))


# --- a save and the claim of the call it decided, in one script (SAVE_CLAIM) ------------


def _terms(call: str, token: str, seq: int | None = None, run_id: str = "r1") -> CallClaim:
    return CallClaim(run_id, call, seq, token, lease_ms=5_000, now_ms=1_000, task="task-1")


def test_a_save_and_the_claim_of_the_call_it_decided_are_one_script(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    loaded = store.load("r1")
    assert loaded is not None
    # Many trace lines, so the script splits a long argument list between the two.
    lines = tuple(TraceEntry(at_ms=i, run="r1", kind="note", text=f"{i}") for i in range(1_500))
    step = _step(_running("call-1", asked=4, seq=4), trace=lines)
    saved, claim = store.save_then_claim(step, loaded.version, None, _terms("call-1", "tok"))
    assert saved is Saved.SAVED
    assert claim is not None
    assert (claim.status, claim.attempts, claim.task_before) == (ClaimStatus.CLAIMED, 1, "")
    assert claim.loaded is not None
    assert claim.loaded.version == "2"  # the run as the save left it
    assert claim.loaded.record == step.record
    assert claim.loaded.snapshot == "snap"  # (no agent kept by this process: read back)
    assert store.trace("r1")[0] == 1_500
    run = store.keys.run("r1")
    assert store.redis.hget(run, "a:call-1") == b"1"
    assert store.redis.hget(run, "k:call-1") == b"task-1"
    assert store.redis.get(store.keys.lease("r1", "call-1")) == b"tok"
    outbox = store.keys.index("r1").outbox
    assert store.redis.zscore(outbox, "t|r1|call-1") == 1_000 + 5_000  # the lease's end
    # The message, were it delivered too, finds the call taken.
    assert _claim(store, "call-1", "other").status is ClaimStatus.BUSY
    # On a single Redis only the run's key is sent (the scripts spell the rest); on a
    # cluster each key is sent once: those the claim shares with the save not again.
    for keys, sent in ((store.keys, 1), (Keys("t:", cluster=True), 9 + 1)):  # (+ the lease)
        again = scripts.save_claim(
            scripts.save(keys, advanced=step, version="2", own=None),
            scripts.claim(
                keys, run_id="r1", call="call-1", seq=None, token="t", lease_ms=1, now_ms=1,
                admission=Admission(0, 0.0, 0.0), known_version="",
            ),
        )  # fmt: skip
        assert sorted(again.keys) == sorted(set(again.keys))
        assert len(again.keys) == sent


def test_a_save_that_does_not_land_claims_nothing(store: RunStore) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    # (call-2 is due as the run stands: a claim that ran regardless would take it)
    version = _save(store, _running("call-1", "call-2"))
    _claim(store, "call-1", "x")
    _record_outcome(store, "call-1", "x", attempt=1)
    run = store.keys.run("r1")
    next_step = _step(_running("call-2", seq=1))
    # Stale: someone saved since version 1.
    assert store.save_then_claim(next_step, "1", None, _terms("call-2", "a")) == (
        Saved.STALE,
        None,
    )
    # Duplicate: the call's own outcome is in already.
    own = OwnOutcome("r1", "call-1", 1, "x", "t|r1|call-1")
    assert store.save_then_claim(next_step, version, own, _terms("call-2", "a")) == (
        Saved.DUPLICATE,
        None,
    )
    assert store.redis.hget(run, "a:call-2") is None
    assert not store.redis.exists(store.keys.lease("r1", "call-2"))
    assert store.redis.hget(run, "v") == version.encode()


def test_a_claim_with_a_save_is_refused_what_the_saved_record_does_not_call_for(
    store: RunStore,
) -> None:
    store.create(_record(), "snap", due_ms=5_000)
    loaded = store.load("r1")
    assert loaded is not None
    step = _step(_running("call-1", asked=4, seq=4))
    saved, claim = store.save_then_claim(step, loaded.version, None, _terms("call-9", "a"))
    assert saved is Saved.SAVED  # the save stands
    assert claim is not None
    assert claim.status is ClaimStatus.REFUSED
    assert store.redis.hget(store.keys.run("r1"), "v") == b"2"
    model = store.save_then_claim(step, "2", None, _terms("m5", "a", seq=5))
    assert model[1] is not None
    assert model[1].status is ClaimStatus.REFUSED  # the record asked for m4, not m5
    given = store.save_then_claim(step, "3", None, _terms("m4", "a", seq=4))
    assert given[1] is not None
    assert given[1].status is ClaimStatus.CLAIMED


def test_a_model_call_claimed_with_a_save_is_admitted_and_reserves(store: RunStore) -> None:
    _tree(store, Budget(tokens=1_000))
    loaded = store.load("root.call-1")
    assert loaded is not None
    child = _record("root.call-1", parent="root", root="root", asked=2, seq=2, asked_bytes=400)
    terms = _terms("m2", "a", seq=2, run_id="root.call-1")
    terms = replace(terms, admission=Admission(100, 0.0, 0.0))
    saved, claim = store.save_then_claim(_step(child), loaded.version, None, terms)
    assert saved is Saved.SAVED
    assert claim is not None
    assert (claim.status, claim.over, claim.reply_cap) == (ClaimStatus.CLAIMED, None, 100)
    assert store.limits("root").reserved == (300, 0, 1)  # type: ignore[union-attr]


_CAPPED = ModelRoute("told", url="http://127.0.0.1:9/v1", model="m", max_concurrency=1, tpm=60_000)


def _ask_route(
    limits: RouteLimits, route: ModelRoute, holder: str, tokens: int, now: int
) -> Admitted:
    """Admit a call of the key named as `route` (one call of a key at a time)."""
    return limits.admit(
        route, key=route.name, holder=holder, tokens=tokens, key_concurrency=1,
        lease_ms=60_000, now_ms=now,
    )  # fmt: skip


def _route_after(store: RunStore, route: ModelRoute) -> dict[str, Any]:
    """What a route's limits hold: its hash, its calls in flight and its key's (the key
    each route's calls are of is named as the route: a key's calls in flight are counted
    over every route)."""
    redis, keys = store.redis, store.keys
    state = {k.decode(): v.decode() for k, v in redis.hgetall(keys.route(route.name)).items()}
    return {
        "hash": state,
        "in flight": redis.zrange(keys.route(route.name, "inflight"), 0, -1),
        "key's": redis.zrange(keys.key_inflight(route.name, route.name), 0, -1),
    }


@pytest.mark.parametrize("answer", list(Saved))
def test_a_save_tells_the_route_that_replied_as_route_done_would_whatever_it_answers(
    store: RunStore, answer: Saved
) -> None:
    """On a single Redis the save of a model call's reply takes its route's news along
    (`OwnOutcome.route`): the route's slots come back, its circuit's failures are reset
    and the tokens it charged are settled, exactly as ROUTE_DONE told apart leaves a twin
    route; and so whether the save lands, loses a race, or is fenced or a duplicate (the
    call was made all the same)."""
    limits = RouteLimits(store.connection)
    twins = (_CAPPED, _CAPPED.model_copy(update={"name": "saved"}))
    for route in twins:
        for n in range(2):  # two failures in a row: a success sets the count back
            assert _ask_route(limits, route, f"f{n}", 1, n).admitted
            limits.done(
                route, key=route.name, holder=f"f{n}", outcome="failed", now_ms=n, charged=1
            )
        admitted = _ask_route(limits, route, "r1|3", 5_000, 10)
        assert admitted.admitted
        assert admitted.charged == 5_000
    news = {"holder": "r1|3", "now_ms": 20, "paused_until_ms": 20, "charged": 5_000, "used": 400}
    limits.tell(limits.news(twins[0], key="told", **news))
    store.create(_record(), "snap", due_ms=5_000)
    version = _save(store, _running("call-1"))
    _claim(store, "call-1", "x")
    attempt, saved_at = 1, version
    if answer is Saved.STALE:
        saved_at = "99"
    elif answer is Saved.FENCED:
        attempt = 2
    elif answer is Saved.DUPLICATE:
        _record_outcome(store, "call-1", "x", attempt=1)
    ok = limits.news(twins[1], key="saved", **news)
    own = OwnOutcome("r1", "call-1", attempt, "x", "t|r1|call-1", route=ok)
    assert store.save(_step(_record(seq=1)), saved_at, own) is answer
    told, saved = (_route_after(store, route) for route in twins)
    assert told == saved
    assert told["in flight"] == told["key's"] == []
    assert (told["hash"]["failures"], told["hash"]["used"]) == ("0", "400")
    for route in twins:
        # The tokens unused came back: the next call waits for 400 tokens' share, not
        # 5,000's; and the slot is free, not held until the lease lapses (60 s).
        assert _ask_route(limits, route, "r1|5", 1, 21).verdict == "wait"
        assert _ask_route(limits, route, "r1|5", 1, 1_000).admitted


def test_a_cluster_save_will_not_take_a_routes_news_along(store: RunStore) -> None:
    """A cluster's routes are in other slots than the run's: its saves cannot tell them,
    and a caller that asked one to would have the news lost, so it is refused."""
    ok = RouteLimits.news(
        _CAPPED, key="k", holder="r1|3", now_ms=1, paused_until_ms=1, charged=1, used=1
    )
    own = OwnOutcome("r1", "call-1", 1, "x", "t|r1|call-1", route=ok)
    with pytest.raises(ValueError, match="cannot tell a model route"):
        scripts.save(Keys("t:", cluster=True), advanced=_step(_record()), version="1", own=own)
    assert store.saves_tell_routes  # (a single Redis's may)
