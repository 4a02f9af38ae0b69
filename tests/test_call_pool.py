"""The threads that run calls: kept for the next call, and ended once idle for a while."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

from workers.runtime.leases import _Job, _Pool


def _calls_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "relay-call")


def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_a_burst_of_calls_leaves_no_idle_threads_behind_and_the_pool_still_serves() -> None:
    pool = _Pool()
    pool.idle_s = 0.3
    before = _calls_threads()
    release = threading.Event()
    burst = [_Job(lambda: release.wait(10)) for _ in range(40)]
    for job in burst:
        pool.submit(job)
    assert _calls_threads() >= before + 40  # each blocked call took a thread of its own
    release.set()
    assert all(job.done.wait(10) for job in burst)

    # Calls that come while the threads are still idle reuse them: no new thread.
    again = [_Job(lambda: 7) for _ in range(10)]
    for seven in again:
        pool.submit(seven)
    assert all(seven.done.wait(10) for seven in again)
    assert [seven.value for seven in again] == [7] * 10
    assert _calls_threads() <= before + 40

    assert _wait_for(lambda: _calls_threads() <= before), "idle threads did not end"
    late = _Job(lambda: "served")
    pool.submit(late)
    assert late.done.wait(10)
    assert late.value == "served"


def test_a_call_submitted_as_an_idle_thread_gives_up_is_still_run() -> None:
    pool = _Pool()
    pool.idle_s = 0.01  # threads time out all the time: submits race their ends
    for round_ in range(300):
        job = _Job(partial(int, round_))
        pool.submit(job)
        assert job.done.wait(5), f"call {round_} was never run"
        assert job.value == round_
        time.sleep(0.01 * (round_ % 3))
