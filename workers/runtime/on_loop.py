"""Model calls held on the process's event loop past their tasks (DESIGN §10.1).

A model call is seconds of waiting on the network. A task that has claimed its call
(CLAIM counts the attempt and starts the lease) hands it here and returns: its
pool slot is free for the next message, and the call is one coroutine on the
process's loop (`workers.loop`), not a thread. What fences a call made in a task
fences it here too:

- its lease is renewed while it runs: every third of a lease, ONE batch for every
  call the process holds (`renew`), not a round trip per call;
- a run cancelled, or a lease lost (another attempt took the call over, or a person
  stopped its turn), cancels the call's coroutine at its next await; a reply that
  arrives after is never saved (`Stopped`);
- its outcome is kept (SAVE under its lease, the run's next step sent or continued)
  on a keeper thread, one of `KEEPERS` the process has, never on the loop: a save is
  Redis round trips and the engine's CPU work, which would stall every stream.

A process that dies loses what it holds to the tick, which sends each call again
once its lease lapses (its attempt counted, the run's trace saying so). A process
told to stop waits for its calls as long as a call may go without a byte
(RELAY_MODEL_TIMEOUT), then hands back what is left (`hand_back`): each claim given
back, so the tick sends it again at once; nothing that finished is run again.

At most `most` calls are held (RELAY_MODEL_CARRIED); past that a task makes its call
itself, waiting on the loop's future (the pool's slots are the back-pressure).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeAlias, TypeVar

from workers.errors import StoreUnavailable
from workers.loop import process_loop
from workers.runtime.reports import Report
from workers.store.runs import HeldLease

__all__ = ["KEEPERS", "LoopCalls", "Outcome", "Stopped"]

log = logging.getLogger(__name__)

KEEPERS = 2
"""Keeper threads a process saves outcomes on: one would do for the CPU (the GIL), a
second lets a save's Redis round trip overlap another's work."""

Made = TypeVar("Made")


class Stopped(enum.Enum):
    """Why a call held on the loop was stopped before its reply: nothing it finds is saved."""

    CANCELLED = "its run was cancelled"
    LEASE_LOST = "it lost its lease (another attempt took it over, or its turn was stopped)"
    HANDED_BACK = "its worker stopped before the reply came; its claim was given back"


Outcome: TypeAlias = Made | Stopped | Exception
Keep = Callable[[Outcome[Made]], Report]
Renew = Callable[[Sequence[HeldLease]], Sequence[Stopped | None]]
"""Renews every lease given in one batch: for each, what stops its call (None: go on)."""


@dataclass(eq=False)
class _Held(Generic[Made]):
    lease: HeldLease
    keep: Keep[Made]
    context: contextvars.Context
    """The handing task's context: its run and call for the logs, its Celery task."""
    task: asyncio.Task[None] | None = None
    stopped: Stopped | None = None
    since: float = field(default_factory=time.monotonic)


def _on_keeper() -> bool:
    return threading.current_thread().name.startswith(_KEEPER_NAME)


_KEEPER_NAME = "relay-keeper"


class LoopCalls:
    """Holds up to `most` claimed model calls as coroutines on the process's loop.

    `renew` renews a batch of leases (on a thread of its own, every third of
    `lease_s`); `kept(keep)` calls `keep` (a held call's save, on a keeper thread) and
    may go on with the run's next steps (`Runtime._keep_held`); `done` is told each held
    call's report once it is kept (in the context of the task that handed it over).
    """

    def __init__(
        self,
        most: int,
        renew: Renew,
        done: Callable[[Report], None],
        *,
        lease_s: float,
        kept: Callable[[Callable[[], Report]], Report] = lambda keep: keep(),
    ) -> None:
        self.most = most
        self._renew = renew
        self._done = done
        self._kept_by = kept
        self._interval = max(lease_s / 3, 0.05)
        self._lock = threading.Condition()
        self._fresh()

    def _fresh(self) -> None:
        """Begin with nothing held (also in a forked child: its parent's calls, threads and
        loop are not its own)."""
        self._pid = os.getpid()
        self._count = 0
        self._keeping = 0
        """Outcomes being kept now (their calls no longer count against `most`)."""
        self._held: set[_Held[Any]] = set()
        """What the loop holds now (touched on the loop's thread only)."""
        self._renewing: asyncio.Task[None] | None = None
        self._keepers = concurrent.futures.ThreadPoolExecutor(KEEPERS, _KEEPER_NAME)
        self._renewer = concurrent.futures.ThreadPoolExecutor(1, "relay-renewer")

    def _here(self) -> None:
        """Called under the lock: start afresh in a forked child."""
        if self._pid != os.getpid():
            self._fresh()

    @property
    def in_flight(self) -> int:
        """Calls held now, their outcomes not yet kept."""
        with self._lock:
            self._here()
            return self._count

    def hold(
        self, lease: HeldLease, make: Callable[[], Awaitable[Made]], keep: Keep[Made]
    ) -> int | None:
        """Make the claimed call `make()` on the loop, and `keep` its outcome on a keeper
        thread: the number of calls held with it, or None if the loop holds all it may
        (the caller makes the call itself)."""
        with self._lock:
            self._here()
            if self._count >= self.most and not _on_keeper():
                return None  # (a keeper goes on: the call it just kept left room for this one)
            self._count += 1
            held_now = self._count
        held: _Held[Made] = _Held(lease, keep, contextvars.copy_context())
        process_loop().loop.call_soon_threadsafe(self._start, held, make)
        return held_now

    def _start(self, held: _Held[Made], make: Callable[[], Awaitable[Made]]) -> None:
        loop = asyncio.get_running_loop()
        self._held.add(held)
        held.task = loop.create_task(self._carry(held, make), context=held.context.copy())
        if self._renewing is None:
            self._renewing = loop.create_task(self._renew_while_held())

    async def _carry(self, held: _Held[Made], make: Callable[[], Awaitable[Made]]) -> None:
        try:
            outcome: Outcome[Made]
            try:
                outcome = await make()
            except asyncio.CancelledError:
                outcome = held.stopped or Stopped.HANDED_BACK
            except Exception as error:  # noqa: BLE001 - the keeper decides what it means
                outcome = error
            finally:
                self._held.discard(held)
                self._count_change(calls=-1, keeping=+1)
            keep = partial(held.context.copy().run, self._kept, held, outcome)
            await asyncio.get_running_loop().run_in_executor(self._keepers, keep)
        finally:
            self._count_change(calls=0, keeping=-1)

    def _count_change(self, *, calls: int, keeping: int) -> None:
        with self._lock:
            self._count += calls
            self._keeping += keeping
            self._lock.notify_all()

    def _kept(self, held: _Held[Made], outcome: Outcome[Made]) -> None:
        """On a keeper thread: keep the outcome, and tell `done` what came of it."""
        try:
            report = self._kept_by(partial(held.keep, outcome))
        except Exception as error:  # noqa: BLE001 - its lease lapses; the tick sends it again
            log.warning("a held call failed before its outcome was saved: %s", error)
            report = Report(f"failed before its outcome was saved ({error})", failed=True)
        try:
            self._done(report)
        except Exception as error:  # noqa: BLE001 - counting it must not lose the keeper
            log.warning("could not count a held call: %s", error)

    async def _renew_while_held(self) -> None:
        """Every third of a lease, renew every held call's lease in one batch; stop the
        calls whose run was cancelled or whose lease was lost."""
        loop = asyncio.get_running_loop()
        try:
            while self._held:
                await asyncio.sleep(self._interval)
                held = [h for h in self._held if h.stopped is None]
                if not held:
                    continue
                leases = [h.lease for h in held]
                try:
                    stops = await loop.run_in_executor(self._renewer, self._renew, leases)
                except StoreUnavailable as error:
                    log.warning("could not renew the leases of %d calls: %s", len(held), error)
                    continue
                for one, stop in zip(held, stops, strict=True):
                    if stop is not None:
                        self._stop(one, stop)
        finally:
            self._renewing = None

    def _stop(self, held: _Held[object], why: Stopped) -> None:
        if held.task is None or held.task.done() or held.stopped is not None:
            return
        held.stopped = why
        held.task.cancel()
        if why is Stopped.LEASE_LOST:
            log.warning(
                "model call %s of run %s (attempt %d) lost its lease while it ran; it is"
                " stopped, and nothing it finds is saved",
                held.lease.what, held.lease.run_id, held.lease.attempt,
            )  # fmt: skip

    def wait_idle(self, timeout_s: float) -> int:
        """Wait (up to `timeout_s`) until no call is held and no outcome is being kept;
        return how many calls still are."""
        give_up = time.monotonic() + timeout_s
        with self._lock:
            self._here()
            while (self._count or self._keeping) and time.monotonic() < give_up:
                self._lock.wait(max(0.0, give_up - time.monotonic()))
            return self._count + self._keeping

    def hand_back(self, timeout_s: float = 5.0) -> int:
        """Stop every call still held; each is kept as `Stopped.HANDED_BACK` (its claim
        given back). Returns how many were still held after `timeout_s`."""
        loop = process_loop().loop

        def stop_all() -> None:
            for held in list(self._held):
                self._stop(held, Stopped.HANDED_BACK)

        loop.call_soon_threadsafe(stop_all)
        return self.wait_idle(timeout_s)
