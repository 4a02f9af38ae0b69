"""The `relay` command."""

from __future__ import annotations

import socket
import sys

import click

from workers.appload import load_relay
from workers.errors import RelayError
from workers.relay import Relay
from workers.settings import SettingsError

__all__ = ["main"]


class _Context:
    def __init__(self, app: str | None) -> None:
        self.app = app
        self._relay: Relay | None = None

    @property
    def relay(self) -> Relay:
        if self._relay is None:
            try:
                self._relay = load_relay(self.app)
            except (RelayError, SettingsError) as error:
                raise click.ClickException(str(error)) from None
        return self._relay


@click.group()
@click.option("--app", envvar="RELAY_APP", help="The Relay object, as module:attr (or RELAY_APP).")
@click.pass_context
def cli(ctx: click.Context, app: str | None) -> None:
    """Relay: run LLM agents on Celery workers, with their state in Redis."""
    ctx.obj = _Context(app)


@cli.command()
@click.option(
    "--concurrency", "-c", type=click.IntRange(min=1), help="Processes or threads (default: CPUs)."
)
@click.option(
    "--pool",
    "-P",
    type=click.Choice(["prefork", "threads", "solo"]),
    default="prefork",
    show_default=True,
)
@click.option(
    "--queues",
    "-Q",
    help="Comma-separated queues: advance, model, tools (default: all of them).",
)
@click.option("--beat", "-B", is_flag=True, help="Also run the beat (the tick) in this worker.")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--hostname", "-n", help="Worker name (default: relay@<host>).")
@click.pass_obj
def worker(
    obj: _Context,
    *,
    concurrency: int | None,
    pool: str,
    queues: str | None,
    beat: bool,
    loglevel: str,
    hostname: str | None,
) -> None:
    """Start a worker that consumes every Relay queue (or those given)."""
    relay = obj.relay
    names = (
        relay.queues.all()
        if not queues
        else [relay.queues.named(q.strip()) for q in queues.split(",")]
    )
    argv = [
        "worker",
        f"--loglevel={loglevel}",
        f"--queues={','.join(names)}",
        f"--pool={pool}",
        "-E",
    ]
    argv.append(f"--hostname={hostname or f'relay-{relay.name}@{socket.gethostname()}'}")
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if beat:
        argv.append("--beat")
    relay.celery.worker_main(argv)


@cli.command()
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_obj
def beat(obj: _Context, loglevel: str) -> None:
    """Start the beat: it sends `relay.tick` every few seconds (schedules, healing)."""
    relay = obj.relay
    # The in-memory scheduler: the only entry is the tick, so there is nothing to persist.
    relay.celery.start(["beat", f"--loglevel={loglevel}", "--scheduler=celery.beat:Scheduler"])


def main() -> None:
    """Run the `relay` command."""
    try:
        cli(standalone_mode=True)
    except RelayError as error:
        click.echo(f"relay: {error}", err=True)
        sys.exit(1)
