"""Model server faults, end to end: retried, then a stated stop.

Real Redis, a real `relay worker`, and a real HTTP model server playing the
faults. The model client gets one retry per call (RELAY_MODEL_RETRIES=1) and a
2 s read timeout. One retry budget per call: a fault that never clears costs
the client's 2 HTTP attempts, then the run stops (the agent is not asked to try
again: its own retries, max_retries=1 here, are for unusable replies).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import Config, Stop
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply, refusing_url
from tests.support.waiting import calls_for, shared_fleet

FAST = Config(require_plan=False, max_retries=1)
"""One retry of an unusable reply or a failed call, then the run stops."""
CLIENT = {"RELAY_MODEL_TIMEOUT": "2", "RELAY_MODEL_RETRIES": "1"}


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    directory = tmp_path_factory.mktemp("faults")
    with shared_fleet(directory, "--concurrency", "2", extra_env=CLIENT) as running:
        yield running


def test_a_500_then_success_is_retried_and_the_run_finishes(f: Fleet) -> None:
    f.brain.script("E500:", {0: [Reply(status=500), final("fine after all")]})
    run_id = f.relay.start("E500: say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    assert outcome.summary == "fine after all"
    calls = calls_for(f, "E500:")
    assert len(calls) == 2
    assert calls[0].prompt == calls[1].prompt  # the same step, asked again
    # The client retried on its own: the agent never saw a failure.
    kinds = [e.kind for e in f.relay.trace(run_id)]
    assert "retry" not in kinds
    assert "model_failed" not in kinds


def test_a_429_with_retry_after_is_honoured(f: Fleet) -> None:
    busy = Reply(status=429, text="slow down", headers={"Retry-After": "1"})
    f.brain.script("E429:", {0: [busy, final("patience paid")]})
    run_id = f.relay.start("E429: say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.DONE, f.logs()
    calls = calls_for(f, "E429:")
    assert len(calls) == 2
    gap = calls[1].at - calls[0].at
    assert 0.9 <= gap < 20, gap


def test_a_model_that_hangs_is_timed_out_retried_then_stopped(f: Fleet) -> None:
    f.brain.script("HANG:", {0: Reply(hang=True)})
    run_id = f.relay.start("HANG: say something", config=FAST)
    outcome = f.relay.wait(run_id, 90)
    assert outcome.stop is Stop.MODEL_FAILED, f.logs()
    assert "ReadTimeout" in outcome.summary, outcome.summary
    assert "gave up after 2 attempts" in outcome.summary, outcome.summary
    # Two HTTP attempts (the client's retry budget), then the run stops: not 2 x 2.
    assert len(calls_for(f, "HANG:")) == 2
    assert "model_failed" not in [e.kind for e in f.relay.trace(run_id)]  # no "trying again"


def test_a_garbage_body_is_a_stated_model_failure(f: Fleet) -> None:
    f.brain.script("GARBAGE-BODY:", {0: Reply(raw_body=b"not json")})
    run_id = f.relay.start("GARBAGE-BODY: say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.MODEL_FAILED, f.logs()
    assert "not JSON" in outcome.summary, outcome.summary
    assert "'not json'" in outcome.summary, outcome.summary
    # An unusable body is the server's failure, not the model's reply: not asked again.
    assert len(calls_for(f, "GARBAGE-BODY:")) == 1


def test_a_model_that_never_replies_in_the_format_stops_with_bad_replies(f: Fleet) -> None:
    f.brain.script("CHATTY:", {0: "Sure! I would be glad to help with that."})
    run_id = f.relay.start("CHATTY: say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.BAD_REPLIES, f.logs()
    assert outcome.summary.startswith("The model's replies could not be used:"), outcome.summary
    prompts = [c.prompt for c in calls_for(f, "CHATTY:")]
    assert len(prompts) == 2
    assert "Your last reply could not be used" in prompts[1]


def test_a_persistent_500_costs_one_retry_budget_then_a_stated_stop(f: Fleet) -> None:
    f.brain.script("E500-ALWAYS:", {0: Reply(status=500, text="down for good")})
    run_id = f.relay.start("E500-ALWAYS: say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.MODEL_FAILED, f.logs()
    assert "gave up after 2 attempts" in outcome.summary, outcome.summary
    assert len(calls_for(f, "E500-ALWAYS:")) == 2  # RELAY_MODEL_RETRIES + 1, and no more
    stops = [e for e in f.relay.trace(run_id) if e.kind in ("stop", "model_failed")]
    assert [e.kind for e in stops] == ["stop"]  # said once, and never "trying again"


@pytest.mark.parametrize(
    ("status", "said"), [(400, "unknown model: big-9"), (401, "no key"), (404, "no such model")]
)
def test_a_request_the_server_calls_wrong_is_asked_once(f: Fleet, status: int, said: str) -> None:
    # Not "cannot stream" (that 400 names `stream`), not worth a retry by anyone.
    marker = f"WRONG-{status}:"
    f.brain.script(marker, {0: Reply(status=status, text=said)})
    run_id = f.relay.start(f"{marker} say something", config=FAST)
    outcome = f.relay.wait(run_id, 60)
    assert outcome.stop is Stop.MODEL_FAILED, f.logs()
    assert said in outcome.summary, outcome.summary
    assert len(calls_for(f, marker)) == 1
    assert all(c.body.get("stream") is True for c in calls_for(f, marker))


def test_a_fault_in_one_run_leaves_another_alone(f: Fleet) -> None:
    f.brain.script("SICK:", {0: Reply(raw_body=b"{")})
    f.brain.script("WELL:", {0: call("read_note", name="well.txt"), 1: final("all well")})
    sick = f.relay.start("SICK: say something", config=FAST)
    well = f.relay.start("WELL: read a note", config=FAST)
    assert f.relay.wait(sick, 60).stop is Stop.MODEL_FAILED, f.logs()
    assert f.relay.wait(well, 60).stop is Stop.DONE, f.logs()


def test_a_refused_connection_is_retried_then_stopped(tmp_path: Path) -> None:
    with refusing_url() as url, fleet(tmp_path, extra_env={**CLIENT, "RELAY_MODEL_URL": url}) as g:
        g.worker("--concurrency", "1")
        run_id = g.relay.start("REFUSED: say something", config=FAST)
        outcome = g.relay.wait(run_id, 60)
        assert outcome.stop is Stop.MODEL_FAILED, g.logs()
        assert "could not connect" in outcome.summary, outcome.summary
        assert "gave up after 2 attempts" in outcome.summary, outcome.summary
        assert g.model.calls == []
