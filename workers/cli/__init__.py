"""The `relay` command: workers, runs followed live, approvals, and Flower.

    relay demo                                  # try it: private Redis, a worker, the demo model
    relay --app mymodule:relay worker           # serve an app: every queue, or --queues
    relay --app mymodule:relay run "task"       # start a run and follow it live
    relay web                                   # runs, approvals and /metrics in a browser
    relay runs | status RUN... | show RUN | watch RUN   # a run's state in a line, or whole
    relay pending | approve RUN [CALL] | deny | answer | cancel
    relay extend RUN --usd 1.00                 # raise a run tree's budget
    relay routes                                # the model routes: limits, circuits, errors
    relay tools [--refresh]                     # the tools: risk, idempotent, Python or MCP
    relay mcp [--http PORT] [--allow-decisions] # the fleet as an MCP server
    relay send RUN "text" | pause RUN | resume RUN | reply RUN "next request"
    relay skills list|check PATH                # the Agent Skills in a folder

`--app module:attr` (or RELAY_APP) names the Relay object, before or after the
verb. `worker`, `beat`, `run` and `flower` need it; the verbs that only talk to
runs use it when given and otherwise build a bare Relay from the RELAY_*
settings. With no RELAY_REDIS_URL, `run` and `demo` bring up a private Redis
and one worker for as long as they run (workers.cli.embedded).

Errors of the runtime, of the settings and of the agent core are caught at
this edge: one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

from typing import Any

import click

from agent_core.errors import AgentError
from workers.cli import schedule_control  # registers pause, resume, run, backfill, history
from workers.cli.budget import extend
from workers.cli.common import Context, Failure
from workers.cli.evals import evaluate
from workers.cli.mcp_serve import mcp_serve
from workers.cli.replays import diff, fork, replay
from workers.cli.routes import routes
from workers.cli.runs import (
    answer,
    approve,
    cancel,
    demo,
    deny,
    pending,
    run,
    runs,
    show,
    status,
    watch,
)
from workers.cli.schedule import schedule
from workers.cli.serve import beat, flower, ping, worker
from workers.cli.skills import skills
from workers.cli.steer import pause, reply, resume, send
from workers.cli.terminal import one_line
from workers.cli.tools import tools
from workers.cli.web import web
from workers.errors import RelayError
from workers.settings import SettingsError

__all__ = ["cli", "main"]


class _Group(click.Group):
    """Turns the runtime's, the settings' and the core's errors into one line each."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as error:
            raise _printable(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RelayError, SettingsError, AgentError) as error:
            raise Failure(one_line(str(error))) from None
        except click.ClickException as error:
            if type(error) is not click.ClickException:
                raise _printable(error) from None  # usage errors keep click's format and code
            raise Failure(error.format_message()) from None


def _printable(error: click.ClickException) -> click.ClickException:
    """Return `error` with its message safe to print: it may quote what was typed."""
    # click types `message` as Final; every show() prints it through format_message().
    error.message = one_line(error.message)  # type: ignore[misc]
    return error


@click.group(cls=_Group)
@click.option(
    "--app", envvar="RELAY_APP", metavar="MODULE:ATTR", help="The Relay object (or RELAY_APP)."
)
@click.version_option(package_name="relay-agents", prog_name="relay")
@click.pass_context
def cli(ctx: click.Context, app: str | None) -> None:
    """Relay: run LLM agents on Celery workers, with their state in Redis.

    Try it with `relay demo`: no Redis, no model server, nothing to set up.
    """
    ctx.obj = Context(app)


VERBS = (
    worker,
    beat,
    flower,
    ping,
    web,
    run,
    demo,
    runs,
    show,
    status,
    watch,
    pending,
    approve,
    deny,
    answer,
    cancel,
    extend,
    routes,
    tools,
    mcp_serve,
    send,
    pause,
    resume,
    reply,
    replay,
    fork,
    diff,
)
del schedule_control  # imported for its commands only
for verb in (*VERBS, schedule, skills, evaluate):
    cli.add_command(verb)


def main() -> None:
    """Run the `relay` command."""
    cli(prog_name="relay")
