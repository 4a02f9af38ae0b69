"""Each task's one line, and when it is a failure: pure functions of what the step did."""

from __future__ import annotations

import pytest

from agent_core import Config, Outcome, Stop, ToolOutput
from workers.engine.effects import Advanced, Effects
from workers.engine.events import BudgetReached, InboxEvent, ModelFailed, ModelReplied, ToolDone
from workers.engine.records import CallTrack, RunRecord, Usage
from workers.runtime.reports import FAILED_STOPS, Report, after_step, did, run_now


def _record(**changes: object) -> RunRecord:
    base = RunRecord(id="r1", root="r1", task="t", created_ms=0, updated_ms=0, config=Config())
    return base.model_copy(update=changes)


TOOL = "call-2 read_note"
CALLS = [
    (ModelReplied(seq=3, text="x", usage=Usage(total_tokens=42)), "replied, 42 tokens", False),
    (ModelFailed(seq=3, error="the server\nanswered 503"), "failed: the server answered 503", True),
    (BudgetReached(seq=3, limit="usd", detail="Extend it."), "not made: Extend it.", False),
    (ToolDone(call="call-2", output=ToolOutput.ok("x" * 120)), "ok, 120 chars", False),
    (ToolDone(call="call-2", output=ToolOutput.error("Boom: kaboom")), "error: Boom: kaboom", True),
    (ToolDone(call="call-2", output=ToolOutput.unknown("it may")), "unknown: it may", True),
]  # fmt: skip


@pytest.mark.parametrize(("event", "line", "failed"), CALLS)
def test_what_a_call_did(event: InboxEvent, line: str, failed: bool) -> None:
    if isinstance(event, ToolDone):
        assert did("call-2", "read_note", event) == Report(f"{TOOL} {line}", failed)
    else:
        assert did("m3", None, event) == Report(f"model call m3 {line}", failed)


def _track(status: str, child: str | None = None) -> dict[str, CallTrack]:
    call = "call-3" if status == "approval" else "call-1"
    return {call: CallTrack(status=status, tool="t", child=child, created_ms=0)}  # type: ignore[arg-type]


def _ended(stop: Stop, summary: str) -> dict[str, object]:
    return {"outcome": Outcome(stop=stop, summary=summary)}


NOW = [
    ("running", "model", {"seq": 4}, "run waits for the model (step 4)"),
    ("waiting", "call", {"calls": _track("approval")}, "run waits for approval of call-3"),
    ("running", "tools", {"calls": _track("running")}, "run waits for call-1"),
    ("running", "children", {"calls": _track("child", "r1.1")}, "run waits for specialists r1.1"),
    ("waiting", "plan", {}, "run waits for approval of its plan"),
    ("waiting", "question", {}, "run waits for an answer"),
    ("waiting", "budget", {}, "run waits for its budget to be extended"),
    ("finished", None, _ended(Stop.DONE, "all\ndone"), "run finished (done): all done"),
    ("finished", None, _ended(Stop.FAILED, "no"), "run failed (failed): no"),
    ("finished", None, _ended(Stop.CANCELLED, "stop"), "run finished (cancelled): stop"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "waiting_for", "changes", "line"), NOW)
def test_where_the_run_is_now(
    state: str, waiting_for: str | None, changes: dict[str, object], line: str
) -> None:
    assert run_now(_record(state=state, waiting_for=waiting_for, **changes)) == line


@pytest.mark.parametrize("stop", list(Stop))
def test_a_step_that_ends_its_run_fails_only_for_a_failed_stop(stop: Stop) -> None:
    before = _record(state="running", waiting_for="model")
    after = _record(state="finished", outcome=Outcome(stop=stop, summary="s"))
    report = after_step(before, Advanced(after, "", Effects(applied=("1-0",))))
    assert report.failed is (stop in FAILED_STOPS)
    assert report.line.startswith("applied 1 event(s); run ")
    assert (stop in FAILED_STOPS) is (stop not in (Stop.DONE, Stop.CANCELLED, Stop.PLAN_DECLINED))


def test_a_finished_run_woken_again_is_no_failure() -> None:
    ended = _record(state="finished", outcome=Outcome(stop=Stop.FAILED, summary="s"))
    report = after_step(ended, Advanced(ended, "", Effects(applied=("1-0", "2-0"))))
    assert report == Report("the run had finished already; 2 late event(s) dropped")
