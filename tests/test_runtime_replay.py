"""Replay, fork and diff on a real fleet: Redis, `relay worker` processes, the loopback
model server (a second one for forks onto another route).

Runs of every kind (plans, batches, approvals, questions, specialists, summaries,
steering, follow-ups) replay identically from their journals; a fork at any step
makes no model call and runs no tool for its prefix, and with stubbed tools runs
no tool the original ran; every edge (beyond the journal, at the end, waiting on
a person, mid-batch, a cancelled run, a corrupt, trimmed or missing journal) has
its stated result.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_core import Config, Policy, Risk, Stop, prompts
from tests.apps.notes import (
    SPECIALISTS,
    TOOLS,
    async_wait,
    build,
    crunch,
    crunch_long_lease,
)
from tests.support.brain import batch, call, final
from tests.support.cli import clean_env
from tests.support.cli import relay as relay_command
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import ModelServer
from tests.support.waiting import calls_for, pending_for, prompts_for
from workers import Budget, Relay, RelayError, Settings
from workers.engine import journal
from workers.engine.journal import call_digest, read_start
from workers.store.layout import RunFields

TRUSTING = Config(require_plan=False, max_batch=4, max_calls=20, policy=Policy.TRUSTING)
CAUTIOUS = Config(require_plan=False, max_batch=4, max_calls=20)


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("replay")) as running:
        running.worker("--concurrency", "2")
        yield running


def _finished(f: Fleet, run_id: str, stop: Stop = Stop.DONE) -> None:
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is stop, (outcome, f.logs())


def _identical(relay: Relay, run_id: str) -> int:
    report = relay.replay(run_id)
    assert report.problem is None, report
    assert report.identical, report
    assert report.replayed == report.steps
    return report.steps


# --- every kind of run replays ------------------------------------------------------------


def test_runs_of_every_kind_replay_identically(f: Fleet) -> None:
    f.brain.script("RP-PLAIN", {0: call("read_note", name="a.txt"), 1: final("read")})
    f.brain.script(
        "RP-BATCH",
        {0: batch(("read_note", {"name": "a.txt"}), ("number", {}), ("big", {"size": 10})),
         3: final("batched")},  # (a turn per result: three came back)
    )  # fmt: skip
    f.brain.script(
        "RP-PLAN", {0: call("read_note", name="p.txt"), 1: final("planned")}, plan=["Read it."]
    )
    f.brain.script(
        "RP-ASK",
        {0: call("delete_note", name="old.txt"), 1: call("delete_note", name="keep.txt"),
         2: final("asked")},
    )  # fmt: skip
    f.brain.script(
        "RP-QUESTION",
        {0: json.dumps({"ask_user": "Which note?"}), 1: final("answered")},
    )
    f.brain.script(
        "RP-KIDS",
        {0: batch(("delegate", {"specialist": "reader", "task": "RP-KID: read a.txt"})),
         1: final("delegated")},
    )  # fmt: skip
    f.brain.script("RP-KID", {0: call("read_note", name="a.txt"), 1: final("kid read")})
    f.brain.script("RP-SUMMARY", {n: call("big", size=700) for n in range(8)})
    f.brain.script("RP-STEER", {0: call("sleep", seconds=1.5), 1: final("steered")})
    f.brain.script("RP-MORE", {0: final("first turn"), 1: final("second turn")})

    plain = f.relay.start("RP-PLAIN: read", config=TRUSTING)
    batched = f.relay.start("RP-BATCH: three at once", config=TRUSTING)
    planned = f.relay.start(
        "RP-PLAN: read", config=TRUSTING.model_copy(update={"require_plan": True})
    )
    asked = f.relay.start("RP-ASK: delete two", config=Config(require_plan=False))
    question = f.relay.start("RP-QUESTION: ask me", config=TRUSTING)
    kids = f.relay.start("RP-KIDS: delegate", config=TRUSTING)
    summary = f.relay.start(
        "RP-SUMMARY: big outputs",
        config=TRUSTING.model_copy(
            update={"summarize": True, "history_chars": 1_000, "max_calls": 4}
        ),
    )
    steer = f.relay.start("RP-STEER: nap", config=TRUSTING)
    more = f.relay.start("RP-MORE: twice", config=TRUSTING)

    pending_for(f, planned, "plan")
    f.relay.approve_plan(planned, yes=True)
    first = pending_for(f, asked, "call")
    f.relay.approve(asked, first.call_id or "")
    second = pending_for(f, asked, "call", timeout=60)
    f.relay.deny(asked, second.call_id or "", "keep it")
    pending_for(f, question, "question")
    f.relay.answer(question, "a.txt")
    f.until(lambda: f.relay.status(steer).waiting_for == "tools", what="the nap to begin")
    f.relay.send(steer, "Be quick about it.")
    _finished(f, more)
    f.relay.reply(more, "RP-MORE: and again")

    for run_id in (plain, batched, planned, asked, question, kids, steer):
        _finished(f, run_id)
    f.relay.wait(summary, 60)  # (it ends at its call limit, or done)

    def second_turn_over() -> bool:
        outcome = f.relay.status(more).outcome
        return outcome is not None and outcome.summary == "second turn"

    f.until(second_turn_over, what="the second turn")
    assert "summary" in [e.kind for e in f.relay.trace(summary)]  # a summary was written
    assert any("Be quick about it." in p for p in prompts_for(f, "RP-STEER"))
    assert any(e.kind == "declined" for e in f.relay.trace(asked))
    for run_id in (plain, batched, planned, asked, question, kids, summary, steer, more):
        assert _identical(f.relay, run_id) >= 2
    child = f.relay.status(kids).children[0]
    assert _identical(f.relay, child) >= 2


def test_a_journal_is_kept_with_its_run_expiring_and_persisting_with_it(f: Fleet) -> None:
    # Each turn sleeps first, so the journal is seen while its run still goes on.
    turns = {
        0: call("sleep", seconds=2),
        1: final("first"),
        2: call("sleep", seconds=2),
        3: final("second"),
    }
    f.brain.script("RP-TTL", turns)
    run_id = f.relay.start("RP-TTL: keep", config=TRUSTING)
    store = f.relay.store
    journal, run_hash = store.keys.journal(run_id), store.keys.run(run_id)
    f.until(lambda: store.redis.exists(journal), what="the journal")
    assert store.redis.ttl(journal) == -1  # no TTL while the run goes on
    _finished(f, run_id)
    week = 7 * 24 * 3600  # RELAY_RETENTION's default
    assert week - 60 < store.redis.ttl(journal) <= week
    assert abs(store.redis.ttl(journal) - store.redis.ttl(run_hash)) <= 1
    f.relay.reply(run_id, "and again")  # a follow-up reopens it: both live again
    f.until(lambda: f.relay.status(run_id).waiting_for == "tools", what="the second turn")
    assert store.redis.ttl(run_hash) == -1
    assert store.redis.ttl(journal) == -1
    _finished(f, run_id)
    f.until(lambda: f.relay.status(run_id).outcome.summary == "second", what="turn two")  # type: ignore[union-attr]
    assert store.redis.ttl(journal) > 0
    assert _identical(f.relay, run_id) >= 4


def _variant(f: Fleet, *, without: str = "", changed: Callable[..., str] | None = None) -> Relay:
    """The test app as a new version of it might be: a tool gone, or one changed."""
    relay = Relay(
        "notes",
        config=Config(require_plan=False, max_batch=4, max_calls=20),
        specialists=SPECIALISTS,
        questions=True,
        settings=Settings.from_env(f.env),
    )
    tools = cast("list[tuple[Callable[..., Any], Risk]]", TOOLS)
    for function, risk in tools:
        name = getattr(function, "__name__", "")
        if name == without:
            continue
        new: Callable[..., Any] = changed if changed and name == changed.__name__ else function
        relay.tool(risk=risk)(new)
    relay.tool(risk=Risk.CREATE)(crunch)
    relay.tool(risk=Risk.CREATE, lease_seconds=60)(crunch_long_lease)
    relay.tool(risk=Risk.READ, timeout=2)(async_wait)
    return relay


def big(size: int, fill: str) -> str:
    """Return a long text of `fill`."""
    return fill * size


def test_new_code_that_differs_names_the_first_divergence(
    f: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    f.brain.script("RP-NEW", {0: call("number"), 1: call("big", size=3), 2: final("new")})
    run_id = f.relay.start("RP-NEW: number then big", config=TRUSTING)
    _finished(f, run_id)
    assert _identical(_variant(f), run_id) == 6  # the same code, built again: the same

    gone = _variant(f, without="number").replay(run_id)
    assert gone.divergence is not None
    assert (gone.divergence.step, gone.divergence.recorded) == (1, "ask")
    assert gone.divergence.why == "the tool number is gone, so the system prompt changed"

    other = _variant(f, changed=big).replay(run_id)
    assert other.divergence is not None
    assert other.divergence.step == 1
    assert other.divergence.why.startswith("the tool big changed")

    written = prompts.system_text
    monkeypatch.setattr(prompts, "system_text", lambda *a: written(*a) + "\nBe brief.")
    template = f.relay.replay(run_id)
    assert template.divergence is not None
    assert template.divergence.step == 1
    assert template.divergence.why == "the system prompt changed (its template or the instructions)"
    assert not template.identical


def test_a_fork_while_a_specialist_works_starts_it_again_with_its_calls_stubbed(f: Fleet) -> None:
    f.brain.script(
        "RP-PARENT",
        {0: batch(("delegate", {"specialist": "writer", "task": "RP-CHILD: write"})),
         1: final("parent done")},
    )  # fmt: skip
    f.brain.script(
        "RP-CHILD", {0: call("write_note", name="kid.txt", text="from the kid"), 1: final("kid")}
    )
    run_id = f.relay.start("RP-PARENT: delegate", config=TRUSTING)
    _finished(f, run_id)
    assert f.ledger().count("write_note kid.txt") == 1
    journal = [json.loads(e) for e in f.relay.store.journal(run_id)[1:]]
    delegating = next(n for n, e in enumerate(journal, start=1) if e["s"].get("t") == ["delegate"])
    fork = f.relay.fork(run_id, delegating, stub_tools=True)
    _finished(f, fork)
    child = f.relay.status(fork).children[0]
    assert f.relay.status(child).outcome.summary == "kid"  # type: ignore[union-attr]
    assert f.ledger().count("write_note kid.txt") == 1  # the specialist's write: stubbed


STEP_REPLIES = st.sampled_from([
    call("read_note", name="a.txt"),
    call("number"),
    call("big", size=600),
    call("sleep", seconds=0.05),
    batch(("read_note", {"name": "b.txt"}), ("big", {"size": 40})),
    "not a JSON reply",
])  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    replies=st.lists(STEP_REPLIES, min_size=1, max_size=6),
    summarize=st.booleans(),
    number=st.integers(0, 10**9),
)
def test_scripted_runs_on_the_fleet_always_replay_identically(
    f: Fleet, replies: list[str], summarize: bool, number: int
) -> None:
    marker = f"RP-HYP-{number}-{len(replies)}-{int(summarize)}"
    script = {n: reply for n, reply in enumerate(replies)}
    script.update({n: final("enough") for n in range(len(replies), len(replies) + 40)})
    f.brain.script(marker, script)
    config = TRUSTING.model_copy(
        update={"summarize": summarize, "history_chars": 1_000, "max_calls": 8}
    )
    run_id = f.relay.start(f"{marker}: go", config=config)
    f.relay.wait(run_id, 60)  # however it ends
    assert _identical(f.relay, run_id) >= 2


def test_a_fork_inside_a_summary_asks_for_the_summary_again(f: Fleet) -> None:
    f.brain.script("RP-FOLD", {n: call("big", size=600) for n in range(12)})
    config = TRUSTING.model_copy(update={"summarize": True, "history_chars": 1_000, "max_calls": 4})
    run_id = f.relay.start("RP-FOLD: big outputs", config=config)
    f.relay.wait(run_id, 60)
    journal = [json.loads(e) for e in f.relay.store.journal(run_id)[1:]]
    folding = next(n for n, e in enumerate(journal, start=1) if e["s"]["k"] == "summarize")
    fork = f.relay.fork(run_id, folding, stub_tools=True)
    f.relay.wait(fork, 60)
    kinds = [e.kind for e in f.relay.trace(fork)]
    assert kinds[0] == "forked"
    assert "summary" in kinds  # the fork's first model call wrote the summary again
    forked_journal = [json.loads(e) for e in f.relay.store.journal(fork)[1:]]
    assert forked_journal[0]["s"]["k"] == "summarize"  # where it began: the same step
    assert _identical(f.relay, fork) >= 2


# --- what cannot be replayed, and says so -----------------------------------------------------


def test_a_run_without_a_journal_a_trimmed_one_and_a_corrupt_entry_each_say_so(f: Fleet) -> None:
    f.brain.script("RP-BAD", {0: call("read_note", name="a.txt"), 1: final("ok")})
    runs = [f.relay.start(f"RP-BAD: run {n}", config=TRUSTING) for n in range(5)]
    for run_id in runs:
        _finished(f, run_id)
    store = f.relay.store
    old, trimmed, corrupt, fine, bad_start = runs
    store.redis.lset(store.keys.journal(bad_start), 0, b"z1:not-deflate")
    said = f.relay.replay(bad_start).problem or ""
    assert said.startswith(f"run {bad_start}: its journal's start cannot be read")
    store.redis.delete(store.keys.journal(old))  # as a run started before the journal
    store.redis.lpop(store.keys.journal(trimmed))  # its start dropped, as JOURNAL_MAX does
    store.redis.lset(store.keys.journal(corrupt), 3, b'{"events": 7}')

    assert "started before runs kept a journal" in (f.relay.replay(old).problem or "")
    assert "its start was trimmed" in (f.relay.replay(trimmed).problem or "")
    problem = f.relay.replay(corrupt).problem or ""
    assert f"run {corrupt}: journal entry 3 cannot be read" in problem
    assert f.relay.replay(fine).identical
    assert "no run nosuchrun" in (f.relay.replay("nosuchrun").problem or "")
    with pytest.raises(RelayError, match="entry 3 cannot be read"):
        f.relay.fork(corrupt, 1)


# --- forks: the stated result at each edge -----------------------------------------------------


def test_fork_edges_beyond_the_end_mid_batch_waiting_on_a_person_and_cancelled(f: Fleet) -> None:
    f.brain.script(
        "RP-EDGE",
        {0: batch(("read_note", {"name": "a.txt"}), ("delete_note", {"name": "x.txt"})),
         2: final("edge"), 3: final("the new turn")},
    )  # fmt: skip
    run_id = f.relay.start("RP-EDGE: read and delete", config=CAUTIOUS)
    pending_for(f, run_id, "call")  # the read ran; the delete waits for a person

    def mid_batch() -> bool:
        last = json.loads(f.relay.store.journal(run_id)[-1])
        return bool(last["s"]["k"] == "run" and last["s"].get("t") == ["delete_note"])

    f.until(mid_batch, what="the read's result to be applied, the delete still waiting")
    mid = f.relay.replay(run_id).steps
    # Mid-batch and waiting on a person: the fork waits on a person of its own for the
    # call still to run, and does not run the read again.
    fork = f.relay.fork(run_id, mid)
    mine = pending_for(f, fork, "call")
    assert mine.tool == "delete_note"
    assert f.relay.status(fork).forked_from is not None
    assert f.relay.status(fork).forked_from.run == run_id  # type: ignore[union-attr]
    f.relay.approve(fork, mine.call_id or "")
    _finished(f, fork)
    assert [e.tool for e in f.relay.trace(fork) if e.kind == "result"] == ["delete_note"]
    assert any(p.run_id == run_id for p in f.relay.pending())  # the original: untouched

    steps = f.relay.replay(fork).steps
    with pytest.raises(RelayError, match=f"has {steps} journal steps: fork at 0 to {steps}"):
        f.relay.fork(fork, steps + 1)
    with pytest.raises(RelayError, match="had ended: nothing is left to run"):
        f.relay.fork(fork, steps)
    with pytest.raises(RelayError, match="begins a new turn after the run's end"):
        f.relay.fork(fork, 1, task="something else")
    # A new turn after the end.
    again = f.relay.fork(fork, steps, task="and now this")  # (the prompt's task stays)
    _finished(f, again)
    assert f.relay.status(again).outcome.summary == "the new turn"  # type: ignore[union-attr]

    # A cancelled run: forking at its end is refused; before it, the fork goes on.
    f.relay.cancel(run_id, "not needed")
    _finished(f, run_id, Stop.CANCELLED)
    with pytest.raises(RelayError, match="had ended"):
        f.relay.fork(run_id, f.relay.replay(run_id).steps)
    revived = f.relay.fork(run_id, mid)
    assert pending_for(f, revived, "call").tool == "delete_note"
    f.relay.cancel(revived)
    _finished(f, revived, Stop.CANCELLED)


def test_a_fork_counts_its_time_budget_from_the_fork_not_the_originals_start(f: Fleet) -> None:
    f.brain.script("RP-CLOCK", {0: call("delete_note", name="clock.txt"), 1: final("deleted")})
    run_id = f.relay.start("RP-CLOCK: delete", config=CAUTIOUS, budget=Budget(seconds=4))
    pending_for(f, run_id, "call")
    asked = f.relay.replay(run_id).steps  # the step that waits on a person
    _finished(f, run_id, Stop.BUDGET_EXCEEDED)  # nobody came within its 4 s
    started_ms = f.relay.status(run_id).created_ms
    assert time.time() * 1000 - started_ms > 4_000

    # Forked later than its budget after the original's start: the fork still runs.
    fork = f.relay.fork(run_id, asked)
    mine = pending_for(f, fork, "call")
    f.relay.approve(fork, mine.call_id or "")
    _finished(f, fork)
    assert f.ledger().count("delete_note clock.txt") == 1
    assert f.relay.status(fork).budget == Budget(seconds=4)  # the budget came along

    # ... and its own 4 s are counted: a fork nobody decides for stops at them.
    idle = f.relay.fork(run_id, asked)
    forked_at = time.monotonic()
    pending_for(f, idle, "call")
    outcome = f.relay.wait(idle, 60)
    assert outcome.stop is Stop.BUDGET_EXCEEDED, outcome
    assert "time budget" in outcome.summary
    assert time.monotonic() - forked_at >= 3.5
    assert f.ledger().count("delete_note clock.txt") == 1


# --- fork at every step onto another model server, tools stubbed ----------------------------


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, ModelServer, Relay]]:
    directory = tmp_path_factory.mktemp("fork")
    with fleet(directory) as running, ModelServer(running.brain) as second:
        models = directory / "models.json"
        models.write_text(json.dumps([
            {"name": "first", "url": running.model.url, "model": "m1"},
            {"name": "second", "url": second.url, "model": "m2"},
        ]))  # fmt: skip
        env = {"RELAY_MODELS": str(models)}
        running.worker("--concurrency", "2", env=env)
        relay = build(Settings.from_env({**running.env, **env}))
        yield running, second, relay


SIX = {
    0: call("write_note", name="one.txt", text="first"),
    1: call("read_note", name="one.txt"),
    2: final("wrote and read"),
}


def test_a_fork_at_every_step_runs_nothing_twice_and_asks_the_second_server(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, second, relay = two
    f.brain.script("RP-SIX", SIX)
    original = relay.start("RP-SIX: write then read", config=TRUSTING)
    _finished(f, original)
    steps = relay.replay(original).steps
    assert steps == 6  # asked; write_note; written; read_note; read; done
    assert f.ledger().count("write_note one.txt") == 1
    first_calls = len(calls_for(f, "RP-SIX"))
    second_before = len(second.calls)
    for at in range(steps):
        fork = relay.fork(original, at, route="second", stub_tools=True)
        _finished(f, fork)
        assert relay.status(fork).forked_from.step == at  # type: ignore[union-attr]
        assert len(calls_for(f, "RP-SIX")) == first_calls  # the prefix asked nobody
        # The write in the prefix, or stubbed after it: never run again.
        assert f.ledger().count("write_note one.txt") == 1
        found = relay.diff(original, fork)
        assert found.first_difference is None, found.rows  # the same steps
    # Model calls after each fork point: 3 before the write, 2 after it, 1 after the read.
    assert len(second.calls) - second_before == 3 + 3 + 2 + 2 + 1 + 1

    # Not stubbed: the write runs again (the test above could fail).
    fork = relay.fork(original, 0, route="second")
    _finished(f, fork)
    assert f.ledger().count("write_note one.txt") == 2

    # A call that differs by one byte is not handed the recorded outcome: it runs.
    def one_byte_more(chat: Any) -> Any:
        reply = f.brain(chat)
        return reply.replace('"first"', '"first "') if isinstance(reply, str) else reply

    second.set_responder(one_byte_more)
    try:
        byte = relay.fork(original, 0, route="second", stub_tools=True)
        _finished(f, byte)
    finally:
        second.set_responder(f.brain)
    assert f.ledger().count("write_note one.txt") == 3


def test_a_stubbed_call_whose_recorded_outcome_is_gone_is_not_run_and_says_why(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, second, relay = two
    f.brain.script(
        "RP-GONE", {0: call("write_note", name="gone.txt", text="once"), 1: final("handled")}
    )
    original = relay.start("RP-GONE: write once", config=TRUSTING)
    _finished(f, original)
    assert f.ledger().count("write_note gone.txt") == 1
    field = RunFields.stub(call_digest("write_note", {"name": "gone.txt", "text": "once"}))
    made: dict[str, str] = {}

    def lose_the_recorded_outcome(chat: Any) -> Any:
        # While the fork's model is asked (before it calls the write again), the outcome
        # its --stub-tools recorded is lost from Redis.
        f.until(lambda: "fork" in made, 10, what="the fork's id")
        assert relay.store.redis.hdel(relay.store.keys.run(made["fork"]), field) in (0, 1)
        return f.brain(chat)

    second.set_responder(lose_the_recorded_outcome)
    try:
        made["fork"] = relay.fork(original, 0, route="second", stub_tools=True)
        assert relay.store.redis.hexists(relay.store.keys.run(made["fork"]), field)
        _finished(f, made["fork"])
    finally:
        second.set_responder(f.brain)
    assert not relay.store.redis.hexists(relay.store.keys.run(made["fork"]), field)
    # The write did not run again: the call was stopped, and the model was told why.
    assert f.ledger().count("write_note gone.txt") == 1
    [result] = [e for e in relay.trace(made["fork"]) if e.kind == "result"]
    assert (result.tool, result.status) == ("write_note", "error")
    assert result.text == "its recorded outcome is gone; it was not run"


def test_a_stubbed_write_neither_runs_nor_asks_a_person_and_one_that_differs_asks(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, second, relay = two
    f.brain.script("RP-ASKED", {0: call("delete_note", name="asked.txt"), 1: final("gone")})
    original = relay.start("RP-ASKED: delete", config=CAUTIOUS)
    relay.approve(original, pending_for(f, original, "call").call_id or "")
    _finished(f, original)
    assert f.ledger().count("delete_note asked.txt") == 1
    # The original's yes stands for the stubbed call: it gets the outcome, nobody is asked.
    fork = relay.fork(original, 0, route="second", stub_tools=True)
    assert relay.wait(fork, 30).stop is Stop.DONE, relay.status(fork).pending
    assert f.ledger().count("delete_note asked.txt") == 1
    assert not any(e.kind == "waiting" for e in relay.trace(fork))

    def other_note(chat: Any) -> Any:
        reply = f.brain(chat)
        return reply.replace("asked.txt", "other.txt") if isinstance(reply, str) else reply

    second.set_responder(other_note)
    try:  # Not the original's call: a WRITE like any other, it waits for a person.
        differs = relay.fork(original, 0, route="second", stub_tools=True)
        assert pending_for(f, differs, "call").tool == "delete_note"
    finally:
        second.set_responder(f.brain)
    relay.cancel(differs)
    assert "delete_note other.txt" not in f.ledger()


def test_a_stubbed_call_whose_original_outcome_is_unknown_is_not_run_again(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, _, relay = two
    f.brain.script("RP-UNSURE", {0: call("unsure", amount=7), 1: final("told")})
    original = relay.start("RP-UNSURE: transfer", config=TRUSTING)
    _finished(f, original)
    [was] = [e for e in relay.trace(original) if e.kind == "result"]
    assert was.status == "unknown"
    fork = relay.fork(original, 0, route="second", stub_tools=True)
    _finished(f, fork)
    assert f.ledger().count("unsure 7") == 1  # it may have gone through once: not again
    [result] = [e for e in relay.trace(fork) if e.kind == "result"]
    assert result.status == "error"
    assert result.text.startswith("with stubbed tools it was not run: the run it was forked")
    assert "its outcome is unknown (the bank timed out" in result.text


def test_a_stubbed_result_says_so_in_the_trace_and_relay_show(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, _, relay = two
    f.brain.script(
        "RP-MARK", {0: call("write_note", name="mark.txt", text="hello"), 1: final("marked")}
    )
    original = relay.start("RP-MARK: write", config=TRUSTING)
    _finished(f, original)
    fork = relay.fork(original, 0, route="second", stub_tools=True)
    _finished(f, fork)
    assert f.ledger().count("write_note mark.txt") == 1
    [real] = [e for e in relay.trace(original) if e.kind == "result"]
    [stub] = [e for e in relay.trace(fork) if e.kind == "result"]
    assert real.data["attempt"] == 1
    assert "stubbed" not in real.data
    assert stub.text == real.text == "wrote 5 characters to mark.txt"
    # Not a first attempt that took 0 ms: nothing ran, and the line says so.
    assert stub.data["stubbed"] is True
    assert "attempt" not in stub.data
    assert "ms" not in stub.data
    env = clean_env(
        **f.env, RELAY_MODELS=str(f.directory / "models.json"), RELAY_APP="tests.apps.notes:relay"
    )
    shown = relay_command("show", fork, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "← stubbed, nothing ran: wrote 5 characters to mark.txt" in shown.stdout
    plain = relay_command("show", original, env=env)
    assert "← wrote 5 characters to mark.txt" in plain.stdout
    assert "stubbed" not in plain.stdout


def test_diff_labels_each_ending_as_it_ended_and_says_what_differs(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, second, relay = two
    f.brain.script(
        "RP-TEN", {0: call("write_note", name="ten.txt", text="ten"), 1: final("wrote ten")}
    )
    original = relay.start("RP-TEN: write", config=TRUSTING)
    _finished(f, original)

    def twenty(chat: Any) -> Any:
        reply = f.brain(chat)
        return reply.replace("ten", "twenty") if isinstance(reply, str) else reply

    second.set_responder(twenty)
    try:
        other = relay.fork(original, 0, route="second")
        _finished(f, other)
    finally:
        second.set_responder(f.brain)
    env = clean_env(
        **f.env, RELAY_MODELS=str(f.directory / "models.json"), RELAY_APP="tests.apps.notes:relay",
        COLUMNS="250",
    )  # fmt: skip
    shown = relay_command("diff", original, other, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {r["step"]: r for r in json.loads(shown.stdout)["rows"]}
    assert json.loads(shown.stdout)["first_difference"] == 2
    assert (rows[1]["same"], rows[1]["differs"]) == (True, "")
    assert (rows[2]["a"], rows[2]["b"]) == ("run write_note", "run write_note")
    assert (
        rows[2]["differs"] == 'args differ: name "ten.txt" -> "twenty.txt"; text "ten" -> "twenty"'
    )
    assert rows[3]["differs"].startswith("prompt differs")  # its result said "twenty"
    assert (rows[4]["a"], rows[4]["b"], rows[4]["differs"]) == (
        "done",
        "done",
        "reply text differs",
    )
    table = relay_command("diff", original, other, env=env)
    assert 'first difference: args differ: name "ten.txt" -> "twenty.txt"' in table.stdout
    assert "reply text differs" in table.stdout

    # A run that was cancelled ends "cancelled", not "done"; the fork that went on, "done".
    f.brain.script("RP-HALT", {0: call("delete_note", name="halt.txt"), 1: final("deleted")})
    halted = relay.start("RP-HALT: delete", config=CAUTIOUS)
    pending_for(f, halted, "call")
    asked = relay.replay(halted).steps
    relay.cancel(halted, "not now")
    _finished(f, halted, Stop.CANCELLED)
    went_on = relay.fork(halted, asked)
    relay.approve(went_on, pending_for(f, went_on, "call").call_id or "")
    _finished(f, went_on)
    rows = {r.step: r for r in relay.diff(halted, went_on).rows}
    assert (rows[asked].a, rows[asked].same) == ("run delete_note", True)
    assert (rows[asked + 1].a, rows[asked + 1].b) == ("cancelled", "run delete_note")
    assert rows[asked + 1].differs == "step differs: cancelled -> run delete_note"
    assert rows[max(rows)].a == ""
    assert (rows[max(rows)].b, rows[max(rows)].differs) == (
        "done",
        "only the second run went this far",
    )


def test_the_upgrade_check_names_a_tool_whose_risk_or_idempotency_changed(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, _, relay = two
    f.brain.script("RP-RISK", {0: call("delete_note", name="risk.txt"), 1: final("deleted")})
    parked = relay.start("RP-RISK: delete", config=CAUTIOUS)
    pending_for(f, parked, "call")  # a WRITE: it asks a person
    env = clean_env(
        **f.env, RELAY_MODELS=str(f.directory / "models.json"), RELAY_APP="tests.apps.notes:relay"
    )
    same = relay_command("replay", parked, env=env)
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"{parked}: identical, 2 steps (waiting)" in same.stdout

    # The next version classes delete_note READ (the parked call would no longer ask) and
    # write_note idempotent: the same steps, but not the same run. Named, with exit 1.
    upgraded = {**env, "RELAY_APP": "tests.apps.notes:upgraded"}
    checked = relay_command("replay", "--waiting", env=upgraded)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert (
        f"{parked}: diverges at step 2 of 2: run delete_note then, run delete_note now:"
        " tool delete_note: risk WRITE -> READ, idempotent no -> yes;"
        " tool write_note: idempotent no -> yes"
    ) in checked.stdout
    report = json.loads(relay_command("replay", parked, "--json", env=upgraded).stdout)
    assert (report["identical"], report["replayed"]) == (False, 2)
    assert report["divergence"]["why"].startswith("tool delete_note: risk WRITE -> READ")

    # A run started before starts kept the risks: its steps match, but the check could
    # not see a changed risk, and says so rather than a plain "identical".
    _as_before_risks_were_kept(relay, parked)
    blind = relay_command("replay", "--waiting", env=upgraded)
    assert f"{parked}: identical, 2 steps (waiting); but its tools' risks were not kept" in (
        blind.stdout
    ), blind.stdout + blind.stderr
    assert "runs replay identically (1 of them unchecked for changed risks)." in blind.stdout
    assert relay.replay(parked).unchecked is not None
    relay.cancel(parked)


def _as_before_risks_were_kept(relay: Relay, run_id: str) -> None:
    """Rewrite a run's journal start as a release before this one wrote it: no risks,
    no idempotent tools (packed as `start_text` packs it)."""
    store = relay.store
    start = read_start(store.journal(run_id)[0])
    document = {
        "record": json.loads(start.record.model_dump_json(exclude_defaults=True)),
        "snapshot": json.loads(start.snapshot),
        "tools": start.tools,
    }
    raw = json.dumps(document, separators=(",", ":")).encode()
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, journal._PRESET)
    packed = journal._PACKED + base64.b64encode(packer.compress(raw) + packer.flush()).decode()
    store.redis.lset(store.keys.journal(run_id), 0, packed.encode())
    assert read_start(store.journal(run_id)[0]).risks is None


def test_a_fork_onto_an_unknown_route_or_bad_config_is_refused(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, _, relay = two
    f.brain.script("RP-REFUSE", {0: final("done")})
    run_id = relay.start("RP-REFUSE: nothing", config=TRUSTING)
    _finished(f, run_id)
    with pytest.raises(RelayError, match="no model route nowhere; routes: first, second"):
        relay.fork(run_id, 0, route="nowhere")
    with pytest.raises(RelayError, match="max_calls"):
        relay.fork(run_id, 0, config={"max_calls": 0})


def test_the_commands_replay_fork_and_diff(
    two: tuple[Fleet, ModelServer, Relay],
) -> None:
    f, _, relay = two
    f.brain.script("RP-CLI", {0: call("read_note", name="a.txt"), 1: final("cli")})
    original = relay.start("RP-CLI: read", config=TRUSTING)
    _finished(f, original)
    env = clean_env(
        **f.env, RELAY_MODELS=str(f.directory / "models.json"), RELAY_APP="tests.apps.notes:relay"
    )

    done = relay_command("replay", original, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{original}: identical, 4 steps (finished)" in done.stdout

    forked = relay_command(
        "fork", original, "--at", "1", "--route", "second", "--stub-tools", "--json", env=env
    )
    assert forked.returncode == 0, forked.stderr
    fork_id = json.loads(forked.stdout)["run_id"]
    _finished(f, fork_id)

    shown = relay_command("diff", original, fork_id, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert found["first_difference"] is None
    assert found["b"]["forked_from"] == {"run": original, "step": 1}
    assert [r["step"] for r in found["rows"]] == [1, 2, 3, 4]  # its step 1 restates step 1

    refused = relay_command("fork", original, "--at", "9", env=env)
    assert refused.returncode == 1
    assert "has 4 journal steps" in refused.stderr

    # Before an upgrade: every running or parked run, one line each, exit 0 if all replay.
    f.brain.script("RP-PARK", {0: call("delete_note", name="p.txt"), 1: final("x")})
    parked = [relay.start(f"RP-PARK: {n}", config=CAUTIOUS) for n in range(2)]
    for run_id in parked:
        pending_for(f, run_id, "call")
    waiting = relay_command("replay", "--waiting", env=env)
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    for run_id in parked:
        assert f"{run_id}: identical, 2 steps (waiting)" in waiting.stdout
    assert original not in waiting.stdout  # finished: not in flight

    # A corrupt entry fails that run's replay with a line naming it, not the command.
    relay.store.redis.lset(relay.store.keys.journal(parked[0]), 2, b"{not json")
    broken = relay_command("replay", "--waiting", "--json", env=env)
    assert broken.returncode == 1
    reports = {r["run_id"]: r for r in json.loads(broken.stdout)}
    assert "journal entry 2 cannot be read" in reports[parked[0]]["problem"]
    assert reports[parked[1]]["identical"] is True
    one = relay_command("replay", parked[0], env=env)
    assert one.returncode == 1
    assert f"{parked[0]}: cannot be replayed: run {parked[0]}: journal entry 2" in one.stdout
    for run_id in parked:
        relay.cancel(run_id)
