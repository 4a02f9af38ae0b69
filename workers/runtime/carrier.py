"""Which Celery task, on which worker, carries the step this thread is running.

The task body sets it (`carried_by`) around the runtime's work; a call made in that
work, in its own task or continued inside a `relay.advance`, says so in its run's trace
(`engine.events.Ran`), so the trace links the task that really ran it and names the
worker. Outside a task (the embedded runner, tests) it is empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["NOBODY", "Carrier", "carried_by", "carrier"]


@dataclass(frozen=True)
class Carrier:
    task: str = ""
    """The Celery task id."""
    worker: str = ""
    """The worker's Celery hostname (`celery@host`)."""


NOBODY = Carrier()
_CARRIER: ContextVar[Carrier | None] = ContextVar("relay_carrier", default=None)


@contextmanager
def carried_by(task: str, worker: str) -> Iterator[None]:
    """Within this block, the work on this thread is carried by Celery task `task`."""
    token = _CARRIER.set(Carrier(task, worker))
    try:
        yield
    finally:
        _CARRIER.reset(token)


def carrier() -> Carrier:
    """The task and worker carrying this thread's work (empty outside a task)."""
    return _CARRIER.get() or NOBODY
