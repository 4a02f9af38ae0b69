"""What a worker accepts over Celery's remote control: inspection, and no more.

Anyone who can publish to the broker can broadcast a remote control command to
every worker (`celery control shutdown`, `pool_restart`, `revoke`...). A Relay
worker answers the inspect commands, which Flower's worker pages read (stats,
active, registered, queues), and refuses every command that would change it,
with one line in its log, unless it was started with `--remote-control`.

Flower sends two commands that are not inspections. `heartbeat` (its event
receiver's wake-up call, at every connection) only makes a worker send a
heartbeat event at once: obeyed, like an inspection. And Flower broadcasts
`enable_events` every 5 s to catch workers started after it, and a refusal
each time was a WARNING every 5 s on every worker. A worker's task events are
the operator's setting (RELAY_EVENTS), not a broadcast's: `enable_events` is
answered "already enabled" when they are on, and changes nothing;
`enable_events` with them off (the operator saved the round trips; the carrier
reads the setting, so events switched on by a broadcast would leave its calls
STARTED in Flower for ever) and `disable_events` (an outsider blinding Flower)
are refused, and said once in the worker's log, not at every broadcast.

This is a worker's edge, not the trust boundary: with Redis as the broker,
access to the broker is access to Redis, which can approve anything (README).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import click
from celery import Celery, bootsteps
from celery.worker.control import Panel

__all__ = ["EVENT_TOGGLES", "OBEYED", "guard_remote_control", "refused_commands"]

log = logging.getLogger(__name__)

OBEYED = frozenset({"heartbeat"})
"""Commands obeyed though not inspections: they only make the worker send an event now."""
EVENT_TOGGLES = ("enable_events", "disable_events")
"""Flower's event toggles: answered from RELAY_EVENTS, never obeyed (see above)."""


def refused_commands() -> list[str]:
    """The remote control commands a worker refuses: every one that is not an inspection,
    but the wake-up call Flower sends (`OBEYED`)."""
    return sorted(
        name for name, meta in Panel.meta.items() if meta.type != "inspect" and name not in OBEYED
    )


def _refusal(name: str) -> Callable[..., dict[str, str]]:
    def refuse(state: Any, **_arguments: Any) -> dict[str, str]:
        del state
        log.warning(
            "refused the remote control command %r: a Relay worker takes inspections only"
            " (start it with --remote-control to allow more)",
            name,
        )
        return {"error": f"{name} refused: this worker takes inspections only"}

    return refuse


def _sends_task_events(state: Any) -> bool:
    """Whether this worker's event dispatcher sends task events (an empty set of
    groups is every group: Celery's EventDispatcher)."""
    dispatcher = state.consumer.event_dispatcher
    if dispatcher is None:  # between a lost broker connection and the next one
        return bool(state.app.conf.worker_send_task_events)
    return bool(dispatcher.enabled) and (not dispatcher.groups or "task" in dispatcher.groups)


class _EventToggle:
    """The answer to `enable_events` or `disable_events`: what RELAY_EVENTS decided, and
    a refusal, logged once in this worker's life, when the broadcast asks for a change."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.said = False
        self.lock = threading.Lock()

    def __call__(self, state: Any, **_arguments: Any) -> dict[str, str]:
        on = _sends_task_events(state)
        if on and self.name == "enable_events":
            return {"ok": "task events already enabled"}
        now = "on" if on else "off"
        with self.lock:
            first, self.said = not self.said, True
        if first:
            log.warning(
                "refused the remote control command %r: task events stay %s, as RELAY_EVENTS"
                " says%s (said once: later %r commands are refused without a line)",
                self.name,
                now,
                "; Flower shows no tasks" if not on else "",
                self.name,
            )
        return {"error": f"{self.name} refused: task events stay {now}, as RELAY_EVENTS says"}


def guard_remote_control(app: Celery) -> None:
    """Add `--remote-control` to the workers of `app`, which refuse every remote control
    command but inspections without it."""
    app.user_options["worker"].add(
        click.Option(
            ("--remote-control",),
            is_flag=True,
            default=False,
            help="Obey remote control commands (shutdown, pool_restart...), not only inspect.",
        )
    )

    class RemoteControlGuard(bootsteps.Step):
        """Swaps the worker's control commands for refusals, before its mailbox listens."""

        label = "Relay remote control"

        def __init__(self, parent: Any, remote_control: bool = False, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            if remote_control:
                return
            # The worker's mailbox dispatches through this very dict (Panel.data); this
            # process is a worker of this app, whose rules it follows.
            for name in refused_commands():
                Panel.data[name] = _EventToggle(name) if name in EVENT_TOGGLES else _refusal(name)
                alias = Panel.meta[name].alias
                if alias:
                    Panel.data[alias] = _refusal(alias)

    app.steps["worker"].add(RemoteControlGuard)
