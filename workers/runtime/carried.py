"""Model calls carried past their task: the task claims the call and ends; a thread of
the worker process makes it, keeps its lease, and saves its outcome.

A model call is seconds of waiting on the network. Run inside its Celery task it
holds one of the pool's slots all that time, so a worker has as many calls in
flight as its pool has slots. Relay's own fences do not need the slot: the call
is claimed (CLAIM counts the attempt and starts the lease), its lease is renewed
while it runs, and its outcome is saved by SAVE under that lease, exactly as in a
task. So with `RELAY_MODEL_CARRIED` above 0, a model task that has claimed its
call hands it to a `Carrier` and returns; the slot is free for the next message.

What a crash costs is what it cost before: a worker that dies with calls in
flight leaves their leases to lapse, and the tick sends each call again (its
attempt counted, the run's trace saying so). A worker that stops (a warm
shutdown) first waits for the calls it carries, up to `STOP_WAIT_S`.

The carrier holds at most `most` calls; past that, a call is made in its task as
before (the pool's slots are the back-pressure). The call's Celery task stays
under way in Flower until the call ends, and then shows what it did
(`workers.celery_app.carried_ends`, told through `done`'s hook); the run's trace
says it too, and the metrics count it when it ends.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable

from workers.runtime.reports import Report

__all__ = ["STOP_WAIT_S", "Carrier"]

log = logging.getLogger(__name__)

STOP_WAIT_S = 30.0
"""How long a stopping worker waits for the calls it carries (then their leases lapse)."""


class Carrier:
    """Carries up to `most` claimed calls at once, each on a thread of its own; `done`
    is told what each did once it ends (its report)."""

    def __init__(self, most: int, done: Callable[[Report], None]) -> None:
        self.most = most
        self._done = done
        self._lock = threading.Condition()
        self._carried = 0
        self._pid = os.getpid()

    @property
    def carried(self) -> int:
        """Calls this process carries now."""
        with self._lock:
            return self._carried if self._pid == os.getpid() else 0

    def take(self, work: Callable[[], Report]) -> int | None:
        """Carry `work` (the rest of a claimed call) on a thread; return how many calls
        this process carries with it, or None if it is full (make the call in the task)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's calls are not here
                self._pid, self._carried = os.getpid(), 0
            if self._carried >= self.most:
                return None
            self._carried += 1
            carried = self._carried
        context = contextvars.copy_context()  # the task's log context (its run and call)
        thread = threading.Thread(
            target=context.run, args=(self._carry, work), name="relay-carried", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: the task makes the call itself
            self._release()
            return None
        return carried

    def _carry(self, work: Callable[[], Report]) -> None:
        try:
            try:
                report = work()
            except Exception as error:  # noqa: BLE001 - its lease lapses; the tick sends it again
                log.warning("a carried call failed before its outcome was saved: %s", error)
                report = Report(f"failed before its outcome was saved ({error})", failed=True)
            try:
                self._done(report)
            except Exception as error:  # noqa: BLE001 - counting it must not end the thread noisily
                log.warning("could not count a carried call: %s", error)
        finally:
            self._release()  # after it is counted: a stopping worker writes the count

    def _release(self) -> None:
        with self._lock:
            self._carried -= 1
            self._lock.notify_all()

    def wait_idle(self, timeout_s: float = STOP_WAIT_S) -> int:
        """Wait (up to `timeout_s`) until this process carries no call; return how many
        it still carries."""
        give_up = time.monotonic() + timeout_s
        with self._lock:
            if self._pid != os.getpid():
                return 0
            while self._carried and time.monotonic() < give_up:
                self._lock.wait(max(0.0, give_up - time.monotonic()))
            return self._carried
