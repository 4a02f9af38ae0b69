"""`relay diff`'s words, without a fleet: each step labelled as the run took it (an ending
by how the run ended), and what differs at each step that does. The runtime test
(tests/test_runtime_replay.py) holds the same through the command line on real runs."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core import Config, Outcome, Stop
from workers.client.diffs import Steps, diff_of
from workers.engine.journal import StepSeen
from workers.engine.records import RunRecord, Usage
from workers.engine.replay import Taken


def _run(run_id: str, ending: Stop | None = None) -> RunRecord:
    finished = {"state": "finished", "outcome": Outcome(stop=ending, summary="")} if ending else {}
    return RunRecord(
        id=run_id, root=run_id, task="t", created_ms=1, updated_ms=1, config=Config(), **finished
    )


def _steps(record: RunRecord, *steps: tuple[StepSeen, Taken]) -> Steps:
    return Steps(record, Usage(), [seen for seen, _ in steps], [taken for _, taken in steps])


def _ask(system: str = "s", digest: str = "a") -> tuple[StepSeen, Taken]:
    return StepSeen(kind="ask", digest=digest, system=system), Taken()


def _run_step(*calls: tuple[str, dict[str, Any]]) -> tuple[StepSeen, Taken]:
    digest = repr(calls)
    return StepSeen(kind="run", digest=digest, tools=tuple(t for t, _ in calls)), Taken(calls)


def _done(stop: Stop, summary: str = "ok") -> tuple[StepSeen, Taken]:
    seen = StepSeen(kind="done", digest=f"{stop.value}:{summary}")
    return seen, Taken(ending=Outcome(stop=stop, summary=summary))


@pytest.mark.parametrize("stop", [Stop.FAILED, Stop.CANCELLED, Stop.MODEL_FAILED, Stop.DONE])
def test_the_last_step_is_named_by_how_the_run_ended(stop: Stop) -> None:
    # The journal's own step says `done` whatever the ending; the record says how.
    seen = StepSeen(kind="done", digest="x")
    a = _steps(_run("a", stop), _ask(), (seen, Taken()))
    b = _steps(_run("b", Stop.DONE), _ask(), _done(Stop.DONE))
    rows = diff_of(a, b).rows
    assert (rows[-1].a, rows[-1].b) == (stop.value, "done")


def test_what_differs_is_said_for_each_kind_of_step() -> None:
    long = "x" * 100
    a = _steps(
        _run("a", Stop.DONE),
        _ask(system="one"),
        _run_step(("pay", {"amount": 10, "to": "bob", "memo": long})),
        _run_step(("pay", {"amount": 1})),
        _ask(digest="after"),
        _done(Stop.DONE, "paid"),
    )
    b = _steps(
        _run("b", Stop.DONE),
        _ask(system="two"),
        _run_step(("pay", {"amount": 20, "to": "bob", "note": "hi"})),
        _run_step(("refund", {"amount": 1})),
        _ask(digest="other"),
        _done(Stop.DONE, "paid twice"),
    )
    found = diff_of(a, b)
    said = [r.differs for r in found.rows]
    assert said[0] == "system prompt differs"
    assert said[1] == ('args differ: amount 10 -> 20; memo "' + "x" * 38 + '… -> -; note - -> "hi"')
    assert said[2] == "tool differs: pay -> refund"
    assert said[3] == "prompt differs (what the model is shown of the run so far)"
    assert said[4] == "reply text differs"
    assert found.first_difference == 1


def test_an_ending_against_another_and_a_step_only_one_run_took() -> None:
    a = _steps(_run("a", Stop.CANCELLED), _ask(), _done(Stop.CANCELLED))
    b = _steps(_run("b"), _ask(), _done(Stop.DONE, "first turn"), _ask(digest="next"))
    rows = diff_of(a, b).rows
    assert (rows[1].a, rows[1].b) == ("cancelled", "done")  # b's turn end: from its replay
    assert rows[1].differs == "ending differs: cancelled -> done"
    assert (rows[2].a, rows[2].differs) == ("", "only the second run went this far")
    same = diff_of(a, a)
    assert same.first_difference is None
    assert all(r.same and r.differs == "" for r in same.rows)


def test_a_step_this_code_no_longer_replays_is_still_labelled() -> None:
    # No replay reached it (the code changed): the journal's kinds are all there is.
    seen = StepSeen(kind="run", digest="1", tools=("pay",))
    other = StepSeen(kind="run", digest="2", tools=("pay",))
    ended = StepSeen(kind="done", digest="3")
    a = Steps(_run("a"), Usage(), [seen, ended], [])
    b = Steps(_run("b"), Usage(), [other, ended], [])
    rows = diff_of(a, b).rows
    assert (rows[0].a, rows[0].differs) == ("run pay", "args differ")
    assert (rows[1].a, rows[1].same) == ("ended", True)
