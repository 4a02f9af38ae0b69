"""A scripted model for runtime tests: many runs at once, each playing its own script.

A script is chosen by a marker in the run's task. Which reply comes next is
read off the prompt: the number of `→` lines (results, answers, sent-back
finals) the history shows. That keeps replies right when calls are retried
or duplicated, and lets a script react to a batch of N results at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.model_server import ChatCall, Reply

__all__ = ["Brain", "batch", "call", "final"]

PLAN_ASK = "Reply now with your plan"
SUMMARY_SYSTEM = "You keep an agent's notes short"


def call(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args})


def batch(*calls: tuple[str, dict[str, Any]]) -> str:
    return json.dumps({"tools": [{"tool": t, "args": a} for t, a in calls]})


def final(text: str, **extra: Any) -> str:
    return json.dumps({"final": text, **extra})


@dataclass
class _Script:
    replies: dict[int, list[Reply | str]]
    plan: str


@dataclass
class Brain:
    """The responder for a `ModelServer`: `brain.script("T-1", {0: call(...), 1: final(...)})`."""

    scripts: dict[str, _Script] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def script(
        self,
        marker: str,
        replies: Mapping[int, Reply | str | list[Reply | str]],
        *,
        plan: list[str] | None = None,
    ) -> None:
        """Play `replies[n]` when the prompt shows n results.

        A list is played in order, its last entry repeating."""
        steps = {n: (list(r) if isinstance(r, list) else [r]) for n, r in replies.items()}
        self.scripts[marker] = _Script(steps, json.dumps({"plan": plan or ["Do the task."]}))

    def __call__(self, chat: ChatCall) -> Reply | str:
        if chat.system.startswith(SUMMARY_SYSTEM):
            return "Summary: the earlier work went fine."
        task = chat.prompt.split("\n\n", 1)[0]
        with self.lock:
            # The longest marker wins, so RUN-1 does not answer for RUN-10.
            markers = sorted((m for m in self.scripts if m in task), key=len, reverse=True)
            script = self.scripts[markers[0]] if markers else None
            if script is None:
                raise AssertionError(f"no script for the task in: {task[:200]!r}")
            if PLAN_ASK in chat.prompt:
                return script.plan
            turn = chat.prompt.count("\n→ ")
            queue = script.replies.get(turn)
            if queue is None:
                raise AssertionError(
                    f"the script has no reply for turn {turn}:\n{chat.prompt[-1500:]}"
                )
            return queue.pop(0) if len(queue) > 1 else queue[0]
