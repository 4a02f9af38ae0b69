"""The history the model sees: how each turn reads, and how it stays bounded.

A turn is one history entry (a batch of calls with all their results, a note,
a loaded skill, a question and its answer, a final sent back, a person's
message, a notice about progress, the end of a turn and the request after
it). Entries are
dropped or folded whole, oldest first, so a call is never separated from its
result; the newest entry always stays.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent_core.state import (
    AnswerEntry,
    CallsEntry,
    Entry,
    FollowUpEntry,
    MessageEntry,
    NoteEntry,
    NoticeEntry,
    SentBackEntry,
    SkillEntry,
)
from agent_core.text import cut
from agent_core.tools import ToolCall, ToolOutput

__all__ = [
    "fold_count",
    "output_cap",
    "render_call",
    "render_entry",
    "render_history",
    "size",
    "trimmed",
]

ARG_SHOWN_CHARS = 2_000


def output_cap(history_chars: int) -> int:
    """Return how much of one tool output (or loaded text) may enter history."""
    return max(500, history_chars // 4)


def render_args(args: Any) -> str:
    return json.dumps(args, ensure_ascii=False)


def render_call(call: ToolCall) -> str:
    return f"[{call.id}] {call.tool} {cut(render_args(call.args), ARG_SHOWN_CHARS)}"


def render_output(output: ToolOutput) -> str:
    match output.status:
        case "ok":
            return f"→ ok: {output.text}"
        case "error":
            return f"→ error: {output.text}"
        case "declined":
            reason = f" ({output.text})" if output.text else ""
            return f"→ declined by the person{reason}. Do not ask for the same call again."
        case "unknown":
            return (
                f"→ outcome unknown: {output.text}. It may or may not have taken effect;"
                " check before doing it again."
            )


_RENDERED: dict[int, tuple[Entry, str]] = {}
_RENDERED_MAX = 4_096


def render_entry(entry: Entry) -> str:
    """Return how `entry` reads in the prompt.

    Memoised by identity (entries are immutable, and each step renders the whole
    history more than once); the entry is kept with its text, so an id is never
    reused while cached.
    """
    hit = _RENDERED.get(id(entry))
    if hit is not None and hit[0] is entry:
        return hit[1]
    text = _render(entry)
    if len(_RENDERED) >= _RENDERED_MAX:
        _RENDERED.clear()
    _RENDERED[id(entry)] = (entry, text)
    return text


def _render(entry: Entry) -> str:
    match entry:
        case CallsEntry(results=results, note=note):
            lines = [f"{render_call(r.call)}\n{render_output(r.output)}" for r in results]
            if note:
                lines.append(note)
            return "\n".join(lines)
        case SentBackEntry(final=final, problem=problem):
            return f"You answered: {final}\n→ sent back: {problem}"
        case NoteEntry(text=text):
            return f"You noted: {text}"
        case SkillEntry(name=name, body=body, note=note):
            shown = body or "(It has no instructions beyond its description.)"
            return f"You loaded the skill {name}:\n{shown}" + (f"\n{note}" if note else "")
        case NoticeEntry(text=text):
            return f"Notice: {text}"
    return _render_person(entry)


def _render_person(entry: Entry) -> str:
    """Return how an entry that a person wrote reads."""
    match entry:
        case AnswerEntry(question=question, answer=answer):
            return f"You asked the person: {question}\n→ they answered: {answer}"
        case MessageEntry(text=text):
            return f"The person told you: {text}"
        case FollowUpEntry(stop=stop, answer=answer, request=request):
            return f"Your turn ended ({stop.label()}): {answer}\n→ then the person asked: {request}"
    raise AssertionError(f"unknown history entry {entry!r}")  # pragma: no cover


def render_history(history: Sequence[Entry]) -> str:
    return "\n\n".join(render_entry(e) for e in history)


def size(history: Sequence[Entry]) -> int:
    """Return the characters `history` takes in the prompt."""
    return sum(len(render_entry(e)) + 2 for e in history)


def trimmed(history: tuple[Entry, ...], limit: int) -> tuple[Entry, ...]:
    """Return `history` without its oldest entries, so it fits `limit` (the newest stays)."""
    sizes = [len(render_entry(e)) + 2 for e in history]
    total = sum(sizes)
    start = 0
    while total > limit and start < len(history) - 1:
        total -= sizes[start]
        start += 1
    return history[start:]


def fold_count(history: Sequence[Entry], limit: int) -> int:
    """Return how many oldest entries to fold into a summary (0: none needed or possible).

    Folding starts once history passes `limit` and keeps what is left within
    half of it, so summaries are asked for rarely, never for the newest entry.
    """
    sizes = [len(render_entry(e)) + 2 for e in history]
    total = sum(sizes)
    if total <= limit or len(history) < 2:
        return 0
    fold = 0
    while total > limit // 2 and fold < len(history) - 1:
        total -= sizes[fold]
        fold += 1
    return fold


ARG_KEPT_CHARS = 1_000
"""Characters of each argument a call keeps in history."""


def kept(call: ToolCall) -> ToolCall:
    """Return `call` as history keeps it: each long argument cut, so history stays bounded."""
    shown = {k: render_args(v) for k, v in call.args.items()}
    if all(len(text) <= ARG_KEPT_CHARS for text in shown.values()):
        return call
    args = {
        k: cut(shown[k], ARG_KEPT_CHARS) if len(shown[k]) > ARG_KEPT_CHARS else v
        for k, v in call.args.items()
    }
    return call.model_copy(update={"args": args})
