"""Following a run live in the terminal: its trace as readable lines, its answer as
the model writes it, a spinner while the model thinks, and the person asked at the
prompt for approvals and answers."""

from __future__ import annotations

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_STOPPED",
    "Deciding",
    "Follower",
    "console",
    "describe",
    "one_line",
    "usage_line",
]

import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal

import click
from rich.console import Console
from rich.markup import escape
from rich.prompt import Confirm, Prompt
from rich.status import Status
from rich.text import Text

from agent_core import Stop
from workers.cli.answer import Answer, pump_stream
from workers.cli.embedded import Embedded
from workers.cli.lines import describe
from workers.cli.terminal import one_line, printable, whole_args
from workers.engine.records import Pending, RunStatus, StreamEvent, TraceEntry, Usage
from workers.errors import DecisionRefused
from workers.relay import Relay

EXIT_STOPPED = 1
"""`run` and `demo`: the run ended without doing its task (declined, cancelled, failed)."""
EXIT_INTERRUPTED = 130
QUIET_SECONDS = 15.0
"""After this long without a trace line, `run` and `watch` ask whether a worker is up
(unless a worker holds one of the run's calls: then it is working, and they say so)."""
PAGED_ARGS_CHARS = 2_000
"""A call's arguments longer than this are paged before its question, on a terminal."""
ASKS = frozenset({"plan", "waiting", "question"})
"""Trace kinds written in the same save that parks a run on a person."""


def console(*, stderr: bool = False) -> Console:
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


# --- following a run live ---------------------------------------------------------------------


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
class Deciding:
    """How a followed run's plans and calls are decided: asked, approved, declined or shown."""

    mode: Literal["ask", "yes", "no", "watch"]
    why: str = ""
    """Shown beside each automatic decision."""


_END = object()


class Follower:
    """Shows a run and its specialists as they work, and settles what waits on a person."""

    def __init__(
        self,
        relay: Relay,
        run_id: str,
        policy: Deciding,
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
        self.out = console(stderr=quiet)
        self.quiet = quiet
        self.tty = sys.stdin.isatty()
        self._entries: queue.Queue[object] = queue.Queue()
        self._answer = Answer(run_id) if self.out.is_terminal and not quiet else None
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
        if self._answer is not None:
            args = (self.relay, self.run_id, self._entries)
            threading.Thread(
                target=pump_stream, args=args, name="relay-stream", daemon=True
            ).start()
        self._spin("the model is thinking…")
        try:
            while (item := self._next()) is not _END:
                if isinstance(item, BaseException):
                    if self.embedded is not None:
                        self.embedded.check()  # a dead Redis or worker explains it best
                    raise item
                if isinstance(item, TraceEntry):
                    self._show(item)
                elif isinstance(item, StreamEvent):
                    self._text(item)
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
        held = self.relay.runs_client.held_calls(self.run_id) if status.state == "running" else []
        if held:
            self._say(
                f"Nothing new for {QUIET_SECONDS:.0f} s: a worker is running"
                f" {one_line(', '.join(held), 200)}.",
                "dim",
            )
        elif status.state == "running":
            app = f"--app {self.app} " if self.app else ""
            self._say(
                f"Nothing has happened for {QUIET_SECONDS:.0f} s (the run waits for"
                f" {status.waiting_for}). Is a worker running? Start one: relay {app}worker",
                "yellow",
            )

    def _text(self, event: StreamEvent) -> None:
        assert self._answer is not None
        if self._answer.show(event) and not self._waiting:
            self._last = time.monotonic()
            self._spin(self._answer.view() if self._answer.text else "the model is thinking…")

    def _show(self, entry: TraceEntry) -> None:
        self._last = time.monotonic()
        line = describe(entry, self.run_id)
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

    def _spin(self, text: str | Text | None) -> None:
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
        if pending.kind == "budget":  # never decided for a person: it costs money
            self._hint(pending)
        elif pending.kind == "question":
            if mode != "watch" and self.tty:
                try:
                    self._ask_question(pending)
                except EOFError:
                    self._hint(pending)
            else:
                self._hint(pending)
        elif mode in ("yes", "no"):
            self._decide(pending, mode == "yes", auto=True)
        elif mode == "ask" and self.tty:
            try:
                self._ask(pending)
            except EOFError:  # the terminal went away: decide from elsewhere
                self._hint(pending)
        else:
            self._hint(pending)

    def _what(self, pending: Pending) -> str:
        if pending.kind == "plan":
            return "the plan"
        return one_line(f"{pending.call_id} ({pending.tool})", 200)

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
            self._say(f"  ({one_line(error)}: it was decided elsewhere)", "dim")

    def _ask(self, pending: Pending) -> None:
        self._spin(None)
        if pending.kind == "plan":
            yes = Confirm.ask("Approve this plan?", default=True, console=self.out)
        else:
            shown = whole_args(pending.args)
            risk = pending.risk.value if pending.risk is not None else "?"
            tool = one_line(pending.tool or "this call", 80)
            head = f"  {tool} (risk: {risk}) with these arguments, {len(shown):,} characters:"
            self.out.print(Text(head, style="yellow"))
            if len(shown) > PAGED_ARGS_CHARS and self.out.is_terminal:
                # Too long for the screen: paged, so every character passes before the
                # question (a tail hidden past the scrollback approves nothing unseen).
                click.echo_via_pager(shown)
            else:
                self.out.print(Text(shown))
            yes = Confirm.ask(f"Allow {escape(tool)}?", console=self.out)
        self._decide(pending, bool(yes))

    def _ask_question(self, pending: Pending) -> None:
        self._spin(None)
        question = escape(printable(pending.summary))
        answer = Prompt.ask(f"[bold]{question}[/]\nYour answer", console=self.out)
        try:
            self.relay.answer(pending.run_id, str(answer))
        except DecisionRefused as error:
            self._say(f"  ({one_line(error)}: it was answered elsewhere)", "dim")

    def _hint(self, pending: Pending) -> None:
        """Say how to decide from another shell; the run keeps waiting meanwhile."""
        self._waiting = True
        env = ""
        if self.embedded is not None:
            env = f"RELAY_REDIS_URL=$(cat {self.embedded.url_file}) "
        run = one_line(pending.run_id, 200)
        if pending.kind == "budget":
            root = one_line(pending.root_id, 200)
            self._say(
                f"Waiting for the budget to be extended. From another shell:\n"
                f"  {env}relay extend {root} --usd X (or --tokens N, --calls N)",
                "yellow",
            )
            return
        if pending.kind == "question":
            self._say(f'Waiting for an answer. From another shell: {env}relay answer {run} "…"')
            return
        target = run if pending.kind == "plan" else f"{run} {one_line(pending.call_id or '', 80)}"
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
            self._say(f"{usage_line(status.total_usage)} · run {status.id} · {took:.1f} s", "dim")
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


def usage_line(usage: Usage) -> str:
    """`1,234 tokens (1,000 prompt, 234 completion) · $0.0123`, saying "no price" for
    calls to a model with none."""
    line = (
        f"{usage.total_tokens:,} tokens ({usage.prompt_tokens:,} prompt,"
        f" {usage.completion_tokens:,} completion)"
    )
    if usage.cost_micro or usage.unpriced_calls < usage.model_calls:
        line += f" · {cost_text(usage)}"
    elif usage.unpriced_calls:
        line += " · no price"
    return line


def cost_cell(usage: Usage) -> str:
    """The cost in a table cell: dollars, `no price`, or dollars+ when some calls had none."""
    if not usage.model_calls:
        return ""
    if usage.unpriced_calls == usage.model_calls:
        return "no price"
    cost = usage.cost_micro / 1_000_000
    text = f"${cost:,.2f}" if cost >= 0.01 or cost == 0 else f"${cost:.6f}".rstrip("0")
    return text + ("+" if usage.unpriced_calls else "")


def cost_text(usage: Usage) -> str:
    """The cost in dollars (to the micro-dollar when under a cent), and "no price" for
    calls whose model has none."""
    cost = usage.cost_micro / 1_000_000
    text = f"${cost:,.2f}" if cost >= 0.01 or cost == 0 else f"${cost:.6f}".rstrip("0")
    if usage.unpriced_calls:
        text += (
            f" (+{usage.unpriced_calls} call{'s' if usage.unpriced_calls > 1 else ''}, no price)"
        )
    return text
