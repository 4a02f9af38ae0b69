"""The verbs that go back into runs: `replay` (offline, or every parked run before an
upgrade), `fork` (a new run from a step) and `diff` (two runs side by side)."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from workers.cli.common import Context, Failure, app_option, json_option, print_json, row
from workers.cli.live import console, cost_text
from workers.cli.terminal import one_line
from workers.client.replays import Diff, ReplayReport
from workers.errors import RelayError

__all__ = ["diff", "fork", "replay"]

EXIT_DIVERGED = 1
"""`relay replay`'s exit status when a run replays otherwise, or cannot be replayed."""


@click.command()
@click.argument("run_id", required=False)
@click.option(
    "--waiting",
    is_flag=True,
    help="Replay every run that is running or parked (before an upgrade).",
)
@json_option
@app_option
@click.pass_obj
def replay(obj: Context, run_id: str | None, waiting: bool, as_json: bool) -> None:
    """Play a run's journal back with this code, offline: no model, no tool, nothing written.

    Exit 0 when every step is the one the run took; 1 at the first divergence (its step,
    then and now, and why) or when a run cannot be replayed. A tool whose risk or
    idempotency changed since the run started is a divergence too ("tool pay: risk
    WRITE -> READ"): a call may no longer ask, or may run again. With --waiting, every
    run that is running or parked: run it with the new code before the old workers stop.
    """
    if waiting == (run_id is not None):
        raise Failure("give a RUN_ID, or --waiting (not both)")
    obj.spec("replay")  # the app's tools and code are what is checked
    reports = obj.relay.replay_waiting() if waiting else [obj.relay.replay(run_id or "")]
    if as_json:
        print_json(
            [r.model_dump(mode="json") for r in reports]
            if waiting
            else reports[0].model_dump(mode="json")
        )
    else:
        for report in reports:
            click.echo(_line(report))
        if waiting and not reports:
            click.echo("No run is running or parked: nothing to replay.")
        elif waiting:
            same = sum(r.identical for r in reports)
            unchecked = sum(r.identical and r.unchecked is not None for r in reports)
            blind = f" ({unchecked} of them unchecked for changed risks)" if unchecked else ""
            click.echo(f"{same} of {len(reports)} runs replay identically{blind}.")
    if not all(r.identical for r in reports):
        sys.exit(EXIT_DIVERGED)


def _line(report: ReplayReport) -> str:
    run = one_line(report.run_id)
    if report.problem is not None:
        return f"{run}: cannot be replayed: {one_line(report.problem)}"
    if report.identical:
        unchecked = f"; but {report.unchecked}" if report.unchecked else ""
        return f"{run}: identical, {report.steps} steps ({report.state}){unchecked}"
    d = report.divergence
    assert d is not None
    then, now = one_line(d.recorded) or "-", one_line(d.now) or "(raised)"
    where = f"step {d.step} of {report.steps}"
    return f"{run}: diverges at {where}: {then} then, {now} now: {one_line(d.why)}"


@click.command()
@click.argument("run_id")
@click.option("--at", "at", type=int, required=True, help="Journal steps of the run to keep.")
@click.option("--route", "routes", multiple=True, help="A model route for the rest (repeatable).")
@click.option(
    "--stub-tools", is_flag=True, help="Hand identical tool calls their recorded outcome."
)
@click.option("--max-calls", type=int, help="The fork's max_calls.")
@click.option("--max-batch", type=int, help="The fork's max_batch.")
@click.option("--task", help="A new request, begun after the run's end (fork at its last step).")
@json_option
@app_option
@click.pass_obj
def fork(
    obj: Context,
    *,
    run_id: str,
    at: int,
    routes: tuple[str, ...],
    stub_tools: bool,
    max_calls: int | None,
    max_batch: int | None,
    task: str | None,
    as_json: bool,
) -> None:
    """Start a new run from a run's state after its first AT journal steps.

    The prefix is replayed (no model call, no tool call); the rest runs live on the fleet,
    with its own approvals and budget (a time budget counts from the fork). --stub-tools:
    a tool call identical (tool and arguments) to one the original made gets its recorded
    outcome, marked stubbed, and nothing runs; one whose outcome was unknown gets an
    error saying so, and does not run either.
    """
    obj.spec("fork")
    changes = {
        k: v for k, v in (("max_calls", max_calls), ("max_batch", max_batch)) if v is not None
    }
    try:
        new_id = obj.relay.fork(
            run_id, at, route=routes or None, config=changes or None, stub_tools=stub_tools,
            task=task,
        )  # fmt: skip
    except RelayError as error:
        raise Failure(str(error)) from None
    if as_json:
        print_json({"run_id": new_id, "forked_from": {"run": run_id, "step": at}})
    else:
        click.echo(f"Forked run {one_line(run_id)} at step {at}: run {new_id}.")
        click.echo(f"Follow it with: relay watch {new_id}")


@click.command()
@click.argument("a")
@click.argument("b")
@json_option
@app_option
@click.pass_obj
def diff(obj: Context, a: str, b: str, as_json: bool) -> None:
    """Two runs side by side, step by step: what differs at each step that does (the
    first marked), how each ended, tokens, cost."""
    try:
        found = obj.relay.diff(a, b)
    except RelayError as error:
        raise Failure(str(error)) from None
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    _print_diff(found)


def _print_diff(found: Diff) -> None:
    sides = Table(show_header=True, header_style="bold")
    for column in ("run", "outcome", "steps", "tool calls", "tokens", "cost", "forked from"):
        sides.add_column(column)
    for side in (found.a, found.b):
        origin = f"{side.forked_from.run} @ {side.forked_from.step}" if side.forked_from else ""
        sides.add_row(
            *row(
                side.run_id, side.stop or side.state, str(side.steps), str(side.tool_calls),
                f"{side.usage.total_tokens:,}", cost_text(side.usage), origin,
            )
        )  # fmt: skip
    console().print(sides)
    steps = Table(show_header=True, header_style="bold")
    for column in ("step", found.a.run_id, found.b.run_id, ""):
        steps.add_column(one_line(column))
    for line in found.rows:
        first = "first difference: " if line.step == found.first_difference else ""
        mark = "" if line.same else first + line.differs
        steps.add_row(*row(str(line.step), line.a or "-", line.b or "-", mark))
    console().print(steps)
    if found.first_difference is None:
        console().print("The same steps, as far as both went.")
