"""Model calls held on the process's event loop past their tasks (DESIGN §10.1).

A model call is seconds of waiting on the network. A task that has claimed its call
(CLAIM counts the attempt and starts the lease) hands it to the loop and returns: its
pool slot is free for the next message, and the call is one coroutine on the
process's loop (`workers.loop`), not a thread. What fences a call made in a task
fences it here too:

- its lease is renewed while it runs: every third of a lease, ONE batch for every
  call the process holds (`RunStore.renew_many`, whose answer also says which runs
  were cancelled; their route slots in a second), not a round trip per call;
- a run cancelled, or a lease lost (another attempt took the call over, or a person
  stopped its turn), cancels the call's coroutine at its next await; a reply that
  arrives after is never saved (`Stopped`);
- its outcome is kept (SAVE under its lease, the run's next step sent or continued)
  on a keeper thread (`on_keeper`), one of `KEEPERS` the process has, never on the
  loop: a save is Redis round trips and the engine's CPU work, which would stall
  every stream.

A process that dies loses what it holds to the tick, which sends each call again
once its lease lapses (its attempt counted, the run's trace saying so). A process
told to stop waits for its calls as long as a call may go without a byte
(RELAY_MODEL_TIMEOUT), then hands back what is left (`hand_back`): each claim given
back, so the tick sends it again at once; nothing that finished is run again.

At most `most` calls are held (RELAY_MODEL_CARRIED; `reserve`); past that a task
makes its call itself, waiting on the loop's future (the pool's slots are the
back-pressure). While the process's calls are quick (under QUICK_S of late, `quick`),
a task of a threads pool that hands a call over waits a moment for its reply and keeps
it itself (`Waiter`): a reply in 50 ms is cheaper kept there than handed to a keeper.
(A prefork child or a solo worker never waits: `Runtime.task`.)
This module only holds: the coroutine it runs is the runtime's
(`Runtime._held`), which makes the call and keeps its outcome.
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
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

from workers.errors import StoreUnavailable
from workers.loop import process_loop
from workers.model.router import ModelRouter
from workers.store.runs import HeldLease, RunStore
from workers.store.scripts import Renewed

__all__ = ["KEEPERS", "QUICK_S", "LoopCalls", "Outcome", "Stopped", "Waiter"]

log = logging.getLogger(__name__)

KEEPERS = 2
"""Keeper threads a process saves outcomes on: one would do for the CPU (the GIL), a
second lets a save's Redis round trip overlap another's work."""
_KEEPER_NAME = "relay-keeper"
QUICK_S = 0.2
"""A task waits this long for the reply of a call it handed to the loop, while this
process's calls have lately taken less (`LoopCalls.quick`): a reply that comes in that
time is kept by the task itself, its run going on in the task's own slice, which costs
less than the hop to a keeper and Flower's task ended apart. A call not back by then
goes on, held on the loop; it counts as twice QUICK_S, so a few such stop the waiting
until calls are quick again."""

Made = TypeVar("Made")
T = TypeVar("T")


class Stopped(enum.Enum):
    """Why a call held on the loop was stopped before its reply: nothing it finds is saved."""

    CANCELLED = "its run was cancelled"
    LEASE_LOST = "it lost its lease (another attempt took it over, or its turn was stopped)"
    HANDED_BACK = "its worker stopped before the reply came; its claim was given back"


Outcome: TypeAlias = Made | Stopped | Exception

_STOPPED_BY: dict[Renewed | None, Stopped] = {
    Renewed.CANCELLED: Stopped.CANCELLED,
    Renewed.LOST: Stopped.LEASE_LOST,
}
"""What a lease's renewal says stops its call (kept, or refused by Redis, stops nothing)."""


def on_keeper_thread() -> bool:
    """Whether the caller is one of this process's keeper threads."""
    return threading.current_thread().name.startswith(_KEEPER_NAME)


class Waiter:
    """A task waiting a moment (QUICK_S) for the outcome of the call it handed over: the
    loop `give`s it the outcome; the task keeps it if it came in time, else the keeper
    does (whichever the lock says came first)."""

    def __init__(self, calls: LoopCalls) -> None:
        self._calls = calls
        self._lock = threading.Lock()
        self._came = threading.Event()
        self._outcome: Any = None
        self._gone = False

    def give(self, outcome: object) -> bool:
        """On the loop: hand the outcome to the task; False if it stopped waiting."""
        with self._lock:
            if self._gone:
                return False
            self._outcome = outcome
        self._came.set()
        return True

    def wait(self) -> Any:
        """In the task: the outcome, if it came within QUICK_S; else None (the keeper will
        keep it), and the call counts as slow."""
        self._came.wait(QUICK_S)
        with self._lock:
            if self._outcome is None:
                self._gone = True
                self._calls.took(2 * QUICK_S)
            return self._outcome


class LoopCalls:
    """Holds up to `most` claimed model calls as coroutines on the process's loop, renews
    their leases in one batch every third of `lease_s`, and keeps their outcomes on
    keeper threads."""

    def __init__(
        self,
        most: int,
        store: RunStore,
        router: ModelRouter | None,
        *,
        lease_s: float,
        clock: Callable[[], int],
    ) -> None:
        self.most = most
        self._store = store
        self._router = router
        self._clock = clock
        self._interval = max(lease_s / 3, 0.05)
        self._lock = threading.Condition()
        self._fresh()

    def _fresh(self) -> None:
        """Begin with nothing held (also in a forked child: its parent's calls, threads and
        loop are not its own)."""
        self._pid = os.getpid()
        self._count = 0
        """Calls reserved or held, their outcomes not yet in: what `most` bounds."""
        self._keeping = 0
        """Calls whose outcomes are being kept (they no longer count against `most`)."""
        self._tasks: dict[HeldLease, asyncio.Task[None]] = {}
        """The calls the loop holds now, by lease (touched on the loop's thread only)."""
        self._why: dict[HeldLease, Stopped] = {}
        self._began: dict[HeldLease, float] = {}
        """When each held call's coroutine began (monotonic; the loop's thread only)."""
        self._renewing: asyncio.Task[None] | None = None
        self._lately_s: float | None = None
        """How long this process's model calls took of late (`took`), None before the first."""
        self._keepers = concurrent.futures.ThreadPoolExecutor(KEEPERS, _KEEPER_NAME)
        self._renewer = concurrent.futures.ThreadPoolExecutor(1, "relay-renewer")

    def _here(self) -> None:
        """Called under the lock: start afresh in a forked child."""
        if self._pid != os.getpid():
            self._fresh()

    @property
    def in_flight(self) -> int:
        """Calls held now, their outcomes not yet in."""
        with self._lock:
            self._here()
            return self._count

    def waiter(self) -> Waiter | None:
        """A `Waiter` for a task that hands a call over now, if it should wait (`quick`)."""
        return Waiter(self) if self.quick() else None

    def took(self, seconds: float) -> None:
        """A model call of this process took `seconds` on the loop, from its start to its
        outcome: an average that follows the last few calls (any thread; a race between two
        only loses one of them)."""
        lately = self._lately_s
        self._lately_s = seconds if lately is None else lately + (seconds - lately) / 4

    def quick(self) -> bool:
        """Whether a task that hands a model call over should wait for its reply a moment
        (QUICK_S): this process's calls have lately taken less than that. (A keeper never
        waits: the calls of every run held on the loop wait on it.)"""
        lately = self._lately_s
        return lately is not None and lately < QUICK_S and not on_keeper_thread()

    def reserve(self) -> int | None:
        """Take a place for one more call: the calls held with it, or None if the loop holds
        all it may (a keeper goes on regardless: the call it just kept left room)."""
        with self._lock:
            self._here()
            if self._count >= self.most and not on_keeper_thread():
                return None
            self._count += 1
            return self._count

    def start(self, lease: HeldLease, held: Coroutine[Any, Any, None]) -> None:
        """Run `held` (a reserved call's coroutine) on the loop, in the caller's context (its
        run and call for the logs, its Celery task); renew `lease` while it is held."""
        context = contextvars.copy_context()
        process_loop().loop.call_soon_threadsafe(self._start, lease, held, context)

    def _start(
        self, lease: HeldLease, held: Coroutine[Any, Any, None], context: contextvars.Context
    ) -> None:
        loop = asyncio.get_running_loop()
        task = loop.create_task(held, context=context)
        self._tasks[lease] = task
        self._began[lease] = time.monotonic()
        task.add_done_callback(lambda _: self._ended(lease))
        if self._renewing is None:
            self._renewing = loop.create_task(self._renew_while_held())

    def made(self, lease: HeldLease) -> Stopped | None:
        """On the loop: the call's outcome is in (its reply, its error, or its stop); its
        lease is renewed no more, and its place is free. Why it was stopped, if it was."""
        self._tasks.pop(lease, None)
        began = self._began.pop(lease, None)
        if began is not None:
            self.took(time.monotonic() - began)
        with self._lock:
            self._count -= 1
            self._keeping += 1
        return self._why.pop(lease, None)

    def _ended(self, lease: HeldLease) -> None:
        """On the loop: the call's coroutine ended (kept; or cancelled before it began)."""
        with self._lock:
            self._began.pop(lease, None)
            if self._tasks.pop(lease, None) is not None:  # (it never said `made`)
                self._count -= 1
                self._why.pop(lease, None)
            else:
                self._keeping -= 1
            self._lock.notify_all()

    async def on_keeper(self, keep: Callable[[], T]) -> T:
        """What `keep()` returns, run on a keeper thread in this coroutine's context."""
        run = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self._keepers, run, keep)

    async def _renew_while_held(self) -> None:
        """Every third of a lease, renew every held call's lease in one batch; stop the
        calls whose run was cancelled or whose lease was lost."""
        loop = asyncio.get_running_loop()
        try:
            while self._tasks:
                await asyncio.sleep(self._interval)
                leases = [lease for lease in self._tasks if lease not in self._why]
                if not leases:
                    continue
                try:
                    stops = await loop.run_in_executor(self._renewer, self._renew, leases)
                except StoreUnavailable as error:
                    log.warning("could not renew the leases of %d calls: %s", len(leases), error)
                    continue
                for lease, stop in zip(leases, stops, strict=True):
                    if stop is not None:
                        self._stop(lease, stop)
        finally:
            self._renewing = None

    def _renew(self, leases: list[HeldLease]) -> list[Stopped | None]:
        """On the renewer thread: renew `leases` (and their route slots) in one batch; for
        each, what stops it (its run cancelled, its lease lost), or None."""
        renewed = self._store.renew_many(leases, self._clock())
        if self._router is not None:
            self._router.renew_many([lease.holder for lease in leases if lease.holder])
        return [_STOPPED_BY.get(answer) for answer in renewed]

    def _stop(self, lease: HeldLease, why: Stopped) -> None:
        task = self._tasks.get(lease)
        if task is None or task.done() or lease in self._why:
            return
        self._why[lease] = why
        task.cancel()
        if why is Stopped.LEASE_LOST:
            log.warning(
                "model call %s of run %s (attempt %d) lost its lease while it ran; it is"
                " stopped, and nothing it finds is saved",
                lease.what, lease.run_id, lease.attempt,
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

        def stop_all() -> None:
            for lease in list(self._tasks):
                self._stop(lease, Stopped.HANDED_BACK)

        process_loop().loop.call_soon_threadsafe(stop_all)
        return self.wait_idle(timeout_s)
