"""What a worker accepts over Celery's remote control: inspection, and no more.

Anyone who can publish to the broker can broadcast a remote control command to
every worker (`celery control shutdown`, `pool_restart`, `revoke`...). A Relay
worker answers the inspect commands, which Flower's worker pages read (stats,
active, registered, queues), and refuses every command that would change it,
with one line in its log, unless it was started with `--remote-control`.

This is a worker's edge, not the trust boundary: with Redis as the broker,
access to the broker is access to Redis, which can approve anything (README).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click
from celery import Celery, bootsteps
from celery.worker.control import Panel

__all__ = ["guard_remote_control", "refused_commands"]

log = logging.getLogger(__name__)


def refused_commands() -> list[str]:
    """The remote control commands a worker refuses: every one that is not an inspection."""
    return sorted(name for name, meta in Panel.meta.items() if meta.type != "inspect")


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
                Panel.data[name] = _refusal(name)
                alias = Panel.meta[name].alias
                if alias:
                    Panel.data[alias] = _refusal(alias)

    app.steps["worker"].add(RemoteControlGuard)
