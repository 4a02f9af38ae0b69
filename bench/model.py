"""The fake model: one scripted behaviour per task, read off the task's first line.

A task looks like `bench run-7 turns=50 size=200 park=1` (see `Task`). The
reply depends only on the prompt (which turns its history shows), so the same
function drives Relay through the loopback model server, the pure core in
process and LangGraph; history may be trimmed, since the newest turn always stays.

`Brain` is the model server's responder: it also notes when each call of each
task arrived (time.monotonic(), shared by every process of the machine) and
lets a benchmark wait for the next call of a task.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tests.support.model_server import ChatCall, Reply

__all__ = ["Brain", "Task", "reply_for"]

_NOOP = re.compile(r'noop \{"n": (\d+)')
_WAIT = re.compile(r'wait \{"ms": \d+, "i": (\d+)')
_TASK_LINE = re.compile(r"bench (\S+)((?: \w+=\d+)*)")
_FIELDS = ("turns", "size", "park", "batches", "batch", "ms", "delay_ms", "answer", "gap_ms")


@dataclass(frozen=True)
class Task:
    """What the model does for one run.

    `turns` noop calls (output padded to `size`), then, with `park`, one
    `approve_me` call, then the final answer (padded to `answer` characters).
    With `batches`, that many replies of `batch` parallel `wait(ms)` calls come
    first. Replies stream (when asked) `gap_ms` apart, 4 characters an event.
    """

    marker: str
    turns: int = 0
    size: int = 0
    park: int = 0
    batches: int = 0
    batch: int = 8
    ms: int = 0
    delay_ms: int = 0
    answer: int = 0
    gap_ms: int = 0

    def text(self) -> str:
        """The task text for `Relay.start` (the first line carries the script)."""
        fields = " ".join(f"{name}={getattr(self, name)}" for name in _FIELDS)
        return f"bench {self.marker} {fields}\nWork through the steps, then finish."

    @classmethod
    def parse(cls, prompt: str) -> Task | None:
        found = _TASK_LINE.search(prompt)
        if found is None:
            return None
        values = {k: int(v) for k, v in (p.split("=") for p in found.group(2).split())}
        return cls(marker=found.group(1), **values)


def reply_for(task: Task, prompt: str) -> tuple[str, int]:
    """Return the model's reply to `prompt` and the turn it answers (noop calls seen)."""
    waits = [int(i) for i in _WAIT.findall(prompt)]
    batches_done = (max(waits) + 1) // task.batch if waits else 0
    if batches_done < task.batches:
        first = batches_done * task.batch
        calls = [
            {"tool": "wait", "args": {"ms": task.ms, "i": first + k}} for k in range(task.batch)
        ]
        return json.dumps({"tools": calls}), batches_done
    turn = max((int(n) for n in _NOOP.findall(prompt)), default=0)
    if turn < task.turns:
        args = {"n": turn + 1, "size": task.size} if task.size else {"n": turn + 1}
        return json.dumps({"tool": "noop", "args": args}), turn
    if task.park and "approve_me {" not in prompt:
        return json.dumps({"tool": "approve_me", "args": {"n": 1}}), turn
    said = f"done after {turn} turns"
    padding = " and then some more words" * (max(task.answer - len(said), 0) // 25 + 1)
    return json.dumps({"final": (said + padding)[: max(task.answer, len(said))]}), turn


class Brain:
    """The model server's responder; records arrivals per task marker."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.arrivals: dict[str, list[tuple[float, int]]] = defaultdict(list)
        """marker -> [(time.monotonic() on arrival, turn answered)]"""
        self.on_call: Callable[[str, int], None] | None = None
        """Called (marker, turn) before replying, e.g. to sample what Redis holds."""

    def __call__(self, call: ChatCall) -> Reply | str:
        arrived = time.monotonic()
        task = Task.parse(call.prompt)
        if task is None:
            raise AssertionError(f"no bench task in the prompt: {call.prompt[:200]!r}")
        text, turn = reply_for(task, call.prompt)
        hook = self.on_call
        if hook is not None:
            hook(task.marker, turn)
        with self._cond:
            self.arrivals[task.marker].append((arrived, turn))
            self._cond.notify_all()
        if task.delay_ms or task.gap_ms:
            return Reply(text=text, delay=task.delay_ms / 1000, gap=task.gap_ms / 1000)
        return text

    def count(self, marker: str) -> int:
        with self._cond:
            return len(self.arrivals.get(marker, ()))

    def wait_for(self, marker: str, calls: int, timeout: float) -> float:
        """Block until `marker` has had `calls` calls; return when the last of them arrived.

        Raises:
            TimeoutError: it did not happen within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.arrivals.get(marker, ())) < calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{marker}: {calls} model calls did not come in time")
                self._cond.wait(left)
            return self.arrivals[marker][calls - 1][0]

    def reset(self) -> None:
        with self._cond:
            self.arrivals.clear()
