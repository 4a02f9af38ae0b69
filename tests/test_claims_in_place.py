"""A call a task continues in place is claimed by the save of the step that decided it
(SAVE_CLAIM), and the claim is the task's, or given back.

The runtime's task bodies in this process (`workers.runtime.bodies.Runtime`, no Celery:
a list stands for the broker) on a real private Redis, with a model that is a function.
What real workers do with continuation is tested in tests/test_runtime_inline.py; this
file counts the scripts a step runs, and breaks a task between a save and its next step,
which a worker cannot be made to do on cue.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_core import ModelRequest, Stop
from bench.inprocess import EveryQueue
from tests.apps.notes import build
from tests.support.brain import call, final
from tests.support.redis_server import RedisServer
from workers import Relay, Settings, StoreUnavailable
from workers.engine.effects import Message
from workers.engine.records import RunRecord
from workers.model.transport import ModelSource
from workers.model.wire import ModelReply
from workers.runtime.bodies import Runtime
from workers.runtime.reports import Report
from workers.settings import now_ms


class _OneToolThenDone:
    """A model that calls `tool` once and, with its result in the prompt, finishes."""

    def __init__(self, tool: str = "sleep") -> None:
        self.asked = 0
        self.tool = tool

    def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        del should_stop, on_text
        self.asked += 1
        if "→" in request.prompt:
            return ModelReply(text=final("did it once"))
        if self.tool == "once":
            return ModelReply(text=call("once", label="charge"))
        return ModelReply(text=call("sleep", seconds=0))


@dataclass
class _Host:
    relay: Relay
    runtime: Runtime
    model: _OneToolThenDone
    queue: deque[Message] = field(default_factory=deque)
    scripts: list[str] = field(default_factory=list)

    def start(self) -> str:
        agent = self.relay.kit.new_agent(self.relay.config)
        agent.start_with("charge once", "", ())
        run_id, now = secrets.token_hex(8), now_ms()
        record = RunRecord(
            id=run_id, root=run_id, task="charge once", created_ms=now, updated_ms=now,
            config=self.relay.config,
        )  # fmt: skip
        assert self.relay.store.create(record, agent.snapshot(), now + 60_000)
        self.queue.append(Message("advance", run_id))
        return run_id

    def drain(self) -> None:
        while self.queue:
            self.runtime.task(self.queue.popleft())


@pytest.fixture
def host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[_Host]:
    """The runtime in this process on a private Redis; its model calls `sleep` (which may
    run twice), or the tool a test names by parametrizing `host` indirectly."""
    monkeypatch.setenv("RELAY_TEST_DIR", str(tmp_path))  # (the `once` tool's ledger)
    with RedisServer(tmp_path) as server:
        # (Held calls off: each step runs where `drain` sends it, none on the loop.)
        env = {"RELAY_REDIS_URL": server.url, "RELAY_INLINE_MS": "5000", "RELAY_MODEL_CARRIED": "0"}
        settings = Settings.from_env(env)
        relay = build(settings)
        model = _OneToolThenDone(getattr(request, "param", "sleep"))
        queue: deque[Message] = deque()
        runtime = Runtime(
            settings, relay.store, relay.kit, models=ModelSource(settings, model),
            send=queue.extend, tick=relay.tick, reach=EveryQueue(),
        )  # fmt: skip
        made = _Host(relay, runtime, model, queue)
        run = relay.store.connection.run

        def counted(script: Any, **options: Any) -> Any:
            made.scripts.append(script.name)
            return run(script, **options)

        monkeypatch.setattr(relay.store.connection, "run", counted)
        yield made


def _ledger(tmp_path: Path) -> list[str]:
    return (tmp_path / "ledger.txt").read_text().splitlines()


def _done_once(host: _Host, run_id: str, tmp_path: Path, ledger: list[str]) -> None:
    """The run finished; its tool ran as `ledger` says; each call's first attempt made it."""
    status = host.relay.status(run_id)
    assert (status.state, status.outcome and status.outcome.stop) == ("finished", Stop.DONE)
    assert _ledger(tmp_path) == ledger
    assert _attempts(host, run_id) == [("usage", None, 1), ("result", "ok", 1), ("usage", None, 1)]


def test_each_continued_call_is_claimed_by_the_save_before_it(host: _Host, tmp_path: Path) -> None:
    run_id = host.start()
    host.drain()
    status = host.relay.status(run_id)
    assert (status.state, status.outcome and status.outcome.stop) == ("finished", Stop.DONE)
    # One task ran the run: its advance, the model call, the tool, the model call again.
    # Each call was claimed with the save of the step before; none claimed on its own.
    assert host.scripts == ["load", "save_claim", "save_claim", "save_claim", "save"]
    assert _ledger(tmp_path) == ["sleep start 0", "sleep end 0"]
    results = [e for e in host.relay.trace(run_id) if e.kind == "result"]
    assert [(r.status, r.data.get("attempt")) for r in results] == [("ok", 1)]


def _breaking_once(host: _Host, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The first step of `kind` raises after its save (as a bug in what follows would)."""
    counted = host.runtime._counted
    broke: list[str] = []

    def breaks_once(done: str, report: Report) -> Report:
        if done == kind and not broke:
            broke.append(done)
            raise RuntimeError("a bug after the save")
        return counted(done, report)

    monkeypatch.setattr(host.runtime, "_counted", breaks_once)


def _attempts(host: _Host, run_id: str) -> list[tuple[str, str | None, object]]:
    return [
        (e.kind, e.status, e.data.get("attempt"))
        for e in host.relay.trace(run_id)
        if e.kind in ("usage", "result")
    ]


def test_a_claim_kept_for_a_step_the_task_did_not_run_is_given_back(
    host: _Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's first step breaks after its save claimed the model call: the claim is
    given back and the message published, so the call is made by its own task as attempt
    1, at once (not after its lease lapsed, as if a worker had died)."""
    _breaking_once(host, monkeypatch, "advance")
    run_id = host.start()
    with pytest.raises(RuntimeError, match="a bug after the save"):
        host.drain()
    assert host.queue == deque([Message("call_model", run_id, seq=1)])
    run = host.relay.store.keys.run(run_id)
    assert host.relay.store.redis.hget(run, "a:m1") is None  # no attempt counted
    assert not host.relay.store.redis.exists(host.relay.store.keys.lease(run_id, "m1"))
    host.drain()
    _done_once(host, run_id, tmp_path, ["sleep start 0", "sleep end 0"])
    assert host.model.asked == 2


def test_a_continued_step_that_breaks_still_hands_its_claim_to_the_next(
    host: _Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model call, continued, breaks after its save claimed the tool call: its own
    message is published again (and refused: the run moved on), and the task runs the
    tool with the claim it holds, once."""
    _breaking_once(host, monkeypatch, "call_model")
    run_id = host.start()
    host.drain()
    _done_once(host, run_id, tmp_path, ["sleep start 0", "sleep end 0"])
    assert host.model.asked == 2
    # (the republished m1: a CLAIM of its own, refused, for the run had moved on)
    assert host.scripts.count("claim") == 1


@pytest.mark.parametrize("host", ["once"], indirect=True)
def test_a_tool_that_must_not_run_twice_is_claimed_as_it_starts(
    host: _Host, tmp_path: Path
) -> None:
    """A claim made with the save and never used (its answer lost, its worker dead before
    the call) would have a second attempt report it "outcome unknown" without it having
    run: such a tool is claimed by its own step, as it starts."""
    run_id = host.start()
    host.drain()
    assert host.scripts == ["load", "save_claim", "save", "claim", "save_claim", "save"]
    assert _ledger(tmp_path) == ["once start charge", "once end charge"]
    assert _attempts(host, run_id) == [("usage", None, 1), ("result", "ok", 1), ("usage", None, 1)]


def test_a_claim_whose_answer_was_lost_is_given_back_and_due_at_once(
    host: _Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops as SAVE_CLAIM's answer comes back: the save and the claim both
    landed, but the task cannot know. The claim is given back by its token, so the call
    is due again at once (not when its lease lapses), as attempt 1."""
    run = host.relay.store.connection.run
    lost: list[str] = []

    def drops_one_answer(script: Any, **options: Any) -> Any:
        answer = run(script, **options)
        if script.name == "save_claim" and script.args[-12] == "m1" and not lost:
            lost.append(script.name)
            raise StoreUnavailable("the connection dropped as the answer came back")
        return answer

    monkeypatch.setattr(host.relay.store.connection, "run", drops_one_answer)
    run_id = host.start()
    with pytest.raises(StoreUnavailable):  # (its task fails; its step is saved all the same)
        host.drain()
    assert lost == ["save_claim"]
    assert host.relay.store.redis.hget(host.relay.store.keys.run(run_id), "a:m1") is None
    due = host.relay.store.upkeep.due_messages(now_ms())  # what the tick sends now
    assert due == [f"m|{run_id}|1"]
    host.queue.extend(m for m in map(Message.of, due) if m is not None)
    host.drain()
    _done_once(host, run_id, tmp_path, ["sleep start 0", "sleep end 0"])


def test_a_claim_left_held_by_a_task_cut_off_is_given_back_as_the_next_task_begins(
    host: _Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task is cut off between taking the claim and keeping its message (as a signal
    raised there would): the next task on that thread gives the claim back first, so the
    call is due at once rather than after its lease."""
    keep = host.runtime.placement.keep
    cut: list[str] = []

    def cut_off(message: Message, release: Callable[[], None]) -> None:
        if not cut:
            cut.append(message.kind)
            raise RuntimeError("cut off")
        keep(message, release)

    monkeypatch.setattr(host.runtime.placement, "keep", cut_off)
    run_id = host.start()
    with pytest.raises(RuntimeError, match="cut off"):
        host.drain()
    assert cut == ["call_model"]
    assert host.relay.store.upkeep.due_messages(now_ms()) == []  # held: due when it lapses
    host.runtime.task(Message("advance", run_id))  # the thread's next task (a wake-up)
    assert host.relay.store.upkeep.due_messages(now_ms()) == [f"m|{run_id}|1"]
    host.queue.append(Message("call_model", run_id, seq=1))
    host.drain()
    _done_once(host, run_id, tmp_path, ["sleep start 0", "sleep end 0"])
