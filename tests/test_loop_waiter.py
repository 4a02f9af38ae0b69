"""`LoopCalls.quick` and `Waiter`: a task waits a moment for the reply of a call it
handed to the loop only while the process's calls are quick, and exactly one side (the
task, or a keeper) keeps each outcome."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from workers.runtime import on_loop
from workers.runtime.on_loop import QUICK_S, LoopCalls


def _calls() -> LoopCalls:
    store: Any = None  # (waiting and timing touch no store)
    return LoopCalls(10, cast(Any, store), None, lease_s=30, clock=lambda: 0)


def test_a_task_waits_only_while_the_calls_are_quick() -> None:
    calls = _calls()
    assert not calls.quick()  # nothing known yet: hand it over
    calls.took(0.05)
    assert calls.quick()
    calls.took(5.0)  # one slow call is enough to stop waiting (an average of the last few)
    assert not calls.quick()
    for _ in range(20):
        calls.took(0.05)
    assert calls.quick()


def test_no_keeper_waits() -> None:
    calls = _calls()
    calls.took(0.01)
    seen: list[bool] = []
    keeper = threading.Thread(target=lambda: seen.append(calls.quick()), name="relay-keeper_0")
    keeper.start()
    keeper.join()
    assert seen == [False]


def test_an_outcome_in_time_is_the_tasks_and_a_late_one_the_keepers() -> None:
    calls = _calls()
    calls.took(0.01)
    waiter = calls.waiter()
    assert waiter is not None
    threading.Timer(0.02, lambda: waiter.give("reply")).start()
    assert waiter.wait() == "reply"

    late = calls.waiter()
    assert late is not None
    began = time.monotonic()
    assert late.wait() is None  # not in time: the task goes on without it
    assert time.monotonic() - began >= QUICK_S * 0.9
    assert not late.give("reply")  # the loop hands it to a keeper instead
    # A call not back in time counts as slow: after a few such, no task waits.
    for _ in range(3):
        waiting = calls.waiter()
        if waiting is None:
            break
        waiting.wait()
    assert calls.waiter() is None


def test_the_wait_is_short(monkeypatch: Any) -> None:
    monkeypatch.setattr(on_loop, "QUICK_S", 0.05)
    calls = _calls()
    calls.took(0.01)
    waiter = calls.waiter()
    assert waiter is not None
    began = time.monotonic()
    assert waiter.wait() is None
    assert time.monotonic() - began < 1.0
