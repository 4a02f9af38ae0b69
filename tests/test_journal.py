"""The journal, in process: every step the engine takes is written down so that
replaying it through the same code takes exactly the same steps.

A small host here drives the engine as the workers do (inbox events in, the step
saved, its messages answered), with replies, outcomes and decisions drawn by
hypothesis, events grouped into steps at random and duplicates thrown in. Each
run's journal, read back from its stored text, must replay identically; and a
replay through changed code must stop at the right step and say why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_core import (
    Config,
    Kind,
    Outcome,
    Policy,
    Risk,
    Stop,
    Tool,
    ToolArgsError,
    ToolOutput,
    prompts,
)
from tests.apps.notes import build
from workers import Relay, Settings
from workers.client.start import new_run
from workers.engine.decide import decide
from workers.engine.effects import Reservation
from workers.engine.events import (
    Answer,
    CallDecision,
    ChildDone,
    InboxEvent,
    ModelFailed,
    ModelReplied,
    PlanDecision,
    Ran,
    Told,
    ToolDone,
)
from workers.engine.journal import (
    JournalError,
    call_digest,
    read_entry,
    read_start,
    start_text,
)
from workers.engine.records import RunRecord
from workers.engine.replay import Replayed, replay
from workers.engine.working import Surroundings

AROUND = Surroundings(now_ms=1_000, grace_ms=5_000, approval_ttl_ms=None, retention_s=60)
OFFLINE = Settings.from_env({"RELAY_REDIS_URL": "redis://127.0.0.1:1", "RELAY_MODEL_URL": ""})


def _relay(**changes: Any) -> Relay:
    return build(OFFLINE, **changes)


class Chooser:
    """What a host chooses as a run goes: this one, the simplest thing every time."""

    def take(self, waiting: int) -> int:
        """How many of the waiting events the next step applies."""
        return waiting

    def output(self) -> ToolOutput:
        return ToolOutput.ok("fine")

    def yes(self) -> bool:
        return True

    def duplicate(self) -> bool:
        return False

    def model_fails(self) -> bool:
        return False


@dataclass
class Drawn(Chooser):
    """Chooses as hypothesis draws."""

    draw: Any

    def take(self, waiting: int) -> int:
        return int(self.draw(st.integers(0, waiting)))

    def output(self) -> ToolOutput:
        ok = bool(self.draw(st.booleans()))
        return ToolOutput.ok("fine") if ok else ToolOutput.error("no")

    def yes(self) -> bool:
        return bool(self.draw(st.booleans()))

    def duplicate(self) -> bool:
        return bool(self.draw(st.booleans()))

    def model_fails(self) -> bool:
        return int(self.draw(st.integers(0, 9))) == 0


@dataclass
class Host:
    """Drives one run through the engine the way the workers do, keeping its journal."""

    relay: Relay
    replies: list[str]
    choose: Chooser = field(default_factory=Chooser)
    record: RunRecord = field(init=False)
    start: str = field(init=False)
    journal: list[str] = field(default_factory=list)

    def run(self, task: str, config: Config) -> None:
        kit = self.relay.kit
        self.record, snapshot, self.start = new_run(
            kit, task, "", config, attachments=None, budget=None, tools=None, notes=None,
            recipe=None, schedule=None, run_id="r1", key=None, memory=None,
            remembered=lambda _: [], app="notes",
        )  # fmt: skip
        agent = kit.restore(self.record, snapshot)
        waiting: list[InboxEvent] = []
        for _ in range(60):
            take = self.choose.take(len(waiting)) if waiting else 0
            inbox: list[tuple[str, InboxEvent | None]] = [
                (str(i), e) for i, e in enumerate(waiting[:take])
            ]
            waiting = waiting[take:]
            advanced = decide(self.record, agent, inbox, AROUND)
            assert advanced.effects.journal is not None
            self.journal.append(advanced.effects.journal)
            self.record = advanced.record
            if self.record.state == "finished":
                return
            waiting += self._answers(advanced.messages, advanced.effects.pending_add)
            if not waiting and not advanced.messages:
                waiting.append(Told(text="go on"))

    def _answers(self, messages: Any, pending: Any) -> list[InboxEvent]:
        events: list[InboxEvent] = []
        for message in messages:
            if message.kind == "call_model":
                events.append(self._model_answer(message.seq))
            elif message.kind == "run_tool":
                events.append(ToolDone(call=message.call, output=self.choose.output()))
        events += self._decisions(pending)
        done = Outcome(stop=Stop.DONE, summary="helped")
        for call_id, call in self.record.calls.items():  # a specialist's run ends at once
            if call.child is not None and call.status == "child":
                events.append(ChildDone(call=call_id, child=call.child, outcome=done))
        if events and self.choose.duplicate():
            events.append(events[0])  # a duplicate: the engine must ignore it, replay too
        return events

    def _decisions(self, pending: Any) -> list[InboxEvent]:
        events: list[InboxEvent] = []
        for entry in pending:
            yes = self.choose.yes()
            if entry.kind == "call":
                events.append(CallDecision(call=entry.call_id, yes=yes, reason="not now"))
            elif entry.kind == "plan":
                events.append(PlanDecision(seq=entry.seq, yes=yes))
            elif entry.kind == "question":
                events.append(Answer(seq=entry.seq, text="blue"))
        return events

    def _model_answer(self, seq: int) -> InboxEvent:
        if self.choose.model_fails():
            return ModelFailed(seq=seq, error="HTTP 503")
        text = self.replies.pop(0) if self.replies else json.dumps({"final": "all done"})
        return ModelReplied(seq=seq, text=text)


def _call(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args})


BATCH = json.dumps(
    {
        "tools": [
            {"tool": "read_note", "args": {"name": "a.txt"}},
            {"tool": "write_note", "args": {"name": "d.txt", "text": "x"}},
        ]
    }
)
REPLIES = st.lists(
    st.one_of(
        st.builds(lambda n: _call("read_note", name=n), st.sampled_from(["a.txt", "b.txt"])),
        st.builds(lambda t: _call("write_note", name="c.txt", text=t), st.text(max_size=20)),
        st.builds(lambda n: _call("delete_note", name=n), st.just("a.txt")),
        st.just(BATCH),
        st.just(json.dumps({"ask_user": "Which colour?"})),
        st.just(_call("delegate", specialist="reader", task="read a.txt")),
        st.just("this is not JSON"),
        st.just(json.dumps({"final": "done early"})),
    ),
    max_size=8,
)

CONFIGS = st.builds(
    Config,
    require_plan=st.booleans(),
    max_batch=st.sampled_from([1, 4]),
    policy=st.sampled_from([Policy.CAUTIOUS, Policy.TRUSTING]),
    summarize=st.booleans(),
    history_chars=st.sampled_from([1_000, 24_000]),
)


def _replayed(host: Host, relay: Relay | None = None) -> Replayed:
    start = read_start(host.start)
    entries = [read_entry(i, text) for i, text in enumerate(host.journal, start=1)]
    return replay(start, entries, (relay or host.relay).kit.restore, AROUND)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies=REPLIES, config=CONFIGS, data=st.data())
def test_every_run_replays_identically(replies: list[str], config: Config, data: Any) -> None:
    host = Host(_relay(), list(replies), Drawn(data.draw))
    host.run("Tidy the notes", config)
    played = _replayed(host)
    assert played.divergence is None, played.divergence
    assert played.steps == len(host.journal)
    assert played.agent is not None
    assert played.agent.snapshot() == played.agent.snapshot()  # (restorable state)
    assert played.record.state == host.record.state
    assert played.record.outcome == host.record.outcome


def _read(name: str) -> str:
    return "hello"


def _write(name: str, text: str) -> str:
    return "written"


READ = Tool("read_note", "Read a note").arg("name", Kind.TEXT).risk(Risk.READ)
WRITE = Tool("write_note", "Write a note").arg("name", Kind.TEXT).arg("text", Kind.TEXT)


def _mini(*tools: Tool) -> Relay:
    """A small app: the tools given (read and write notes, by default)."""
    relay = Relay("mini", config=Config(require_plan=False), settings=OFFLINE)
    for tool in tools or (READ, WRITE.risk(Risk.CREATE)):
        relay.add_tool(tool, _read if tool.name == "read_note" else _write)
    return relay


def _copy_run() -> Host:
    replies = [_call("read_note", name="a.txt"), _call("write_note", name="b.txt", text="hi")]
    host = Host(_mini(), replies)
    host.run("Copy a.txt to b.txt", Config(require_plan=False, policy=Policy.TRUSTING))
    assert host.record.state == "finished"
    assert len(host.journal) == 6  # asked; read_note; read; write_note; written; done
    return host


@pytest.mark.parametrize("own", [False, True], ids=["from-the-inbox", "its-own-task"])
def test_a_reply_that_ends_its_run_lets_go_of_its_reservation_once(own: bool) -> None:
    kit = _mini().kit
    record, snapshot, _ = new_run(
        kit, "Say hi", "", Config(require_plan=False), attachments=None, budget=None,
        tools=None, notes=None, recipe=None, schedule=None, run_id="r1", key=None,
        memory=None, remembered=lambda _: [], app="notes",
    )  # fmt: skip
    agent = kit.restore(record, snapshot)
    asked = decide(record, agent, [], AROUND)
    (message,) = asked.messages
    assert message.kind == "call_model"
    assert message.seq is not None
    reply = ModelReplied(seq=message.seq, text=json.dumps({"final": "hi"}))
    if own:
        done = decide(asked.record, agent, [], AROUND, reply)
    else:
        done = decide(asked.record, agent, [("1-0", reply)], AROUND)
    assert done.record.state == "finished"
    # (Applied as a reply, and let go again as the finished run's last call: once.)
    assert done.effects.settle == (Reservation("r1", "r1", f"m{message.seq}"),)


def test_the_same_code_replays_the_same_run() -> None:
    played = _replayed(_copy_run(), _mini())
    assert played.divergence is None
    assert played.steps == 6
    assert played.ran == {
        "call-1": ("read_note", {"name": "a.txt"}),
        "call-2": ("write_note", {"name": "b.txt", "text": "hi"}),
    }
    assert [o.status for o in played.outcomes.values()] == ["ok", "ok"]


def test_a_removed_tool_is_the_first_divergence() -> None:
    played = _replayed(_copy_run(), _mini(READ))
    assert played.divergence is not None
    assert played.divergence.step == 1  # the first model request lists the tools
    assert played.divergence.why == "the tool write_note is gone, so the system prompt changed"


def test_a_changed_tool_signature_is_the_first_divergence() -> None:
    renamed = Tool("write_note", "Write a note").arg("path", Kind.TEXT).arg("text", Kind.TEXT)
    played = _replayed(_copy_run(), _mini(READ, renamed.risk(Risk.CREATE)))
    assert played.divergence is not None
    assert played.divergence.step == 1
    assert played.divergence.why.startswith("the tool write_note changed")


def test_a_changed_prompt_template_is_the_first_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    host = _copy_run()
    written = prompts.system_text
    monkeypatch.setattr(prompts, "system_text", lambda *a: written(*a) + "\nBe brief.")
    played = _replayed(host, _mini())
    assert played.divergence is not None
    assert played.divergence.step == 1
    assert played.divergence.why == "the system prompt changed (its template or the instructions)"


def test_a_tool_that_now_refuses_the_call_is_the_first_divergence() -> None:
    def refuse(args: dict[str, Any]) -> dict[str, Any]:
        raise ToolArgsError("b.txt is read-only now")

    stricter = WRITE.risk(Risk.CREATE).validate(refuse)  # (a check is not in the prompt)
    played = _replayed(_copy_run(), _mini(READ, stricter))
    assert played.divergence is not None
    assert played.divergence.step == 4  # where the model's reply became the write_note call
    assert played.divergence.recorded is not None
    assert played.divergence.recorded.kind == "run"
    assert played.divergence.now is not None
    assert played.divergence.now.kind == "ask"
    assert "no longer checks against the tool's arguments" in played.divergence.why
    assert "b.txt is read-only now" in played.divergence.why


def test_the_digest_of_a_call_sees_every_byte_of_its_arguments() -> None:
    one = call_digest("write_note", {"name": "a.txt", "text": "pay 100"})
    assert one == call_digest("write_note", {"text": "pay 100", "name": "a.txt"})  # key order
    assert one != call_digest("write_note", {"name": "a.txt", "text": "pay 100 "})
    assert one != call_digest("write_note", {"name": "a.txt", "text": "pay 1OO"})
    assert one != call_digest("delete_note", {"name": "a.txt", "text": "pay 100"})
    assert one != call_digest("write_note", {"name": "a.txt", "text": 100})


def test_a_corrupt_entry_is_named() -> None:
    with pytest.raises(JournalError, match="entry 3 cannot be read") as raised:
        read_entry(3, b'{"events": "nope"}')
    assert raised.value.index == 3
    with pytest.raises(JournalError, match="not a journal's start"):
        read_start(b'{"events": [], "step": {"kind": "ask", "digest": "x"}}')


def test_a_start_keeps_each_tools_risk_and_whether_it_may_run_again() -> None:
    record = RunRecord(id="r1", root="r1", task="t", created_ms=1, updated_ms=1, config=Config())
    tools = [READ, WRITE.risk(Risk.MONEY)]
    start = read_start(start_text(record, "{}", tools, idempotent={"read_note", "not_offered"}))
    assert start.risks == {"read_note": "READ", "write_note": "MONEY"}
    assert start.idempotent == ("read_note",)  # only of the tools offered
    # Who cannot tell (the engine, starting a specialist) leaves idempotency unsaid: a
    # replay then checks the risks alone, and an older start, without either, nothing.
    unsaid = read_start(start_text(record, "{}", tools))
    assert (unsaid.risks["write_note"], unsaid.idempotent) == ("MONEY", None)


def test_who_ran_a_call_says_stubbed_only_for_a_stubbed_one() -> None:
    # A worker of the version before reads every outcome but a stubbed one (mid-upgrade).
    made = ToolDone(call="call-1", output=ToolOutput.ok("fine"), ran=Ran(attempt=1, worker="w"))
    assert "stubbed" not in made.model_dump_json()
    stubbed = made.model_copy(update={"ran": Ran(attempt=1, stubbed=True)})
    assert json.loads(stubbed.model_dump_json())["ran"]["stubbed"] is True
    assert ToolDone.model_validate_json(stubbed.model_dump_json()) == stubbed
