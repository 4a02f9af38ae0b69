"""The Celery app of a Relay: its queues, and how it delivers.

One explicit app per Relay (never `current_app`). JSON only; late acks with
reject-on-worker-lost, so a message whose worker dies is delivered again;
prefetch 1, so a slow call never holds messages another worker could take.
Relay's own leases and the tick recover a dead worker's call within
`RELAY_RECOVERY_SECONDS`; the broker's visibility timeout (on RabbitMQ, the
consumer timeout) is kept longer than any task can run, so it never hands a live
task to a second worker. Its tasks are registered by
`workers.celery_app.tasks`; how the queues are declared on Redis or RabbitMQ is
`workers.celery_app.brokers`; how messages are sent, `workers.celery_app.sending`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Celery

from workers.celery_app.brokers import broker_conf, kombu_url
from workers.celery_app.channels import RelayAMQP
from workers.celery_app.flower import RelayEvents
from workers.settings import Settings

__all__ = ["Queues", "build_celery", "delivery_settings", "visibility_timeout"]

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
        # No results: the (disabled) backend holds nothing, so one serves every thread.
        # Else each new thread that sends a message makes its own, looking its class up
        # in every installed package's entry points: 3-5 ms of CPU a carried call's
        # thread paid at its first publish.
        "result_backend_thread_safe": True,
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
    """Return the configured Celery app (`tasks.register_tasks` gives it its tasks)."""
    queues = Queues.under(settings.prefix)
    # RelayEvents: task events that reach Flower from a threads pool too (celery_app.flower);
    # RelayAMQP: a Redis broker channel that keeps its client (celery_app.channels).
    app = Celery(
        name,
        broker=kombu_url(broker_url),
        set_as_current=False,
        events=RelayEvents,
        amqp=RelayAMQP,
    )
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
            "relay.advances": {"queue": queues.advance},
            "relay.tick": {"queue": queues.tick},
            "relay.call_model": {"queue": queues.model},
            "relay.run_tool": {"queue": queues.tools},
        },
        beat_schedule={
            "relay-tick": {
                "task": "relay.tick",
                "schedule": settings.tick_interval,
                # Ticks queued while every worker was down are dropped, not run in a burst.
                "options": {"expires": max(2 * settings.tick_interval, 10.0)},
            }
        },
    )
    return app
