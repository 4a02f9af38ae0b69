"""`Carrier.hold` (RELAY_MODEL_CARRIED): who keeps a call's outcome, the task that waited
for it or the carrier's thread, is decided once; and carrier threads are used again.
In process, with real threads (the runtime tests run it in real workers)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest

from workers.runtime.carried import Carried, Carrier
from workers.runtime.reports import Report


class _Told:
    """What the carrier told `done`, and when."""

    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.event = threading.Event()

    def __call__(self, report: Report) -> None:
        self.reports.append(report)
        self.event.set()


def _kept(made: str) -> Report:
    return Report(f"kept {made} on {threading.current_thread().name}")


def test_an_outcome_made_while_the_task_waits_is_the_tasks() -> None:
    told = _Told()
    carrier = Carrier(10, told)
    assert carrier.hold(lambda: "reply", _kept, wait_s=5.0) == "reply"
    assert told.reports == []  # the task keeps it: nothing for the carrier to count
    assert carrier.wait_idle(timeout_s=5.0) == 0


def test_an_outcome_past_the_wait_is_kept_and_told_by_the_carrier() -> None:
    told = _Told()
    carrier = Carrier(10, told)
    go = threading.Event()
    held = carrier.hold(lambda: "slow" if go.wait(5.0) else "never", _kept, wait_s=0.01)
    assert held == Carried(1)
    assert carrier.carried == 1
    go.set()
    assert told.event.wait(5.0)
    assert [r.line for r in told.reports] == ["kept slow on relay-call"]
    assert carrier.wait_idle(timeout_s=5.0) == 0


class _Stopped(BaseException):
    """What a prefork child's SIGTERM handler raises in its main thread (a SystemExit)."""


def test_a_task_stopped_while_it_waits_leaves_the_outcome_to_the_carrier() -> None:
    """SIGTERM to a worker's process group raises in each child's running task: if the
    task was waiting for its call's reply, the call is the carrier's to keep, not lost."""
    told = _Told()
    carrier = Carrier(10, told)
    go = threading.Event()

    def stop(*_: object) -> None:
        raise _Stopped

    before = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # (it comes during the 30 s wait)
        with pytest.raises(_Stopped):
            carrier.hold(lambda: "slow" if go.wait(5.0) else "never", _kept, wait_s=30.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    go.set()
    assert told.event.wait(5.0)
    assert [r.line for r in told.reports] == ["kept slow on relay-call"]
    assert carrier.wait_idle(timeout_s=5.0) == 0


def test_an_error_while_the_task_waits_is_raised_in_the_task() -> None:
    told = _Told()
    carrier = Carrier(10, told)

    def fails() -> str:
        raise ValueError("the model client broke")

    with pytest.raises(ValueError, match="client broke"):
        carrier.hold(fails, _kept, wait_s=5.0)
    assert told.reports == []
    assert carrier.wait_idle(timeout_s=5.0) == 0


def test_an_error_after_the_wait_fails_the_carried_call() -> None:
    told = _Told()
    carrier = Carrier(10, told)
    go = threading.Event()

    def fails_later() -> str:
        go.wait(5.0)
        raise ValueError("the model client broke")

    assert isinstance(carrier.hold(fails_later, _kept, wait_s=0.0), Carried)
    go.set()
    assert told.event.wait(5.0)
    assert told.reports[0].failed
    assert "the model client broke" in told.reports[0].line


def test_a_full_carrier_leaves_the_call_to_its_task() -> None:
    carrier = Carrier(1, _Told())
    go = threading.Event()
    assert isinstance(carrier.hold(lambda: go.wait(5.0), lambda _: Report("ok"), 0.0), Carried)
    assert carrier.hold(lambda: True, lambda _: Report("ok"), 0.0) is None
    go.set()
    assert carrier.wait_idle(timeout_s=5.0) == 0


def test_each_outcome_is_kept_exactly_once_whoever_gets_there_first() -> None:
    """Replies that come just as the wait ends: each is kept by the task or by the
    carrier, never both and never neither."""
    told = _Told()
    carrier = Carrier(1000, told)

    def reply_as_the_wait_ends() -> str:
        time.sleep(0.0005)
        return "reply"

    by_task = 0
    for _ in range(300):
        held = carrier.hold(reply_as_the_wait_ends, _kept, wait_s=0.0005)
        by_task += not isinstance(held, Carried)
    assert carrier.wait_idle(timeout_s=10.0) == 0
    assert by_task + len(told.reports) == 300


def test_a_call_thread_takes_the_next_call_instead_of_a_new_thread() -> None:
    carrier = Carrier(10, _Told())
    mark = threading.local()

    def new_thread() -> bool:
        """True the first time a thread makes a call here."""
        first = not getattr(mark, "seen", False)
        mark.seen = True
        return first

    started = []
    for _ in range(50):
        started.append(carrier.hold(new_thread, lambda _: Report("ok"), 5.0))
        assert carrier.wait_idle(timeout_s=5.0) == 0
    # One call at a time: the threads that made the first calls made the rest (a thread
    # is spare again just after its call is counted, so now and then one more starts).
    assert started.count(True) <= 5, started.count(True)


class _Clock:
    """A monotonic clock that a call moves by how long it 'took'."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def call_taking(self, seconds: float) -> Callable[[], str]:
        def make() -> str:
            self.now += seconds
            return "reply"

        return make


def _one_call(carrier: Carrier, make: Callable[[], str]) -> None:
    carrier.hold(make, _kept, wait_s=0.0)
    assert carrier.wait_idle(timeout_s=5.0) == 0


def test_a_task_stops_waiting_for_replies_once_most_take_longer_than_its_wait() -> None:
    """RELAY_MODEL_CARRIED_AFTER_MS is waited while it pays: the carrier learns how many
    of the process's recent calls came back within it (a remote model: none)."""
    clock = _Clock()
    carrier = Carrier(10, _Told(), moment_s=0.01, clock=clock)
    assert carrier.worth_waiting()  # a new process waits, as a local model answers at once
    for _ in range(10):
        _one_call(carrier, clock.call_taking(2.0))
    assert carrier.worth_waiting()  # (10 slow calls: about half the recent ones still)
    _one_call(carrier, clock.call_taking(2.0))
    assert not carrier.worth_waiting()
    for _ in range(30):
        _one_call(carrier, clock.call_taking(2.0))
    assert not carrier.worth_waiting()
    # The replies come quickly again (a cache, a local model): the tasks wait again.
    _one_call(carrier, clock.call_taking(0.001))
    _one_call(carrier, clock.call_taking(0.01))
    assert not carrier.worth_waiting()
    for _ in range(8):
        _one_call(carrier, clock.call_taking(0.001))
    assert carrier.worth_waiting()


def test_a_call_that_fails_quickly_counts_as_quick() -> None:
    clock = _Clock()
    carrier = Carrier(10, _Told(), moment_s=0.01, clock=clock)
    for _ in range(20):
        _one_call(carrier, clock.call_taking(2.0))
    assert not carrier.worth_waiting()

    def refused() -> str:
        raise ValueError("429")

    for _ in range(20):
        carrier.hold(refused, _kept, wait_s=0.0)
        assert carrier.wait_idle(timeout_s=5.0) == 0
    assert carrier.worth_waiting()


class _GoesOn:
    """A `kept` hook: keeps the outcome, then says it went on with the run (as
    `Runtime._keep_carried` does in a free slot), or raises as it goes on."""

    def __init__(self, raises: bool = False) -> None:
        self.kept: list[Report] = []
        self.raises = raises

    def __call__(self, keep: Callable[[], Report]) -> Report:
        report = keep()
        self.kept.append(report)
        if self.raises:
            raise ConnectionError("the broker went away")
        return report.continued("call-1 read_note", Report("ok"))


@pytest.mark.parametrize("fails", [False, True], ids=["kept", "failed-before-saved"])
def test_what_the_carrier_keeps_goes_through_its_kept_hook(*, fails: bool) -> None:
    told, goes_on = _Told(), _GoesOn()
    carrier = Carrier(10, told, kept=goes_on)
    go = threading.Event()

    def reply() -> str:
        go.wait(5.0)
        if fails:
            raise ValueError("the model client broke")
        return "slow"

    assert isinstance(carrier.hold(reply, _kept, wait_s=0.0), Carried)
    go.set()
    assert told.event.wait(5.0)
    assert carrier.wait_idle(timeout_s=5.0) == 0
    # Kept (or failed) once, through the hook, and told with what the hook went on to do.
    [kept] = goes_on.kept
    assert kept.failed is fails
    assert [r.line for r in told.reports] == [f"{kept.line} | continued call-1 read_note: ok"]


def test_a_task_that_waited_keeps_its_outcome_without_the_hook() -> None:
    told, goes_on = _Told(), _GoesOn()
    carrier = Carrier(10, told, kept=goes_on)
    assert carrier.hold(lambda: "quick", _kept, wait_s=5.0) == "quick"
    assert carrier.wait_idle(timeout_s=5.0) == 0
    assert (goes_on.kept, told.reports) == ([], [])


def test_a_hook_that_raises_after_the_save_still_ends_the_call() -> None:
    told = _Told()
    carrier = Carrier(10, told, kept=_GoesOn(raises=True))
    assert isinstance(carrier.hold(lambda: time.sleep(0.05) or "slow", _kept, 0.0), Carried)
    assert told.event.wait(5.0)
    assert carrier.wait_idle(timeout_s=5.0) == 0
    [report] = told.reports
    assert report.failed
    assert "saved; its next step not sent (the broker went away)" in report.line
