"""Holding a finished call's outcome through a Redis outage, until it is saved.

A call that finished while Redis was away must not lose its outcome: a tool
that ran would be reported "outcome unknown" (or run again), and a model call
would be paid for twice. So the worker keeps the outcome (not the tool: it has
finished) and tries to save it again, with jittered backoff, for up to the
recovery time. Once Redis is back, the save is fenced as always: it is taken
only if no later attempt claimed the call meanwhile.

The log says once that an outcome is held, once that it was saved, and, if the
worker is stopped while it still holds one, which outcomes it loses.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from workers.errors import StoreUnavailable
from workers.model.wire import backoff_seconds

__all__ = ["held", "save_holding"]

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 1.0
"""Short: once Redis is back, the holder should save before the tick sends the call again."""

_held: dict[int, str] = {}
_held_lock = threading.Lock()


def held() -> list[str]:
    """The calls whose outcome this process holds unsaved right now."""
    with _held_lock:
        return sorted(_held.values())


def save_holding(
    save: Callable[[], T],
    label: str,
    *,
    for_s: float,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> T:
    """Return `save()`, trying again while Redis is unreachable, for up to `for_s` seconds.

    Raises:
        StoreUnavailable: Redis stayed away longer than that (the outcome is lost,
            and the log says so).
    """
    deadline = time.monotonic() + for_s
    attempt = 0
    key = id(save)
    try:
        while True:
            try:
                result = save()
            except StoreUnavailable as error:
                if time.monotonic() >= deadline:
                    log.error(
                        "gave up saving the outcome of %s after %.0f s without Redis;"
                        " it is lost, and the call's next attempt decides what to report: %s",
                        label,
                        for_s,
                        error,
                    )
                    raise
                if attempt == 0:
                    log.warning(
                        "Redis is unreachable: holding the outcome of %s until it is back: %s",
                        label,
                        error,
                    )
                    with _held_lock:
                        _held[key] = label
                sleep(backoff_seconds(attempt, None, BACKOFF_BASE_S, BACKOFF_CAP_S, rand()))
                attempt += 1
                continue
            if attempt:
                log.warning("saved the held outcome of %s", label)
            return result
    finally:
        with _held_lock:
            _held.pop(key, None)


def _say_what_is_lost() -> None:
    lost = held()
    if lost:
        log.error(
            "stopping while holding %d unsaved outcome(s), now lost: %s",
            len(lost),
            "; ".join(lost),
        )


atexit.register(_say_what_is_lost)
