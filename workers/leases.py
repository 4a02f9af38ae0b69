"""Running one call while keeping its lease, watching for cancellation and a time limit.

The call runs in a helper thread; the task's own thread renews the lease every
third of its length, so a dead worker's lease lapses quickly while a live one
keeps it however long the call takes. A call that finishes at once costs one
thread start and no Redis round trip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from workers.errors import StoreUnavailable

__all__ = ["CallTimedOut", "Lease", "run_leased"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class CallTimedOut(Exception):
    """The call did not finish within its time limit (it may still be running)."""


@dataclass
class Lease:
    """How to keep a claim alive while its call runs."""

    length_s: float
    renew: Callable[[], bool]
    """Extend the lease; False if it was lost."""
    cancelled: Callable[[], bool]
    """Whether the run was cancelled meanwhile."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None


def run_leased(
    fn: Callable[[], T], lease: Lease, timeout_s: float | None, cancel: threading.Event
) -> T:
    """Return `fn()`, renewing `lease` while it runs.

    Sets `cancel` when the run is cancelled or the time limit passes (so the
    call can notice and stop).

    Raises:
        CallTimedOut: `timeout_s` passed before `fn` returned.
        Exception: whatever `fn` raised.
    """
    outcome: _Outcome[T] = _Outcome()

    def call() -> None:
        try:
            outcome.value = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome.error = error

    worker = threading.Thread(target=call, name="relay-call", daemon=True)
    worker.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    interval = max(lease.length_s / 3, 0.05)
    while True:
        wait = (
            interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
        )
        worker.join(wait)
        if not worker.is_alive():
            break
        if deadline is not None and time.monotonic() >= deadline:
            cancel.set()
            raise CallTimedOut(f"it did not finish within {timeout_s:g} s")
        _keep(lease, cancel)
    if outcome.error is not None:
        raise outcome.error
    return cast(T, outcome.value)


def _keep(lease: Lease, cancel: threading.Event) -> None:
    try:
        if not lease.renew():
            log.warning("a call's lease was lost while it ran; another worker may take it over")
        if lease.cancelled():
            cancel.set()
    except StoreUnavailable as error:
        log.warning("could not renew a lease: %s", error)
