"""Which Celery task, on which worker, carries the step this thread is running, and
which run and call that step is about.

The task body sets the carrier (`carried_by`) around the runtime's work; a call made in
that work, in its own task or continued inside a `relay.advance`, says so in its run's
trace (`engine.events.Ran`), so the trace links the task that really ran it and names
the worker. Outside a task (the embedded runner, tests) it is empty.

A call's body sets what it is working on (`working_on`); every log line Relay's own
modules write meanwhile, in this thread or the call's (`run_leased` carries the context
over), names the run and the call unless it does already (`name_runs_in_logs`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["NOBODY", "Carrier", "carried_by", "carrier", "name_runs_in_logs", "working_on"]


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


_WORKING_ON: ContextVar[tuple[str, str] | None] = ContextVar("relay_working_on", default=None)
_OWN_LOGGERS = ("workers.", "scheduler.")


@contextmanager
def working_on(run_id: str, call: str) -> Iterator[None]:
    """Within this block, this thread works on `call` of run `run_id` (for the logs)."""
    token = _WORKING_ON.set((run_id, call))
    try:
        yield
    finally:
        _WORKING_ON.reset(token)


def name_runs_in_logs() -> None:
    """Make every log line of Relay's own modules written while working on a call name
    the run and the call (`run R, call-2: ...`) where it does not already. Once per
    process; later calls change nothing."""
    made = logging.getLogRecordFactory()
    if getattr(made, "relay_names_runs", False):
        return

    def make(*args: object, **kwargs: object) -> logging.LogRecord:
        record = made(*args, **kwargs)
        working = _WORKING_ON.get()
        if working is not None and record.name.startswith(_OWN_LOGGERS):
            run_id, call = working
            message = record.getMessage()
            if run_id not in message:
                record.msg, record.args = f"run {run_id}, {call}: {message}", ()
        return record

    make.relay_names_runs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)
