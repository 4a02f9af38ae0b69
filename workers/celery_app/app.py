"""The Celery app of a Relay: its settings, its three tasks and how messages are sent.

One explicit app per Relay (never `current_app`). JSON only; late acks with
reject-on-worker-lost, so a message whose worker dies is delivered again;
prefetch 1, so a slow call never holds messages another worker could take.
Relay's own leases and the tick recover a dead worker's call within
`RELAY_RECOVERY_SECONDS`; the broker's visibility timeout (on RabbitMQ, the
consumer timeout) is kept longer than any task can run, so it never hands a live
task to a second worker. How the queues are declared on Redis or RabbitMQ:
`workers.celery_app.brokers`.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import click
from celery import Celery, Task, bootsteps
from celery.exceptions import Ignore
from celery.signals import beat_init, worker_process_init, worker_shutting_down
from kombu import Producer

from workers.celery_app.brokers import broker_conf
from workers.celery_app.events import RelayEvents
from workers.celery_app.publishing import one_round_trip
from workers.engine.effects import Message
from workers.errors import StepFailed
from workers.runtime.holding import held
from workers.runtime.reports import Report
from workers.settings import Settings

__all__ = ["Queues", "WorkerReach", "build_celery", "delivery_settings", "register_tasks", "sender"]

log = logging.getLogger(__name__)

VISIBILITY_MARGIN_S = 120


@dataclass(frozen=True)
class Queues:
    """Queue names: advancing runs, model calls, tool calls and the tick, so each can get
    its own pool, and a tick never waits behind long tools."""

    advance: str
    model: str
    tools: str
    tick: str

    @classmethod
    def under(cls, prefix: str) -> Queues:
        return cls(
            advance=f"{prefix}advance",
            model=f"{prefix}model",
            tools=f"{prefix}tools",
            tick=f"{prefix}tick",
        )

    def all(self) -> list[str]:
        return [self.advance, self.model, self.tools, self.tick]

    def named(self, short: str) -> str:
        """Return the queue for a short name (`advance`, `model`, `tools`, `tick`) or a full one."""
        short_names = {
            "advance": self.advance,
            "model": self.model,
            "tools": self.tools,
            "tick": self.tick,
        }
        return short_names.get(short, short)


class RuntimeLike(Protocol):
    """The part of the runtime the tasks call (see workers.runtime.tasks.Runtime)."""

    def task(self, message: Message, hard_limit_s: float | None = None) -> Report: ...
    def tick(self) -> None: ...
    def start_ticking(self) -> Callable[[], None]: ...


def visibility_timeout(settings: Settings) -> int:
    """Seconds a delivered message stays invisible (Redis) or may stay unacknowledged
    (RabbitMQ): longer than the longest task."""
    model_s = (settings.model_timeout + 30) * (settings.model_retries + 1)
    return int(max(model_s, settings.tool_timeout) + VISIBILITY_MARGIN_S)


def delivery_settings(visibility_timeout_s: int, *, events: bool) -> dict[str, Any]:
    """Return how Relay's Celery apps deliver: JSON only, late acks, prefetch 1, no results.

    Also what `bench/` gives the bare Celery app it measures Relay against.
    """
    return {
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_ignore_result": True,
        "result_backend": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"visibility_timeout": visibility_timeout_s},
        "task_send_sent_event": events,
        "worker_send_task_events": events,
        "worker_hijack_root_logger": False,
    }


def build_celery(name: str, settings: Settings, broker_url: str) -> Celery:
    """Return the configured Celery app (`register_tasks` gives it its tasks)."""
    queues = Queues.under(settings.prefix)
    # RelayEvents: task events that reach Flower from a threads pool too (celery_app.events).
    app = Celery(name, broker=broker_url, set_as_current=False, events=RelayEvents)
    timeout_s = visibility_timeout(settings)
    # Declared, so a plain `celery -A mymodule:app worker` consumes all four.
    declared = broker_conf(
        broker_url,
        queues.all(),
        prefix=settings.prefix,
        queue_type=settings.queue_type,
        visibility_timeout_s=timeout_s,
    )
    app.conf.update(
        **{**delivery_settings(timeout_s, events=settings.events), **declared},
        task_default_queue=queues.advance,
        task_routes={
            "relay.advance": {"queue": queues.advance},
            "relay.tick": {"queue": queues.tick},
            "relay.call_model": {"queue": queues.model},
            "relay.run_tool": {"queue": queues.tools},
        },
        beat_schedule={
            "relay-tick": {
                "task": "relay.tick",
                "schedule": settings.tick_seconds,
                # Ticks queued while every worker was down are dropped, not run in a burst.
                "options": {"expires": max(2 * settings.tick_seconds, 10.0)},
            }
        },
    )
    return app


def register_tasks(app: Celery, runtime: RuntimeLike) -> None:
    """Register `relay.advance`, `relay.call_model`, `relay.run_tool` and `relay.tick` on
    `app`, each a short body on `runtime`, and the tick in every worker of the app.

    Each step task returns one readable line (what it did, what the run waits for
    now), or raises StepFailed with it once its work is saved: Flower shows it as
    FAILURE, the message is acked like any other, and nothing is retried. The
    tasks are this app's alone (`shared=False`): Celery would otherwise add them
    to every app of the process, and two Relays in one process would run each
    other's tasks on the wrong Redis.
    """

    @app.task(name="relay.advance", shared=False, throws=(StepFailed,), bind=True)
    def advance(task: Task[Any, Any], run_id: str) -> str:
        if not _valid("relay.advance", run_id=run_id):
            return REFUSED
        return _told(runtime.task(Message("advance", run_id), _hard_limit(task)))

    @app.task(name="relay.call_model", shared=False, throws=(StepFailed,), bind=True)
    def call_model(task: Task[Any, Any], run_id: str, seq: int) -> str:
        if not _valid("relay.call_model", run_id=run_id, seq=seq):
            return REFUSED
        own_id = task.request.id == model_task_id(run_id, seq)
        message = Message("call_model", run_id, seq=seq)
        return _told(runtime.task(message, _hard_limit(task)), own_id)

    @app.task(name="relay.run_tool", shared=False, throws=(StepFailed,), bind=True)
    def run_tool(task: Task[Any, Any], run_id: str, call_id: str) -> str:
        if not _valid("relay.run_tool", run_id=run_id, call_id=call_id):
            return REFUSED
        own_id = task.request.id == tool_task_id(run_id, call_id)
        message = Message("run_tool", run_id, call=call_id)
        return _told(runtime.task(message, _hard_limit(task)), own_id)

    # The tick sends no task events: every few seconds, it would push the real
    # tasks out of Flower's memory.
    @app.task(name="relay.tick", shared=False, send_events=False)
    def tick() -> None:
        runtime.tick()

    _add_ticker(app, runtime)
    worker_process_init.connect(_in_prefork_child, weak=False, dispatch_uid="relay-prefork")
    worker_shutting_down.connect(_say_what_is_held, weak=False, dispatch_uid="relay-held")

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


def _hard_limit(task: Task[Any, Any]) -> float | None:
    """The running task's hard time limit in seconds, where the pool enforces it."""
    limits = task.request.timelimit
    if not _POOL_KILLS_AT_LIMIT.is_set() or not limits or not limits[0]:
        return None
    return float(limits[0])


class WorkerReach:
    """Which steps a worker of `app` may continue in place (`runtime.continuation.Reach`)."""

    def __init__(
        self, app: Celery, queues: Queues, tool_limit_s: Callable[[str], float], settings: Settings
    ) -> None:
        self._app = app
        self._queues = {"advance": queues.advance, "call_model": queues.model}
        self._queues["run_tool"] = queues.tools
        self._tool_limit_s = tool_limit_s
        # A model call usually answers within one read timeout. One killed at the limit
        # is recovered like a crash (its lease lapses, the tick sends it again): paid
        # twice at worst, never lost. A tool is continued only within its own limit.
        self._model_s = settings.model_timeout + 30

    def owns(self, message: Message) -> bool:
        # The queues this worker consumes: `-Q`'s selection, set before a prefork pool
        # forks (so its children see it too); every declared queue when none was given.
        return self._queues[message.kind] in self._app.amqp.queues.consume_from

    def needs_s(self, message: Message) -> float:
        if message.kind == "run_tool":  # the time limit its own message would carry
            return _tool_time_limit(self._tool_limit_s, message.tool)
        return self._model_s if message.kind == "call_model" else 0.0


def model_task_id(run_id: str, seq: int) -> str:
    """The task id of a run's model call: the same at every sending."""
    return f"{run_id}:m{seq}"


def tool_task_id(run_id: str, call_id: str) -> str:
    """The task id of a run's tool call: the same at every sending."""
    return f"{run_id}:{call_id}"


def _told(report: Report, own_id: bool = False) -> str:
    """Return the report's line, or raise StepFailed with it when the step failed.

    A call's messages all carry one task id, so Flower shows them as one task. A
    second delivery that does nothing (the call is under way elsewhere, or was made
    and applied) raises Ignore: it is acked and sends no final event, and Flower
    keeps the result of the delivery that made the call. A message with another id
    (sent by someone else) reports as usual, so it too ends in Flower.
    """
    if report.idle and own_id:
        raise Ignore(report.line)
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


def _add_ticker(app: Celery, runtime: RuntimeLike) -> None:
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
            self._halt = runtime.start_ticking()

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
        isinstance(run_id, str)
        and 0 < len(run_id) <= MAX_ID_CHARS
        and run_id.isprintable()
        and isinstance(seq, int)
        and not isinstance(seq, bool)
        and 0 <= seq < 2**53
        and isinstance(call_id, str)
        and 0 < len(call_id) <= MAX_ID_CHARS
        and call_id.isprintable()
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


def sender(
    app: Celery, queues: Queues, tool_time_limit: Callable[[str], float]
) -> Callable[[list[Message]], None]:
    """Return a function that sends messages as tasks, with deterministic ids where they matter.

    A message that cannot be sent is logged and left to the tick, which finds
    it in the outbox and sends it again.
    """

    def send(messages: list[Message]) -> None:
        if not messages:
            return
        try:  # a batch in one broker round trip (workers.celery_app.publishing)
            with one_round_trip(app) as producer:
                for message in messages:
                    try:
                        _send_one(app, queues, message, tool_time_limit, producer)
                    except Exception as error:  # noqa: BLE001 - the outbox keeps it
                        what = f"{message.kind} for run {message.run}"
                        log.warning("could not send %s: %s", what, error)
        except Exception as error:  # noqa: BLE001 - the outbox keeps them; the tick re-sends
            log.warning("could not send %d message(s): %s", len(messages), error)

    return send


def _send_one(
    app: Celery,
    queues: Queues,
    m: Message,
    tool_time_limit: Callable[[str], float],
    producer: Producer,
) -> None:
    if m.kind == "call_model":
        app.send_task(
            "relay.call_model",
            args=[m.run, m.seq],
            task_id=model_task_id(m.run, m.seq),
            argsrepr=f"run={m.run} step={m.seq}",
            queue=queues.model,
            countdown=m.delay_ms / 1000 if m.delay_ms > 0 else None,
            producer=producer,
        )
    elif m.kind == "run_tool":
        app.send_task(
            "relay.run_tool",
            args=[m.run, m.call],
            task_id=tool_task_id(m.run, m.call),
            argsrepr=f"run={m.run} call={m.call} tool={m.tool or '?'}",
            queue=queues.tools,
            time_limit=_tool_time_limit(tool_time_limit, m.tool),
            producer=producer,
        )
    else:
        app.send_task(
            "relay.advance",
            args=[m.run],
            task_id=f"{m.run}:advance:{secrets.token_hex(4)}",
            argsrepr=f"run={m.run}",
            queue=queues.advance,
            producer=producer,
        )


def _tool_time_limit(tool_time_limit: Callable[[str], float], tool: str) -> int:
    """A tool call's hard time limit: its own timeout, and a minute to report it."""
    return int(tool_time_limit(tool)) + 60
