"""The tick, run by the fleet itself: one tick per `RELAY_TICK_SECONDS`, whoever runs it.

Every worker process runs a `Ticker` thread (unless started with `--no-tick`);
`relay beat`, or anyone's own beat, may also send `relay.tick` messages. Each
would-be tick first asks Redis for the tick lock (`RunStore.elect_ticker`): the
first asker in an interval ticks, the others learn when the lock lapses and ask
again then. The lock lapses on its own after one interval, so a worker that dies
mid-tick is replaced at the next one, and a fleet of plain workers heals itself
(dead workers' calls re-sent, approvals expired, schedules fired) with no beat.

The thread runs beside the pool, not in it: long tools filling every pool slot
never delay the tick.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Callable

from workers.errors import StoreUnavailable
from workers.store.runs import RunStore

__all__ = ["Ticker"]

log = logging.getLogger(__name__)

JITTER_S = 0.05
"""Spread between processes asking for the lock at the same moment."""


class Ticker:
    """Ticks through the fleet-wide lock; `run(stop)` keeps doing so in a thread."""

    def __init__(
        self,
        store: RunStore,
        tick: Callable[[int], object],
        interval_s: float,
        clock: Callable[[], int],
    ) -> None:
        self._store = store
        self._tick = tick
        self._interval_ms = max(int(interval_s * 1000), 100)
        self._clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"

    def tick_once(self) -> float:
        """Tick if no other process has this interval; return seconds until the next try."""
        now = self._clock()
        wait_ms = self._store.upkeep.elect_ticker(self.holder, self._interval_ms, now)
        if wait_ms == 0:
            try:
                self._tick(now)
            except StoreUnavailable as error:
                log.warning("the tick could not reach Redis: %s", error)
            except Exception:  # a bug in one tick must not end the ticking thread
                log.exception("the tick failed; the next one comes in %d ms", self._interval_ms)
            wait_ms = self._interval_ms
        return wait_ms / 1000 + random.uniform(0, JITTER_S)

    def run(self, stop: threading.Event) -> None:
        """Tick (or let another process tick) every interval until `stop` is set."""
        log.info("ticking every %.1f s with the rest of the fleet", self._interval_ms / 1000)
        while not stop.is_set():
            try:
                wait = self.tick_once()
            except StoreUnavailable as error:
                log.warning("the tick could not reach Redis: %s", error)
                wait = self._interval_ms / 1000
            stop.wait(wait)

    def start(self) -> Callable[[], None]:
        """Run in a daemon thread; return a function that stops it."""
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(stop,), name="relay-tick", daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(timeout=5)

        return halt
