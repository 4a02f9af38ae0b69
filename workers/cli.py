"""The `relay` command: workers, runs followed live, approvals, and Flower.

    relay demo                                  # try it: private Redis, a worker, the demo model
    relay --app mymodule:relay worker           # serve an app: every queue, or --queues
    relay --app mymodule:relay run "task"       # start a run and follow it live
    relay runs | show RUN | watch RUN | pending | approve RUN [CALL] | deny | answer | cancel

`--app module:attr` (or RELAY_APP) names the Relay object, before or after the
verb. `worker`, `beat`, `run` and `flower` need it; the verbs that only talk to
runs use it when given and otherwise build a bare Relay from the RELAY_*
settings. With no RELAY_REDIS_URL, `run` and `demo` bring up a private Redis
and one worker for as long as they run (workers.embedded).

Errors of the runtime, of the settings and of the agent core are caught at
this edge: one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Confirm, Prompt
from rich.status import Status
from rich.table import Table
from rich.text import Text

from agent_core import Stop
from agent_core.errors import AgentError
from workers.appload import load_relay
from workers.embedded import Embedded
from workers.errors import DecisionRefused, RelayError
from workers.model_client import Usage
from workers.records import Pending, RunStatus, TraceEntry
from workers.relay import Relay
from workers.settings import Settings, SettingsError, redact_url

__all__ = ["cli", "main"]

DEMO_APP = "workers.demo:relay"
DEMO_TASK = "Look through my notes and write a short summary of the meeting notes to summary.md."
EXIT_STOPPED = 1
"""`run` and `demo`: the run ended without doing its task (declined, cancelled, failed)."""
EXIT_INTERRUPTED = 130
QUIET_SECONDS = 15.0
"""After this long without a trace line, `run` and `watch` ask whether a worker is up."""
FINAL_CHARS = 4_000
ASKS = frozenset({"plan", "waiting", "question"})
"""Trace kinds written in the same save that parks a run on a person."""

F = TypeVar("F", bound=Callable[..., Any])


class _Failure(click.ClickException):
    """A bad input or an unreachable service: one line on stderr, exit code 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"relay: {self.format_message()}", err=True, file=file)


def _one_line(text: str, limit: int = 0) -> str:
    line = " ".join(str(text).split())
    return line if not limit or len(line) <= limit else line[: limit - 1] + "…"


def _load(spec: str) -> Relay:
    try:
        return load_relay(spec)
    except (RelayError, SettingsError, AgentError):
        raise
    except Exception as error:  # noqa: BLE001 - an app that fails to import is a bad --app
        raise _Failure(
            f"--app {spec!r}: importing it failed: {type(error).__name__}: {error}"
        ) from None
    except SystemExit as error:
        raise _Failure(f"--app {spec!r}: importing it called exit({error.code})") from None


class _Context:
    """What every verb shares: the app spec and, once loaded, its Relay."""

    def __init__(self, app: str | None = None) -> None:
        self.app = app
        self._relay: Relay | None = None

    def spec(self, verb: str) -> str:
        """Return the app spec, which `verb` cannot do without."""
        if not self.app:
            raise _Failure(f"`relay {verb}` needs an app: --app module:attr or RELAY_APP")
        return self.app

    @property
    def relay(self) -> Relay:
        """The app's Relay or, with no app given, a bare one on the RELAY_* settings."""
        if self._relay is None:
            self._relay = _load(self.app) if self.app else Relay()
        return self._relay


class _Group(click.Group):
    """Turns the runtime's, the settings' and the core's errors into one line each."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (RelayError, SettingsError, AgentError) as error:
            raise _Failure(_one_line(str(error))) from None


def _app_option(fn: F) -> F:
    def remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value:
            ctx.ensure_object(_Context).app = value

    option = click.option(
        "--app",
        "app_here",
        metavar="MODULE:ATTR",
        expose_value=False,
        callback=remember,
        help="The Relay object (or RELAY_APP; also accepted before the verb).",
    )
    return option(fn)


def _json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")(fn)


def _console(*, stderr: bool = False) -> Console:
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


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
    ctx.obj = _Context(app)


# --- serving: worker, beat, flower ------------------------------------------------------


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
@click.option("--hostname", "-n", help="Worker name (default: relay-<app>@<host>).")
@_app_option
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
    """Start a worker that consumes every Relay queue (or those given).

    Model calls wait on the network: give them a threads pool with many
    threads (`--queues model --pool threads -c 32`); tools may use CPU: a
    prefork pool (`--queues tools,advance`).
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
        "-E",
        f"--hostname={hostname or f'relay-{relay.name}@{socket.gethostname()}'}",
    ]
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if beat:
        # The in-memory scheduler: the tick is the only entry, nothing to persist.
        argv += ["--beat", "--scheduler=celery.beat:Scheduler"]
    relay.celery.worker_main(argv)


@cli.command()
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@_app_option
@click.pass_obj
def beat(obj: _Context, loglevel: str) -> None:
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
            raise _Failure("set both RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD")
        if ":" in user or "," in user + password:
            raise _Failure("RELAY_FLOWER_USER may not hold ':', and neither may hold ','")
        # Flower reads FLOWER_* variables itself: the password never goes on a command line.
        os.environ["FLOWER_BASIC_AUTH"] = f"{user}:{password}"
    elif not os.environ.get("FLOWER_BASIC_AUTH", "").strip():
        raise _Failure(
            "refusing to start Flower without credentials:"
            " set RELAY_FLOWER_USER and RELAY_FLOWER_PASSWORD"
        )


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
@_app_option
@click.pass_obj
def flower(obj: _Context, address: str, port: int, flower_args: tuple[str, ...]) -> None:
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


# --- following a run live ---------------------------------------------------------------------

_LINES: dict[str, tuple[str, str]] = {
    "started": ("▶ {text}", "bold"),
    "plan_approved": ("✓ plan approved", "green"),
    "plan_declined": ("✗ plan declined", "red"),
    "call": ("→ {text}", "cyan"),
    "waiting": ("⏸ {call} ({tool}) needs approval", "yellow"),
    "approved": ("✓ {call} ({tool}) approved", "green"),
    "declined": ("✗ {call} ({tool}) declined: {text}", "yellow"),
    "question": ("? {text}", "yellow"),
    "answer": ("  answered: {text}", ""),
    "retry": ("↻ unusable reply, asked again: {text}", "dim"),
    "sent_back": ("↩ final answer sent back: {text}", "yellow"),
    "note": ("✎ remembered: {text}", "dim"),
    "skill": ("◆ loaded the skill {text}", "dim"),
    "summary": ("… earlier work summarised", "dim"),
    "child": ("⇉ handed to the specialist {text}", "magenta"),
    "progress": ("  … {tool}: {text}", "dim"),
    "rejected": ("↩ the final answer was sent back: {text}", "yellow"),
    "verifier_failed": ("✗ the final answer could not be checked: {text}", "red"),
    "ignored": ("  ignored: {text}", "dim"),
}
_HIDDEN = frozenset({"usage", "stop"})
_RESULT_STYLES = {"ok": "green", "error": "red", "declined": "yellow", "unknown": "magenta"}


def _stop_label(stop: str | None) -> str:
    try:
        return Stop(stop or "").label()
    except ValueError:
        return str(stop)


def _describe(entry: TraceEntry, root: str) -> Text | None:
    """Return how one trace entry reads in a terminal (None: bookkeeping, not shown).

    Lines of a specialist's run are indented under the run that started it.
    """
    indent = "  " * max(0, entry.run.count(".") - root.count("."))
    text = _one_line(entry.text, 200)
    if entry.kind in _HIDDEN:
        return None
    if entry.kind == "plan":
        steps = [s for s in entry.text.splitlines() if s.strip()]
        lines = "\n".join(f"{indent}  {n}. {_one_line(s, 160)}" for n, s in enumerate(steps, 1))
        return Text(f"{indent}Plan:\n{lines}", style="bold")
    if entry.kind == "result":
        status = entry.status or "ok"
        shown = text if status == "ok" else f"{status}: {text}".rstrip(": ")
        return Text(f"{indent}  ← {shown}", style=_RESULT_STYLES.get(status, ""))
    if entry.kind == "finished":
        # The final answer is what the run was for: shown whole, line breaks kept.
        style = "bold green" if entry.stop == Stop.DONE.value else "bold red"
        head = f"{indent}■ {_stop_label(entry.stop).capitalize()}:"
        body = entry.text.strip()[:FINAL_CHARS]
        if "\n" in body:
            return Text(head, style=style) + Text("\n" + body)
        return Text(f"{head} {body}", style=style)
    template, style = _LINES.get(entry.kind, (f"{entry.kind}: {{text}}", "dim"))
    line = template.format(text=text, tool=entry.tool or "", call=entry.call_id or "")
    return Text(indent + line.rstrip(": "), style=style)


def _activity(entry: TraceEntry, waiting: bool) -> str:
    """Return what the spinner says after `entry` (`waiting`: on someone elsewhere)."""
    if waiting:
        return "waiting for a decision…"
    if entry.kind == "call":
        return f"running {entry.tool}…"
    if entry.kind == "child":
        return "specialists at work…"
    return "the model is thinking…"


@dataclass(frozen=True)
class _Policy:
    """How a followed run's plans and calls are decided: asked, approved, declined or shown."""

    mode: Literal["ask", "yes", "no", "watch"]
    why: str = ""
    """Shown beside each automatic decision."""


_END = object()


class _Follow:
    """Shows a run and its specialists as they work, and settles what waits on a person."""

    def __init__(
        self,
        relay: Relay,
        run_id: str,
        policy: _Policy,
        *,
        embedded: Embedded | None = None,
        app: str | None = None,
        quiet: bool = False,
    ) -> None:
        self.relay = relay
        self.run_id = run_id
        self.policy = policy
        self.embedded = embedded
        self.app = app
        self.out = _console(stderr=quiet)
        self.quiet = quiet
        self.tty = sys.stdin.isatty()
        self._entries: queue.Queue[object] = queue.Queue()
        self._settled: set[str] = set()
        self._spinner: Status | None = None
        self._last = time.monotonic()
        self._hinted_quiet = False
        self._waiting = False
        """A hint was printed: the run waits on someone in another shell."""

    # --- the loop -------------------------------------------------------------------------

    def follow(self) -> RunStatus:
        """Show the run until it finishes; return its status then."""
        pump = threading.Thread(target=self._pump, name="relay-watch", daemon=True)
        pump.start()
        self._spin("the model is thinking…")
        try:
            while (item := self._next()) is not _END:
                if isinstance(item, BaseException):
                    if self.embedded is not None:
                        self.embedded.check()  # a dead Redis or worker explains it best
                    raise item
                if isinstance(item, TraceEntry):
                    self._show(item)
        finally:
            self._spin(None)
        return self.relay.status(self.run_id)

    def _pump(self) -> None:
        # relay.watch blocks on Redis; in its own thread the loop above stays free
        # to notice Ctrl-C, a dead worker, or a run nobody works on.
        try:
            for entry in self.relay.watch(self.run_id):
                self._entries.put(entry)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, raised there
            self._entries.put(error)
        else:
            self._entries.put(_END)

    def _next(self) -> object:
        while True:
            try:
                return self._entries.get(timeout=0.5)
            except queue.Empty:
                self._idle()

    def _idle(self) -> None:
        if self.embedded is not None:
            self.embedded.check()
            return
        if self._hinted_quiet or time.monotonic() - self._last < QUIET_SECONDS:
            return
        self._hinted_quiet = True
        status = self.relay.status(self.run_id)
        if status.state == "running":
            app = f"--app {self.app} " if self.app else ""
            self._say(
                f"Nothing has happened for {QUIET_SECONDS:.0f} s (the run waits for"
                f" {status.waiting_for}). Is a worker running? Start one: relay {app}worker",
                "yellow",
            )

    def _show(self, entry: TraceEntry) -> None:
        self._last = time.monotonic()
        line = _describe(entry, self.run_id)
        if line is not None and not self.quiet:
            self.out.print(line)
        self._waiting = False
        if entry.kind in ASKS:
            for pending in self.relay.status(entry.run).pending:
                key = f"{pending.run_id}|{pending.kind}|{pending.call_id or pending.seq}"
                if key not in self._settled:
                    self._settled.add(key)
                    self._settle(pending)
        self._spin(_activity(entry, self._waiting))

    def _spin(self, text: str | None) -> None:
        if self.quiet or not self.out.is_terminal:
            return
        if text is None:
            if self._spinner is not None:
                self._spinner.stop()
                self._spinner = None
        elif self._spinner is None:
            self._spinner = self.out.status(text)
            self._spinner.start()
        else:
            self._spinner.update(text)

    def _say(self, message: str, style: str = "") -> None:
        self.out.print(Text(message, style=style))

    # --- what waits on a person --------------------------------------------------------------

    def _settle(self, pending: Pending) -> None:
        mode = self.policy.mode
        if pending.kind == "question":
            if mode != "watch" and self.tty:
                self._ask_question(pending)
            else:
                self._hint(pending)
        elif mode in ("yes", "no"):
            self._decide(pending, mode == "yes", auto=True)
        elif mode == "ask" and self.tty:
            self._ask(pending)
        else:
            self._hint(pending)

    def _what(self, pending: Pending) -> str:
        return "the plan" if pending.kind == "plan" else f"{pending.call_id} ({pending.tool})"

    def _decide(self, pending: Pending, yes: bool, *, auto: bool = False) -> None:
        if auto:
            verdict = "approving" if yes else "declining"
            why = f" ({self.policy.why})" if self.policy.why else ""
            self._say(f"  {verdict} {self._what(pending)} automatically{why}", "dim")
        try:
            if pending.kind == "plan":
                self.relay.approve_plan(pending.run_id, yes)
            else:
                assert pending.call_id is not None
                self.relay.approve(pending.run_id, pending.call_id, yes, reason="")
        except DecisionRefused as error:
            self._say(f"  ({error}: it was decided elsewhere)", "dim")

    def _ask(self, pending: Pending) -> None:
        self._spin(None)
        if pending.kind == "plan":
            yes = Confirm.ask("Approve this plan?", default=True, console=self.out)
        else:
            args = _one_line(json.dumps(pending.args, ensure_ascii=False), 600)
            risk = pending.risk.value if pending.risk is not None else "?"
            self.out.print(Text(f"  {pending.tool} (risk: {risk}) with {args}", style="yellow"))
            yes = Confirm.ask(f"Allow {escape(pending.tool or 'this call')}?", console=self.out)
        self._decide(pending, bool(yes))

    def _ask_question(self, pending: Pending) -> None:
        self._spin(None)
        answer = Prompt.ask(f"[bold]{escape(pending.summary)}[/]\nYour answer", console=self.out)
        try:
            self.relay.answer(pending.run_id, str(answer))
        except DecisionRefused as error:
            self._say(f"  ({error}: it was answered elsewhere)", "dim")

    def _hint(self, pending: Pending) -> None:
        """Say how to decide from another shell; the run keeps waiting meanwhile."""
        self._waiting = True
        env = ""
        if self.embedded is not None:
            env = f"RELAY_REDIS_URL=$(cat {self.embedded.url_file}) "
        run = pending.run_id
        if pending.kind == "question":
            self._say(f'Waiting for an answer. From another shell: {env}relay answer {run} "…"')
            return
        target = run if pending.kind == "plan" else f"{run} {pending.call_id}"
        self.out.print(
            Text(
                f"Waiting for a decision on {self._what(pending)}. From another shell:\n"
                f"  {env}relay approve {target}\n  {env}relay deny {target}",
                style="yellow",
            )
        )

    # --- the end ------------------------------------------------------------------------------

    def conclude(self, status: RunStatus, started: float) -> int:
        """Print the usage line; return the exit code for how the run ended."""
        if not self.quiet:
            took = time.monotonic() - started
            self._say(f"{_usage(status.total_usage)} · run {status.id} · {took:.1f} s", "dim")
        done = status.outcome is not None and status.outcome.stop is Stop.DONE
        return 0 if done else EXIT_STOPPED

    def interrupted(self) -> int:
        """Handle Ctrl-C: stop with the embedded services, or cancel or leave the run."""
        self._spin(None)
        run = self.run_id
        if self.embedded is not None:
            self._say(
                "Stopped. The private Redis and worker end with this command,"
                " and the run with them.",
                "yellow",
            )
            return EXIT_INTERRUPTED
        cancel = False
        if self.tty:
            try:
                cancel = Confirm.ask(
                    f"Cancel run {run}? (no: leave it running)", default=False, console=self.out
                )
            except (KeyboardInterrupt, EOFError):
                cancel = False
        if cancel:
            self.relay.cancel(run, "Cancelled from the terminal (Ctrl-C).")
            self._say(f"Cancelled run {run}.", "yellow")
        else:
            self._say(
                f"Left run {run} running. Follow it: relay watch {run}"
                f" · stop it: relay cancel {run}",
                "yellow",
            )
        return EXIT_INTERRUPTED


def _usage(usage: Usage) -> str:
    return (
        f"{usage.total_tokens:,} tokens ({usage.prompt_tokens:,} prompt,"
        f" {usage.completion_tokens:,} completion)"
    )


# --- run and demo ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """One run to start and follow, and how."""

    app: str
    task: str
    context: str
    policy: _Policy
    as_json: bool = False
    worker_env: dict[str, str] | None = None


def _start_and_follow(obj: _Context, job: _Job, stack: ExitStack) -> int:
    """Start the run (with the embedded default if no Redis is set); return the exit code."""
    out = _console(stderr=job.as_json)
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
        raise _Failure(
            f"{job.app} does not read RELAY_REDIS_URL (it uses {redact_url(relay.redis_url)}):"
            " build its Relay from the environment, or set RELAY_REDIS_URL and start workers"
        )
    started = time.monotonic()
    run_id = relay.start(job.task, job.context)
    out.print(Text(f"Run {run_id} started.", style="dim"))
    follow = _Follow(relay, run_id, job.policy, embedded=embedded, app=job.app, quiet=job.as_json)
    try:
        status = follow.follow()
    except KeyboardInterrupt:
        return follow.interrupted()
    if job.as_json:
        click.echo(status.model_dump_json())
    return follow.conclude(status, started)


@cli.command()
@click.argument("task")
@click.option("--context", default="", help="Background the agent should know.")
@click.option("--yes", "approve_all", is_flag=True, help="Approve every plan and call.")
@click.option("--deny", "deny_all", is_flag=True, help="Decline every plan and call.")
@_json_option
@_app_option
@click.pass_obj
def run(
    obj: _Context, *, task: str, context: str, approve_all: bool, deny_all: bool, as_json: bool
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
    """
    if approve_all and deny_all:
        raise click.UsageError("--yes and --deny exclude each other")
    mode: Literal["ask", "yes", "no"] = "yes" if approve_all else "no" if deny_all else "ask"
    why = "--yes" if approve_all else "--deny" if deny_all else ""
    job = _Job(obj.spec("run"), task, context, _Policy(mode, why), as_json)
    with ExitStack() as stack:
        code = _start_and_follow(obj, job, stack)
    sys.exit(code)


@cli.command()
@click.option("--ask", is_flag=True, help="Decide the plan and the write yourself.")
@click.option("--task", help="What to ask of the agent (default: summarise the meeting notes).")
@click.pass_obj
def demo(obj: _Context, ask: bool, task: str | None) -> None:
    """Watch an agent summarise a folder of notes: nothing to set up, no network.

    With no RELAY_REDIS_URL, a private Redis and a worker start and stop with
    the command. With no RELAY_MODEL_URL, the built-in demo model plays the
    model's part, offline. The plan and the note it writes need approval;
    the demo gives it, saying so, unless you pass --ask.
    """
    out = _console()
    settings = Settings.from_env()
    out.print(Text("Relay demo: an agent reads a folder of notes and writes a summary.", "bold"))
    if settings.model_url is None:
        out.print(
            "Model: the demo model, built in: offline and scripted."
            " Set RELAY_MODEL_URL to use a real model."
        )
    else:
        out.print(f"Model: {settings.model} at {redact_url(settings.model_url)}")
    why = "the demo approves by itself; pass --ask to decide"
    policy = _Policy("ask", "") if ask else _Policy("yes", why)
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
            out.print(Panel(written.read_text(errors="replace").strip(), title="summary.md"))
    sys.exit(code)


# --- looking at runs ---------------------------------------------------------------------


def _age(ms: int | None) -> str:
    if ms is None:
        return ""
    seconds = max(0, int(time.time() - ms / 1000))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _state(status: RunStatus) -> str:
    if status.outcome is not None:
        return f"finished: {status.outcome.stop.label()}"
    if status.waiting_for:
        return f"{status.state}, for {status.waiting_for}"
    return status.state


@cli.command()
@click.option("--limit", "-n", type=click.IntRange(1, 10_000), default=20, show_default=True)
@_json_option
@_app_option
@click.pass_obj
def runs(obj: _Context, limit: int, as_json: bool) -> None:
    """List the newest runs (specialists' runs included): state, tokens, task."""
    found = obj.relay.runs(limit)
    if as_json:
        _print_json([status.model_dump(mode="json") for status in found])
        return
    out = _console()
    if not found:
        out.print("No runs.")
        return
    table = Table("run", "state", "tokens", "started", "task", box=None, header_style="bold")
    for status in found:
        table.add_row(
            status.id,
            _state(status),
            f"{status.total_usage.total_tokens:,}",
            _age(status.created_ms),
            _one_line(status.task, 60),
        )
    out.print(table)


@cli.command()
@click.argument("run_id")
@_json_option
@_app_option
@click.pass_obj
def show(obj: _Context, run_id: str, as_json: bool) -> None:
    """Show one run: its state, outcome, usage, what it waits for, and its trace."""
    relay = obj.relay
    status = relay.status(run_id)
    trace = relay.trace(run_id)
    if as_json:
        _print_json(
            {
                "status": status.model_dump(mode="json"),
                "trace": [entry.model_dump(mode="json") for entry in trace],
            }
        )
        return
    out = _console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        ("run", status.id),
        ("task", _one_line(status.task, 300)),
        ("state", _state(status)),
        ("parent", status.parent or ""),
        ("children", ", ".join(status.children)),
        ("schedule", status.schedule or ""),
        ("tokens", _usage(status.total_usage)),
        ("started", _age(status.created_ms)),
        ("finished", _age(status.finished_ms)),
        ("outcome", _one_line(status.outcome.summary, 300) if status.outcome else ""),
    ]
    for name, value in rows:
        if value:
            grid.add_row(name, value)
    for pending in status.pending:
        grid.add_row("waits on", _pending_line(pending))
    out.print(grid)
    out.print(Text("trace:", style="bold"))
    for entry in trace:
        line = _describe(entry, run_id)
        if line is not None:
            out.print(Text("  ") + line)


@cli.command()
@click.argument("run_id")
@_json_option
@_app_option
@click.pass_obj
def watch(obj: _Context, run_id: str, as_json: bool) -> None:
    """Follow a run and its specialists live until it finishes (Ctrl-C stops watching).

    With --json, one JSON object per trace entry, one per line.
    """
    relay = obj.relay
    try:
        if as_json:
            for entry in relay.watch(run_id):
                click.echo(entry.model_dump_json())
            return
        follow = _Follow(relay, run_id, _Policy("watch"), app=obj.app)
        status = follow.follow()
        _console().print(Text(_usage(status.total_usage), style="dim"))
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


# --- people in the loop ---------------------------------------------------------------------------


def _pending_line(pending: Pending) -> str:
    if pending.kind == "plan":
        steps = [s for s in pending.summary.splitlines() if s.strip()]
        return "plan: " + _one_line(" ".join(f"{n}. {s}" for n, s in enumerate(steps, 1)), 200)
    if pending.kind == "question":
        return "question: " + _one_line(pending.summary, 200)
    return f"{pending.call_id}: {_one_line(pending.summary, 200)}"


@cli.command()
@click.option("--run", "run_id", help="Only what this run (or its specialists) waits on.")
@_json_option
@_app_option
@click.pass_obj
def pending(obj: _Context, run_id: str | None, as_json: bool) -> None:
    """List what waits on a person: plans, calls and questions, oldest first."""
    found = [p for p in obj.relay.pending() if run_id is None or run_id in (p.run_id, p.root_id)]
    if as_json:
        _print_json([p.model_dump(mode="json") for p in found])
        return
    out = _console()
    if not found:
        out.print("Nothing waits on a person.")
        return
    table = Table("run", "kind", "call", "risk", "waiting", "what", box=None, header_style="bold")
    for p in found:
        risk = p.risk.value if p.risk is not None else ""
        table.add_row(p.run_id, p.kind, p.call_id or "", risk, _age(p.created_ms), _pending_line(p))
    out.print(table)
    out.print(Text("Decide with: relay approve RUN [CALL] · relay deny RUN [CALL]", style="dim"))


def _decide(relay: Relay, run_id: str, call_id: str | None, yes: bool, reason: str) -> str:
    """Decide the plan (no call given) or a call; return what was decided, for the message."""
    if call_id is not None and call_id != "plan":
        relay.approve(run_id, call_id, yes, reason=reason)
        return f"{call_id} of run {run_id}"
    try:
        relay.approve_plan(run_id, yes)
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


@cli.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@_app_option
@click.pass_obj
def approve(obj: _Context, run_id: str, call_id: str | None) -> None:
    """Approve a call (RUN CALL) or, with no CALL, the plan a run waits on."""
    what = _decide(obj.relay, run_id, call_id, True, "")
    click.echo(f"Approved {what}.")


@cli.command()
@click.argument("run_id")
@click.argument("call_id", required=False)
@click.option("--reason", default="", help="Why not; the model is told.")
@_app_option
@click.pass_obj
def deny(obj: _Context, run_id: str, call_id: str | None, reason: str) -> None:
    """Decline a call (RUN CALL) or, with no CALL, the plan a run waits on."""
    what = _decide(obj.relay, run_id, call_id, False, reason)
    click.echo(f"Declined {what}.")


@cli.command()
@click.argument("run_id")
@click.argument("text")
@_app_option
@click.pass_obj
def answer(obj: _Context, run_id: str, text: str) -> None:
    """Answer the question a run waits on."""
    obj.relay.answer(run_id, text)
    click.echo(f"Answered run {run_id}.")


@cli.command()
@click.argument("run_id")
@click.option("--reason", default="", help="Why; it goes into the run's outcome.")
@_app_option
@click.pass_obj
def cancel(obj: _Context, run_id: str, reason: str) -> None:
    """Stop a run, parked or working, and its specialists."""
    if obj.relay.cancel(run_id, reason):
        click.echo(f"Cancelling run {run_id} (its specialists stop too).")
    else:
        click.echo(f"Run {run_id} had finished already.")


# The lead attaches the `relay schedule add|list|rm|preview` group here, from
# workers/cli_schedule.py (one line: cli.add_command(schedule)).


def main() -> None:
    """Run the `relay` command."""
    cli(prog_name="relay")


if __name__ == "__main__":
    main()
