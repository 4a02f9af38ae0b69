"""The slice's rules (`workers.runtime.continuation`), with a fake clock and fake steps.

What a real worker does with them is tested in tests/test_runtime_inline.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from workers.engine.effects import Message
from workers.runtime.continuation import Continuation
from workers.runtime.reports import Report


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reach:
    queues: frozenset[str] = frozenset({"advance", "call_model", "run_tool"})
    tool_s: float = 360.0

    def owns(self, message: Message) -> bool:
        return message.kind in self.queues

    def needs_s(self, message: Message) -> float:
        return self.tool_s if message.kind == "run_tool" else 0.0


@dataclass
class World:
    """Steps that each take `step_s` and send what `plan` says comes after them."""

    inline: Continuation
    clock: Clock
    plan: dict[Message, list[Message]]
    step_s: float = 0.01
    published: list[Message] = field(default_factory=list)
    ran: list[Message] = field(default_factory=list)
    fails: set[Message] = field(default_factory=set)

    def step(self, message: Message) -> Report:
        self.ran.append(message)
        self.clock.now += self.step_s
        self.inline.send(self.plan.get(message, []))
        if message in self.fails:
            raise ConnectionError("Redis went away")
        return Report(f"did {message.kind}")


MODEL = Message("call_model", "r", seq=1)
TOOL = Message("run_tool", "r", call="call-1", tool="read_note")
MODEL2 = Message("call_model", "r", seq=3)
ADVANCE = Message("advance", "r")
CHAIN = {ADVANCE: [MODEL], MODEL: [TOOL], TOOL: [MODEL2]}


def world(
    slice_ms: int = 250,
    reach: Reach | None = None,
    *,
    plan: dict[Message, list[Message]],
    step_s: float = 0.01,
    fails: frozenset[Message] = frozenset(),
    claim_held_s: float = float("inf"),
) -> World:
    clock = Clock()
    published: list[Message] = []
    inline = Continuation(
        published.extend, slice_ms, reach or Reach(), clock, claim_held_s=claim_held_s
    )
    return World(inline, clock, plan, step_s, published, fails=set(fails))


def test_a_chain_runs_in_one_task_and_the_report_names_each_step() -> None:
    w = world(plan=CHAIN)
    report = w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE, MODEL, TOOL, MODEL2]
    assert w.published == []
    assert report.line == (
        "did advance | continued model call m1: did call_model"
        " | continued call-1 read_note: did run_tool | continued model call m3: did call_model"
    )


def test_after_the_slice_the_next_step_is_published() -> None:
    w = world(plan=CHAIN, step_s=0.1)
    w.inline.run(ADVANCE, w.step)
    # 0.1 s per step, a 0.25 s slice: the third step's successor goes to the broker.
    assert w.ran == [ADVANCE, MODEL, TOOL]
    assert w.published == [MODEL2]


@pytest.mark.parametrize(
    ("why", "plan", "reach"),
    [
        ("a batch", {ADVANCE: [TOOL, Message("run_tool", "r", call="call-2")]}, Reach()),
        ("a delay", {ADVANCE: [Message("call_model", "r", seq=1, delay_ms=500)]}, Reach()),
        ("another queue", {ADVANCE: [MODEL]}, Reach(frozenset({"advance"}))),
    ],
)
def test_what_is_published_as_usual(
    why: str, plan: dict[Message, list[Message]], reach: Reach
) -> None:
    w = world(plan=plan, reach=reach)
    w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE], why
    assert w.published == plan[ADVANCE], why


def test_off_publishes_everything() -> None:
    w = world(slice_ms=0, plan=CHAIN)
    w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE]
    assert w.published == [MODEL]


def test_a_tool_that_would_outlive_the_tasks_hard_limit_is_published() -> None:
    w = world(plan=CHAIN, reach=Reach(tool_s=360.0))
    w.inline.run(ADVANCE, w.step, hard_limit_s=100.0)
    assert w.ran == [ADVANCE, MODEL]
    assert w.published == [TOOL]


def test_a_continued_step_that_raises_is_published_and_the_task_keeps_its_report() -> None:
    w = world(plan=CHAIN, fails=frozenset({TOOL}))
    report = w.inline.run(ADVANCE, w.step)
    # The tool's step saved and kept its successor before it raised: that one runs too.
    assert w.ran == [ADVANCE, MODEL, TOOL, MODEL2]
    assert w.published == [TOOL]
    assert "continued call-1 read_note: failed (ConnectionError); published instead" in report.line


def test_a_first_step_that_raises_publishes_what_it_kept() -> None:
    w = world(plan=CHAIN, fails=frozenset({ADVANCE}))
    with pytest.raises(ConnectionError):
        w.inline.run(ADVANCE, w.step)
    assert w.published == [MODEL]


def test_outside_a_task_nothing_is_kept() -> None:
    w = world(plan=CHAIN)
    w.inline.send([MODEL])
    assert w.published == [MODEL]


@dataclass
class ClaimingWorld(World):
    """Steps whose successor's call is claimed with their save (`ahead`, then `keep`), as
    `Steps.save` does. `events` says, in order, what was published and what given back."""

    events: list[tuple[str, Message]] = field(default_factory=list)

    def step(self, message: Message) -> Report:
        self.ran.append(message)
        self.clock.now += self.step_s
        after = self.plan.get(message, [])
        kept = self.inline.ahead(after)
        if kept is None:
            self.inline.send(after)
        else:
            self.inline.keep(kept, lambda: self.events.append(("released", kept)))
        if message in self.fails:
            raise ConnectionError("Redis went away")
        return Report(f"did {message.kind}")


def claiming(
    plan: dict[Message, list[Message]], fails: frozenset[Message] = frozenset()
) -> ClaimingWorld:
    clock, events = Clock(), []

    def publish(messages: list[Message]) -> None:
        events.extend(("published", m) for m in messages)

    inline = Continuation(publish, 250, Reach(), clock)
    return ClaimingWorld(inline, clock, plan, fails=set(fails), events=events)


def test_ahead_names_the_one_step_send_would_keep() -> None:
    w = claiming(CHAIN)
    assert w.inline.ahead([MODEL]) is None  # outside a task: nothing is kept
    report = w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE, MODEL, TOOL, MODEL2]
    assert w.events == []  # each claim kept was used by its step; nothing was published
    assert "continued call-1 read_note" in report.line


@pytest.mark.parametrize(
    "plan",
    [
        {ADVANCE: [TOOL, Message("run_tool", "r", call="call-2")]},
        {ADVANCE: [Message("call_model", "r", seq=1, delay_ms=500)]},
    ],
    ids=["a-batch", "a-delay"],
)
def test_ahead_claims_nothing_that_is_published(plan: dict[Message, list[Message]]) -> None:
    w = claiming(plan)
    w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE]
    assert w.events == [("published", m) for m in plan[ADVANCE]]


def test_a_claim_kept_for_a_step_that_is_not_run_is_given_back_before_it_is_published() -> None:
    w = claiming(CHAIN, fails=frozenset({ADVANCE}))
    with pytest.raises(ConnectionError):
        w.inline.run(ADVANCE, w.step)
    assert w.ran == [ADVANCE]
    # (its task claims it anew: a claim held by no one would stall it for a lease)
    assert w.events == [("released", MODEL), ("published", MODEL)]


def test_a_claim_that_cannot_be_given_back_does_not_keep_its_message_from_going_out() -> None:
    w = claiming(CHAIN, fails=frozenset({ADVANCE}))
    real_keep = w.inline.keep

    def keep_failing_release(message: Message, release: object) -> None:
        def release_fails() -> None:
            raise ConnectionError("Redis went away")

        real_keep(message, release_fails)

    w.inline.keep = keep_failing_release  # type: ignore[method-assign]
    with pytest.raises(ConnectionError, match="Redis went away"):
        w.inline.run(ADVANCE, w.step)
    assert w.events == [("published", MODEL)]  # (its claim lapses with its lease)


# --- a carried call's thread borrows a free slot (`Continuation.borrow`) -----------------


def _saved_call(w: World) -> Report:
    """What a carried call's save does: it decides the run's next step, the tool call."""
    w.inline.send([TOOL])
    return Report("model call m1 replied")


def test_a_carried_call_goes_on_with_the_run_in_a_free_slot() -> None:
    w = world(plan=CHAIN)
    report = w.inline.borrow(lambda: _saved_call(w), w.step)
    assert w.ran == [TOOL, MODEL2]
    assert w.published == []
    assert report.line == (
        "model call m1 replied | continued call-1 read_note: did run_tool"
        " | continued model call m3: did call_model"
    )
    assert w.inline.slot_to_spare()  # the slot is given back


def _carried_call_in_task(w: World, hold_s: float, saved: Callable[[], Report]) -> Report:
    """A task holds the process's one slot while a carried call ends on a thread of its
    own (its save: `saved`) and for up to `hold_s` more; returns what the call's thread did."""
    during: list[Report] = []
    thread = threading.Thread(target=lambda: during.append(w.inline.borrow(saved, w.step)))

    def task_step(_: Message) -> Report:
        thread.start()
        thread.join(hold_s)
        return Report("did advance")

    w.inline.run(ADVANCE, task_step)
    thread.join(10)
    return during[0]


def test_with_every_slot_taken_a_carried_call_waits_for_one_and_goes_on() -> None:
    w = world(slice_ms=5_000, plan=CHAIN)
    began = time.monotonic()
    report = _carried_call_in_task(w, 0.2, lambda: _saved_call(w))
    assert report.line.startswith("model call m1 replied | continued call-1 read_note")
    assert w.ran == [TOOL, MODEL2]  # (after the task gave the slot back)
    assert w.published == []
    assert time.monotonic() - began < 2.5  # (no waiting out its 5 s slice)
    assert w.inline.slot_to_spare()


@pytest.mark.parametrize(
    ("why", "slice_ms", "claim_held_s"),
    [("its slice", 100, float("inf")), ("its claim's renewal", 60_000, 0.1)],
)
def test_a_carried_call_waits_for_a_slot_no_longer_than_then_publishes(
    why: str, slice_ms: int, claim_held_s: float
) -> None:
    w = world(slice_ms=slice_ms, plan=CHAIN, claim_held_s=claim_held_s)
    given_back: list[Message] = []

    def saved_claiming_its_tool_call() -> Report:  # (SAVE_CLAIM: the call claimed with it)
        ahead = w.inline.ahead([TOOL])
        assert ahead == TOOL
        w.inline.keep(ahead, lambda: given_back.append(ahead))
        return Report("model call m1 replied")

    began = time.monotonic()
    report = _carried_call_in_task(w, 10, saved_claiming_its_tool_call)
    assert report == Report("model call m1 replied"), why
    assert (w.ran, w.published, given_back) == ([], [TOOL], [TOOL]), why
    assert 0.09 <= time.monotonic() - began < 5, why  # it waited 0.1 s, not the 10 s hold
    assert w.inline.slot_to_spare()


def test_a_carried_call_with_no_next_step_waits_for_no_slot() -> None:
    w = world(slice_ms=5_000, plan=CHAIN)
    began = time.monotonic()
    report = _carried_call_in_task(w, 10, lambda: Report("model call m5 replied; run done"))
    assert time.monotonic() - began < 2.5
    assert (report.line, w.ran, w.published) == ("model call m5 replied; run done", [], [])


def test_off_a_carried_call_publishes_its_next_step() -> None:
    w = world(slice_ms=0, plan=CHAIN)
    w.inline.borrow(lambda: _saved_call(w), w.step)
    assert w.ran == []
    assert w.published == [TOOL]


def test_a_borrowed_slice_publishes_what_comes_after_it() -> None:
    w = world(plan=CHAIN, step_s=0.3)
    w.inline.borrow(lambda: _saved_call(w), w.step)
    assert w.ran == [TOOL]  # 0.3 s: past the 0.25 s slice, the next step is published
    assert w.published == [MODEL2]


def _borrowing(w: World, release: threading.Event) -> threading.Thread:
    """A carried call's thread that borrows the slot and holds it until `release`."""
    holding = threading.Event()

    def held(message: Message) -> Report:
        holding.set()
        release.wait(10)
        return Report(f"did {message.kind}")

    thread = threading.Thread(target=w.inline.borrow, args=(lambda: _saved_call(w), held))
    thread.start()
    assert holding.wait(10)
    return thread


def _waiting_task(w: World) -> tuple[threading.Thread, threading.Event]:
    """A task that comes while the process's one slot is borrowed: it waits (it has not
    started its step 0.3 s later). Returns its thread and what says it started."""
    started = threading.Event()
    task = threading.Thread(
        target=w.inline.run, args=(ADVANCE, lambda _: started.set() or Report("did advance"))
    )
    task.start()
    assert not started.wait(0.3)
    return task, started


def test_a_task_waits_for_a_slot_a_carried_call_borrowed() -> None:
    w = world(slice_ms=5_000, plan={})
    release = threading.Event()
    borrower = _borrowing(w, release)
    task, started = _waiting_task(w)  # the task does not start beside the borrowed step...
    release.set()
    assert started.wait(10)  # ...until the borrowed step ends
    for thread in (borrower, task):
        thread.join(10)
    assert w.inline.slot_to_spare()


def test_a_task_waits_for_a_borrowed_slot_at_most_a_slice() -> None:
    w = world(slice_ms=100, plan={})
    release = threading.Event()
    borrower = _borrowing(w, release)
    began = time.monotonic()
    w.inline.run(ADVANCE, lambda _: Report("did advance"))
    waited = time.monotonic() - began
    release.set()
    borrower.join(10)
    assert 0.09 <= waited < 5  # it waited the 0.1 s slice, then ran beside the borrowed step
    assert w.inline.slot_to_spare()


def test_no_carried_call_borrows_a_slot_while_a_task_waits_for_one() -> None:
    w = world(slice_ms=5_000, plan={TOOL: []})
    release = threading.Event()
    borrower = _borrowing(w, release)
    task, started = _waiting_task(w)
    # A second slot appears (as the pool's count would): the task waiting is owed it, so
    # a carried call ending now waits too, and does not run its next step beside it.
    w.inline.slots = 2
    carried = threading.Thread(target=w.inline.borrow, args=(lambda: _saved_call(w), w.step))
    carried.start()
    time.sleep(0.3)
    assert (w.ran, started.is_set()) == ([], False)
    release.set()
    for thread in (borrower, task, carried):
        thread.join(10)
    assert (w.ran, w.published, started.is_set()) == ([TOOL], [], True)


def test_tasks_beyond_the_slots_counted_never_wait_for_each_other() -> None:
    """A pool that runs more tasks at once than its process counts slots (greenlets,
    counted as one): with no slot borrowed, a second task starts at once."""
    w = world(slice_ms=5_000, plan={})
    release, holding = threading.Event(), threading.Event()

    def held(_: Message) -> Report:
        holding.set()
        release.wait(10)
        return Report("did advance")

    first = threading.Thread(target=w.inline.run, args=(ADVANCE, held))
    first.start()
    assert holding.wait(10)
    began = time.monotonic()
    w.inline.run(ADVANCE, lambda _: Report("did advance"))
    assert time.monotonic() - began < 2.5  # (a wait would be the 5 s slice)
    release.set()
    first.join(10)


def test_every_task_waiting_goes_once_the_borrowed_slot_is_back() -> None:
    """Tasks beyond the slots counted (greenlets, counted as one) that came while a slot
    was borrowed all start when it is given back, none a slice later (each runs on, so
    none makes room for another)."""
    w = world(slice_ms=5_000, plan={})
    release, done = threading.Event(), threading.Event()
    borrower = _borrowing(w, release)
    starts = [threading.Event() for _ in range(2)]

    def task(started: threading.Event) -> None:
        def step(_: Message) -> Report:
            started.set()
            done.wait(10)
            return Report("did advance")

        w.inline.run(ADVANCE, step)

    tasks = [threading.Thread(target=task, args=(started,)) for started in starts]
    for thread in tasks:
        thread.start()
    assert not any(started.wait(0.3) for started in starts)  # both wait for the slot
    began = time.monotonic()
    release.set()
    assert all(started.wait(10) for started in starts)
    assert time.monotonic() - began < 2.5  # (one left waiting would wait the 5 s slice)
    done.set()
    for thread in [borrower, *tasks]:
        thread.join(10)
