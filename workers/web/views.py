"""What relay web shows of a run, as plain data: the same dicts feed the pages and /api/.

Columns that other parts of Relay add later (a run's `key`, `Usage.cost_usd`)
are read with `getattr`, so they appear as soon as the RunStatus has them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from workers.aio import AsyncRelay
from workers.client.runs import page_cursor
from workers.engine.budget import Budget
from workers.engine.journal import JournalError, read_entry
from workers.engine.records import Pending, RunStatus, TraceEntry, run_list
from workers.errors import RunNotFound

__all__ = [
    "BUDGET_FIELDS",
    "LONG_ARGS_CHARS",
    "MARKS",
    "RunsPage",
    "args_digest",
    "args_text",
    "budget_limits",
    "budget_raise",
    "cost_of",
    "duration",
    "journal_rows",
    "money",
    "nested",
    "pending_row",
    "run_row",
    "run_tree",
    "runs_page",
    "tokens_text",
    "trace_row",
]

MAX_TREE_RUNS = 200


def age(now_ms: int, since_ms: int | None) -> str:
    """`42 s`, `7 min`, `3 h`, `2 d`."""
    if since_ms is None:
        return ""
    seconds = max(0, now_ms - since_ms) // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


MARKS = {
    "running": "▶",
    "waiting": "⏸",
    "done": "✓",
    "failed": "✗",
    "cancelled": "⊘",
    "declined": "↩",
}
"""The mark beside each list's name: no two lists share one (nor a colour, in relay.css)."""


def duration(ms: int | None) -> str:
    """`850 ms`, `12.3 s`, `4 min 5 s`, `2 h 3 min`, `3 d 4 h` ("" for none)."""
    if ms is None:
        return ""
    ms = max(0, ms)
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    for unit, size, rest_unit, rest_size in (
        ("d", 86_400, "h", 3_600),
        ("h", 3_600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if seconds >= size:
            return f"{seconds // size} {unit} {seconds % size // rest_size} {rest_unit}"
    return f"{seconds} s"  # (unreachable: under a minute is above)


def money(micro: int | None) -> str:
    """Dollars to the micro-dollar, as exact as they were counted (`$0.000315`, `$12.50`);
    "no price" for None."""
    if micro is None:
        return "no price"
    text = f"{micro / 1_000_000:.6f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def tokens_text(total: int, prompt: int, completion: int, own: int) -> str:
    """A run's tokens as its page says them (the page's live poll says them anew)."""
    return f"{total:,} ({prompt:,} prompt, {completion:,} completion; its own calls {own:,})"


def run_row(status: RunStatus, now_ms: int) -> dict[str, Any]:
    """One run, as the runs list and the API show it."""
    usage = status.total_usage
    cost = _cost(usage)
    outcome = status.outcome
    ended = None
    if outcome is not None:
        stop = outcome.stop
        ended = {"stop": stop.value, "label": stop.label(), "summary": outcome.summary}
    return {
        "id": status.id,
        "state": status.state,
        "list": run_list(status.state, status.outcome),
        "ending": status.ending,
        "unknown_calls": status.unknown_calls,
        "cursor": page_cursor(status),
        "waiting_for": status.waiting_for or "",
        "task": status.task,
        "parent": status.parent,
        "root": status.root,
        "children": list(status.children),
        "key": getattr(status, "key", None),
        "tokens": usage.total_tokens,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "own_tokens": status.usage.total_tokens,
        "tokens_text": tokens_text(
            usage.total_tokens,
            usage.prompt_tokens,
            usage.completion_tokens,
            status.usage.total_tokens,
        ),
        "cost_usd": cost,
        "cost_micro": None if cost is None else status.total_usage.cost_micro,
        "cost_text": money(None if cost is None else status.total_usage.cost_micro),
        "took": duration(
            None if status.finished_ms is None else status.finished_ms - status.created_ms
        ),
        "created_ms": status.created_ms,
        "updated_ms": status.updated_ms,
        "finished_ms": status.finished_ms,
        "age": age(now_ms, status.created_ms),
        "waiting_since": age(now_ms, status.updated_ms) if status.state == "waiting" else "",
        "outcome": ended,
        "pending": [pending_row(p, now_ms) for p in status.pending],
        "forked_from": status.forked_from.model_dump() if status.forked_from else None,
        "schedule": status.schedule,
        "fired_ms": status.fired_ms,
    }


_STEP_WORDS = {
    "ask": "waits for the model",
    "summarize": "waits for the model's summary",
    "run": "runs {}",
    "plan": "waits for its plan's approval",
    "question": "waits for a person's answer",
    "done": "turn ended",
}
"""What a run does after a journal step, as its page says it (an ending the run went on
from is a turn's: the journal keeps no more of how it ended)."""


def journal_rows(
    first: int, stored: list[bytes], ending: str | None = None
) -> list[dict[str, Any]]:
    """Journal steps as stored (`workers.store.reads.journal_tail`: the first numbered
    `first`), each as "its kind and tools"; an entry that cannot be read says so. The
    last step of a finished run says how it ended (`ending`: its stop's label, as
    `done`, `cancelled`, `failed`); `ended` marks each step the run had ended at."""
    rows = []
    for number, text in enumerate(stored, start=first):
        ended = False
        try:
            step = read_entry(number, text).step
            said = _STEP_WORDS.get(step.kind, step.kind).format(", ".join(step.tools))
            ended = step.kind == "done"
        except JournalError as error:
            said = f"unreadable: {error}"
        last = number == first + len(stored) - 1
        rows.append({"step": number, "said": ending if ended and last and ending else said})
        rows[-1]["ended"] = ended
    return rows


@dataclass(frozen=True)
class RunsPage:
    """One page of a list of runs: its rows, how many the list holds, the next page's cursor."""

    rows: list[dict[str, Any]]
    total: int
    next: str
    """`before=` of the next page ("" if this is the last)."""


async def runs_page(
    relay: AsyncRelay, state: str, limit: int, before: str, now_ms: int
) -> RunsPage:
    """The runs in `state` ("" for all) created before the cursor `before` ("" from the
    newest), at most `limit`: filtered by the index of `state`, then cut.

    Raises:
        ValueError: `state` is no state, or `before` no cursor.
    """
    found = await relay.runs(limit=limit, state=state, before=before)
    rows = [run_row(status, now_ms) for status in found]
    total = await relay.count_runs(state)
    more = len(found) == limit and bool(found)
    return RunsPage(nested(rows), total, rows[-1]["cursor"] if more else "")


def nested(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` (newest first) with each specialist's run right under its parent's where both
    are on the page, its `depth` set (0 for a run whose parent is not here)."""
    here = {row["id"] for row in rows}
    under: dict[str, list[dict[str, Any]]] = {}
    tops = []
    for row in rows:
        if row["parent"] in here:
            under.setdefault(row["parent"], []).append(row)
        else:
            tops.append(row)
    ordered: list[dict[str, Any]] = []

    def place(row: dict[str, Any], depth: int) -> None:
        ordered.append({**row, "depth": depth})
        for child in reversed(under.get(row["id"], [])):  # the first started first
            place(child, depth + 1)

    for row in tops:
        place(row, 0)
    return ordered


def _cost(usage: object) -> float | None:
    """Dollars spent, or None where nothing had a price (shown as "no price")."""
    micro = getattr(usage, "cost_micro", None)
    if not isinstance(micro, int) or (micro == 0 and getattr(usage, "unpriced_calls", None)):
        return None
    return micro / 1_000_000


def cost_of(usage: object) -> str:
    """What `usage` cost, as every page says it ("no price" where nothing had one)."""
    dollars = _cost(usage)
    return money(None if dollars is None else getattr(usage, "cost_micro", 0))


LONG_ARGS_CHARS = 2_000
"""A call's arguments longer than this (as shown, in JSON) are folded on the page: its
Approve stays off until the person opens them whole (`args_digest` proves it)."""


def args_text(args: dict[str, Any] | None) -> str:
    """A call's arguments as a person reads them: JSON, indented, every character kept."""
    return json.dumps(args or {}, ensure_ascii=False, indent=2)


def args_digest(args: dict[str, Any] | None) -> str:
    """What the page sends back once the whole arguments were opened (see LONG_ARGS_CHARS)."""
    return hashlib.sha256(args_text(args).encode()).hexdigest()[:32]


BUDGET_FIELDS = (
    ("tokens", "tokens", "tokens"),
    ("usd", "dollars", "usd"),
    ("calls", "model calls", "model_calls"),
    ("minutes", "minutes", "seconds"),
)
"""A budget form's fields: (its name, what it raises by, the `Budget` field it fills)."""
MAX_RAISE = {"tokens": 10**15, "usd": 10**9, "calls": 10**9, "minutes": 10**7}
"""A raise each field may ask for, under what a `Budget` holds (seconds: 10**9)."""


def budget_limits(budget: Budget | None) -> list[dict[str, str]]:
    """The fields of the form that raises a tree's budget: one for each limit the tree has
    (raising one it never had is refused, as `relay extend` is), with the limit now."""
    if budget is None:
        return []
    now = {
        "tokens": None if budget.tokens is None else f"{budget.tokens:,}",
        "usd": None if budget.usd is None else f"${budget.usd:,.2f}",
        "calls": None if budget.model_calls is None else f"{budget.model_calls:,}",
        "minutes": None if budget.seconds is None else duration(int(budget.seconds * 1000)),
    }
    return [
        {"name": name, "label": label, "now": limit}
        for name, label, _ in BUDGET_FIELDS
        if (limit := now[name]) is not None
    ]


def budget_raise(fields: dict[str, str]) -> Budget | str:
    """The raise a budget form asks for (its empty fields raise nothing), or why it is
    none: a field that is no positive number, or no field filled."""
    more: dict[str, float] = {}
    for name, label, field in BUDGET_FIELDS:
        text = fields.get(name, "").strip().lstrip("$").replace(",", "")
        if not text:
            continue
        try:
            number = int(text) if name in ("tokens", "calls") else float(text)
        except ValueError:
            return f"{label}: {text[:40]!r} is not a{' whole' if name != 'usd' else ''} number"
        if not 0 < number < MAX_RAISE[name]:  # (NaN and infinity are not either)
            return f"{label}: raise it by more than 0 and less than {MAX_RAISE[name]:,}"
        more[field] = number * 60 if name == "minutes" else number
    if not more:
        return "say what to raise: tokens, dollars, model calls or minutes"
    return Budget.model_validate(more)


def pending_row(pending: Pending, now_ms: int) -> dict[str, Any]:
    """Something that waits on a person; `what` names it exactly (the call, or the step)."""
    what = pending.call_id if pending.kind == "call" and pending.call_id else str(pending.seq)
    shown = args_text(pending.args) if pending.kind == "call" else ""
    return {
        "args_text": shown,
        "args_chars": len(shown),
        "args_long": len(shown) > LONG_ARGS_CHARS,
        "args_digest": args_digest(pending.args) if pending.kind == "call" else "",
        "plan_steps": [s.strip() for s in pending.summary.splitlines() if s.strip()]
        if pending.kind == "plan"
        else [],
        "kind": pending.kind,
        "run_id": pending.run_id,
        "root_id": pending.root_id,
        "what": what,
        "call_id": pending.call_id,
        "tool": pending.tool,
        "summary": pending.summary,
        "args": pending.args,
        "risk": None if pending.risk is None else str(pending.risk),
        "created_ms": pending.created_ms,
        "expires_ms": pending.expires_ms,
        "waiting": age(now_ms, pending.created_ms),
    }


def trace_row(entry: TraceEntry, flower_url: str) -> dict[str, Any]:
    """One trace line. `flower` links the Celery task that carried its call (recorded by
    the worker that made it: the call's own task, or the step task it ran inside), and
    only where one was recorded; `run_link` the specialist's run a delegation started;
    `made` says which attempt, on which worker."""
    child = entry.data.get("child") if entry.kind == "child" else None
    task = entry.data.get("task")
    task_id = task if isinstance(task, str) and task else None
    text = entry.text
    if entry.kind == "usage" and not text:
        text = f"{entry.data.get('tokens', 0):,} tokens"
    return {
        "at_ms": entry.at_ms,
        "run": entry.run,
        "kind": entry.kind,
        "text": text,
        "call_id": entry.call_id,
        "tool": entry.tool,
        "status": entry.status,
        "stop": entry.stop,
        "data": entry.data,
        "task_id": task_id,
        "flower": _flower_task(flower_url, task_id),
        "run_link": f"/runs/{child}" if isinstance(child, str) else None,
        "made": _made(entry.data),
    }


def _flower_task(flower_url: str, task_id: str | None) -> str | None:
    """Flower's page of the task `task_id`, if there is a Flower and a task."""
    if not flower_url or not task_id:
        return None
    return f"{flower_url}/task/{quote(task_id, safe=':@')}"


def _made(data: dict[str, Any]) -> str:
    """`took 1.2 s, attempt 2 on celery@w2`, or what of it is known ("" for none);
    `stubbed: its recorded outcome, nothing ran` for an outcome handed back."""
    if data.get("stubbed") is True:
        return "stubbed: its recorded outcome, nothing ran"
    attempt, worker, took = data.get("attempt"), data.get("worker"), data.get("ms")
    parts = [f"took {duration(took)}," if isinstance(took, int) else ""]
    parts.append(f"attempt {attempt}" if isinstance(attempt, int) else "")
    parts.append(f"on {worker}" if isinstance(worker, str) and worker else "")
    return " ".join(part for part in parts if part)


async def run_tree(relay: AsyncRelay, status: RunStatus, now_ms: int) -> dict[str, Any]:
    """The run with its specialists under it, as deep as they go (at most MAX_TREE_RUNS)."""
    seen = 0

    async def grow(node: RunStatus) -> dict[str, Any]:
        nonlocal seen
        row = run_row(node, now_ms)
        row["specialists"] = []
        for child_id in node.children:
            if seen >= MAX_TREE_RUNS:
                break
            seen += 1
            try:
                row["specialists"].append(await grow(await relay.status(child_id)))
            except RunNotFound:
                continue
        return row

    return await grow(status)
