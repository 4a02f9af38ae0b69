"""One Celery message that advances several runs: the body of `relay.advances`.

When a send holds two or more advances (many starts at once, the tick's re-sends, a
schedule's firings), `celery_app.sending` publishes them as one `relay.advances`
message: one delivery and one ack for runs that each need one short step. Inside, each
run is advanced exactly as `relay.advance` would advance it alone: its own
`Runtime.task`, so its own claim, save and outbox entry (a run the message never
reached keeps its entry, and the tick sends it again on its own), in its own `try`, so
a run whose record is corrupt, or whose step raises, fails alone and the others go on.

Flower still shows each run's step. The message's worker sends, for each run, the task
events its own `relay.advance` would have had (received, started, then succeeded or
failed), under a task id of the run's own (`<run>:advance:<token>`), named
`relay.advance`, its parent the grouped task. Each run's work is carried by that id
(`runtime.carrier`), so a call it continues names it in the run's trace, and a model
call it hands to the event loop ends that task in Flower when the call does
(`celery_app.flower`). The grouped task itself returns a summary: how many runs
did what, and each run's outcome in a word.

The runs' first events go out in one broker round trip before the first run starts,
and their final events in one after the last ends (a run's end waits for the others of
its message, a few milliseconds each, rather than costing a round trip per event).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.utils.saferepr import saferepr
from kombu.utils.encoding import safe_repr

from workers.celery_app.flower import RESULT_CHARS, CarriedEnds
from workers.celery_app.sending import advance_task_id, one_round_trip
from workers.engine.effects import Message
from workers.errors import StepFailed
from workers.runtime.carrier import carried_by
from workers.runtime.reports import Report

__all__ = ["Advances"]

log = logging.getLogger(__name__)

RunTask = Callable[[Message, float | None], Report]
"""`Runtime.task`: one message's step (and those it continues), with the task's hard limit,
as one of several runs (`alone=False`: it never waits for a model reply, so the message's
next run is not held up)."""

Event = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class _Advanced:
    """How one run of the message went."""

    run: str
    task_id: str
    """The run's own task id, as Flower lists it."""
    line: str
    failed: bool
    seconds: float
    carried: bool = False
    """Its model call is held on the event loop: its end is sent by `CarriedEnds`."""

    @property
    def word(self) -> str:
        if self.failed:
            return "failed"
        return "held on the event loop" if self.carried else "ok"


class Advances:
    """Advances each run of a `relay.advances` message, and tells Flower of each."""

    def __init__(self, app: Celery, ends: CarriedEnds, task: RunTask) -> None:
        self._app = app
        self._ends = ends
        self._task = task

    def __call__(
        self, group_id: str, worker: str, runs: list[str], hard_limit_s: float | None
    ) -> str:
        """Advance each of `runs` (checked already: distinct ids, at most MOST_RUNS) in turn,
        as message `group_id` on `worker`; return the summary line. `hard_limit_s`: the
        message's hard time limit where the pool kills at it (each run gets what is left)."""
        began = time.monotonic()
        ids = {run: advance_task_id(run) for run in runs}
        self._tell(worker, [e for run in runs for e in _begun(run, ids[run], group_id)])
        done = []
        for run in runs:
            left = None if hard_limit_s is None else hard_limit_s - (time.monotonic() - began)
            done.append(self._advance(run, ids[run], worker, left))
        self._tell(worker, [_end(advanced) for advanced in done if not advanced.carried])
        return _summary(done)

    def _advance(self, run: str, task_id: str, worker: str, left_s: float | None) -> _Advanced:
        """One run's advance, as its own `relay.advance` would do it; never raises."""
        started = time.monotonic()
        try:
            with carried_by(task_id, worker):
                report = self._task(Message("advance", run), left_s)
        except Exception as error:  # this run fails; the others go on
            log.exception("task %s (run %s): its advance raised", task_id, run)
            line = f"advance raised {type(error).__name__}: {error}"
            return _Advanced(run, task_id, line, True, time.monotonic() - started)
        seconds = time.monotonic() - started
        log.info("task %s (run %s) ended in %.3fs: %s", task_id, run, seconds, report.line)
        if report.carried and self._ends.enabled:
            self._ends.task_ended(task_id, worker, report, started)
            return _Advanced(run, task_id, report.line, report.failed, seconds, carried=True)
        return _Advanced(run, task_id, report.line, report.failed, seconds)

    def _tell(self, worker: str, events: list[Event]) -> None:
        """Send `events` as `worker`'s, in one broker round trip (when task events are on)."""
        if not events or not self._app.conf.worker_send_task_events:
            return
        try:
            with one_round_trip(self._app) as producer:
                # Not enabled: it makes no producer of its own; publishes through ours.
                dispatcher = self._app.events.Dispatcher(
                    producer.connection,
                    hostname=worker,
                    channel=producer.channel,
                    enabled=False,
                    buffer_while_offline=False,
                )
                for kind, fields in events:
                    dispatcher.publish(kind, fields, producer)
        except Exception as error:  # noqa: BLE001 - Flower misses these; the runs are saved
            log.warning("could not tell Flower of %d run(s)' advances: %s", len(events), error)


def _begun(run: str, task_id: str, group_id: str) -> list[Event]:
    """The events of a run's advance taken from the message and begun, as Celery's own."""
    received = {
        "uuid": task_id,
        "name": "relay.advance",
        "args": f"run={run}",
        "kwargs": "{}",
        "root_id": group_id,
        "parent_id": group_id,
        "retries": 0,
        "eta": None,
        "expires": None,
    }
    return [("task-received", received), ("task-started", {"uuid": task_id})]


def _end(advanced: _Advanced) -> Event:
    """The final event of a run's advance: failed with StepFailed, as a single task's."""
    if advanced.failed:
        failure = safe_repr(StepFailed(advanced.line))
        return ("task-failed", {"uuid": advanced.task_id, "exception": failure, "traceback": ""})
    result = saferepr(advanced.line, RESULT_CHARS)
    ended = {"uuid": advanced.task_id, "result": result, "runtime": advanced.seconds}
    return ("task-succeeded", ended)


def _summary(done: list[_Advanced]) -> str:
    """`5 runs (4 ok, 1 failed): r1 ok; r2 failed; ...`: each run's outcome in a word."""
    counts: dict[str, int] = {}
    for advanced in done:
        counts[advanced.word] = counts.get(advanced.word, 0) + 1
    tally = ", ".join(f"{n} {word}" for word, n in counts.items())
    each = "; ".join(f"{advanced.run} {advanced.word}" for advanced in done)
    return f"{len(done)} runs ({tally}): {each}"
