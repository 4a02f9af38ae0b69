"""Model calls carried past their task: a call whose reply takes more than a moment
goes on on a thread of the worker process, which keeps its lease and saves its outcome.

A model call is seconds of waiting on the network. Run inside its Celery task it
holds one of the pool's slots all that time, so a worker has as many calls in
flight as its pool has slots. Relay's own fences do not need the slot: the call
is claimed (CLAIM counts the attempt and starts the lease), its lease is renewed
while it runs, and its outcome is saved by SAVE under that lease, exactly as in a
task. So with `RELAY_MODEL_CARRIED` above 0, a model task that has claimed its
call makes it on a call thread (`Carrier.hold`) and waits for the reply a
moment (`RELAY_MODEL_CARRIED_AFTER_MS`, never past its slice, `RELAY_INLINE_MS`; a
threads pool with a slot free beside the task's waits out the slice, as waiting
there holds up no other message):

- a reply that quick (a local model, a cache) comes back to the task, which saves
  it and continues the run in place as it would have without a carrier;
- a reply that takes longer (any remote model) is the carrier thread's to save,
  and the task returns: its slot is free for the next message, and the run's
  next step is published once the reply is saved.

The wait is short because it holds the slot: a task that waited its whole slice
would take in a few calls a second. And it is only waited while it pays: once most
of the process's recent calls took longer than the wait (a remote model), a task
hands its call over and returns at once (`Carrier.worth_waiting`), its slot free
for the next message; should replies come that quickly again, the calls the carrier
makes show it, and the tasks wait again.

What a crash costs is what it cost before: a worker that dies with calls in
flight leaves their leases to lapse, and the tick sends each call again (its
attempt counted, the run's trace saying so). A worker that stops (a warm
shutdown) first waits for the calls it carries, as long as a call may go without a
byte from the model (RELAY_MODEL_TIMEOUT), as it would for a call made in its task.

The carrier holds at most `most` calls; past that, a call is made in its task as
before (the pool's slots are the back-pressure). A carried call's Celery task stays
under way in Flower until the call ends, and then shows what it did
(`workers.celery_app.carried_ends`, told through `done`'s hook); the run's trace
says it too, and the metrics count it when it ends. A carried call runs on one of the
process's call threads (`leases.on_call_thread`), which wait a while for the next call
once one ends, so a call seldom pays for starting a thread.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from workers.runtime.leases import on_call_thread
from workers.runtime.reports import Report

__all__ = ["QUICK_ENOUGH", "Carried", "Carrier"]

QUICK_ENOUGH = 0.5
"""A task waits for its call's reply while at least this share of the process's recent
calls came back within the wait: below it, the wait mostly holds a slot for nothing."""
_LEARNING = 1 / 16
"""How much each call's speed moves that share (about the last 16 calls count)."""

log = logging.getLogger(__name__)

Made = TypeVar("Made")


@dataclass(frozen=True)
class Carried:
    """The call went on past its task: this process carries `in_flight` calls with it."""

    in_flight: int


class _Handoff(Generic[Made]):
    """Who saves a call's outcome: the task, if the call was made while it waited, else
    the carrier thread. Decided once, under a lock, whichever side gets there first."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._state = "waiting"
        self._made: tuple[Made] | None = None
        self._error: BaseException | None = None

    def give(self, made: tuple[Made] | None, error: BaseException | None) -> bool:
        """The carrier thread has the call's outcome (or its error): True if the task
        takes it, False if it is the thread's own to save (the task has gone)."""
        with self._lock:
            if self._state != "waiting":
                return False
            self._state, self._made, self._error = "given", made, error
            self._lock.notify_all()
            return True

    def wait(self, timeout_s: float) -> tuple[Made] | None:
        """The task waits up to `timeout_s` for the outcome: it, boxed, if it came (its
        error is raised here), else None and the call is the carrier's."""
        with self._lock:
            try:
                self._lock.wait_for(lambda: self._state == "given", max(0.0, timeout_s))
            finally:  # (also when the wait is cut short: a prefork child's SIGTERM raises)
                if self._state != "given":
                    self._state = "carried"
            if self._state != "given":
                return None
            if self._error is not None:
                raise self._error
            return self._made


class Carrier:
    """Carries up to `most` claimed calls at once, each on a call thread; `done` is told
    what each carried call did once it ends (its report). `moment_s` is the wait a task
    makes for a reply (RELAY_MODEL_CARRIED_AFTER_MS), which the carrier learns whether
    the process's calls come back within; `clock` (monotonic seconds) times them."""

    def __init__(
        self,
        most: int,
        done: Callable[[Report], None],
        moment_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        kept: Callable[[Callable[[], Report]], Report] = lambda keep: keep(),
    ) -> None:
        self.most = most
        self._done = done
        self._kept = kept
        """How a carried call's outcome is kept: `kept(keep)` calls `keep` (the save; it
        raises nothing) and may go on with the run (`Runtime._keep_carried`)."""
        self._moment_s = moment_s
        self._clock = clock
        self._lock = threading.Condition()
        self._carried = 0
        self._pid = os.getpid()
        self._quick = 1.0
        """The share of recent calls that came back within `moment_s` (a moving mean)."""

    def worth_waiting(self) -> bool:
        """Whether a task should wait its moment for the reply of the call it hands over:
        while at least QUICK_ENOUGH of this process's recent calls came back within it."""
        with self._lock:
            return self._quick >= QUICK_ENOUGH

    @property
    def carried(self) -> int:
        """Calls this process carries now."""
        with self._lock:
            return self._carried if self._pid == os.getpid() else 0

    def hold(
        self, make: Callable[[], Made], keep: Callable[[Made], Report], wait_s: float
    ) -> Made | Carried | None:
        """Make a claimed call (`make`) on a call thread, waiting up to `wait_s` for it:
        its outcome if it came (the task keeps it), `Carried` if the thread will `keep` it
        and tell `done`, or None if this process carries all it may (make it in the task).
        An error `make` raises while the task waits is raised here."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's calls are not here
                self._pid, self._carried = os.getpid(), 0
            if self._carried >= self.most:
                return None
            self._carried += 1
            carried = self._carried
        handoff: _Handoff[Made] = _Handoff()
        context = contextvars.copy_context()  # the task's log context (its run and call)
        try:
            on_call_thread(partial(context.run, self._carry, handoff, make, keep))
        except RuntimeError:  # no thread to be had: the task makes the call itself
            self._release()
            return None
        came = handoff.wait(wait_s)
        return Carried(carried) if came is None else came[0]

    def _carry(
        self, handoff: _Handoff[Made], make: Callable[[], Made], keep: Callable[[Made], Report]
    ) -> None:
        began = self._clock()

        def timed() -> Made:
            try:
                return make()
            finally:
                self._learn(self._clock() - began <= self._moment_s)

        try:
            try:
                report = self._outcome(handoff, timed, keep)
            except Exception as error:  # noqa: BLE001 - saved, and its outbox covers the rest
                report = _not_sent(error)
            if report is not None:
                self._tell(report)
        finally:
            self._release()  # after it is counted: a stopping worker writes the count

    def _outcome(
        self, handoff: _Handoff[Made], make: Callable[[], Made], keep: Callable[[Made], Report]
    ) -> Report | None:
        """Make the call and, once its task has gone, keep it: what it did, or None if the
        task took its outcome (or its error) while it waited."""
        try:
            made = make()
        except Exception as error:  # noqa: BLE001 - the task raises it, or its lease lapses
            return None if handoff.give(None, error) else self._kept(partial(_unsaved, error))
        if handoff.give((made,), None):
            return None
        return self._kept(partial(_saved, keep, made))

    def _tell(self, report: Report) -> None:
        try:
            self._done(report)
        except Exception as error:  # noqa: BLE001 - counting it must not end the thread noisily
            log.warning("could not count a carried call: %s", error)

    def _learn(self, quick: bool) -> None:
        """A call came back within the moment (`quick`) or took longer."""
        with self._lock:
            self._quick += ((1.0 if quick else 0.0) - self._quick) * _LEARNING

    def _release(self) -> None:
        with self._lock:
            self._carried -= 1
            self._lock.notify_all()

    def wait_idle(self, timeout_s: float) -> int:
        """Wait (up to `timeout_s`) until this process carries no call; return how many
        it still carries."""
        give_up = time.monotonic() + timeout_s
        with self._lock:
            if self._pid != os.getpid():
                return 0
            while self._carried and time.monotonic() < give_up:
                self._lock.wait(max(0.0, give_up - time.monotonic()))
            return self._carried


def _saved(keep: Callable[[Made], Report], made: Made) -> Report:
    """What keeping `made` did: `keep`'s report, or why it was not saved."""
    try:
        return keep(made)
    except Exception as error:  # noqa: BLE001 - its lease lapses; the tick sends it again
        return _unsaved(error)


def _not_sent(error: Exception) -> Report:
    """What a carried call did when its outcome was saved but what followed could not be
    sent (the save's outbox has it: the tick sends it)."""
    log.warning("a carried call's next step could not be sent: %s", error)
    return Report(f"saved; its next step not sent ({error}): the tick sends it", failed=True)


def _unsaved(error: Exception) -> Report:
    """What a carried call that failed before its outcome was saved did (said in the log
    too): its lease lapses, and the tick sends the call again."""
    log.warning("a carried call failed before its outcome was saved: %s", error)
    return Report(f"failed before its outcome was saved ({error})", failed=True)
