"""Relay's five tasks on a Celery app, each a short body on the runtime.

    relay.advance(run_id)            advance a run (a wake-up: the client, the tick)
    relay.advances(run_ids)          advance each of several runs, as relay.advance
                                     would alone (celery_app.grouped)
    relay.call_model(run_id, seq)    make the run's model call for step `seq`
    relay.run_tool(run_id, call_id)  run one call of the run's batch
    relay.tick()                     the fleet's tick (schedules, expiries, healing)

Each first refuses arguments Relay never sends (anyone with the broker, or
Flower's "apply", can send a task), then hands the message to
`workers.runtime.bodies.Runtime.task` and returns its one readable line. Every
worker also runs the tick beside its pool (a bootstep; `--no-tick` turns it off).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import click
from celery import Celery, Task, bootsteps
from celery.signals import (
    beat_init,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)

from workers.celery_app.control import guard_remote_control
from workers.celery_app.flower import CarriedEnds, NoFinalEvent, QuietRequest
from workers.celery_app.grouped import Advances
from workers.celery_app.sending import MOST_RUNS, model_task_id, tool_task_id
from workers.engine.effects import Message
from workers.errors import StepFailed
from workers.model.transport import shared_tls
from workers.runtime.carrier import carried_by
from workers.runtime.leases import held
from workers.runtime.reports import Report

__all__ = ["REFUSED", "RuntimeLike", "register_tasks"]

log = logging.getLogger(__name__)


class RuntimeLike(Protocol):
    """The part of the runtime the tasks call (see workers.runtime.bodies.Runtime)."""

    def task(
        self, message: Message, hard_limit_s: float | None = None, *, alone: bool = True
    ) -> Report: ...
    def on_carried_end(self, hook: Callable[[Report], None]) -> None: ...
    def tick(self) -> None: ...
    def stop(self) -> None: ...
    def start_ticking(self) -> Callable[[], None]: ...


class _Built:
    """The runtime, built by `build` at its first use and kept (so a task never asks the
    Relay for it again)."""

    def __init__(self, build: Callable[[], RuntimeLike], ends: CarriedEnds) -> None:
        self._build = build
        self._ends = ends
        self._runtime: RuntimeLike | None = None
        self._lock = threading.Lock()

    def __call__(self) -> RuntimeLike:
        runtime = self._runtime
        if runtime is None:
            with self._lock:
                if self._runtime is None:
                    built = self._build()
                    built.on_carried_end(self._ends.call_ended)
                    self._runtime = built
                runtime = self._runtime
        return runtime

    def built(self) -> RuntimeLike | None:
        """The runtime if it was built (None: never build one to stop it)."""
        return self._runtime


_STEP_TASK: dict[str, Any] = {
    "shared": False,
    "throws": (StepFailed,),
    "bind": True,
    "Request": QuietRequest,
}
"""The step tasks' options: this app's alone, StepFailed an expected end, and a request
that sends no final event for a `NoFinalEvent` (see `register_tasks`)."""


def register_tasks(app: Celery, build: Callable[[], RuntimeLike]) -> None:
    """Register `relay.advance`, `relay.advances`, `relay.call_model`, `relay.run_tool` and
    `relay.tick` on `app`, each a short body on the runtime, and the tick in every worker.

    `build()` makes the runtime, once, at its first use: a worker of `app` builds it
    as it starts (so its first task pays nothing), a process that only sends never does.

    Each step task returns one readable line (what it did, what the run waits for
    now), or raises StepFailed with it once its work is saved: Flower shows it as
    FAILURE, the message is acked like any other, and nothing is retried. The
    tasks are this app's alone (`shared=False`): Celery would otherwise add them
    to every app of the process, and two Relays in one process would run each
    other's tasks on the wrong Redis.
    """
    ends = CarriedEnds(app)
    runtime = _Built(build, ends)

    @app.task(name="relay.advance", **_STEP_TASK)
    def advance(task: Task[Any, Any], run_id: str) -> str | NoFinalEvent:
        if not _valid("relay.advance", run_id=run_id):
            return REFUSED
        started = time.monotonic()
        with _carrying(task):
            report = runtime().task(Message("advance", run_id), _hard_limit(task))
        return _told(report, ends.ended(task, started))

    _register_advances(app, runtime, ends)

    @app.task(name="relay.call_model", **_STEP_TASK)
    def call_model(task: Task[Any, Any], run_id: str, seq: int) -> str | NoFinalEvent:
        if not _valid("relay.call_model", run_id=run_id, seq=seq):
            return REFUSED
        own_id = task.request.id == model_task_id(run_id, seq)
        message = Message("call_model", run_id, seq=seq)
        started = time.monotonic()
        with _carrying(task):
            report = runtime().task(message, _hard_limit(task))
        return _told(report, ends.ended(task, started), own_id)

    @app.task(name="relay.run_tool", **_STEP_TASK)
    def run_tool(task: Task[Any, Any], run_id: str, call_id: str) -> str | NoFinalEvent:
        if not _valid("relay.run_tool", run_id=run_id, call_id=call_id):
            return REFUSED
        own_id = task.request.id == tool_task_id(run_id, call_id)
        message = Message("run_tool", run_id, call=call_id)
        started = time.monotonic()
        with _carrying(task):
            report = runtime().task(message, _hard_limit(task))
        return _told(report, ends.ended(task, started), own_id)

    # The tick sends no task events: every few seconds, it would push the real
    # tasks out of Flower's memory.
    @app.task(name="relay.tick", shared=False, send_events=False)
    def tick() -> None:
        runtime().tick()

    _add_ticker(app, runtime)
    guard_remote_control(app)
    _connect_signals(app, runtime)


def _register_advances(app: Celery, runtime: _Built, ends: CarriedEnds) -> None:
    """Register `relay.advances`: each run as `relay.advance` would (celery_app.grouped)."""
    each = Advances(app, ends, lambda message, limit: runtime().task(message, limit, alone=False))

    # Always a summary: each run's own end (FAILURE for a failed run) is its own task's.
    @app.task(name="relay.advances", **_STEP_TASK)
    def advances(task: Task[Any, Any], run_ids: object) -> str:
        runs = _valid_runs(run_ids)
        if runs is None:
            return REFUSED
        request = task.request
        return each(str(request.id), str(request.hostname or ""), runs, _hard_limit(task))


def _connect_signals(app: Celery, runtime: _Built) -> None:
    """What a worker (or a beat) of `app` does as it starts and stops."""
    worker_process_init.connect(_in_prefork_child, weak=False, dispatch_uid="relay-prefork")
    worker_shutting_down.connect(_say_what_is_held, weak=False, dispatch_uid="relay-held")

    def stop(**_: Any) -> None:
        # A prefork child's, or a threads or solo pool's process: the calls it carries
        # end, and what it counted since its last flush is written, not lost with it.
        built = runtime.built()
        if built is not None:
            built.stop()

    for stopping in (worker_process_shutdown, worker_shutdown):
        stopping.connect(stop, weak=False, dispatch_uid=f"relay-stop-{id(app)}")

    def build_runtime(sender: Any, **_: Any) -> None:
        if getattr(sender, "app", None) is app:  # a worker of this app (not of another)
            runtime()  # (built as the worker starts, before a prefork pool forks)
            shared_tls()  # (before a prefork pool forks: its children inherit it)

    worker_init.connect(build_runtime, weak=False, dispatch_uid=f"relay-runtime-{id(app)}")

    def quiet_beat(sender: Any, **_: Any) -> None:
        # A beat sends only ticks: their `task-sent` events would fill Flower too.
        if getattr(sender, "app", None) is app:
            app.conf.task_send_sent_event = False

    beat_init.connect(quiet_beat, weak=False, dispatch_uid=f"relay-quiet-beat-{id(app)}")


REFUSED = "refused: arguments Relay never sends (see the worker's log)"


_POOL_KILLS_AT_LIMIT = threading.Event()
"""Set in a prefork pool's child: its parent kills a task at its hard time limit (threads
and solo pools enforce none)."""


def _in_prefork_child(**_: Any) -> None:
    _POOL_KILLS_AT_LIMIT.set()


def _carrying(task: Task[Any, Any]) -> AbstractContextManager[None]:
    """The running task as the carrier of the work it does (see workers.runtime.carrier)."""
    request = task.request
    return carried_by(str(request.id or ""), str(request.hostname or ""))


def _hard_limit(task: Task[Any, Any]) -> float | None:
    """The running task's hard time limit in seconds, where the pool enforces it."""
    limits = task.request.timelimit
    if not _POOL_KILLS_AT_LIMIT.is_set() or not limits or not limits[0]:
        return None
    return float(limits[0])


def _told(
    report: Report, carried: Callable[[Report], bool], own_id: bool = False
) -> str | NoFinalEvent:
    """Return the report's line, or raise StepFailed with it when the step failed.

    A call's messages all carry one task id, so Flower shows them as one task. A
    second delivery that does nothing (the call is under way elsewhere, or was made
    and applied) returns `NoFinalEvent`: it is acked and sends no final event, and
    Flower keeps the result of the delivery that made the call. A message with
    another id (sent by someone else) reports as usual, so it too ends in Flower.

    A task that handed its model call to the loop returns `NoFinalEvent` too, once
    `carried(report)` has taken its line: it ends in Flower when the call does
    (`celery_app.flower`).
    """
    if report.idle and own_id:
        return NoFinalEvent(report.line)
    if report.carried and carried(report):
        return NoFinalEvent(report.line)
    if report.failed:
        raise StepFailed(report.line)
    return report.line


def _say_what_is_held(**_: Any) -> None:
    """Tell the log which outcomes a worker that is being stopped still holds unsaved."""
    holding = held()
    if holding:
        log.warning(
            "stopping while holding %d outcome(s) not yet saved (Redis is away): %s",
            len(holding),
            "; ".join(holding),
        )


def _add_ticker(app: Celery, runtime: Callable[[], RuntimeLike]) -> None:
    """Make every worker of `app` run the fleet's tick in a thread (`--no-tick` turns it off)."""
    app.user_options["worker"].add(
        click.Option(
            ("--no-tick",),
            is_flag=True,
            default=False,
            help="Do not take part in the tick (schedules, expiries, healing).",
        )
    )

    class Ticking(bootsteps.StartStopStep):
        """Runs `workers.runtime.tick.Ticker` beside the pool, in the worker's main process."""

        label = "Relay tick"
        requires = ("celery.worker.components:Pool",)

        def __init__(self, parent: Any, no_tick: bool = False, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.enabled = not no_tick
            self._halt: Callable[[], None] | None = None

        def start(self, parent: Any) -> None:  # noqa: ARG002 - the bootstep API
            self._halt = runtime().start_ticking()

        def stop(self, parent: Any) -> None:  # noqa: ARG002 - the bootstep API
            if self._halt is not None:
                self._halt()
                self._halt = None

    app.steps["worker"].add(Ticking)


MAX_ID_CHARS = 300


def _valid(task: str, *, run_id: object, seq: object = 0, call_id: object = "call") -> bool:
    """Whether a task message's arguments have the types and sizes Relay sends.

    Anyone with access to the broker (or Flower's "apply") can send a task: what
    Relay never sends is refused here, with a warning, before it reaches Redis.
    """
    fine = (
        _an_id(run_id)
        and isinstance(seq, int)
        and not isinstance(seq, bool)
        and 0 <= seq < 2**53
        and _an_id(call_id)
    )
    if not fine:
        log.warning(
            "refused a %s message with arguments Relay never sends: run=%.80r seq=%.40r call=%.80r",
            task,
            run_id,
            seq,
            call_id,
        )
    return fine


def _an_id(value: object) -> bool:
    """Whether `value` is an id as Relay makes them (a run's, a call's)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable()


def _valid_runs(run_ids: object) -> list[str] | None:
    """The runs of a `relay.advances` message, or None (with a warning) when it is not
    what Relay sends: a list of 1 to MOST_RUNS distinct run ids."""
    problem = _runs_problem(run_ids)
    if problem or not isinstance(run_ids, list):
        log.warning(
            "refused a relay.advances message with arguments Relay never sends (%s): %.80r",
            problem,
            run_ids,
        )
        return None
    return [str(run_id) for run_id in run_ids]


def _runs_problem(run_ids: object) -> str:
    """What is wrong with a `relay.advances` message's argument ('' if nothing)."""
    if not isinstance(run_ids, list):
        return f"not a list but {type(run_ids).__name__}"
    if not 0 < len(run_ids) <= MOST_RUNS:
        return f"{len(run_ids)} runs, not 1 to {MOST_RUNS}"
    if not all(_an_id(run_id) for run_id in run_ids):
        return "an entry that is not a run id"
    if len(set(run_ids)) != len(run_ids):
        return "a run named twice"
    return ""
