"""How one line of a run's trace reads in a terminal (`relay run`, `watch`, `show`)."""

from __future__ import annotations

import json

from rich.text import Text

from agent_core import Stop
from workers.cli.terminal import one_line, printable
from workers.engine.records import TraceEntry

__all__ = ["FINAL_CHARS", "describe"]

FINAL_CHARS = 4_000

_LINES: dict[str, tuple[str, str]] = {
    "started": ("▶ {text}", "bold"),
    "plan_approved": ("✓ plan approved", "green"),
    "plan_declined": ("✗ plan declined", "red"),
    "call": ("→ {text}", "cyan"),
    "waiting": ("⏸ {call} ({tool}) needs approval", "yellow"),
    "approved": ("✓ {call} ({tool}) approved {text}", "green"),
    "edited": ("✎ {call} ({tool}) arguments edited by {text}", "yellow"),
    "declined": ("✗ {call} ({tool}) declined{text}", "yellow"),
    "question": ("? {text}", "yellow"),
    "answer": ("  answered: {text}", ""),
    "retry": ("↻ unusable reply, asked again: {text}", "dim"),
    "model_failed": ("↻ the model call failed, trying again: {text}", "yellow"),
    "sent_back": ("↩ final answer sent back: {text}", "yellow"),
    "note": ("✎ remembered: {text}", "dim"),
    "skill": ("◆ loaded the skill {text}", "dim"),
    "summary": ("… earlier work summarised", "dim"),
    "child": ("⇉ handed to the specialist {text}", "magenta"),
    "progress": ("  … {tool}: {text}", "dim"),
    "rejected": ("↩ the final answer was sent back: {text}", "yellow"),
    "verifier_failed": ("✗ the final answer could not be checked: {text}", "red"),
    "ignored": ("  ignored: {text}", "dim"),
    "budget": ("⏸ the budget is spent: {text}", "yellow"),
    "budget_extended": ("✓ the budget was extended: {text}", "green"),
    "warning": ("! {text}", "yellow"),
    "message": ("✉ the person said: {text}", "cyan"),
    "follow_up": ("▶ next turn: {text}", "bold"),
    "continued": ("… the reply was cut; asked for the rest", "dim"),
    "paused": ("⏸ paused: relay resume {run} goes on", "yellow"),
    "resumed": ("▶ resumed", "green"),
    "queued": ("  next turn queued: {text}", "dim"),
    "turn_ended": ("■ turn ended: {text}", "green"),
    "interrupted": ("✗ this turn was stopped for a new request", "yellow"),
}
_HIDDEN = frozenset({"usage", "stop", "call_failed"})
"""Kinds the run's last line says already (a failed call's own line: relay web shows it)."""
_RESULT_STYLES = {"ok": "green", "error": "red", "declined": "yellow", "unknown": "magenta"}


def _stop_label(stop: str | None) -> str:
    try:
        return Stop(stop or "").label()
    except ValueError:
        return str(stop)


def _edited(entry: TraceEntry) -> str:
    """`ana: amount 500 → 50`, for `✎ call-2 (pay) arguments edited by ...`: who edited,
    and each argument changed, added or removed (the entry's data holds both versions)."""
    was, now = entry.data.get("was"), entry.data.get("now")
    before = was if isinstance(was, dict) else {}
    after = now if isinstance(now, dict) else {}
    changes = [
        f"{name} {_value(before[name])} → {_value(after[name])}"
        for name in sorted(before.keys() & after.keys())
        if before[name] != after[name]
    ]
    changes += [
        f"{name} {_value(after[name])} added" for name in sorted(after.keys() - before.keys())
    ]
    changes += [f"{name} removed" for name in sorted(before.keys() - after.keys())]
    who = str(entry.data.get("by") or "") or "someone unnamed"
    what = "; ".join(changes) or "no argument changed"
    return one_line(f"{who}: {what}", 400)


def _value(value: object) -> str:
    """An argument's value as JSON, cut short for a trace line."""
    return one_line(json.dumps(value, ensure_ascii=False), 60)


def describe(entry: TraceEntry, root: str) -> Text | None:
    """Return how one trace entry reads in a terminal (None: bookkeeping, not shown).

    Lines of a specialist's run are indented under the run that started it.
    """
    indent = "  " * max(0, entry.run.count(".") - root.count("."))
    text = _edited(entry) if entry.kind == "edited" else one_line(entry.text, 200)
    if entry.kind == "declined":  # who declined (where the trace knows), then why
        who = f" by {one_line(str(entry.data['by']), 80)}" if entry.data.get("by") else ""
        text = f"{who}: {text}"
    if entry.kind in _HIDDEN:
        return None
    if entry.kind == "plan":
        steps = [s for s in entry.text.splitlines() if s.strip()]
        lines = "\n".join(f"{indent}  {n}. {one_line(s, 160)}" for n, s in enumerate(steps, 1))
        return Text(f"{indent}Plan:\n{lines}", style="bold")
    if entry.kind == "result":
        status = entry.status or "ok"
        shown = text if status == "ok" else f"{status}: {text}".rstrip(": ")
        stubbed = "stubbed, nothing ran: " if entry.data.get("stubbed") is True else ""
        return Text(f"{indent}  ← {stubbed}{shown}", style=_RESULT_STYLES.get(status, ""))
    if entry.kind == "finished":
        # The final answer is what the run was for: shown whole, line breaks kept.
        done = entry.stop == Stop.DONE.value
        style = "bold green" if done else "bold red"
        label = _stop_label(entry.stop)
        body = printable(entry.text.strip()[:FINAL_CHARS])
        head = f"{indent}■ {label.capitalize()}:"
        names_it = body.casefold().startswith(label.casefold()) or (
            entry.stop == Stop.MODEL_FAILED.value and body.startswith("The model")
        )
        if not done and names_it:
            head = f"{indent}■"  # the summary names the stop already: say it once
        if "\n" in body:
            return Text(head, style=style) + Text("\n" + body)
        return Text(f"{head} {body}", style=style)
    template, style = _LINES.get(entry.kind, (f"{one_line(entry.kind, 40)}: {{text}}", "dim"))
    tool, call = one_line(entry.tool or "", 80), one_line(entry.call_id or "", 80)
    line = template.format(text=text, tool=tool, call=call, run=one_line(entry.run, 80))
    return Text(indent + line.rstrip(": "), style=style)
