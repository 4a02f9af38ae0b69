"""The tick, run by the fleet itself: one tick per `RELAY_TICK_SECONDS`, whoever runs it.

A tick fires the schedules that are due (`scheduler.tick`), then heals
(`Healing.heal`): it declines approvals whose time ran out, stops trees whose
time budget is spent, prunes expired runs from the index, and sends again what
the outbox says nobody dealt with (a lost message, a dead worker's call).

Every worker process runs a `Ticker` thread (unless started with `--no-tick`);
`relay beat`, or anyone's own beat, may also send `relay.tick` messages. Each
would-be tick first asks Redis for the tick lock (`Upkeep.elect_ticker`): the
first asker in an interval ticks, the others learn when the lock lapses and ask
again then. The lock lapses on its own after one interval, so a worker that dies
mid-tick is replaced at the next one, and a fleet of plain workers heals itself
(dead workers' calls re-sent, approvals expired, schedules fired) with no beat.
After a gap (two intervals with no tick by Redis's clock: Redis, or the whole
fleet, was away), the next tick waits `SETTLE_AFTER_A_GAP_S`, so outcomes held
through the outage are saved first.

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

from workers.engine.effects import Message
from workers.engine.events import CancelRun, expiry_event
from workers.engine.records import Pending
from workers.errors import StoreUnavailable
from workers.runtime.leases import BACKOFF_CAP_S
from workers.settings import Timing
from workers.store.runs import RunStore
from workers.store.scripts import Decided
from workers.store.upkeep import Upkeep

__all__ = ["Healing", "Ticker"]

log = logging.getLogger(__name__)

JITTER_S = 0.05
"""Spread between processes asking for the lock at the same moment."""
SETTLE_AFTER_A_GAP_S = 3 * BACKOFF_CAP_S
"""After two intervals with no tick (Redis was away), how long the next tick waits: three
times the longest wait between a held outcome's saves (3 s), so the workers that hold
outcomes save them before the tick sends their lapsed calls again."""


class Ticker:
    """Ticks through the fleet-wide lock; `run(stop)` keeps doing so in a thread."""

    def __init__(
        self,
        upkeep: Upkeep,
        tick: Callable[[int], object],
        interval_s: float,
        clock: Callable[[], int],
    ) -> None:
        self._upkeep = upkeep
        self._tick = tick
        self._interval_ms = int(interval_s * 1000)
        self._clock = clock
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"

    def tick_once(self) -> float:
        """Tick if no other process has this interval; return seconds until the next try."""
        now = self._clock()
        wait_ms = self._upkeep.elect_ticker(
            self.holder, self._interval_ms, now, settle_ms=int(SETTLE_AFTER_A_GAP_S * 1000)
        )
        if wait_ms == 0:
            try:
                self._tick(now)
            except StoreUnavailable as error:
                log.warning("the tick could not reach Redis: %s", error)
            except Exception:  # a bug in one tick must not end the ticking thread
                log.exception("the tick failed; the next one comes in %d ms", self._interval_ms)
            # The next interval starts when this tick did: its own time does not add up.
            wait_ms = max(self._interval_ms - (self._clock() - now), 0)
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


class Healing:
    """The runtime's part of each tick: what was never dealt with is dealt with now."""

    def __init__(
        self, store: RunStore, send: Callable[[list[Message]], None], timing: Timing
    ) -> None:
        self._store = store
        self._send = send
        self._timing = timing

    def heal(self, now: int) -> int:
        """Re-send what was never dealt with, decline what expired; return how many were re-sent."""
        store, timing = self._store, self._timing
        # The re-sends first, and the trace's notes of them after: a dead worker's call
        # is promised within the recovery time, and each step before the send (one round
        # trip a note, the expiries, the pruning) would come out of its allowance.
        members = store.upkeep.due_messages(now)
        store.upkeep.postpone(members, now + timing.grace_ms)
        messages = [m for m in (Message.of(member) for member in members) if m is not None]
        self._send(messages)
        for message in messages:
            self._note_resent(message, now)
        for pending in store.people.expired_pending(now):
            self._expire(pending, now)
        for root in store.upkeep.deadlines_due(now):
            self._time_is_up(root, now)
        store.upkeep.prune_runs(now - timing.retention_s * 1000)
        store.upkeep.list_old_runs()
        return len(messages)

    def _note_resent(self, message: Message, now: int) -> None:
        """Say in the run's trace, and in this worker's log, that a call is sent again
        because the attempt that had it was lost (not for a message merely not taken yet)."""
        if message.kind == "advance":
            return
        try:
            attempt = self._store.note_resent(message.run, message.called, now)
        except StoreUnavailable:
            return  # the re-send matters more than saying so
        if attempt is not None:
            log.warning(
                "sending %s of run %s again, as attempt %d: attempt %d lost its lease with"
                " no outcome (its worker died or stalled)",
                message.called, message.run, attempt, attempt - 1,
            )  # fmt: skip

    def _time_is_up(self, root: str, now: int) -> None:
        """Stop a tree whose budget's `seconds` ran out, waiting or not (a finished one
        ignores it)."""
        stop = CancelRun(reason="The run's time budget ran out.", stop="budget_exceeded")
        if self._store.append(root, stop, now + self._timing.grace_ms, cancel_flag=True):
            self._send([Message("advance", root)])
        self._store.upkeep.forget_deadline(root)

    def _expire(self, pending: Pending, now: int) -> None:
        """Decline (or answer for) what waited too long, and wake the run to hear it."""
        what = pending.call_id if pending.call_id is not None else str(pending.seq)
        event = expiry_event(pending.kind, what)
        decided = self._store.people.decide(
            pending.run_id,
            pending.kind,
            what,
            event,
            expired=event,
            due_ms=now + self._timing.grace_ms,
        )
        if decided in (Decided.APPLIED, Decided.EXPIRED):
            self._send([Message("advance", pending.run_id)])
