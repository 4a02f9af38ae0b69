"""`relay eval`: run a suite of cases on the fleet, per model route, and report.

relay eval cases.toml --app mymodule:relay --route small --route large --repeat 3
relay eval --builtin --route local --html report.html
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from workers.cli.common import Context, Failure, app_option, json_option, row
from workers.cli.embedded import Embedded
from workers.cli.live import EXIT_INTERRUPTED, console
from workers.cli.terminal import json_text, one_line
from workers.errors import RelayError
from workers.evals.record import record_case
from workers.evals.report import DEFAULT_ROUTE, RUNS_GONE, Line, Report, build_report
from workers.evals.runner import TrialResult, check_suite, run_suite, trials_of
from workers.evals.suite import (
    BUILTIN_APP,
    Suite,
    builtin_suite,
    builtin_suite_text,
    load_suite,
)
from workers.relay import Relay
from workers.settings import Settings, redact_url

__all__ = ["evaluate"]


class _SuiteFirst(click.Group):
    """`relay eval SUITE ...` runs a suite; `relay eval record RUN` is a subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        elif not args:
            args = ["run"]
        return super().parse_args(ctx, args)


@click.group(cls=_SuiteFirst, name="eval")
def evaluate() -> None:
    """Measure which models can run your agents: `relay eval SUITE` (or --builtin).

    Every case of the suite runs on the fleet (real workers; with no
    RELAY_REDIS_URL a private Redis and a worker start and stop with the command),
    on each route, --repeat times, with the app's real tools: only a case's
    `recorded` tools stand in. Plans, calls and questions are decided by the case,
    never by a person: a call is approved only if its risk is in the suite's
    `approve` list (MONEY also needs --allow-money), else declined, whatever a
    case's config.policy says, and the report says so. Exit status 1 when a case
    falls below its min_pass.
    `relay eval run --help` lists the options.
    """


@evaluate.command(name="run")
@click.argument("suite_file", metavar="SUITE", required=False, type=click.Path(dir_okay=False))
@click.option("--builtin", is_flag=True, help="Run the built-in suite on its offline tools.")
@click.option("--route", "routes", multiple=True, help="A model route (repeatable; default: all).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 1_000))
@click.option("--parallel", default=8, show_default=True, type=click.IntRange(1, 1_000))
@click.option(
    "--timeout",
    default=300.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds a trial may take.",
)
@click.option(
    "--junit", "junit_file", type=click.Path(dir_okay=False), help="Write JUnit XML here."
)
@click.option(
    "--html", "html_file", type=click.Path(dir_okay=False), help="Write an HTML report here."
)
@click.option(
    "--allow-money",
    is_flag=True,
    help="Let the suite approve MONEY calls (it must list money in approve too): they run"
    " for real with the app's tools.",
)
@click.option(
    "--show", is_flag=True, help="Print the suite (with --builtin: the built-in one) and stop."
)
@json_option
@app_option
@click.pass_obj
def run_command(obj: Context, /, suite_file: str | None, **options: Any) -> None:
    """Run SUITE (a TOML file of cases) against the app's routes and report.

    The app's real tools run (a case's `recorded` tools do not). A call is
    approved only when its risk is in the suite's `approve` list (e.g. approve =
    ["read", "create"]; none by default, reads included); MONEY only with
    --allow-money as well. A call of any other risk is asked about, whatever a
    case's config.policy says, and declined; its trial says which and why.

    Prints a table per route and per case (pass rate, model and tool calls,
    tokens, cost, seconds, retries and the ways runs failed), then each failed
    trial with its reasons; --json prints the report as JSON instead; --junit and
    --html write it to files as well.
    """
    suite, app = _chosen(obj, suite_file, builtin=options["builtin"])
    if options["show"]:  # the built-in suite as shipped, to copy; a file as it was read
        shown = builtin_suite_text() if options["builtin"] else None
        click.echo(
            shown or json_text(suite.model_dump_json(indent=2, exclude_defaults=True)), nl=False
        )
        return
    with ExitStack() as stack:
        relay, private = _fleet(obj, app, stack, builtin=options["builtin"])
        report = _run(relay, suite, options, runs_kept=not private)
    _write(report, options)
    sys.exit(1 if report.short else 0)


@evaluate.command(name="record")
@click.argument("run_id", metavar="RUN")
@click.option("--name", help="The case's name (default: run-RUN).")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Add the case to this suite file."
)
@app_option
@click.pass_obj
def record_command(obj: Context, /, run_id: str, name: str | None, output: str | None) -> None:
    """Turn a run that ended into a case: its task, tools, config and answers, and
    every tool call's outcome recorded, so evaluating it touches nothing.

    The case expects the run's stop and the tools it called; add the checks that
    say what right means for it. Printed, or added to the end of --output.
    """
    obj.spec("eval record")
    try:
        text = record_case(obj.relay, run_id, name)
    except RelayError as error:
        raise Failure(str(error)) from None
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "a", encoding="utf-8") as suite:
            suite.write(("\n" if suite.tell() else "") + text)
    except OSError as error:
        raise Failure(f"{output}: cannot write it: {error.strerror or error}") from None
    console(stderr=True).print(Text(f"Added the case to {output}.", style="dim"))


def _chosen(obj: Context, suite_file: str | None, *, builtin: bool) -> tuple[Suite, str]:
    if builtin == (suite_file is not None):
        raise click.UsageError("give a SUITE file or --builtin (one of them)")
    if builtin:
        return builtin_suite(), BUILTIN_APP
    return load_suite(suite_file or ""), obj.spec("eval")


def _fleet(obj: Context, app: str, stack: ExitStack, *, builtin: bool) -> tuple[Relay, bool]:
    """The app's Relay, on a private Redis and worker when no RELAY_REDIS_URL is set
    (then True: the runs go with the Redis when the command ends)."""
    settings = Settings.from_env()  # a bad variable fails before anything starts
    embedded = None
    if settings.redis_url is None:
        if builtin and not os.environ.get("RELAY_EVAL_DIR", "").strip():
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-eval-"))
            os.environ["RELAY_EVAL_DIR"] = folder  # the worker and the after-checks share it
        embedded = stack.enter_context(Embedded(app))
        console(stderr=True).print(
            Text(
                f"Started a private Redis (127.0.0.1:{embedded.port}) and a worker for {app};"
                " both stop when this command ends.",
                style="dim",
            )
        )
    obj.app = app
    relay = obj.relay
    if embedded is not None and relay.redis_url != embedded.redis_url:
        # An app built with its own Settings would send the runs where nobody serves them.
        raise Failure(
            f"{app} does not read RELAY_REDIS_URL (it uses {redact_url(relay.redis_url)}):"
            " build its Relay from the environment, or set RELAY_REDIS_URL and start workers"
        )
    if not relay.has_model:
        raise Failure(
            "no model is configured: set RELAY_MODELS, or RELAY_MODEL_URL (and RELAY_MODEL)"
        )
    return relay, embedded is not None


def _run(relay: Relay, suite: Suite, options: dict[str, Any], *, runs_kept: bool) -> Report:
    routes: list[str | None] = list(options["routes"]) or [r.name for r in relay.routes] or [None]
    try:
        check_suite(relay, suite, routes, allow_money=options["allow_money"])
    except RelayError as error:
        raise Failure(str(error)) from None
    trials = trials_of(suite, routes, options["repeat"])
    with (
        _Stopping(),
        Progress(
            TextColumn("[bold]relay eval[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
            transient=True,
        ) as progress,
    ):
        bar = progress.add_task(escape(one_line(suite.name)), total=len(trials))

        def advanced(result: TrialResult) -> None:
            mark = "passed" if result.verdict.passed else result.verdict.kind
            progress.update(
                bar,
                advance=1,
                # (the suite's name is the file's: not markup, nothing a terminal acts on)
                description=escape(one_line(f"{suite.name}: {result.trial.case.name} {mark}")),
            )

        results = run_suite(
            relay,
            trials,
            parallel=options["parallel"],
            timeout=options["timeout"],
            allow_money=options["allow_money"],
            on_result=advanced,
        )
    return build_report(suite.name, results, runs_kept=runs_kept)


class _Stopping:
    """How a suite that cannot go on ends: one line, and the runs in flight cancelled
    (by `run_suite`); Ctrl-C exits 130."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _tb: object
    ) -> None:
        if isinstance(error, KeyboardInterrupt):
            click.echo("relay eval: interrupted; the runs in flight were cancelled", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(error, RelayError):
            raise Failure(f"{error}; the runs in flight were cancelled") from None


def _write(report: Report, options: dict[str, Any]) -> None:
    for path, text in ((options["junit_file"], report.junit), (options["html_file"], report.html)):
        if path:
            try:
                Path(path).write_text(text(), encoding="utf-8")
            except OSError as error:
                raise Failure(f"{path}: cannot write it: {error.strerror or error}") from None
    if options["as_json"]:
        click.echo(json_text(report.as_json()))
        return
    out = console()
    if not out.is_terminal:
        out.width = 160  # a log or a pipe: whole rows, not cells folded to 80 columns
    out.print(_table("Routes", report.routes))
    out.print(_table("Cases", report.cases))
    _print_failed(out, report)
    for line in report.short:
        out.print(
            Text(
                one_line(
                    f"{line.case} on {line.route}: {line.pass_rate:.0%}"
                    f" < min_pass {line.min_pass:.0%}"
                ),
                "red",
            )
        )


def _print_failed(out: Console, report: Report) -> None:
    """Each failed trial: its kind, every reason (the run's stop and message, the tool
    names it invented, the calls declined) and its runs, or that they are gone; then
    the trials that passed with calls declined. What the models, tools and runs wrote
    is printed one line a reason, nothing in it a terminal acts on (`one_line`)."""
    if report.failed:
        out.print(Text("Failed trials", style="bold"))
    if report.failed and not report.runs_kept:
        out.print(Text(f"({RUNS_GONE}: what it said is below)", style="dim"))
    for result in report.failed:
        out.print(Text(one_line(f"{_named(result)}: {result.verdict.kind}"), "red"))
        for reason in result.verdict.why:
            out.print(Text(f"    {one_line(reason)}"), soft_wrap=True)  # (whole, to grep or copy)
        if report.runs_kept and result.runs:
            out.print(Text(f"    runs: {one_line(', '.join(result.runs))}", style="dim"))
    for result in report.results:  # (a trial that passed may have had calls declined too)
        if result.verdict.passed and result.facts.declined:
            out.print(Text(one_line(f"{_named(result)}: passed"), "yellow"))
            for declined in result.facts.declined:
                out.print(Text(f"    {one_line(declined)}"), soft_wrap=True)


def _named(result: TrialResult) -> str:
    trial = result.trial
    return f"{trial.case.name} #{trial.repeat} on {trial.route or DEFAULT_ROUTE}"


def _table(title: str, lines: tuple[Line, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for head in (
        "route",
        "case",
        "pass",
        "model calls",
        "tool calls",
        "tokens",
        "cost",
        "s",
        "retries",
        "failed as",
    ):
        table.add_column(
            head, justify="left" if head in ("route", "case", "failed as") else "right"
        )
    for line in lines:
        failures = ", ".join(f"{kind} x{n}" for kind, n in line.failures.items()) or "-"
        table.add_row(
            *row(
                line.route,
                line.case or "all",
                f"{line.passed}/{line.trials} {line.pass_rate:.0%}",
                f"{line.model_calls:.1f}",
                f"{line.tool_calls:.1f}",
                f"{line.tokens:,.0f}",
                f"${line.cost_usd:.6f}",
                f"{line.seconds:.1f}",
                f"{line.retries} ({line.invented} invented)",
                failures,
            ),
            style="red" if line.short else None,
        )
    return table
