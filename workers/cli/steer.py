"""The verbs that steer a run while it works: `send`, `pause`, `resume`, `reply`."""

from __future__ import annotations

from typing import cast

import click

from workers.cli.common import Context, app_option
from workers.cli.terminal import one_line
from workers.engine.records import ReplyStrategy

__all__ = ["pause", "reply", "resume", "send"]


@click.command()
@click.argument("run_id")
@click.argument("text")
@app_option
@click.pass_obj
def send(obj: Context, run_id: str, text: str) -> None:
    """Tell a run something: the model sees it at its next call (even after a wait)."""
    obj.relay.send(run_id, text)
    click.echo(f"Sent to run {one_line(run_id)}; the model sees it at its next call.")


@click.command()
@click.argument("run_id")
@app_option
@click.pass_obj
def pause(obj: Context, run_id: str) -> None:
    """Pause a run and its specialists at their next step (calls under way finish)."""
    if obj.relay.pause(run_id):
        click.echo(f"Pausing run {one_line(run_id)}; relay resume {one_line(run_id)} goes on.")
    else:
        click.echo(f"Run {one_line(run_id)} had finished already.")


@click.command()
@click.argument("run_id")
@app_option
@click.pass_obj
def resume(obj: Context, run_id: str) -> None:
    """Let a paused run (and its specialists) go on."""
    if obj.relay.resume(run_id):
        click.echo(f"Resuming run {one_line(run_id)}.")
    else:
        click.echo(f"Run {one_line(run_id)} had finished already.")


@click.command()
@click.argument("run_id")
@click.argument("text")
@click.option(
    "--strategy",
    type=click.Choice(["enqueue", "reject", "interrupt"]),
    default="enqueue",
    show_default=True,
    help="If the run still works: begin after this turn, refuse, or stop this turn now.",
)
@app_option
@click.pass_obj
def reply(obj: Context, run_id: str, text: str, strategy: str) -> None:
    """Continue a run with a new request: a new turn that keeps its history.

    A finished run takes it at once; follow it with `relay watch RUN`.
    """
    obj.relay.reply(run_id, text, cast(ReplyStrategy, strategy))
    click.echo(f"Replied to run {one_line(run_id)} ({strategy}).")
