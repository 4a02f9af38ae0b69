"""`relay web`: the runs, approvals, a JSON API and Prometheus metrics, served by uvicorn."""

from __future__ import annotations

import os

import click

from workers.cli.common import Context, Failure, app_option

__all__ = ["MIN_PASSWORD_CHARS", "web"]

MIN_PASSWORD_CHARS = 8
"""relay web guards approvals of calls that move money: no shorter password starts it."""


def _credentials() -> tuple[str, str]:
    user = os.environ.get("RELAY_WEB_USER", "").strip()
    password = os.environ.get("RELAY_WEB_PASSWORD", "")
    if not user and not password:
        raise Failure(
            "refusing to start relay web without credentials:"
            " set RELAY_WEB_USER and RELAY_WEB_PASSWORD"
        )
    if not (user and password):
        raise Failure("set both RELAY_WEB_USER and RELAY_WEB_PASSWORD")
    if ":" in user:
        raise Failure("RELAY_WEB_USER may not hold ':'")
    if not password.strip():
        raise Failure("RELAY_WEB_PASSWORD is blank: set a password worth guessing")
    if len(password) < MIN_PASSWORD_CHARS:
        raise Failure(f"RELAY_WEB_PASSWORD is shorter than {MIN_PASSWORD_CHARS} characters")
    return user, password


@click.command()
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=5556, show_default=True)
@click.option(
    "--flower-url",
    envvar="RELAY_FLOWER_URL",
    default="",
    help="Flower's address, to link each step to its task (or RELAY_FLOWER_URL).",
)
@app_option
@click.pass_obj
def web(obj: Context, address: str, port: int, flower_url: str) -> None:
    """Start relay web: runs (filtered by state), one run's trace and steps (fork from
    any of them), approvals with Approve (as is, or with edited arguments) and Deny,
    questions answered, budgets raised, Cancel, two runs compared (/diff), the
    schedules and the model routes, a JSON API under /api/ and Prometheus metrics on
    /metrics.

    Every page needs basic auth: RELAY_WEB_USER and RELAY_WEB_PASSWORD (it
    refuses to start without them). It listens on 127.0.0.1 unless --address
    says otherwise; put a proxy with TLS in front of it for other machines.
    RELAY_WEB_SECRET signs approval forms (default: random at each start, so
    forms rendered before a restart are refused; set it when several relay web
    processes serve the same users). --app is optional: without it, relay web
    works on the runs under the RELAY_* settings, but cannot check edited arguments
    (so shows no edit form, and says why), nor fork runs: both need the app's tools.
    """
    import uvicorn  # noqa: PLC0415 - only this verb serves HTTP

    from workers.web import WebSettings, build_app  # noqa: PLC0415

    user, password = _credentials()
    secret = os.environ.get("RELAY_WEB_SECRET", "")
    settings = WebSettings.of(user, password, secret=secret, flower_url=flower_url)
    app = build_app(obj.relay, settings)
    obj.relay.store.ping()
    uvicorn.run(app, host=address, port=port, log_level="info", proxy_headers=False)
