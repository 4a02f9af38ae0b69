"""A task whose model call a worker holds past it ends in Flower when the call does.

With `RELAY_MODEL_CARRIED`, a task that claimed its model call hands it to the
process's event loop (`workers.runtime.on_loop`) and returns while the call is still
in flight. Had Celery ended the task then, Flower would show it SUCCESS with "held on
this worker's event loop" for a call that may yet fail; and a FAILURE sent after it would not
change what Flower shows (Celery's event state ranks SUCCESS above FAILURE, in
either order).

So such a task returns `NoFinalEvent` (`celery_app.final_events`): Celery acks it and
sends no final event, and Flower shows the task STARTED while its call is in flight.
Once both are known, in either order, the task's own line (on its thread, as it
returns) and the call's report (on a keeper thread, in the task's context:
`runtime.carrier.carrier()` names the task), this process sends the task's final
event itself, as its worker would have:
`task-succeeded` with the task's line and then the call's, or `task-failed` with a
StepFailed saying the same when the call (or a step before it) failed.

The call's report may say it went on with the run's next steps on its keeper thread
(`runtime.continuation`), and handed the run's next model call to the loop
in turn: then the task waits for that call too, its line growing by each, and ends once
a call's report carries nothing further.

A worker that dies while it carries a call sends nothing, as for any task it was
running: the task stays STARTED in Flower. The tick sends the call again, as a
model call task of its own, which ends as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from celery import Celery, Task
from celery.utils.saferepr import saferepr
from kombu.utils.encoding import safe_repr

from workers.errors import StepFailed
from workers.runtime.carrier import carrier
from workers.runtime.reports import Report

__all__ = ["CarriedEnds"]

log = logging.getLogger(__name__)

T = TypeVar("T")

KEPT_MOST = 10_000
"""Halves kept waiting for their other half, at most (the oldest go first): a task that
raised after its call was carried never says how it ended, and must not leak."""

RESULT_CHARS = 1_024
"""How much of a result Celery's worker puts in its event (`Task.resultrepr_maxsize`)."""

LINE_CHARS = 8 * RESULT_CHARS
"""How much of a task's line is kept while it waits for more calls: a run that goes on
call after call in borrowed slots must not grow one line without end."""


@dataclass(frozen=True)
class _Ended:
    """A task that returned with its call carried: what it said, where, and when."""

    worker: str
    line: str
    failed: bool
    started: float
    """When the task began (monotonic seconds): the final event's runtime counts from it."""

    def then(self, call: Report) -> _Ended:
        """This, and a call it carried that went on to carry another (the task waits on)."""
        line = _joined(self.line, call.line)
        return _Ended(self.worker, line, self.failed or call.failed, self.started)


class CarriedEnds:
    """Sends the final task event of each task whose model call this process carried."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._tasks: dict[str, _Ended] = {}
        self._calls: dict[str, Report] = {}

    @property
    def enabled(self) -> bool:
        """Whether this app's workers send task events (RELAY_EVENTS): else nothing is sent,
        and a carrying task ends as any other."""
        return bool(self._app.conf.worker_send_task_events)

    def ended(self, task: Task[Any, Any], started: float) -> Callable[[Report], bool]:
        """What the running `task` (begun at `started`, monotonic) does with a report of a
        carried call: keep its line for the final event, and say True (the task then ends
        without one of Celery's); False when no events are sent."""

        def carried(report: Report) -> bool:
            if not self.enabled:
                return False
            request = task.request
            self.task_ended(str(request.id), str(request.hostname or ""), report, started)
            return True

        return carried

    def task_ended(self, task_id: str, worker: str, report: Report, started: float) -> None:
        """The task `task_id` returned `report`, a step of which handed its call to the
        carrier (the task returns `NoFinalEvent` next)."""
        ended = _Ended(worker, report.line, report.failed, started)
        with self._lock:
            call = self._calls.pop(task_id, None)
            if call is None or call.carried:  # (carried: the task waits for its next call)
                _keep(self._tasks, task_id, ended if call is None else ended.then(call))
                return
        self._send(task_id, ended, call)

    def call_ended(self, report: Report) -> None:
        """The held call ended with `report` (called on a keeper thread, in the
        context of the task that handed it over)."""
        here = carrier()
        if not self.enabled or not here.task:
            return
        with self._lock:
            ended = self._tasks.pop(here.task, None)
            if ended is None:
                earlier = self._calls.get(here.task)
                call = report if earlier is None else _after(earlier, report)
                _keep(self._calls, here.task, call)
                return
            if report.carried:  # it went on to carry the run's next call: the task waits for it
                _keep(self._tasks, here.task, ended.then(report))
                return
        self._send(here.task, ended, report)

    def waiting(self) -> int:
        """Tasks and calls still waiting for the other half (a test's check that none leak)."""
        with self._lock:
            return len(self._tasks) + len(self._calls)

    def _send(self, task_id: str, ended: _Ended, call: Report) -> None:
        line = f"{ended.line}; then {call.line}"
        runtime = max(0.0, time.monotonic() - ended.started)
        # (Celery logged the task "ignored": the worker's log says how it ended here.)
        log.info("task %s ended with the call it carried: %s", task_id, line)
        try:
            with self._app.events.default_dispatcher(hostname=ended.worker) as events:
                if ended.failed or call.failed:
                    failure = safe_repr(StepFailed(line))
                    events.send("task-failed", uuid=task_id, exception=failure, traceback="")
                else:
                    # (as Celery's worker writes a task's result: its repr, cut at 1,024)
                    result = saferepr(line, RESULT_CHARS)
                    events.send("task-succeeded", uuid=task_id, result=result, runtime=runtime)
        except Exception as error:  # noqa: BLE001 - Flower misses one end; the call is saved
            log.warning("could not tell Flower how task %s ended: %s", task_id, error)


def _after(earlier: Report, call: Report) -> Report:
    """A carried call's report and then the next call's, carried after it."""
    line = _joined(earlier.line, call.line)
    return Report(line, earlier.failed or call.failed, carried=call.carried)


def _joined(line: str, then: str) -> str:
    """`line`, then `then`, cut to its last LINE_CHARS (what came last says most)."""
    joined = f"{line}; then {then}"
    return joined if len(joined) <= LINE_CHARS else "…" + joined[-LINE_CHARS:]


def _keep(waiting: dict[str, T], task_id: str, half: T) -> None:
    """Keep `half` for `task_id` until its other half comes, dropping the oldest past
    KEPT_MOST."""
    waiting[task_id] = half
    while len(waiting) > KEPT_MOST:
        del waiting[next(iter(waiting))]
