"""Steps for runs that cannot go on as usual, as pure functions (`workers.engine.endings`)."""

from __future__ import annotations

from agent_core import Config, Outcome, Stop, ToolOutput
from workers.engine.effects import Reservation, UsageAdd
from workers.engine.endings import finished_already
from workers.engine.events import ModelReplied, ToolDone
from workers.engine.records import RunRecord, Usage
from workers.engine.working import Surroundings

AROUND = Surroundings(now_ms=9_000, grace_ms=500, approval_ttl_ms=None, retention_s=3_600)


def _finished_child() -> RunRecord:
    return RunRecord(
        id="root.call-1",
        parent="root",
        root="root",
        ancestors=("root",),
        parent_call="call-1",
        depth=1,
        task="read",
        config=Config(),
        created_ms=1_000,
        updated_ms=2_000,
        finished_ms=2_000,
        state="finished",
        seq=3,
        usage=Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110, model_calls=1),
        outcome=Outcome(stop=Stop.CANCELLED, summary="Cancelled by a person."),
    )


def test_a_reply_that_comes_after_its_run_finished_is_counted_and_dropped() -> None:
    late = Usage(prompt_tokens=40, completion_tokens=7, total_tokens=47, model_calls=1)
    inbox = [
        ("1-0", ModelReplied(seq=3, text='{"final": "too late"}', usage=late, route="primary")),
        ("2-0", ToolDone(call="call-9", output=ToolOutput.ok("read"))),
        ("3-0", None),
    ]
    ended = finished_already(_finished_child(), "SNAP", inbox, AROUND)
    effects = ended.effects
    assert effects.applied == ("1-0", "2-0", "3-0")
    # The provider billed the call: the run and every ancestor count it, once.
    assert effects.usage_adds == (UsageAdd("root", late), UsageAdd("root.call-1", late))
    assert ended.record.usage.total_tokens == 157
    assert ended.record.route_usage() == {"primary": late}
    assert effects.settle == (Reservation("root", "root.call-1", "m3"),)
    assert effects.stale_calls == ("m3",)
    # Nothing else happens: the run stays finished, nothing is sent, the reply is not applied.
    assert ended.record.state == "finished"
    assert ended.record.outcome == _finished_child().outcome
    assert ended.messages == ()
    assert effects.sends == ()
    assert effects.deliveries == ()
    assert effects.retention_s == 3_600
    assert ended.snapshot == "SNAP"


def test_late_events_without_usage_are_only_dropped() -> None:
    inbox = [("1-0", ToolDone(call="call-9", output=ToolOutput.ok("read")))]
    ended = finished_already(_finished_child(), "SNAP", inbox, AROUND)
    assert ended.effects.applied == ("1-0",)
    assert ended.effects.usage_adds == ()
    assert ended.effects.settle == ()
    assert ended.record.usage == _finished_child().usage
