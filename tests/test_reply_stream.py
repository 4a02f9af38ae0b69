"""`ReplyStream`: a model call's pieces reach its tree's live stream through the
process's one writer thread, in order, batched while a write is under way and
paced (a write a stream every WRITE_GAP_S, its first and last at once), each
stream's failure its own, and in a forked child too."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from collections.abc import Sequence

import pytest

from workers.errors import StoreUnavailable
from workers.runtime import streaming
from workers.runtime.streaming import WRITE_GAP_S, ReplyStream
from workers.store.live import LiveStreams


class FakeLive:
    """What `LiveStreams.add_many` was given, per run; `gate` holds writes while it is
    clear."""

    def __init__(self, *, failing: Sequence[str] = ()) -> None:
        self.batches: dict[str, list[list[tuple[str, str]]]] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.failing = set(failing)
        self.writers: set[str] = set()
        self.round_trips = 0
        self.widest = 0
        """The most streams one round trip wrote."""

    def add_many(
        self, batches: Sequence[tuple[str, list[tuple[str, str]]]]
    ) -> list[bool | StoreUnavailable]:
        self.writers.add(threading.current_thread().name)
        self.gate.wait(10)
        self.round_trips += 1
        self.widest = max(self.widest, len(batches))
        answers: list[bool | StoreUnavailable] = []
        for run_id, events in batches:
            if run_id in self.failing:
                answers.append(StoreUnavailable("Redis went away"))
                continue
            self.batches.setdefault(run_id, []).append(list(events))
            answers.append(True)
        return answers

    def text(self, run_id: str) -> str:
        return "".join(t for batch in self.batches.get(run_id, []) for k, t in batch if k == "text")


def _stream(live: FakeLive, run_id: str) -> ReplyStream:
    fake: LiveStreams = live  # type: ignore[assignment]
    return ReplyStream(fake, run_id, seq=1, attempt=1)


def test_pieces_queued_during_a_write_go_together_and_close_waits_for_them() -> None:
    live = FakeLive()
    stream = _stream(live, "r1")
    live.gate.clear()  # the first write is held
    stream("Hel")
    time.sleep(0.05)
    stream("lo, ")
    stream("world")
    live.gate.set()
    stream.close()
    assert live.batches["r1"][0] == [("step", "m1"), ("text", "Hel")]
    assert live.batches["r1"][1:] == [[("text", "lo, world")]]  # one event for both


def test_a_model_sending_token_by_token_is_written_a_few_times_a_second() -> None:
    live = FakeLive()
    stream = _stream(live, "r1")
    began = time.monotonic()
    for i in range(100):
        stream(f"t{i} ")
        time.sleep(0.005)  # a hundred or more tokens a second
    stream.close()
    took = time.monotonic() - began
    assert live.text("r1") == "".join(f"t{i} " for i in range(100))
    assert live.batches["r1"][0] == [("step", "m1"), ("text", "t0 ")]  # the first at once
    # One write a gap, and the first and the last beside them (100 without the gap).
    assert live.round_trips <= took / WRITE_GAP_S + 2, (live.round_trips, took)


def test_a_process_streaming_many_replies_writes_each_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 replies at once, with room for 40 writes a second: each is written every 0.5 s,
    # not every 50 ms (40 times in the 2 s).
    monkeypatch.setattr(streaming, "WRITES_PER_S", 40)
    live = FakeLive()
    streams = [_stream(live, f"r{i}") for i in range(20)]
    began = time.monotonic()
    while time.monotonic() - began < 2.0:
        for stream in streams:
            stream("t ")
        time.sleep(0.005)
    assert streaming._WRITER.gap == pytest.approx(0.5)
    for stream in streams[1:]:
        stream.close()
    assert streaming._WRITER.gap == WRITE_GAP_S  # one left: the gap is the least again
    streams[0].close()
    writes = [len(live.batches[f"r{i}"]) for i in range(20)]
    assert max(writes) <= 8, writes  # 4 paced, the first and the last
    assert all(live.text(f"r{i}").startswith("t t t ") for i in range(20))
    # A stream never closed counts no more once it is gone.
    gone = _stream(live, "gone")
    gone("t ")
    assert len(streaming._WRITER._open) == 1
    time.sleep(0.2)  # written
    del gone
    other = _stream(live, "other")  # (the writer lets go of what it wrote last at its next write)
    other("t ")
    other.close()
    deadline = time.monotonic() + 5
    while streaming._WRITER._open and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert len(streaming._WRITER._open) == 0


def test_a_closing_call_writes_what_is_left_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "WRITE_GAP_S", 60.0)  # no paced write comes in this test
    live = FakeLive()
    stream = _stream(live, "r1")
    stream("first ")
    time.sleep(0.1)  # written: the next write is a minute off
    stream("and the rest")
    began = time.monotonic()
    stream.close()
    assert time.monotonic() - began < 1.5  # not CLOSE_SECONDS (2 s) in vain
    assert live.text("r1") == "first and the rest"
    assert live.round_trips == 2
    stream("a late piece")  # after the close: at once too, and close waits for it again
    stream.close()
    assert live.text("r1") == "first and the resta late piece"


def test_many_calls_share_one_writer_and_keep_their_order() -> None:
    live = FakeLive()
    streams = [_stream(live, f"run{n}") for n in range(40)]

    def speak(stream: ReplyStream, n: int) -> None:
        for i in range(200):
            stream(f"{n}.{i} ")
        stream.close()

    threads = [threading.Thread(target=speak, args=(s, n)) for n, s in enumerate(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for n in range(40):
        assert live.text(f"run{n}") == "".join(f"{n}.{i} " for i in range(200))
    assert live.writers == {"relay-live"}
    assert sum(t.name == "relay-live" for t in threading.enumerate()) == 1


def test_streams_due_together_are_written_in_one_round_trip() -> None:
    live = FakeLive()
    first = _stream(live, "first")
    live.gate.clear()
    first("held")  # the writer waits in this write: the others queue meanwhile
    time.sleep(0.05)
    others = [_stream(live, f"run{n}") for n in range(30)]
    for stream in others:
        stream("piece")
    live.gate.set()
    for stream in [first, *others]:
        stream.close()
    assert all(live.text(f"run{n}") == "piece" for n in range(30))
    assert live.widest == 30
    assert live.round_trips == 2


def test_a_stream_whose_write_fails_stops_and_the_others_go_on() -> None:
    live = FakeLive(failing=["broken"])
    broken, fine = _stream(live, "broken"), _stream(live, "fine")
    broken("lost")
    fine("kept ")
    broken.close()
    broken("after the failure")  # dropped: this call's streaming stopped
    fine("too")
    began = time.monotonic()
    broken.close()
    fine.close()
    assert time.monotonic() - began < 5
    assert "broken" not in live.batches
    assert live.text("fine") == "kept too"


def _in_child(answer: multiprocessing.SimpleQueue[str]) -> None:
    live = FakeLive()
    stream = _stream(live, "child")
    stream("from the child")
    stream.close()
    answer.put(live.text("child"))


def test_a_forked_child_streams_through_a_writer_of_its_own() -> None:
    live = FakeLive()
    parent = _stream(live, "parent")
    parent("the parent's writer runs")
    parent.close()
    context = multiprocessing.get_context("fork")
    answer: multiprocessing.SimpleQueue[str] = context.SimpleQueue()
    child = context.Process(target=_in_child, args=(answer,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert answer.get() == "from the child"


class BrokenLive(FakeLive):
    def add_many(
        self, batches: Sequence[tuple[str, list[tuple[str, str]]]]
    ) -> list[bool | StoreUnavailable]:
        if any(run_id == "bug" for run_id, _ in batches):
            raise ValueError("a bug in the store")
        return super().add_many(batches)


def test_a_write_that_raises_stops_its_streams_and_the_writer_serves_the_next() -> None:
    live = BrokenLive()
    broken = _stream(live, "bug")
    broken("never written")
    began = time.monotonic()
    broken.close()
    assert time.monotonic() - began < 1  # settled at once, not after CLOSE_SECONDS
    later = _stream(live, "later")
    later("still written")
    later.close()
    assert live.text("later") == "still written"
    assert "bug" not in live.batches
