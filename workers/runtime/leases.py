"""A call's life support: its lease while it runs, its outcome through a Redis outage.

`run_leased`: the call runs on a pooled helper thread; the task's own thread
renews the lease every third of its length, so a dead worker's lease lapses
quickly while a live one keeps it however long the call takes, and watches for a
cancel and the time limit. A call that finishes at once costs no Redis round
trip and no thread start. `run_leased_async` is the same wait for a coroutine,
run on the process's event loop (`workers.loop`); a cancel, a lost lease or the
time limit cancels the coroutine itself.

`save_holding`: a call that finished while Redis was away must not lose its
outcome (a tool that ran would be reported "outcome unknown", or run again; a
model call would be paid for twice). The worker keeps the outcome (not the
call: it has finished) and tries to save it again, with jittered backoff capped
at a second, for as long as Redis stays away: a late save is fenced as always
(taken only if no later attempt claimed the call meanwhile), so holding longer
never saves a stale outcome. What bounds it is memory: a process holds at most
RELAY_HELD_OUTCOMES outcomes so; one more is held only up to the recovery time,
as a lease is, then given up. The fleet's tick, back after an outage, waits a
moment before it sends lapsed calls again (`workers.store.lua.tick_lock`), so
the holders, retrying every second at most, save first. The log says once that
an outcome is held, once that it was saved, and, if the worker is stopped while
it still holds one, which outcomes it loses (`held`); `/metrics` counts the
held outcomes saved and lost (`held_tally`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

from workers.errors import CallCancelled, CallTimedOut, StoreUnavailable
from workers.loop import process_loop
from workers.model.router import ModelRouter
from workers.model.wire import backoff_seconds
from workers.store.runs import HeldLease, RunStore
from workers.store.scripts import Renewed

__all__ = [
    "CallLease",
    "Holding",
    "Lease",
    "Renewable",
    "held",
    "held_tally",
    "on_call_thread",
    "run_leased",
    "run_leased_async",
    "save_holding",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Renewable(Protocol):
    """How to keep a claim alive while its call runs (`Lease`, `CallLease`)."""

    length_s: float
    label: str

    def renew(self) -> bool:
        """Extend the lease; False if it was lost."""
        ...

    def cancelled(self) -> bool:
        """Whether the run was cancelled meanwhile."""
        ...


class CallLease:
    """The lease of a call a task makes and waits for: renewed in Redis (and, for a routed
    model call, its route slot with it)."""

    def __init__(
        self,
        store: RunStore,
        held: HeldLease,
        clock: Callable[[], int],
        *,
        router: ModelRouter | None = None,
        label: str = "a call",
    ) -> None:
        self.length_s = held.lease_ms / 1000
        self.label = label
        self._store = store
        self._held = held
        self._clock = clock
        self._router = router
        self._renewed: Renewed | None = None

    def renew(self) -> bool:
        held = self._held
        if self._router is not None and held.holder:
            self._router.renew(held.holder)
        self._renewed = self._store.renew(held, self._clock())
        return self._renewed is not Renewed.LOST

    def cancelled(self) -> bool:
        """Whether the run was cancelled, as of the last renewal (RENEW tells both)."""
        return self._renewed is Renewed.CANCELLED


@dataclass
class Lease:
    """A lease kept by the functions given (for a check after a run, a bench, a test)."""

    length_s: float
    renew: Callable[[], bool]
    """Extend the lease; False if it was lost."""
    cancelled: Callable[[], bool]
    """Whether the run was cancelled meanwhile."""
    label: str = "a call"
    """What the call is, for the log."""


class _Job(Generic[T]):
    """One call handed to a pool thread, and what came of it."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            self.error = error
        finally:
            self.done.set()


class _Pool:
    """Daemon threads that run calls, started as needed and kept for the next call.

    Starting a thread per call costs more than a small tool does; a call that
    outlives its time limit keeps its thread, and the pool simply grows. A thread
    left idle for `idle_s` ends, so a burst (a thousand carried model calls) does not
    leave a thousand threads behind it.
    """

    idle_s = 60.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        """Threads waiting for a job that no submitted job is meant for yet."""

    def submit(self, job: _Job[Any]) -> None:
        with self._lock:
            spare = self._idle > 0
            if spare:
                self._idle -= 1  # that idle thread takes this job
        if not spare:
            threading.Thread(target=self._serve, name="relay-call", daemon=True).start()
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no job is meant for this thread: it ends
                        self._idle -= 1
                        return
                continue  # a job was submitted for it as the wait ran out: take it
            job.run()
            with self._lock:
                self._idle += 1


_pools: dict[int, _Pool] = {}


def _pool() -> _Pool:
    """This process's pool (a forked worker child gets its own)."""
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        pool = _pools[pid] = _Pool()
    return pool


def on_call_thread(fn: Callable[[], object]) -> None:
    """Run `fn` on one of this process's call threads (a spare one, else a new one); what
    it returns or raises is dropped: `fn` says what came of it itself."""
    _pool().submit(_Job(fn))


def run_leased(
    fn: Callable[[], T], lease: Renewable, timeout_s: float | None, cancel: threading.Event
) -> T:
    """Return `fn()`, renewing `lease` while it runs.

    Sets `cancel` when the run is cancelled, the lease is lost (its outcome would
    be discarded) or the time limit passes (so the call can notice and stop).

    Raises:
        CallTimedOut: `timeout_s` passed before `fn` returned.
        Exception: whatever `fn` raised.
    """
    job = _Job(partial(contextvars.copy_context().run, fn))  # (what it works on, for the logs)
    _pool().submit(job)
    _wait(job.done, lease, timeout_s, cancel)
    if job.error is not None:
        raise job.error
    return cast(T, job.value)


def run_leased_async(
    coroutine: Coroutine[Any, Any, T],
    lease: Renewable,
    timeout_s: float | None,
    cancel: threading.Event,
) -> T:
    """Return what `coroutine` returns, run on this process's event loop,
    renewing `lease` meanwhile; as `run_leased`, but a cancel, a lost lease or the
    time limit also cancels the coroutine (at its next await).

    Raises:
        CallTimedOut: `timeout_s` passed first (the coroutine was cancelled).
        CallCancelled: the run was cancelled or the lease lost, and the coroutine with it.
        Exception: whatever the coroutine raised.
    """
    context = contextvars.copy_context()

    async def in_context() -> T:
        for var, value in context.items():  # the log context of the task's thread
            var.set(value)
        return await coroutine

    future = process_loop().submit(in_context())
    done = threading.Event()
    future.add_done_callback(lambda _future: done.set())
    try:
        _wait(done, lease, timeout_s, cancel, stop=future.cancel)
    except CallTimedOut:
        future.cancel()
        raise
    try:
        return future.result()
    except (concurrent.futures.CancelledError, asyncio.CancelledError):
        raise CallCancelled(
            "it was cancelled: its run was cancelled, or another attempt took the call over"
        ) from None


def _wait(
    done: threading.Event,
    lease: Renewable,
    timeout_s: float | None,
    cancel: threading.Event,
    stop: Callable[[], object] | None = None,
) -> None:
    """Wait for `done`, renewing `lease`; `stop()` once `cancel` is set, if given.

    Raises:
        CallTimedOut: `timeout_s` passed first (`cancel` is set).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    interval = max(lease.length_s / 3, 0.05)
    while True:
        wait = (
            interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        )
        if done.wait(wait):
            return
        if deadline is not None and time.monotonic() >= deadline:
            cancel.set()
            raise CallTimedOut(f"it did not finish within {timeout_s:g} s")
        _keep(lease, cancel)
        if stop is not None and cancel.is_set():
            stop()


def _keep(lease: Renewable, cancel: threading.Event) -> None:
    try:
        if not lease.renew():
            log.warning(
                "%s lost its lease while it ran (another attempt took it over, its"
                " outcome is in, or a person stopped its turn); it is told to stop, and"
                " whatever it finds will be discarded",
                lease.label,
            )
            cancel.set()
        if lease.cancelled():
            cancel.set()
    except StoreUnavailable as error:
        log.warning("could not renew the lease of %s: %s", lease.label, error)


# --- holding an outcome through an outage ---------------------------------------------

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 1.0
"""Short: once Redis is back, the holder should save before the tick sends the call again."""

_held: dict[int, str] = {}
_held_lock = threading.Lock()
_tally: Counter[str] = Counter()
"""Held outcomes since the last `held_tally`, by what became of them: saved or lost."""


def held() -> list[str]:
    """The calls whose outcome this process holds unsaved right now."""
    with _held_lock:
        return sorted(_held.values())


def held_tally() -> Counter[str]:
    """Take the count of held outcomes saved and lost since the last call (for /metrics)."""
    with _held_lock:  # (taken and cleared at once: no count is lost or doubled)
        taken = _tally.copy()
        _tally.clear()
    return taken


class Holding:
    """One outcome held through a Redis outage, for its saver's loop:

        with Holding(label, for_s=..., cap=...) as holding:
            while True:
                try:
                    result = save()
                except StoreUnavailable as error:
                    holding.failed(error)  # waits before the next try; raises once it gives up
                    continue
                holding.saved()
                return result

    It is held for as long as Redis stays away while this process holds fewer than
    `cap` outcomes, else for up to `for_s`; the log and `/metrics` say what came of it."""

    def __init__(
        self,
        label: str,
        *,
        for_s: float,
        cap: int,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.label = label
        self._for_s = for_s
        self._cap = cap
        self._sleep = sleep
        self._rand = rand
        self._deadline: float | None = None
        self._attempt = 0

    def failed(self, error: StoreUnavailable) -> None:
        """A save failed as Redis was away: wait before the next one.

        Raises:
            StoreUnavailable: Redis stayed away longer than this outcome may be held (it
                is lost, and the log says so).
        """
        if self._attempt == 0:
            self._hold(error)
        elif self._deadline is not None and time.monotonic() >= self._deadline:
            log.error(
                "gave up saving the outcome of %s after %.0f s without Redis (this"
                " worker held %d others, RELAY_HELD_OUTCOMES); it is lost, and the"
                " call's next attempt decides what to report: %s",
                self.label, self._for_s, self._cap, error,
            )  # fmt: skip
            with _held_lock:
                _tally["lost"] += 1
            raise error
        wait = backoff_seconds(self._attempt, None, BACKOFF_BASE_S, BACKOFF_CAP_S, self._rand())
        self._sleep(wait)
        self._attempt += 1

    def _hold(self, error: StoreUnavailable) -> None:
        with _held_lock:
            if len(_held) >= self._cap:  # memory's bound: this one waits as a lease does
                self._deadline = time.monotonic() + self._for_s
            _held[id(self)] = self.label
        log.warning(
            "Redis is unreachable: holding the outcome of %s until it is back%s: %s",
            self.label,
            "" if self._deadline is None else f" (for {self._for_s:g} s at most: {self._cap} held)",
            error,
        )

    def saved(self) -> None:
        """The save went through (at once, or after Redis came back)."""
        if not self._attempt:
            return
        log.warning("saved the held outcome of %s", self.label)
        with _held_lock:
            _tally["saved"] += 1

    def __enter__(self) -> Holding:
        return self

    def __exit__(self, *exc: object) -> None:
        with _held_lock:  # (saved, lost, or another error: this process holds it no more)
            _held.pop(id(self), None)


def save_holding(
    save: Callable[[], T],
    label: str,
    *,
    for_s: float,
    cap: int,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """Return `save()`, trying again while Redis is unreachable (`Holding`).

    Raises:
        StoreUnavailable: Redis stayed away longer than the outcome may be held.
    """
    with Holding(label, for_s=for_s, cap=cap, sleep=sleep, rand=rand) as holding:
        while True:
            try:
                result = save()
            except StoreUnavailable as error:
                holding.failed(error)
                continue
            holding.saved()
            return result


def _say_what_is_lost() -> None:
    lost = held()
    if lost:
        log.error(
            "stopping while holding %d unsaved outcome(s), now lost: %s",
            len(lost),
            "; ".join(lost),
        )


atexit.register(_say_what_is_lost)
