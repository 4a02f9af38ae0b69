"""The process's event loop measures its own lag: how late it runs a timer, over the
last minute (what a worker exports as relay_loop_lag_seconds)."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Iterator

import pytest

import workers.loop
from workers.loop import LAG_TICK_S, ProcessLoop, process_loop


@pytest.fixture
def make_loop() -> Iterator[Callable[[], ProcessLoop]]:
    """A loop of the test's own (the process's would carry other tests' lag), stopped after."""
    made: list[ProcessLoop] = []

    def make() -> ProcessLoop:
        made.append(ProcessLoop())
        return made[-1]

    yield make
    for loop in made:
        loop.submit(_end_tasks()).result(5)
        loop.loop.call_soon_threadsafe(loop.loop.stop)
        loop.thread.join(5)
        loop.loop.close()


async def _end_tasks() -> None:
    """Cancel the loop's other tasks (its lag watch) and let them end, so none is left
    pending when the loop is stopped."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def _until(check: Callable[[], bool], seconds: float) -> bool:
    give_up = time.monotonic() + seconds
    while not check() and time.monotonic() < give_up:
        time.sleep(0.02)
    return check()


def test_a_blocked_loop_shows_as_lag(make_loop: Callable[[], ProcessLoop]) -> None:
    loop = make_loop()
    time.sleep(10 * LAG_TICK_S)
    loop.loop.call_soon_threadsafe(time.sleep, 0.3)  # a callback that holds the loop
    assert _until(lambda: loop.lag_max() >= 0.25, 5), loop.lag_max()
    assert loop.lag_max() < 5
    # Of fewer than a hundred samples (a second's worth), the 99th percentile is the worst.
    assert loop.lag_p99() == loop.lag_max()


def test_an_idle_loop_keeps_time(make_loop: Callable[[], ProcessLoop]) -> None:
    loop = make_loop()
    assert (loop.lag_p99(), loop.lag_max()) == (0.0, 0.0)  # no sample yet
    time.sleep(40 * LAG_TICK_S)
    assert loop.lag_p99() < 0.05


def test_lag_is_forgotten_past_its_window(
    make_loop: Callable[[], ProcessLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers.loop, "LAG_WINDOW_S", 10 * LAG_TICK_S)  # ten samples
    loop = make_loop()
    loop.loop.call_soon_threadsafe(time.sleep, 0.3)
    assert _until(lambda: loop.lag_max() >= 0.25, 5)
    # Ten samples later (half a second on a loop that keeps time), the stall is gone.
    assert _until(lambda: loop.lag_max() < 0.1, 5), loop.lag_max()


def _child_lag(answers: multiprocessing.Queue[float]) -> None:
    loop = process_loop()
    loop.loop.call_soon_threadsafe(time.sleep, 0.3)
    _until(lambda: loop.lag_max() >= 0.25, 5)
    answers.put(loop.lag_max())


def test_a_forked_child_measures_its_own_loop() -> None:
    process_loop()  # the parent's, started before the fork (as a worker's is)
    context = multiprocessing.get_context("fork")  # as Celery's prefork pool makes its children
    answers: multiprocessing.Queue[float] = context.Queue()
    child = context.Process(target=_child_lag, args=(answers,))
    child.start()
    assert answers.get(timeout=20) >= 0.25
    child.join(20)
    assert child.exitcode == 0
