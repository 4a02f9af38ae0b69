"""What the `relay` verbs share: the app they work on, their options and their errors."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click
from rich.text import Text

from agent_core.errors import AgentError
from workers.cli.appload import load_relay
from workers.cli.terminal import json_text, one_line
from workers.errors import RelayError
from workers.relay import Relay
from workers.settings import SettingsError, redact_url

__all__ = [
    "Context",
    "Failure",
    "app_option",
    "json_option",
    "load_app",
    "print_json",
    "row",
    "span",
    "who",
]

F = TypeVar("F", bound=Callable[..., Any])


class Failure(click.ClickException):
    """A bad input or an unreachable service: one line on stderr, exit code 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"relay: {one_line(self.format_message())}", err=True, file=file)


def load_app(spec: str) -> Relay:
    try:
        return load_relay(spec)
    except (RelayError, SettingsError, AgentError):
        raise
    except Exception as error:  # noqa: BLE001 - an app that fails to import is a bad --app
        raise Failure(
            f"--app {spec!r}: importing it failed: {type(error).__name__}: {error}"
        ) from None
    except SystemExit as error:
        raise Failure(f"--app {spec!r}: importing it called exit({error.code})") from None


class Context:
    """What every verb shares: the app spec and, once loaded, its Relay."""

    def __init__(self, app: str | None = None) -> None:
        self.app = app
        self._relay: Relay | None = None

    def spec(self, verb: str) -> str:
        """Return the app spec, which `verb` cannot do without."""
        if not self.app:
            raise Failure(f"`relay {verb}` needs an app: --app module:attr or RELAY_APP")
        return self.app

    @property
    def relay(self) -> Relay:
        """The app's Relay or, with no app given, a bare one on the RELAY_* settings.

        With no RELAY_REDIS_URL it works on the Redis at 127.0.0.1:6379, which may be
        anyone's: it says so, on stderr, naming it."""
        if self._relay is None:
            self._relay = load_app(self.app) if self.app else Relay()
            if self._relay.settings.redis_url is None:
                click.echo(
                    f"relay: RELAY_REDIS_URL is not set: using the Redis at"
                    f" {redact_url(self._relay.redis_url)}",
                    err=True,
                )
        return self._relay


def app_option(fn: F) -> F:
    def remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value:
            ctx.ensure_object(Context).app = value

    option = click.option(
        "--app",
        "app_here",
        metavar="MODULE:ATTR",
        expose_value=False,
        callback=remember,
        help="The Relay object (or RELAY_APP; also accepted before the verb).",
    )
    return option(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")(fn)


def row(*cells: str) -> list[Text]:
    """Table cells as plain, printable text: never read as rich markup or terminal codes."""
    return [Text(one_line(cell)) for cell in cells]


def print_json(value: object) -> None:
    click.echo(json_text(json.dumps(value, ensure_ascii=False)))


def span(seconds: float) -> str:
    """A stretch of time the way a person reads it: 45s, 12m, 3h, 2d."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def who() -> str:
    """Who decides from this shell, for the run's trace: the login name, or ""."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):  # no USER, and no entry in the password database
        return ""
