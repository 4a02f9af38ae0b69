"""`relay worker`, `relay beat` and `relay flower`: serving an app."""

from __future__ import annotations

import os
import socket

import click

from workers.cli_common import Context, Failure, app_option

__all__ = ["beat", "flower", "worker"]


@click.command()
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
@click.option("--hostname", "-n", help="Worker name (default: relay-<app>@<host>).")
@app_option
@click.pass_obj
def worker(
    obj: Context,
    *,
    concurrency: int | None,
    pool: str,
    queues: str | None,
    beat: bool,
    loglevel: str,
    hostname: str | None,
) -> None:
    """Start a worker that consumes every Relay queue (or those given).

    Model calls wait on the network: give them a threads pool with many
    threads (`--queues model --pool threads -c 32`); tools may use CPU: a
    prefork pool (`--queues tools,advance`). A fleet needs the tick too, for
    schedules, expiries and picking up a dead worker's calls: run `relay beat`
    once, or pass --beat to one worker.
    """
    obj.spec("worker")
    relay = obj.relay
    names = (
        relay.queues.all()
        if not queues
        else [relay.queues.named(q.strip()) for q in queues.split(",") if q.strip()]
    )
    argv = [
        "worker",
        f"--loglevel={loglevel}",
        f"--queues={','.join(names)}",
        f"--pool={pool}",
        f"--hostname={hostname or f'relay-{relay.name}@{socket.gethostname()}'}",
    ]
    if relay.settings.events:
        argv.append("-E")  # task events, for Flower (RELAY_EVENTS=0 turns them off)
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if beat:
        # The in-memory scheduler: the tick is the only entry, nothing to persist.
        argv += ["--beat", "--scheduler=celery.beat:Scheduler"]
    relay.celery.worker_main(argv)


@click.command()
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@app_option
@click.pass_obj
def beat(obj: Context, loglevel: str) -> None:
    """Start the beat: it sends `relay.tick` every few seconds (schedules, healing).

    Run one beat per deployment; the tick is safe to run twice, but once is enough.
    """
    obj.spec("beat")
    relay = obj.relay
    # The in-memory scheduler: the only entry is the tick, so there is nothing to persist.
    relay.celery.start(["beat", f"--loglevel={loglevel}", "--scheduler=celery.beat:Scheduler"])


def _flower_credentials() -> None:
    """Put the basic-auth credentials where Flower reads them (FLOWER_BASIC_AUTH), or refuse."""
    user = os.environ.get("RELAY_FLOWER_USER", "").strip()
    password = os.environ.get("RELAY_FLOWER_PASSWORD", "")
    if user or password:
        if not (user and password):
            raise Failure("set both RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD")
        if ":" in user or "," in user + password:
            raise Failure("RELAY_FLOWER_USER may not hold ':', and neither may hold ','")
        # Flower reads FLOWER_* variables itself: the password never goes on a command line.
        os.environ["FLOWER_BASIC_AUTH"] = f"{user}:{password}"
    elif not os.environ.get("FLOWER_BASIC_AUTH", "").strip():
        raise Failure(
            "refusing to start Flower without credentials:"
            " set RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD"
        )


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
@app_option
@click.pass_obj
def flower(obj: Context, address: str, port: int, flower_args: tuple[str, ...]) -> None:
    """Start Flower on the app, behind basic auth.

    The credentials come from RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD (or
    Flower's own FLOWER_BASIC_AUTH=user:password); without them it refuses to
    start. It listens on 127.0.0.1 unless --address says otherwise. Other
    Flower options may follow, e.g. `relay flower -- --url_prefix=flower`.
    """
    obj.spec("flower")
    _flower_credentials()
    relay = obj.relay
    argv = ["flower", f"--address={address}", f"--port={port}", *flower_args]
    relay.celery.start(argv)
