"""Relay's runtime without Celery: the task bodies called in a loop in this process.

`LocalRuntime` builds `workers.runtime.bodies.Runtime` on the bench app with a list in
place of the broker: each message a step sends is appended, and `drain` calls
the task body it names (`advance`, `call_model`, `run_tool`) until none are
left. What it costs per turn is Relay's own work (Redis, serialisation, the
agent core, the model call) with no Celery at all, so the difference from a
worker-driven turn is what Celery adds. The model is either the loopback HTTP
server or an in-process function.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable

from agent_core import ModelRequest
from bench.app import CONFIG, build
from bench.model import Task, reply_for
from workers import Settings
from workers.engine.effects import Message
from workers.engine.records import RunRecord, Usage
from workers.model.transport import ModelSource
from workers.model.wire import Model, ModelReply, complete
from workers.runtime.bodies import Runtime
from workers.settings import now_ms

__all__ = ["EveryQueue", "LocalModel", "LocalRuntime", "local_turn_ms"]


class LocalModel:
    """The bench's fake model as a function call (no HTTP), async: it answers on the
    process's loop at once, holding no thread."""

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        del should_stop, on_text
        task = Task.parse(request.prompt)
        assert task is not None, "not a bench task"
        text, _ = reply_for(task, request.prompt)
        return ModelReply(
            text=text, usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        )


class EveryQueue:
    """This process consumes every queue: each single next step may be continued."""

    def owns(self, message: Message) -> bool:
        del message
        return True

    def needs_s(self, message: Message) -> float:
        del message
        return 0.0


class _Marked:
    """A model that notes when each call begins (a turn runs from one to the next); async,
    whatever the model it wraps (`workers.model.wire.complete` runs a sync one)."""

    def __init__(self, model: Model, marks: list[float]) -> None:
        self._model = model
        self._marks = marks

    async def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply:
        self._marks.append(time.perf_counter())
        return await complete(self._model, request, should_stop=should_stop, on_text=on_text)


class LocalRuntime:
    """The runtime's task bodies driven in a loop; `messages` counts what was sent, by kind.

    `continued`: as a worker consuming every queue runs them, each next step continued
    in place while the slice (RELAY_INLINE_MS) lasts; else every step is a message."""

    def __init__(
        self, settings: Settings, model: Model | None = None, *, continued: bool = False
    ) -> None:
        # Each step runs where this loop sent it: no model call is carried past it.
        settings = settings.model_copy(update={"model_carried": 0})
        self.relay = build(settings)
        self.queue: deque[Message] = deque()
        self.messages: dict[str, int] = {}
        self.model_calls: list[float] = []
        """When each model call began (perf_counter)."""
        chosen = _Marked(model if model is not None else self.relay.model(), self.model_calls)
        self.runtime = Runtime(
            settings,
            self.relay.store,
            self.relay.kit,
            models=ModelSource(settings, chosen),
            send=self._send,
            tick=self.relay.tick,
            reach=EveryQueue() if continued else None,
        )

    def stop(self) -> None:
        """Write what the runtime counted (its metrics) while its Redis is still up: left
        to the process's exit, the counts meet a Redis the bench has already stopped."""
        self.runtime.stop()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _send(self, messages: list[Message]) -> None:
        for message in messages:
            self.messages[message.kind] = self.messages.get(message.kind, 0) + 1
        self.queue.extend(messages)

    def start(self, task: Task, more: str = "") -> str:
        """Create a run as `Relay.start` does, with its first advance queued here (its
        task text followed by `more`)."""
        text = task.text() + more
        agent = self.relay.kit.new_agent(CONFIG)
        agent.start_with(text, "", ())
        run_id = secrets.token_hex(8)
        now = now_ms()
        record = RunRecord(
            id=run_id,
            root=run_id,
            task=text,
            created_ms=now,
            updated_ms=now,
            config=CONFIG,
        )
        self.relay.store.create(record, agent.snapshot(), now + 120_000)
        self._send([Message("advance", run_id)])
        return run_id

    def drain(self) -> int:
        """Run queued messages (and those they send) until none are left; return how many."""
        done = 0
        while self.queue:
            self.drain_one()
            done += 1
        return done

    def drain_one(self) -> Message:
        """Run the first queued message; return it."""
        message = self.queue.popleft()
        self.runtime.task(message)
        return message


def local_turn_ms(local: LocalRuntime, task: Task) -> list[float]:
    """Run `task` in process; return each turn's ms (from one model call's start to the
    next's)."""
    local.start(task)
    del local.model_calls[:]
    local.drain()
    marks = local.model_calls
    return [(later - earlier) * 1000 for earlier, later in itertools.pairwise(marks)]
