"""The slice's rules (`workers.runtime.placement`), with a fake clock and fake steps.

`run` drives a slice as `Runtime.task` does (open, the first step, each step kept,
close); what a real worker does with them is tested in tests/test_runtime_inline.py
and tests/test_runtime_loop.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from workers.engine.effects import Message
from workers.runtime.placement import Placement, label
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

    inline: Placement
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


def run(
    w: World,
    first: Message | Callable[[], Report],
    hard_limit_s: float | None = None,
    *,
    keeper: bool = False,
) -> Report:
    """A slice as `Runtime.task` (or, with `keeper`, `Runtime._keep_held`) drives it."""
    here = w.inline.open(hard_limit_s, keeper=keeper)
    try:
        report = first() if callable(first) else w.step(first)
        while (message := w.inline.next(here)) is not None:
            try:
                after = w.step(message)
            except ConnectionError as error:
                w.inline.publish([message])
                after = Report(f"failed ({type(error).__name__}); published instead")
            report = report.continued(label(message), after)
        return report
    finally:
        w.inline.close(here)


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
) -> World:
    clock = Clock()
    published: list[Message] = []
    inline = Placement(published.extend, slice_ms, reach or Reach(), clock)
    return World(inline, clock, plan, step_s, published, fails=set(fails))


def test_a_chain_runs_in_one_task_and_the_report_names_each_step() -> None:
    w = world(plan=CHAIN)
    report = run(w, ADVANCE)
    assert w.ran == [ADVANCE, MODEL, TOOL, MODEL2]
    assert w.published == []
    assert report.line == (
        "did advance | continued model call m1: did call_model"
        " | continued call-1 read_note: did run_tool | continued model call m3: did call_model"
    )


def test_after_the_slice_the_next_step_is_published() -> None:
    w = world(plan=CHAIN, step_s=0.1)
    run(w, ADVANCE)
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
    run(w, ADVANCE)
    assert w.ran == [ADVANCE], why
    assert w.published == plan[ADVANCE], why


def test_off_publishes_everything() -> None:
    w = world(slice_ms=0, plan=CHAIN)
    run(w, ADVANCE)
    assert w.ran == [ADVANCE]
    assert w.published == [MODEL]


def test_a_tool_that_would_outlive_the_tasks_hard_limit_is_published() -> None:
    w = world(plan=CHAIN, reach=Reach(tool_s=360.0))
    run(w, ADVANCE, hard_limit_s=100.0)
    assert w.ran == [ADVANCE, MODEL]
    assert w.published == [TOOL]


def test_a_continued_step_that_raises_is_published_and_the_task_keeps_its_report() -> None:
    w = world(plan=CHAIN, fails=frozenset({TOOL}))
    report = run(w, ADVANCE)
    # The tool's step saved and kept its successor before it raised: that one runs too.
    assert w.ran == [ADVANCE, MODEL, TOOL, MODEL2]
    assert w.published == [TOOL]
    assert "continued call-1 read_note: failed (ConnectionError); published instead" in report.line


def test_a_first_step_that_raises_publishes_what_it_kept() -> None:
    w = world(plan=CHAIN, fails=frozenset({ADVANCE}))
    with pytest.raises(ConnectionError):
        run(w, ADVANCE)
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

    inline = Placement(publish, 250, Reach(), clock)
    return ClaimingWorld(inline, clock, plan, fails=set(fails), events=events)


def test_ahead_names_the_one_step_send_would_keep() -> None:
    w = claiming(CHAIN)
    assert w.inline.ahead([MODEL]) is None  # outside a task: nothing is kept
    report = run(w, ADVANCE)
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
    run(w, ADVANCE)
    assert w.ran == [ADVANCE]
    assert w.events == [("published", m) for m in plan[ADVANCE]]


def test_a_claim_kept_for_a_step_that_is_not_run_is_given_back_before_it_is_published() -> None:
    w = claiming(CHAIN, fails=frozenset({ADVANCE}))
    with pytest.raises(ConnectionError):
        run(w, ADVANCE)
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
        run(w, ADVANCE)
    assert w.events == [("published", MODEL)]  # (its claim lapses with its lease)


# --- a keeper's slice (`Placement.open(keeper=True)`) -------------------------------------


def _saved_call(w: World, *decided: Message) -> Report:
    """What a held call's save does: it decides the run's next step."""
    w.inline.send(list(decided))
    return Report("model call m1 replied")


def test_a_keeper_goes_on_with_an_advance_and_hands_on_the_model_call_after_it() -> None:
    w = world(plan={ADVANCE: [MODEL2]})
    report = run(w, lambda: _saved_call(w, ADVANCE), keeper=True)
    assert w.ran == [ADVANCE, MODEL2]
    assert w.published == []
    assert report.line == (
        "model call m1 replied | continued advance: did advance"
        " | continued model call m3: did call_model"
    )


def test_a_keeper_never_runs_a_tool_it_publishes_it() -> None:
    w = world(plan=CHAIN)
    report = run(w, lambda: _saved_call(w, TOOL), keeper=True)
    assert (w.ran, w.published) == ([], [TOOL])
    assert report.line == "model call m1 replied"


def test_a_keeper_publishes_what_comes_after_its_slice() -> None:
    w = world(plan={ADVANCE: [MODEL2]}, step_s=0.3)
    run(w, lambda: _saved_call(w, ADVANCE), keeper=True)
    assert w.ran == [ADVANCE]  # 0.3 s: past the 0.25 s slice, the next step is published
    assert w.published == [MODEL2]


def test_off_a_keeper_publishes_the_next_step() -> None:
    w = world(slice_ms=0, plan=CHAIN)
    run(w, lambda: _saved_call(w, ADVANCE), keeper=True)
    assert (w.ran, w.published) == ([], [ADVANCE])
