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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ProcessLoop", "process_loop", "run_blocking"]

T = TypeVar("T")


class ProcessLoop:
    """An event loop running in a daemon thread, taking coroutines from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="relay-loop", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

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
