"""`relay worker`, `relay beat` and `relay flower`: serving an app."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import click

from workers.celery_app.brokers import check_broker
from workers.cli.common import Context, Failure, app_option
from workers.cli.terminal import one_line
from workers.errors import StoreMisconfigured, StoreUnavailable
from workers.relay import Relay
from workers.settings import SettingsError
from workers.store.connection import ping_url

__all__ = ["beat", "flower", "ping", "worker"]

REDIS_WAIT_S = 1.0
"""How often a starting worker asks again for a Redis that is away (a PING each time)."""


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
@click.option(
    "--no-tick",
    is_flag=True,
    help="Take no part in the tick (schedules, expired approvals, a dead worker's calls).",
)
@click.option(
    "--remote-control",
    is_flag=True,
    help="Obey Celery's remote control commands (shutdown, pool_restart...): by default a"
    " worker answers inspections only, which Flower's worker pages read.",
)
@click.option(
    "--loglevel",
    "-l",
    default="INFO",
    show_default=True,
    help="A line for each task. httpx's own line for each HTTP request (an MCP server's"
    " over HTTP) only at DEBUG, or when its logger has a level of its own.",
)
@click.option("--hostname", "-n", help="Worker name (default: relay-<app>@<host>).")
@app_option
@click.pass_obj
def worker(
    obj: Context,
    *,
    concurrency: int | None,
    pool: str,
    queues: str | None,
    no_tick: bool,
    remote_control: bool,
    loglevel: str,
    hostname: str | None,
) -> None:
    """Start a worker that consumes every Relay queue (or those given).

    Model calls wait on the network: each worker process holds up to
    RELAY_MODEL_CARRIED of them on its event loop, whatever its pool (no
    thread a call); tools may use CPU: a prefork pool (`--queues
    tools,advance`). Every worker also takes part in
    the tick (schedules, expired approvals, picking up a dead worker's calls):
    one tick per RELAY_TICK_SECONDS across the fleet, run beside the pool, so
    a fleet of plain workers needs nothing else. --no-tick opts out.
    """
    obj.spec("worker")
    relay = obj.relay
    names = (
        relay.queues.all()
        if not queues
        else [relay.queues.named(q.strip()) for q in queues.split(",") if q.strip()]
    )
    if not no_tick and relay.queues.tick not in names:
        names.append(relay.queues.tick)  # ticks sent by a beat, if one runs
    # The broker first: what it refuses is said at once, even while Redis is away (the
    # store's check waits for a Redis merely away).
    _check_broker(relay, names)
    _check_store(relay)
    if relay.settings.durable_claims:
        _check_durable(relay)
    argv = [
        "worker",
        f"--loglevel={loglevel}",
        f"--queues={','.join(names)}",
        f"--pool={pool}",
        f"--hostname={hostname or f'relay-{relay.name}@{socket.gethostname()}'}",
        # Mingle syncs revoked task ids, which Relay never uses, and costs a second
        # at every start and every reconnection to the broker.
        "--without-mingle",
    ]
    if relay.settings.events:
        argv.append("-E")  # task events, for Flower (RELAY_EVENTS=0 turns them off)
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if no_tick:
        argv.append("--no-tick")
    if remote_control:
        argv.append("--remote-control")
    _quiet_http_lines(loglevel)
    relay.celery.worker_main(argv)


def _quiet_http_lines(loglevel: str) -> None:
    """Leave out httpx's INFO line for each request, unless asked for.

    Each model call's task line already says how the call ended. httpx's line beside
    it doubled a worker's log and cost more of its CPU than Celery's own lines
    (py-spy under `bench/many.py`). A level set on httpx's logger (by the app's own
    logging setup) is kept.
    """
    http = logging.getLogger("httpx")
    if http.level == logging.NOTSET and loglevel.upper() != "DEBUG":
        http.setLevel(logging.WARNING)


def _check_store(relay: Relay) -> None:
    """Refuse to start, in one line, on a Redis URL that waiting cannot mend: a missing or
    wrong password, a database or a host that does not exist; the broker's too, when it
    is a Redis of its own (RELAY_BROKER_URL). A Redis merely away (a fleet may start
    before its Redis) is waited for, said once, and its answer checked when it comes:
    else a Redis that came up wanting a password left Celery retrying for minutes."""
    broker = relay.settings.broker_url or ""
    own_broker = broker != relay.redis_url and urlsplit(broker).scheme in ("redis", "rediss")

    def store() -> None:
        relay.store.ping()  # made inside the wait: a cluster's client asks a node at once

    checks: list[Callable[[], None]] = [store]
    if own_broker:
        checks.append(lambda: ping_url(broker, "RELAY_BROKER_URL"))
    for check in checks:
        _until_answered(check)


def _until_answered(check: Callable[[], None]) -> None:
    """Run `check` until Redis answers it; StoreMisconfigured is a Failure at once."""
    said = False
    while True:
        try:
            check()
        except StoreMisconfigured as error:
            raise Failure(str(error)) from None
        except StoreUnavailable as error:
            if not said:
                click.echo(f"relay: {one_line(str(error))}; waiting for it", err=True)
                said = True
            time.sleep(REDIS_WAIT_S)
        else:
            return


def _check_durable(relay: Relay) -> None:
    """Refuse to start, in one line, when RELAY_DURABLE_CLAIMS cannot be honoured."""
    try:
        mode = relay.store.durability()
    except SettingsError as error:
        raise Failure(str(error)) from None
    click.echo(f"relay: durable claims on ({mode.value})", err=True)


def _check_broker(relay: Relay, names: list[str]) -> None:
    """Refuse to start, in one line, on a RabbitMQ that cannot take the queues `names`."""
    try:
        found = check_broker(relay.celery, names, relay.settings.queue_type)
    except SettingsError as error:
        raise Failure(str(error)) from None
    if found:
        click.echo(f"relay: broker {found}", err=True)


@click.command()
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@app_option
@click.pass_obj
def beat(obj: Context, loglevel: str) -> None:
    """Start a beat: it sends `relay.tick` every RELAY_TICK_SECONDS (schedules, healing).

    Not needed: every worker takes part in the tick already. For deployments
    that want the tick sent from one process of its own; however many beats and
    workers ask, the fleet still ticks once per interval.
    """
    obj.spec("beat")
    relay = obj.relay
    _check_store(relay)
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


def _guard_flower_monitoring() -> None:
    """Put Flower's /metrics and /healthcheck behind its auth, like every other page.

    Flower serves both to anyone (flower.views.monitor has no @authenticated);
    its metrics name every task and worker. The handlers are swapped in Flower's
    URL table, which it reads when it builds its app, for subclasses that ask
    for the same credentials as the rest of Flower.
    """
    import tornado.web  # noqa: PLC0415 - Flower's own web framework, needed only here
    from flower import urls  # noqa: PLC0415
    from flower.views import monitor  # noqa: PLC0415

    class Metrics(monitor.Metrics):  # type: ignore[misc]
        @tornado.web.authenticated
        async def get(self) -> None:
            await super().get()

    class Healthcheck(monitor.Healthcheck):  # type: ignore[misc]
        @tornado.web.authenticated
        async def get(self) -> None:
            await super().get()

    guarded = {monitor.Metrics: Metrics, monitor.Healthcheck: Healthcheck}
    for index, handler in enumerate(urls.handlers):
        if isinstance(handler, tuple) and handler[1] in guarded:
            urls.handlers[index] = (handler[0], guarded[handler[1]], *handler[2:])


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
    Flower options may follow, e.g. `relay flower -- --url_prefix=flower`. --app is
    optional: Flower needs only the broker (RELAY_BROKER_URL, or RELAY_REDIS_URL) and
    the task events the workers send.
    """
    _flower_credentials()
    _guard_flower_monitoring()
    relay = obj.relay
    argv = ["flower", f"--address={address}", f"--port={port}", *flower_args]
    relay.celery.start(argv)


@click.command()
@click.option(
    "--hostname",
    "-n",
    help="The worker to ask: its --hostname (%h is this host's name, as for the worker)."
    " Default: every worker.",
)
@click.option("--timeout", type=click.FloatRange(0.1, 300), default=5.0, show_default=True)
@app_option
@click.pass_obj
def ping(obj: Context, hostname: str | None, timeout: float) -> None:
    """Ask a worker (or every worker) whether it answers: exit 0 if it does, 1 if not.

    For healthchecks (docker-compose.yml's workers use it). It sends Celery's
    inspect ping through the broker, which a Relay worker always answers.
    """
    from celery.utils.nodenames import host_format  # noqa: PLC0415 - only this verb

    destination = [host_format(hostname)] if hostname else None
    inspect = obj.relay.celery.control.inspect(timeout=timeout, destination=destination)
    answered = sorted(inspect.ping() or {})
    if not answered:
        named = f" {destination[0]}" if destination else ""
        raise Failure(f"no worker{named} answered within {timeout:g} s")
    click.echo(f"{', '.join(answered)} answered")
