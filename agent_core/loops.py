"""Noticing a turn that goes nowhere, so it cannot run on until its limits.

Two signs, counted per turn in `Loops` (part of the state): the same call
(tool, arguments and result all identical) made again and again, and calls
that fail one after another. At `max_repeats` of either the model is told
once, in plain words; at twice that the turn stops with `Stop.NO_PROGRESS`.
A call is remembered by a digest, and only the most recent `SEEN_KEPT`
distinct calls are kept, so the state stays small however long a turn goes.

The agent's own turns count too: the same note remembered again, or the same
question asked and answered the same way, is a repeated call. They do not
touch the run of failures (they are not calls of a tool).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_core.state import Loops, Seen, seen_digest
from agent_core.text import cut
from agent_core.tools import ToolOutput

__all__ = ["SEEN_KEPT", "Attempt", "Verdict", "observe"]

SEEN_KEPT = 64
SHOWN_CHARS = 200


@dataclass(frozen=True)
class Attempt:
    """One call and what came of it, as the loop counters see it."""

    shown: str
    """How the call reads to a person, e.g. `read_file(path="a")`."""
    tool: str
    args: dict[str, Any]
    output: ToolOutput


@dataclass(frozen=True)
class Verdict:
    """The counters after some calls, and what to do: tell the model, stop, or carry on."""

    loops: Loops
    warning: str = ""
    """Tell the model this, once (empty: nothing to tell)."""
    stop: str = ""
    """Stop the turn with NO_PROGRESS and this summary (empty: carry on)."""


def _key(done: Attempt) -> str:
    text = json.dumps(
        [done.tool, done.args, done.output.status, done.output.text],
        sort_keys=True,
        ensure_ascii=True,
        default=str,
    )
    # 48 bits (state.DIGEST_BYTES): ample to tell apart the SEEN_KEPT calls kept, and
    # short, as the state is saved each step.
    return seen_digest(hashlib.sha256(text.encode("ascii")).digest())


def _seen(seen: list[Seen], key: str) -> int:
    """Count `key` once more in `seen` (moved to the newest end); return its count."""
    index = next((i for i, s in enumerate(seen) if s.key == key), None)
    count = 1 if index is None else seen.pop(index).count + 1
    seen.append(Seen(key=key, count=count))
    return count


def observe(
    loops: Loops, calls: Sequence[Attempt], limit: int, *, tool_calls: bool = True
) -> Verdict:
    """Return the counters after `calls` (in order) and what they call for.

    `limit` is `Config.max_repeats`. With `tool_calls=False` (the agent's own
    turns), the run of failures is left as it was.
    """
    seen = list(loops.seen)
    failures = loops.failures
    worst, worst_shown = 0, ""
    for done in calls:
        count = _seen(seen, _key(done))
        if count > worst:
            worst, worst_shown = count, cut(done.shown, SHOWN_CHARS)
        if tool_calls:
            failures = failures + 1 if done.output.status == "error" else 0
    counted = Loops(seen=tuple(seen[-SEEN_KEPT:]), failures=failures, warned=loops.warned)
    return _judge(counted, worst, worst_shown, limit)


def _judge(loops: Loops, worst: int, shown: str, limit: int) -> Verdict:
    """Return what counts of `worst` repeats of `shown` and `loops.failures` call for."""
    failures = loops.failures
    if worst >= 2 * limit:
        return Verdict(
            loops, stop=f"No progress: the same call got the same result {worst} times: {shown}."
        )
    if failures >= 2 * limit:
        return Verdict(loops, stop=f"No progress: {failures} calls failed in a row.")
    if loops.warned or max(worst, failures) < limit:
        return Verdict(loops)
    warned = loops.model_copy(update={"warned": True})
    if worst >= limit:
        return Verdict(
            warned,
            warning=(
                f"You have made the same call {worst} times and got the same result each"
                f" time: {shown}. Doing it again will not change the result. Try something"
                " different, or give your final answer with what you have."
            ),
        )
    return Verdict(
        warned,
        warning=(
            f"Your last {failures} calls failed. Doing more of the same will not help. Try"
            " a different approach, or give your final answer and say what went wrong."
        ),
    )
