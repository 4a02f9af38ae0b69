"""Two runs side by side (`relay diff A B`): each step labelled as the run took it, and
for each that differs, what differs, in words.

A step is labelled from its journal (`run pay`, `ask`) and, where the run was replayed,
from what it waited on: a run's ending is named by how it ended (`done`, `cancelled`,
`failed`), never `done` for all. Two steps that differ say how: `tool differs: pay ->
refund`, `args differ: amount 10 -> 20`, `reply text differs`, `ending differs: done ->
cancelled`, `system prompt differs`. Nothing here does I/O: `Replays.diff` reads and
replays the journals, and hands them here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agent_core import Outcome
from agent_core.steps import FROZEN
from workers.engine.journal import StepSeen
from workers.engine.records import ForkedFrom, RunRecord, Usage
from workers.engine.replay import Taken

__all__ = ["Diff", "DiffRow", "RunSide", "Steps", "diff_of"]

SHOWN_CHARS = 40
"""Characters of an argument's value a difference shows."""


class RunSide(BaseModel):
    """One run of a diff: its outcome and what it used."""

    model_config = FROZEN
    run_id: str
    state: str
    stop: str | None
    steps: int
    usage: Usage
    tool_calls: int
    forked_from: ForkedFrom | None = None


class DiffRow(BaseModel):
    model_config = FROZEN
    step: int
    """The step, numbered as in the first run (a fork's steps follow its fork point)."""
    a: str
    b: str
    same: bool
    differs: str = ""
    """What differs, in words ("" when the steps are the same)."""


class Diff(BaseModel):
    """Two runs step by step (`relay diff A B`), with the first step they differ at."""

    model_config = FROZEN
    a: RunSide
    b: RunSide
    rows: tuple[DiffRow, ...]
    first_difference: int | None
    """The first step that differs (None: the same steps, as far as both went)."""


@dataclass(frozen=True)
class Steps:
    """One run's side of a diff: its record (where it is now), its journal's steps, and
    what each step its replay reached waits on (fewer, if this code replays it otherwise)."""

    record: RunRecord
    total: Usage
    seen: Sequence[StepSeen]
    taken: Sequence[Taken]


@dataclass(frozen=True)
class _Step:
    """A step as a row shows it: its label, and what it waits on (where known)."""

    seen: StepSeen
    label: str
    taken: Taken | None


def diff_of(a: Steps, b: Steps) -> Diff:
    """The diff of two runs, numbered in A's steps."""
    offset_a, offset_b = _offsets(a.record, b.record)
    one, two = _labelled(a), _labelled(b)
    rows = []
    last = max(len(one) + offset_a, len(two) + offset_b)
    for step in range(max(offset_a, offset_b) + 1, last + 1):
        x = one[step - offset_a - 1] if 0 < step - offset_a <= len(one) else None
        y = two[step - offset_b - 1] if 0 < step - offset_b <= len(two) else None
        same = x is not None and y is not None and x.seen == y.seen
        said = "" if same else _differs(x, y)
        rows.append(DiffRow(step=step, a=_label(x), b=_label(y), same=same, differs=said))
    first = next((r.step for r in rows if not r.same), None)
    return Diff(a=_side(a), b=_side(b), rows=tuple(rows), first_difference=first)


def _offsets(a: RunRecord, b: RunRecord) -> tuple[int, int]:
    """Where each run's first step falls in A's numbering. A fork's first step states
    again where its fork point left the other (the steps before are the other's,
    shared): a fork at N > 0 begins at the other's step N (at 0, at step 1, which only
    settles the started agent)."""
    if b.forked_from is not None and b.forked_from.run == a.id:
        return 0, max(b.forked_from.step - 1, 0)
    if a.forked_from is not None and a.forked_from.run == b.id:
        return max(a.forked_from.step - 1, 0), 0
    return 0, 0


def _labelled(side: Steps) -> list[_Step]:
    """Each step of a run with its label; an ending is named by how it ended (the run's
    own outcome for its last step, which counts a stop the host imposed)."""
    steps = []
    record = side.record
    last = len(side.seen) - 1 if record.state == "finished" and record.outcome else None
    for index, seen in enumerate(side.seen):
        taken = side.taken[index] if index < len(side.taken) else None
        ending = record.outcome if index == last else taken.ending if taken else None
        steps.append(_Step(seen, _step_label(seen, ending), taken))
    return steps


def _step_label(seen: StepSeen, ending: Outcome | None) -> str:
    if seen.kind == "done":
        return ending.stop.value if ending is not None else "ended"
    return f"{seen.kind} {', '.join(seen.tools)}".strip()


def _label(step: _Step | None) -> str:
    return "" if step is None else step.label


def _differs(x: _Step | None, y: _Step | None) -> str:
    """What differs between two steps at the same place, in words."""
    if x is None or y is None:
        return f"only the {'first' if y is None else 'second'} run went this far"
    if x.seen.kind != y.seen.kind:
        return f"step differs: {x.label} -> {y.label}"
    if x.seen.kind == "run":
        return _calls_differ(x, y)
    return _kind_differs(x, y)


def _kind_differs(x: _Step, y: _Step) -> str:
    """What differs between two steps of the same kind that make no calls."""
    kind = x.seen.kind
    if kind == "done":
        same_end = x.label == y.label
        return "reply text differs" if same_end else f"ending differs: {x.label} -> {y.label}"
    if kind in ("ask", "summarize"):
        if x.seen.system != y.seen.system:
            return "system prompt differs"
        return "prompt differs (what the model is shown of the run so far)"
    return f"{kind} differs"


def _calls_differ(x: _Step, y: _Step) -> str:
    if x.seen.tools != y.seen.tools:
        return f"tool differs: {', '.join(x.seen.tools)} -> {', '.join(y.seen.tools)}"
    if x.taken is None or y.taken is None:
        return "args differ"  # (this code replays one of them otherwise: no arguments)
    changes = [
        change
        for (_, before), (_, after) in zip(x.taken.calls, y.taken.calls, strict=False)
        for change in _arg_changes(before, after)
    ]
    return f"args differ: {'; '.join(changes)}" if changes else "call ids differ"


def _arg_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """`amount 10 -> 20` for each argument that differs (`-` where one has none)."""
    return [
        f"{name} {_value(before, name)} -> {_value(after, name)}"
        for name in sorted(set(before) | set(after), key=lambda n: (n not in before, n))
        if before.get(name, _NONE) != after.get(name, _NONE)
    ]


_NONE = object()


def _value(args: dict[str, Any], name: str) -> str:
    if name not in args:
        return "-"
    shown = json.dumps(args[name], ensure_ascii=False, default=str)
    return shown if len(shown) <= SHOWN_CHARS else shown[: SHOWN_CHARS - 1] + "…"


def _side(side: Steps) -> RunSide:
    record = side.record
    calls = sum(len(seen.tools) for seen in side.seen if seen.kind == "run")
    return RunSide(
        run_id=record.id,
        state=record.state,
        stop=record.outcome.stop.value if record.outcome else None,
        steps=len(side.seen),
        usage=side.total,
        tool_calls=calls,
        forked_from=record.forked_from,
    )
