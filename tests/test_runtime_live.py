"""Live runs, end to end: model replies streamed through Redis to readers as they are written.

Real Redis, real `relay worker` processes, the loopback model server streaming
server-sent events with gaps between them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import FinalStream, Stop
from tests.support.brain import PLAN_ASK, call, final
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.waiting import shared_fleet
from workers import RelayError, StreamEvent
from workers.store.layout import STREAM_KEEP_S, STREAM_PARKED_S

ANSWER = "The total for March is 1,234.50 \u20ac \u2014 \u201cchecked\u201d twice.\nDone."


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with shared_fleet(tmp_path_factory.mktemp("live"), "--concurrency", "2") as running:
        yield running


def shown(events: list[StreamEvent], run_id: str) -> str:
    """What a reader shows of a run's replies: each reply's final text, decoded as it
    comes, starting over at "step" and "restarted"."""
    reader, texts = FinalStream(), [""]
    for event in events:
        if event.run_id != run_id:
            continue
        if event.kind in ("step", "restarted"):
            reader, texts[-1] = FinalStream(), ""
        elif event.kind == "text":
            texts[-1] += reader.feed(event.text)
    return texts[-1]


def test_a_reply_reaches_a_reader_while_it_is_written(f: Fleet) -> None:
    # One character an event, 30 ms apart: escapes and UTF-8 cut everywhere they can be.
    f.brain.script("STREAM-1:", {0: Reply(final(ANSWER), piece_chars=1, gap=0.03)})
    run_id = f.relay.start("STREAM-1: sum March")
    arrived: list[tuple[float, StreamEvent]] = []
    for event in f.relay.stream(run_id, timeout=60):
        arrived.append((time.monotonic(), event))
    events = [event for _, event in arrived]
    kinds = [e.kind for e in events]
    assert kinds[0] == "step"
    assert kinds[-1] == "done"
    assert set(kinds[1:-1]) == {"text"}
    assert "".join(e.text for e in events if e.kind == "text") == final(ANSWER)
    assert shown(events, run_id) == ANSWER
    assert events[-1].text == ANSWER == f.relay.wait(run_id, 5).summary
    # The first piece was read well before the last was written: it streamed.
    first_text = next(at for at, e in arrived if e.kind == "text")
    assert arrived[-1][0] - first_text > 0.03 * len(final(ANSWER)) / 3
    ids = [e.id for e in events]
    assert len(set(ids)) == len(ids)


def test_a_reader_that_disconnects_and_resumes_misses_nothing_and_sees_nothing_twice(
    f: Fleet,
) -> None:
    f.brain.script("STREAM-2:", {0: Reply(final(ANSWER * 3), piece_chars=4, gap=0.02)})
    run_id = f.relay.start("STREAM-2: write a lot")
    seen: list[StreamEvent] = []
    last = "0"
    while not seen or seen[-1].kind != "done":
        for event in f.relay.stream(run_id, after=last, timeout=60):
            seen.append(event)
            last = event.id
            if len(seen) % 7 == 0:
                break  # hang up, and come back from the last id seen
        time.sleep(0.05)
    everything = list(f.relay.stream(run_id, timeout=10))
    assert [e.id for e in seen] == [e.id for e in everything]
    assert seen == everything
    assert shown(seen, run_id) == ANSWER * 3


def test_a_finished_runs_stream_expires_and_a_reader_still_gets_its_end(f: Fleet) -> None:
    f.brain.script("STREAM-3:", {0: Reply(final("short"), piece_chars=2)})
    run_id = f.relay.start("STREAM-3: be brief")
    assert f.relay.wait(run_id, 60).stop is Stop.DONE
    key = f.relay.store.keys.live(run_id)
    redis = f.redis.client()
    assert 0 < redis.ttl(key) <= STREAM_KEEP_S
    redis.delete(key)  # as when it expires
    events = list(f.relay.stream(run_id, after="0", timeout=10))
    assert [(e.kind, e.run_id, e.text, e.id) for e in events] == [("done", run_id, "short", "0")]


def test_a_run_parked_for_a_person_keeps_its_stream_only_a_minute(f: Fleet) -> None:
    f.brain.script("STREAM-4:", {0: Reply(call("delete_note", name="a"), piece_chars=3)})
    run_id = f.relay.start("STREAM-4: delete a")
    f.until(lambda: f.relay.status(run_id).waiting_for == "call", 60, "the run to park")
    ttl = f.redis.client().ttl(f.relay.store.keys.live(run_id))
    assert 0 < ttl <= STREAM_PARKED_S
    f.relay.cancel(run_id)


def test_specialists_stream_into_their_trees_stream(f: Fleet) -> None:
    f.brain.script(
        "STREAM-5:",
        {
            0: Reply(call("delegate", specialist="reader", task="STREAM-5-CHILD: read"), gap=0),
            1: Reply(final("the parent's answer"), piece_chars=5),
        },
    )
    f.brain.script("STREAM-5-CHILD:", {0: Reply(final("the child's answer"), piece_chars=5)})
    run_id = f.relay.start("STREAM-5: ask the reader")
    everything = list(f.relay.stream(run_id, timeout=60))
    child = f"{run_id}.call-1"
    assert {e.run_id for e in everything} == {run_id, child}
    assert shown(everything, child) == "the child's answer"
    assert shown(everything, run_id) == "the parent's answer"
    assert [e.run_id for e in everything if e.kind == "done"] == [child, run_id]
    only_child = list(f.relay.stream(child, timeout=10))
    assert only_child == [e for e in everything if e.run_id == child]


def test_a_bad_cursor_is_refused(f: Fleet) -> None:
    f.brain.script("STREAM-6:", {0: final("ok")})
    run_id = f.relay.start("STREAM-6: anything")
    with pytest.raises(RelayError, match="stream id"):
        next(iter(f.relay.stream(run_id, after="$")))
    f.relay.wait(run_id, 60)


def test_a_worker_killed_mid_reply_restarts_it_and_the_reader_is_told(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.brain.script("KILLED:", {0: Reply(final(ANSWER), piece_chars=2, gap=0.1)})
        first = f.worker("--concurrency", "2")
        run_id = f.relay.start("KILLED: stream slowly")
        events: list[StreamEvent] = []
        for event in f.relay.stream(run_id, timeout=60):
            events.append(event)
            if sum(e.kind == "text" for e in events) == 5:
                break
        first.kill()
        f.worker("--concurrency", "2", name="second")
        events += list(f.relay.stream(run_id, after=events[-1].id, timeout=90))
        kinds = [e.kind for e in events]
        assert kinds[0] == "step"
        assert "restarted" in kinds, kinds
        restart = kinds.index("restarted")
        assert kinds[1:restart] == ["text"] * (restart - 1)
        assert restart >= 6
        assert kinds[-1] == "done"
        again = "".join(e.text for e in events[restart + 1 :] if e.kind == "text")
        assert again == final(ANSWER)  # the second attempt's reply, whole, after the mark
        assert shown(events, run_id) == ANSWER == f.relay.wait(run_id, 5).summary
        assert len(f.model.calls) == 2


def test_a_stream_cut_inside_its_object_is_asked_again_not_held_against_the_model(
    f: Fleet,
) -> None:
    # A gateway that ends the stream early still says "stop" and [DONE]; the half object is a
    # dropped stream: asked again at once, the model never told its reply was unusable.
    half = final(ANSWER)[:25]
    cut = Reply(sse=(_event(half, "stop"), b"data: [DONE]\n\n"))
    f.brain.script("STREAM-CUT:", {0: [cut, Reply(final(ANSWER), piece_chars=8)]})
    run_id = f.relay.start("STREAM-CUT: sum March")
    outcome = f.relay.wait(run_id, 60)
    assert (outcome.stop, outcome.summary) == (Stop.DONE, ANSWER)
    asked = [c.prompt for c in f.model.calls if "STREAM-CUT:" in c.prompt]
    turn0 = [p for p in asked if PLAN_ASK not in p]
    assert len(turn0) == 2
    assert turn0[0] == turn0[1]  # no "your JSON ..." shown back to the model
    events = list(f.relay.stream(run_id, timeout=5))
    assert [e.kind for e in events].count("restarted") >= 1


def _event(text: str, finish: str | None = None) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    return b"data: " + json.dumps(delta).encode() + b"\n\n"
