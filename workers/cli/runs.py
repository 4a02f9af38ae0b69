"""The verbs about runs: `run` and `demo` (followed live), `runs`, `show`, `watch`,
and the people in the loop: `pending`, `approve`, `deny`, `answer`, `cancel`."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import click
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_core.text import counted
from scheduler.schedules import local_iso
from workers.cli.budget import budget_from, budget_options
from workers.cli.common import (
    Context,
    Failure,
    app_option,
    json_option,
    print_json,
    row,
    span,
    who,
)
from workers.cli.embedded import Embedded
from workers.cli.live import (
    EXIT_INTERRUPTED,
    Deciding,
    Follower,
    console,
    cost_cell,
    cost_text,
    describe,
    usage_line,
)
from workers.cli.terminal import json_text, one_line, printable, whole_args
from workers.client.runs import page_cursor
from workers.engine.budget import Budget
from workers.engine.records import RUN_FILTERS, Pending, RunStatus, run_list
from workers.errors import DecisionRefused
from workers.relay import Relay
from workers.settings import Settings, redact_url

__all__ = [
    "answer",
    "approve",
    "cancel",
    "demo",
    "deny",
    "pending",
    "run",
    "runs",
    "show",
    "status",
    "watch",
]

DEMO_APP = "workers.cli.demo:relay"
MAX_ARGS_FILE_CHARS = 1_000_000
"""Edited arguments read from --args-file at most (more is not JSON we take)."""
DEMO_TASK = "Look through my notes and write a short summary of the meeting notes to summary.md."

# --- run and demo ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """One run to start and follow, and how."""

    app: str
    task: str
    context: str
    policy: Deciding
    as_json: bool = False
    worker_env: dict[str, str] | None = None
    budget: Budget | None = None


def _start_and_follow(obj: Context, job: _Job, stack: ExitStack) -> int:
    """Start the run (with the embedded default if no Redis is set); return the exit code."""
    out = console(stderr=job.as_json)
    embedded = None
    if not os.environ.get("RELAY_REDIS_URL", "").strip():
        Settings.from_env()  # a bad variable fails before anything starts
        embedded = stack.enter_context(Embedded(job.app, env=job.worker_env))
        out.print(
            Text(
                f"Started a private Redis (127.0.0.1:{embedded.port}) and a worker for"
                f" {job.app}; both stop when this command ends.",
                style="dim",
            )
        )
    obj.app = job.app
    relay = obj.relay
    if embedded is not None and relay.redis_url != embedded.redis_url:
        # An app built with its own Settings would send the run somewhere nobody serves.
        raise Failure(
            f"{job.app} does not read RELAY_REDIS_URL (it uses {redact_url(relay.redis_url)}):"
            " build its Relay from the environment, or set RELAY_REDIS_URL and start workers"
        )
    if embedded is not None and not relay.has_model:
        # The private worker has this environment: every model call would fail.
        raise Failure(
            "no model is configured: set RELAY_MODEL_URL (and RELAY_MODEL), or RELAY_MODELS,"
            f" or give {job.app}'s Relay a model (`relay demo` needs none)"
        )
    started = time.monotonic()
    run_id = relay.start(job.task, job.context, budget=job.budget)
    out.print(Text(f"Run {run_id} started.", style="dim"))
    follow = Follower(relay, run_id, job.policy, embedded=embedded, app=job.app, quiet=job.as_json)
    try:
        status = follow.follow()
    except KeyboardInterrupt:
        return follow.interrupted()
    if job.as_json:
        click.echo(json_text(status.model_dump_json()))
    return follow.conclude(status, started)


@click.command()
@click.argument("task")
@click.option("--context", default="", help="Background the agent should know.")
@click.option("--yes", "approve_all", is_flag=True, help="Approve every plan and call.")
@click.option("--deny", "deny_all", is_flag=True, help="Decline every plan and call.")
@budget_options
@json_option
@app_option
@click.pass_obj
def run(
    obj: Context,
    *,
    task: str,
    context: str,
    approve_all: bool,
    deny_all: bool,
    as_json: bool,
    budget_tokens: int | None,
    budget_usd: float | None,
    budget_calls: int | None,
    deadline: float | None,
) -> None:
    """Start a run and follow it live: the plan, each call and its result, usage at the end.

    In a terminal, plans, risky calls and questions are asked at the prompt;
    otherwise `run` prints how to decide from another shell and keeps waiting
    (or --yes / --deny decide everything). Ctrl-C asks whether to cancel the
    run or leave it running. With no RELAY_REDIS_URL, a private Redis and one
    worker serve the run and stop with the command. With --json, the run's
    final status is printed as JSON (progress goes nowhere, hints to stderr).

    Exit status: 0 when the run did its task, 1 when it stopped otherwise
    (declined, cancelled, failed), 130 after Ctrl-C.

    A budget caps the whole run tree: at a token, dollar or model-call limit it
    waits until `relay extend RUN ...`; at --deadline it stops.
    """
    if approve_all and deny_all:
        raise click.UsageError("--yes and --deny exclude each other")
    mode: Literal["ask", "yes", "no"] = "yes" if approve_all else "no" if deny_all else "ask"
    why = "--yes" if approve_all else "--deny" if deny_all else ""
    budget = budget_from(budget_tokens, budget_usd, budget_calls, deadline)
    job = _Job(obj.spec("run"), task, context, Deciding(mode, why), as_json, budget=budget)
    with ExitStack() as stack:
        code = _start_and_follow(obj, job, stack)
    sys.exit(code)


@click.command()
@click.option("--ask", is_flag=True, help="Decide the plan and the write yourself.")
@click.option("--task", help="What to ask of the agent (default: summarise the meeting notes).")
@click.pass_obj
def demo(obj: Context, ask: bool, task: str | None) -> None:
    """Watch an agent summarise a folder of notes: nothing to set up, no network.

    With no RELAY_REDIS_URL, a private Redis and a worker start and stop with
    the command. With no RELAY_MODEL_URL, the built-in demo model plays the
    model's part, offline. The plan and the note it writes need approval;
    the demo gives it, saying so, unless you pass --ask. With RELAY_REDIS_URL
    set, the run goes to that Redis, whose workers must serve workers.cli.demo:relay
    (as docker-compose.yml's do).
    """
    out = console()
    settings = Settings.from_env()
    out.print(Text("Relay demo: an agent reads a folder of notes and writes a summary.", "bold"))
    if settings.model_url is None:
        out.print(
            "Model: the demo model, built in: offline and scripted."
            " Set RELAY_MODEL_URL to use a real model."
        )
    else:
        out.print(Text(one_line(f"Model: {settings.model} at {redact_url(settings.model_url)}")))
    why = "the demo approves by itself; pass --ask to decide"
    policy = Deciding("ask", "") if ask else Deciding("yes", why)
    with ExitStack() as stack:
        env: dict[str, str] = {}
        notes: Path | None = None
        if not os.environ.get("RELAY_REDIS_URL", "").strip():
            notes = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-notes-")))
            env["RELAY_DEMO_DIR"] = str(notes)
        code = _start_and_follow(
            obj, _Job(DEMO_APP, task or DEMO_TASK, "", policy, worker_env=env), stack
        )
        written = notes / "summary.md" if notes is not None else None
        if written is not None and written.is_file():
            # The note is the model's text: printed as it is, never as markup or terminal codes.
            note = Text(printable(written.read_text(errors="replace").strip()))
            out.print(Panel(note, title="summary.md"))
    sys.exit(code)


# --- looking at runs ---------------------------------------------------------------------


def _age(ms: int | None) -> str:
    if ms is None:
        return ""
    return f"{span(time.time() - ms / 1000)} ago"


_LIST_STYLES = {
    "running": "blue",
    "waiting": "yellow",
    "done": "green",
    "failed": "bold red",
    "cancelled": "dim",
    "declined": "magenta",
}


def _state(status: RunStatus) -> Text:
    """`failed: no progress`, `plan declined`, `waiting, for call`, ... in the list's
    colour, with a warning when a call's outcome is unknown."""
    which = run_list(status.state, status.outcome)
    if status.outcome is not None:
        label = status.outcome.stop.label()
        # The ending said once: `cancelled`, `plan declined`, `the model call failed`, but
        # `failed: no progress` (never `cancelled: cancelled`, `declined: plan declined`).
        words = label if which in label.split() else f"{which}: {label}"
    elif status.waiting_for:
        words = f"{status.state}, for {status.waiting_for}"
    else:
        words = status.state
    text = Text(words, style=_LIST_STYLES[which])
    if status.unknown_calls:
        text.append(f" ⚠ {status.unknown_calls} unknown", style="bold magenta")
    return text


@click.command()
@click.option("--limit", "-n", type=click.IntRange(1, 10_000), default=20, show_default=True)
@click.option(
    "--state",
    type=click.Choice(RUN_FILTERS),
    default=None,
    help="Only runs in this state, or that ended so (finished: any ending).",
)
@click.option("--before", default="", metavar="CURSOR", help="Runs older than this page cursor.")
@json_option
@app_option
@click.pass_obj
def runs(obj: Context, limit: int, state: str | None, before: str, as_json: bool) -> None:
    """List the newest runs (specialists' runs included): state, tokens, cost, task.

    The filter is applied before the limit: `--state waiting -n 20` shows the 20 newest
    waiting runs however many newer runs finished since. The last line gives the cursor
    of the next page (`--before`)."""
    relay = obj.relay  # outside the try: a bad RELAY_* setting is not the cursor's fault
    try:
        found = relay.runs(limit, state or "", before)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--before") from None
    if as_json:
        print_json([status.model_dump(mode="json") for status in found])
        return
    out = console()
    if not found:
        out.print(f"No {state} runs." if state else "No runs.")
        return
    spent = any(status.total_usage.model_calls for status in found)  # else no cost column
    table = Table(box=None, header_style="bold")
    table.add_column("run", no_wrap=True)
    for header in ("state", "tokens", *(["cost"] if spent else []), "started", "task"):
        table.add_column(header)
    for status in found:
        usage = status.total_usage
        cost = [cost_cell(usage)] if spent else []
        cells = [f"{usage.total_tokens:,}", *cost, _age(status.created_ms)]
        table.add_row(*row(status.id), _state(status), *row(*cells, one_line(status.task, 60)))
    out.print(table)
    total = relay.count_runs(state or "")
    more = f"; older: --before {page_cursor(found[-1])}" if len(found) == limit else ""
    out.print(f"{len(found):,} of {total:,} {state + ' ' if state else ''}runs{more}")


@click.command()
@click.argument("run_id")
@json_option
@app_option
@click.pass_obj
def show(obj: Context, run_id: str, as_json: bool) -> None:
    """Show one run: its state, outcome, usage, what it waits for, and its trace."""
    relay = obj.relay
    status = relay.status(run_id)
    trace = relay.trace(run_id)
    if as_json:
        print_json(
            {
                "status": status.model_dump(mode="json"),
                "trace": [entry.model_dump(mode="json") for entry in trace],
            }
        )
        return
    out = console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, str | Text]] = [
        ("run", status.id),
        ("task", one_line(status.task, 300)),
        ("state", _state(status)),
        ("parent", status.parent or ""),
        ("children", ", ".join(status.children)),
        ("started by", _started_by(relay, status)),
        ("tokens", usage_line(status.total_usage)),
        ("cost", cost_text(status.total_usage) if status.total_usage.model_calls else ""),
        ("budget", status.budget.describe() if status.budget is not None else ""),
        ("started", _age(status.created_ms)),
        ("finished", _age(status.finished_ms)),
        ("outcome", one_line(status.outcome.summary, 300) if status.outcome else ""),
    ]
    for name, value in rows:
        if value:
            grid.add_row(*row(name), value if isinstance(value, Text) else row(value)[0])
    for pending in status.pending:
        grid.add_row(*row("waits on", _pending_line(pending)))
    out.print(grid)
    for pending in status.pending:
        if pending.kind == "call":
            _print_call_whole(out, pending)
    out.print(Text("trace:", style="bold"))
    for entry in trace:
        line = describe(entry, run_id)
        if line is not None:
            out.print(Text("  ") + line)


@click.command()
@click.argument("run_ids", metavar="RUN...", nargs=-1, required=True)
@json_option
@app_option
@click.pass_obj
def status(obj: Context, run_ids: tuple[str, ...], as_json: bool) -> None:
    """Say in one line each where runs stand: their state (how they ended, or what they
    wait for), tokens, and what waits on a person. For scripts and a quick look;
    `relay show RUN` gives the whole run and its trace."""
    relay = obj.relay
    found = [relay.status(run_id) for run_id in run_ids]
    if as_json:
        print_json([one.model_dump(mode="json") for one in found])
        return
    out = console()
    for one in found:
        line = Text(one_line(one.id, 80) + "  ") + _state(one)
        line.append(f"  {counted(one.total_usage.total_tokens, 'token')}", style="dim")
        for waiting in one.pending:
            line.append(f"  · waits on {_pending_line(waiting)}")
        out.print(line)


@click.command()
@click.argument("run_id")
@json_option
@app_option
@click.pass_obj
def watch(obj: Context, run_id: str, as_json: bool) -> None:
    """Follow a run and its specialists live until it finishes (Ctrl-C stops watching).

    With --json, one JSON object per trace entry, one per line.
    """
    relay = obj.relay
    try:
        if as_json:
            for entry in relay.watch(run_id):
                click.echo(json_text(entry.model_dump_json()))
            return
        follow = Follower(relay, run_id, Deciding("watch"), app=obj.app)
        status = follow.follow()
        console().print(Text(usage_line(status.total_usage), style="dim"))
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


# --- people in the loop ---------------------------------------------------------------------------


def _print_call_whole(out: Console, pending: Pending) -> None:
    """A pending call's arguments, every character of them: what an approval approves."""
    shown = whole_args(pending.args)
    risk = pending.risk.value if pending.risk is not None else "?"
    what = f"{pending.run_id} {pending.call_id}: {pending.tool} (risk {risk})"
    head = f"{what}, {len(shown):,} characters:"
    out.print(Text(one_line(head), style="bold"))
    out.print(Text(shown))


def _pending_line(pending: Pending) -> str:
    if pending.kind == "plan":
        steps = [s for s in pending.summary.splitlines() if s.strip()]
        return "plan: " + one_line(" ".join(f"{n}. {s}" for n, s in enumerate(steps, 1)), 200)
    if pending.kind == "question":
        return "question: " + one_line(pending.summary, 200)
    if pending.kind == "budget":
        return "budget: " + one_line(pending.summary, 300)
    return f"{pending.call_id}: {one_line(pending.summary, 200)}"


@click.command()
@click.option("--run", "run_id", help="Only what this run (or its specialists) waits on.")
@json_option
@app_option
@click.pass_obj
def pending(obj: Context, run_id: str | None, as_json: bool) -> None:
    """List what waits on a person: plans, calls, questions and spent budgets, oldest first."""
    found = [p for p in obj.relay.pending() if run_id is None or run_id in (p.run_id, p.root_id)]
    if as_json:
        print_json([p.model_dump(mode="json") for p in found])
        return
    out = console()
    if not found:
        out.print("Nothing waits on a person.")
        return
    table = Table("run", "kind", "call", "risk", "waiting", "what", box=None, header_style="bold")
    for p in found:
        risk = p.risk.value if p.risk is not None else ""
        table.add_row(
            *row(p.run_id, p.kind, p.call_id or "", risk, _age(p.created_ms), _pending_line(p))
        )
    out.print(table)
    for p in found:
        if p.kind == "call":
            _print_call_whole(out, p)
    hint = "Decide with: relay approve RUN [CALL] · relay deny RUN [CALL]"
    if any(p.kind == "budget" for p in found):
        hint += " · a budget: relay extend RUN --usd X (or --tokens, --calls, --seconds)"
    out.print(Text(hint, style="dim"))


def _decide(relay: Relay, run_id: str, call_id: str | None, yes: bool, reason: str) -> str:
    """Decide the plan (no call given) or a call; return what was decided, for the message."""
    if call_id is not None and call_id != "plan":
        relay.approve(run_id, call_id, yes, reason=reason, by=who())
        return f"{call_id} of run {run_id}"
    try:
        relay.approve_plan(run_id, yes, by=who())
    except DecisionRefused as error:
        calls = [p.call_id for p in relay.status(run_id).pending if p.kind == "call"]
        if calls:
            verb = "approve" if yes else "deny"
            raise DecisionRefused(
                f"{error}; it waits on {', '.join(map(str, calls))}:"
                f" relay {verb} {run_id} {calls[0]}"
            ) from None
        raise
    return f"the plan of run {run_id}"


@click.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@click.option(
    "--args-file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Approve the call with these arguments instead (a JSON object; - reads stdin),"
    " checked against the tool as the model's were: needs the run's app (--app or"
    " RELAY_APP), whose tool checks them.",
)
@app_option
@click.pass_obj
def approve(obj: Context, run_id: str, call_id: str | None, args_file: TextIO | None) -> None:
    """Approve a call (RUN CALL) or, with no CALL, the plan a run waits on.

    With --args-file, approve the call with edited arguments: that needs the run's app
    (--app module:attr, or RELAY_APP), whose tool checks them as it checked the model's.
    """
    if args_file is None:
        what = _decide(obj.relay, run_id, call_id, True, "")
        click.echo(f"Approved {one_line(what)}.")
        return
    if call_id is None or call_id == "plan":
        raise click.UsageError("--args-file edits a call: name it (relay approve RUN CALL)")
    _check_editing_app(obj, run_id)
    try:
        args = json.loads(args_file.read(MAX_ARGS_FILE_CHARS + 1))
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--args-file") from None
    if not isinstance(args, dict):
        raise click.BadParameter("a JSON object, {...}", param_hint="--args-file")
    obj.relay.approve(run_id, call_id, True, args=args, by=who())
    click.echo(f"Approved {one_line(call_id)} of run {one_line(run_id)} with edited arguments.")


def _check_editing_app(obj: Context, run_id: str) -> None:
    """Refuse an edit, in one line, unless --app names the run's own app: its tool is what
    checks edited arguments, and a run records its app's name, not where to import it."""
    relay = obj.relay
    found = relay.store.read(run_id)
    if found is None:
        relay.status(run_id)  # raises RunNotFound, worded as every verb words it
        return
    owner = found[0].app
    theirs = f"the app {owner!r}" if owner else "its app"
    if not obj.app:
        raise Failure(
            f"--args-file needs --app (or RELAY_APP): the module:attr of {theirs}, which"
            f" runs {run_id} and whose tool checks the edited arguments"
        )
    if owner and owner != relay.name:
        raise Failure(
            f"run {run_id} belongs to {theirs}, not to {relay.name!r}: give --app the"
            f" module:attr of {owner!r}, whose tool checks the edited arguments"
        )


@click.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@click.option("--reason", default="", help="Why not; the model is told.")
@app_option
@click.pass_obj
def deny(obj: Context, run_id: str, call_id: str | None, reason: str) -> None:
    """Decline a call (RUN CALL) or, with no CALL, the plan a run waits on."""
    what = _decide(obj.relay, run_id, call_id, False, reason)
    click.echo(f"Declined {one_line(what)}.")


@click.command()
@click.argument("run_id")
@click.argument("text")
@app_option
@click.pass_obj
def answer(obj: Context, run_id: str, text: str) -> None:
    """Answer the question a run waits on (the trace says who: the login name)."""
    obj.relay.answer(run_id, text, by=who())
    click.echo(f"Answered run {one_line(run_id)}.")


@click.command()
@click.argument("run_id")
@click.option("--reason", default="", help="Why; it goes into the run's outcome.")
@app_option
@click.pass_obj
def cancel(obj: Context, run_id: str, reason: str) -> None:
    """Stop a run, parked or working, and its specialists."""
    if obj.relay.cancel(run_id, reason):
        click.echo(f"Cancelling run {one_line(run_id)} (its specialists stop too).")
    else:
        click.echo(f"Run {one_line(run_id)} had finished already.")


def _started_by(relay: Relay, status: RunStatus) -> str:
    """ "schedule X, firing at T" (T on the schedule's clock; UTC once it is gone)."""
    if not status.schedule:
        return ""
    if status.fired_ms is None:
        return f"schedule {status.schedule}"
    found = relay.scheduling.get(status.schedule)
    fired = found.local_time(status.fired_ms) if found else local_iso(status.fired_ms, 0)
    return f"schedule {status.schedule}, firing at {fired}"
