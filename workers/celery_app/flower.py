"""What Flower shows of Relay's tasks: every task event sent, and each task ended once.

1. Task events from any pool (`RelayEvents`). A worker with an event loop (prefork,
threads and solo pools alike) buffers its `task-*` events in one list per group and
publishes the list when the loop next flushes (`celery.events.dispatcher.
EventDispatcher`, `send` and `flush`). `send` appends to that list without the
dispatcher's lock; `flush` publishes the list and then empties it in place
(`events[:] = []`). In a prefork or solo worker only the loop's own thread sends task
events, so nothing is lost. In a threads pool, the pool's threads send `task-started`
and `task-succeeded` themselves: whatever they append while the loop's thread is
publishing the list is emptied with it, never sent, and Flower shows the task RECEIVED
or STARTED for ever (600 tasks on 8 threads: 40 % of them; a probe counted the events
appended during each publish). Their requests to flush (`hub._ready.add`, outside the
hub's lock) race the loop as well. So the thread that made the dispatcher (the
worker's loop, where Celery builds it) buffers as before; any other thread publishes
its event at once, under the dispatcher's lock, as Celery does for events it never
buffers: one broker round trip per event sent from a pool thread.
`Celery(..., events=RelayEvents)` puts this dispatcher in an app.

2. Tasks whose worker sends no final event (`NoFinalEvent`, `QuietRequest`). Two kinds
of Relay task end without Celery's `task-succeeded`: a task whose model call the
process's event loop holds past it (its end is sent when the call ends, 3. below), and
a second delivery of a step that did nothing (Flower keeps the end of the delivery
that made the call). Celery's own way to say so is to raise `Ignore`, and that is
dear: the worker builds two `ExceptionInfo`s, each copying the code positions of every
frame of the traceback, and formats the traceback for its log line (2.4 ms of CPU a
task here, against 0.09 ms for a task that returns). So such a task returns
`NoFinalEvent(line)` instead. Celery gives the worker's request what a task returned
as its repr, from a prefork child as from the worker itself; `QuietRequest` knows this
one by its repr and sends no `task-succeeded` for it. Everything else about the task is
as for any task: it is acked, counted, and logged ("succeeded in ...: <no final event
here: ...>"). A task's own lines are strings, whose repr begins with a quote, so no
other result is taken for one.

3. A task whose model call the loop holds ends when the call does (`CarriedEnds`).
With `RELAY_MODEL_CARRIED`, a task that claimed its model call hands it to the
process's event loop (`workers.runtime.on_loop`) and returns while the call is still
in flight. Had Celery ended the task then, Flower would show it SUCCESS with "held on
the event loop" for a call that may yet fail; and a FAILURE sent after it would not
change what Flower shows (Celery's event state ranks SUCCESS above FAILURE, in either
order). So such a task returns `NoFinalEvent`: Celery acks it and sends no final
event, and Flower shows the task STARTED while its call is in flight. Once both are
known, in either order, the task's own line (on its thread, as it returns) and the
call's report (on a keeper thread, in the task's context: `runtime.carrier.carrier()`
names the task), this process sends the task's final event itself, as its worker
would have: `task-succeeded` with the task's line and then the call's, or `task-failed`
with a StepFailed saying the same when the call (or a step before it) failed. The
call's report may say it went on with the run's next steps on its keeper thread and
handed the run's next model call to the loop in turn: then the task waits for that
call too, its line growing by each, and ends once a call's report carries nothing
further. A worker that dies while it holds a call sends nothing, as for any task it
was running: the task stays STARTED in Flower. The tick sends the call again, as a
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
from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher
from celery.events.event import Event, group_from
from celery.utils.saferepr import saferepr
from celery.utils.time import utcoffset
from celery.worker.request import Request
from kombu.utils.encoding import safe_repr

from workers.errors import StepFailed
from workers.runtime.carrier import carrier
from workers.runtime.reports import Report

__all__ = ["CarriedEnds", "NoFinalEvent", "OwnThreadBuffering", "QuietRequest", "RelayEvents"]


# --- 1. task events from any pool --------------------------------------------------


class OwnThreadBuffering(EventDispatcher):
    """An EventDispatcher that buffers only on the thread that made it (the worker's loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_thread = threading.get_ident()

    def send(  # noqa: PLR0917 - Celery's own signature
        self,
        type: str,  # noqa: A002 - Celery's own argument name
        blind: bool = False,
        utcoffset: Any = utcoffset,
        retry: bool = False,
        retry_policy: Any = None,
        Event: Any = Event,  # noqa: N803 - Celery's own argument name
        **fields: Any,
    ) -> Any:
        group = group_from(type)
        buffered = group in getattr(self, "buffer_group", ())
        if not buffered or threading.get_ident() == self._loop_thread:
            return super().send(
                type,
                blind=blind,
                utcoffset=utcoffset,
                retry=retry,
                retry_policy=retry_policy,
                Event=Event,
                **fields,
            )
        if not self.enabled or (self.groups and group not in self.groups):
            return None
        return self.publish(
            type,
            fields,
            self.publisher,  # type: ignore[arg-type]  # enabled: it has a producer
            blind=blind,
            Event=Event,
            retry=retry,
            retry_policy=retry_policy,
        )


class RelayEvents(Events):
    """`app.events` of a Relay app: Celery's, with the dispatcher above."""

    # Celery takes a class where it takes its dotted name (symbol_by_name).
    dispatcher_cls = OwnThreadBuffering  # type: ignore[assignment]


# --- 2. tasks whose worker sends no final event ------------------------------------

_MARK = "<no final event here: "


class NoFinalEvent:
    """What a task returns whose worker must send no final event for it: its line."""

    __slots__ = ("line",)

    def __init__(self, line: str) -> None:
        self.line = line

    def __repr__(self) -> str:
        return f"{_MARK}{self.line}>"


class QuietRequest(Request):
    """A Relay task's request: it sends no `task-succeeded` for a `NoFinalEvent`."""

    def send_event(self, type: str, **fields: Any) -> None:  # noqa: A002 - Celery's name
        if type == "task-succeeded" and str(fields.get("result", "")).startswith(_MARK):
            return
        super().send_event(type, **fields)


# --- 3. a task whose model call the loop holds -------------------------------------

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
