"""Hot agents: the agents this process saved last, so the next step skips the restore.

A worker that saves a run's step usually makes its next one too. Restoring the
agent means reading its snapshot from Redis and validating it (time and bytes
that grow with history); instead the store keeps, per run, the agent it saved
with the version and record that save wrote. A load that finds Redis still at
that version and record uses the agent as it is: this process wrote that state,
so it is trusted without validation. Anything else (another worker saved since,
the run was written by hand, an old process) misses and is read and validated.
Bounded: the least recently used run goes first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from agent_core import Agent
from workers.engine.records import RunRecord

__all__ = ["HOT_AGENTS", "HotAgent", "HotAgents"]

HOT_AGENTS = 256
"""Runs whose agent a worker process keeps (a few hundred: each holds its history)."""


@dataclass(frozen=True)
class HotAgent:
    """A run as this process saved it: version, record (and its stored text), agent.

    `agent` is never advanced itself: takers advance a `copy()`."""

    version: str
    meta: bytes
    record: RunRecord
    agent: Agent


class HotAgents:
    """An LRU of `HotAgent`s by run id; safe to share between threads."""

    def __init__(self, size: int = HOT_AGENTS) -> None:
        self.size = size
        self._runs: OrderedDict[str, HotAgent] = OrderedDict()
        self._lock = threading.Lock()

    def version(self, run_id: str) -> str:
        """Return the version kept for the run ('' for none): a load sends it, and Redis
        leaves the snapshot out of its answer when it still holds that version."""
        with self._lock:
            hot = self._runs.get(run_id)
            return "" if hot is None else hot.version

    def get(self, run_id: str, version: str, meta: bytes) -> HotAgent | None:
        """Return the run's agent if kept at exactly this version and record text."""
        with self._lock:
            hot = self._runs.get(run_id)
            if hot is None or hot.version != version or hot.meta != meta:
                return None
            self._runs.move_to_end(run_id)
            return hot

    def put(self, run_id: str, hot: HotAgent) -> None:
        with self._lock:
            self._runs[run_id] = hot
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.size:
                self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
