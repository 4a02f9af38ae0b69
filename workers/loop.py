"""One asyncio event loop per process, in a thread of its own (DESIGN §9.2).

Async tools and MCP sessions run on it. A task body, which is synchronous,
hands a coroutine to the loop with `submit` and waits on the future it gets
back, renewing the call's lease meanwhile (`workers.runtime.leases`); cancelling
that future cancels the coroutine, so a run's cancel, a lost lease or a time
limit reaches the tool as `asyncio.CancelledError` at its next await.

The loop is made on first use in each process: a forked worker child (Celery's
prefork pool) starts its own, as threads do not survive a fork. Nothing the
loop holds is trusted for recovery: a call's lease, its fenced save and the
tick's re-send stay the only way a lost call comes back.

Each loop measures its own lag: a coroutine sleeps LAG_TICK_S and records how late it
woke. A callback that holds the loop (a save, a parse, a blocking call in a tool) shows
there as the time every call on it waited too; `lag_p99` and `lag_max` are the
numbers a worker exports (`workers.runtime.metrics`, relay web's /metrics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "LAG_TICK_S",
    "LAG_WINDOW_S",
    "ProcessLoop",
    "process_loop",
    "run_blocking",
    "started_loop",
]

T = TypeVar("T")

LAG_TICK_S = 0.05
"""How often the loop's lag is sampled: often enough to see a 20 ms stall, rare enough
to cost nothing (one timer a tick)."""
LAG_WINDOW_S = 60.0
"""The samples kept: a minute of them on a loop that keeps time (a lagging loop's
samples come further apart, so they span somewhat longer)."""


class ProcessLoop:
    """An event loop running in a daemon thread, taking coroutines from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._lags: deque[float] = deque(maxlen=round(LAG_WINDOW_S / LAG_TICK_S))
        self._lags_lock = threading.Lock()
        self._lag_watch: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self._serve, name="relay-loop", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self._lag_watch = self.loop.create_task(self._watch_lag())  # (kept: a task is weakly held)
        self.loop.run_forever()

    async def _watch_lag(self) -> None:
        clock = self.loop.time
        while True:
            due = clock() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            late = max(0.0, clock() - due)
            with self._lags_lock:
                self._lags.append(late)

    def lag_p99(self) -> float:
        """How late the loop ran a timer, in seconds: the 99th percentile over the last
        LAG_WINDOW_S (0.0 before the first sample)."""
        with self._lags_lock:
            lags = sorted(self._lags)
        return lags[math.ceil(0.99 * len(lags)) - 1] if lags else 0.0

    def lag_max(self) -> float:
        """The latest the loop ran a timer over the last LAG_WINDOW_S, in seconds."""
        with self._lags_lock:
            return max(self._lags, default=0.0)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coroutine` on the loop; cancelling the future cancels it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def in_loop(self) -> bool:
        """Whether the caller is the loop's own thread (which must never wait on it)."""
        return threading.current_thread() is self.thread


_loops: dict[int, ProcessLoop] = {}
_lock = threading.Lock()


def process_loop() -> ProcessLoop:
    """This process's loop, started on first use (a forked child gets its own)."""
    pid = os.getpid()
    with _lock:
        loop = _loops.get(pid)
        if loop is None:
            loop = _loops[pid] = ProcessLoop()
        return loop


def started_loop() -> ProcessLoop | None:
    """This process's loop if it was started (None: nothing used it, so none is started)."""
    with _lock:
        return _loops.get(os.getpid())


def run_blocking(coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
    """Run `coroutine` on this process's loop and return its result, for code that is
    not a call under a lease (building an app, a check after a run).

    Raises:
        TimeoutError: it did not finish within `timeout_s` (it is cancelled).
        RuntimeError: called from the loop's own thread, which would wait on itself.
        Exception: whatever the coroutine raised.
    """
    loop = process_loop()
    if loop.in_loop():
        coroutine.close()
        raise RuntimeError("run_blocking was called from the event loop's own thread")
    future = loop.submit(coroutine)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"it did not finish within {timeout_s:g} s") from None
