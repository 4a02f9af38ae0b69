"""`AsyncRelay`: a Relay's client API for asyncio apps (FastAPI, Starlette, aiohttp).

    relay = Relay("notes", ...)
    arelay = AsyncRelay(relay)

    @app.post("/runs")
    async def start(task: str) -> dict[str, str]:
        return {"run_id": await arelay.start(task)}

    async for event in arelay.stream(run_id):   # resumable: after=event.id
        ...

Every command is the one `Relay` sends, written once as steps (`workers.store.ops`:
the keys, the scripts, the reading of what comes back) in `workers.client`; here
they are awaited on `redis.asyncio` instead of run on redis-py's sync client. Only
the broker message that wakes a run is sent through the app's Celery producer, on
a thread (kombu has no asyncio producer); a message lost there is sent again by
the tick, as always.

The Redis client belongs to the event loop that uses it (one is made per loop);
`await arelay.aclose()` at the end of an app's lifespan closes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from agent_core import Outcome
from workers.client.runs import (
    MESSAGE_CHARS,
    answer_steps,
    cancel_steps,
    decide_steps,
    extend_steps,
    plan_steps,
    reply_steps,
    runs_steps,
    status_steps,
    steer_steps,
    stream_steps,
    trace_steps,
    wait_steps,
    watch_steps,
)
from workers.client.start import checked_many, start_steps
from workers.engine.budget import Budget
from workers.engine.effects import Message, Outgoing
from workers.engine.events import CallDecision, PauseRun, ResumeRun, Told
from workers.engine.records import (
    Pending,
    ReplyStrategy,
    RunStatus,
    StreamEvent,
    TraceEntry,
    lists_of,
)
from workers.errors import DecisionRefused, RelayError
from workers.relay import Relay
from workers.settings import now_ms
from workers.store import reads
from workers.store.aconnection import AsyncConnection
from workers.store.layout import Keys
from workers.store.ops import Steps

__all__ = ["AsyncRelay"]

A = TypeVar("A")


class AsyncRelay:
    """The client API of `relay` on asyncio: the same commands, awaited."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._connection: AsyncConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def connection(self) -> AsyncConnection:
        """The asyncio Redis client of the running event loop, made on its first use
        there (redis.asyncio's connections belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._connection is None or self._loop is not loop:
            settings = self.relay.settings
            self._connection = AsyncConnection(
                self.relay.redis_url, settings.prefix, cluster=settings.cluster
            )
            self._loop = loop
        return self._connection

    async def aclose(self) -> None:
        """Close the Redis client (the next command makes a new one)."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await connection.aclose()

    async def __aenter__(self) -> AsyncRelay:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def drive(self, steps: Steps[A]) -> A:
        """Await `steps` (`workers.store.ops`: a read of `workers.store.reads`, say) on this
        loop's client, sending the broker messages they emit: for what the methods below
        do not cover (relay web reads a trace from a position, a journal's tail)."""
        return await self.connection.drive(steps, on_emit=self._deliver)

    async def _deliver(self, value: object) -> None:
        if isinstance(value, Outgoing):
            send = self.relay.send_messages
            await asyncio.to_thread(send, value.messages)

    def _due(self) -> int:
        return now_ms() + self.relay.settings.timing.grace_ms

    @property
    def keys(self) -> Keys:
        """The key map of this loop's client."""
        return self.connection.keys

    # --- starting and reading runs ---------------------------------------------------

    async def start(self, task: str, context: str = "", **options: Any) -> str:
        """Start a run and return its id, as `Relay.start` (the same options)."""
        memory = options.get("memory")
        notes = await self.drive(reads.memory(self.keys, memory)) if memory else []
        made = self.relay.prepare_run(task, context, remembered=lambda _name: notes, **options)
        return await self.drive(start_steps(self.keys, made))

    async def start_many(self, tasks: Sequence[str], **options: Any) -> list[str]:
        """Start a run for each of `tasks` and return their ids, as `Relay.start_many`: their
        first steps sent together, as few Celery messages."""
        memory = options.get("memory")
        notes = await self.drive(reads.memory(self.keys, memory)) if memory else []
        made = [
            self.relay.prepare_run(task, remembered=lambda _name: notes, **options)
            for task in checked_many(tasks, options)
        ]
        first: list[Message] = []

        async def keep(sent: object) -> None:
            if isinstance(sent, Outgoing):
                first.extend(sent.messages)

        try:
            return [await self.connection.drive(start_steps(self.keys, one), keep) for one in made]
        finally:  # (the runs stored before a failure are started too)
            if first:
                await asyncio.to_thread(self.relay.send_messages, first)

    async def status(self, run_id: str) -> RunStatus:
        """Where the run is (`Relay.status`)."""
        return await self.drive(status_steps(self.keys, run_id))

    async def wait(self, run_id: str, timeout: float = 60.0) -> Outcome:
        """The run's outcome once it finishes (`Relay.wait`; WaitTimeout after `timeout`)."""
        return await self.drive(wait_steps(self.keys, run_id, timeout))

    async def trace(self, run_id: str) -> list[TraceEntry]:
        """The run's trace so far (`Relay.trace`)."""
        return await self.drive(trace_steps(self.keys, run_id))

    async def runs(self, limit: int = 100, state: str = "", before: str = "") -> list[RunStatus]:
        """The newest runs first, in `state` if given, before the cursor `before` if given
        (`Relay.runs`; ValueError for a state or a cursor that is none)."""
        return await self.drive(runs_steps(self.keys, limit, state, before))

    async def count_runs(self, state: str = "") -> int:
        """How many runs are in `state` (every run if ""; `Relay.count_runs`)."""
        return await self.drive(reads.count_runs(self.keys, lists_of(state)))

    async def pending(self) -> list[Pending]:
        """What waits on a person (`Relay.pending`)."""
        return await self.drive(reads.pending(self.keys))

    # --- deciding ----------------------------------------------------------------------

    async def approve(
        self,
        run_id: str,
        call_id: str,
        yes: bool = True,
        reason: str = "",
        *,
        args: dict[str, Any] | None = None,
        by: str = "",
    ) -> None:
        """Decide a call that waits for approval (`Relay.approve`: refused unless pending;
        edited `args` are checked against the tool as the model's were)."""
        _check_yes(yes)
        if not isinstance(call_id, str):
            raise DecisionRefused(f"a call id is text, got {call_id!r}")
        if args is not None and yes:
            status = await self.status(run_id)
            args = self.relay.edit_checked(status, call_id, args)
        elif args is not None:
            raise DecisionRefused("edited arguments are a dict, and go with an approval")
        event = CallDecision(
            call=call_id, yes=yes, reason=str(reason)[:2_000], by=str(by)[:200], args=args
        )
        await self.drive(decide_steps(self.keys, self._due(), run_id, "call", call_id, event=event))

    async def deny(self, run_id: str, call_id: str, reason: str = "") -> None:
        """Decline a call that waits for approval (the model is told)."""
        await self.approve(run_id, call_id, yes=False, reason=reason)

    async def approve_plan(self, run_id: str, yes: bool = True, *, by: str = "") -> None:
        """Decide the plan a run waits on."""
        _check_yes(yes)
        await self.drive(plan_steps(self.keys, self._due(), run_id, yes, by))

    async def answer(self, run_id: str, text: str, *, by: str = "") -> None:
        """Answer the question a run waits on."""
        if not isinstance(text, str):
            raise DecisionRefused("an answer must be text")
        await self.drive(answer_steps(self.keys, self._due(), run_id, text, by))

    async def extend(
        self, run_id: str, more: Budget, *, step: int | None = None, by: str = ""
    ) -> int:
        """Raise the tree's budget by `more` and let its runs parked at the budget go on;
        return how many were woken; with `step`, once, as that wait's decision; `by`: who
        raised it (`Relay.extend`)."""
        steps = extend_steps(self.keys, self._due(), run_id, more, step=step, by=by)
        return await self.drive(steps)

    # --- steering ------------------------------------------------------------------------

    async def cancel(self, run_id: str, reason: str = "") -> bool:
        """Stop a run and its children; False if it had finished already."""
        return await self.drive(cancel_steps(self.keys, self._due(), run_id, reason))

    async def send(self, run_id: str, text: str) -> None:
        """Tell a run something (`Relay.send`)."""
        if not isinstance(text, str) or not text.strip():
            raise RelayError("a message must be non-empty text")
        event = Told(text=text[:MESSAGE_CHARS])
        await self.drive(steer_steps(self.keys, self._due(), run_id, event, "send a message to"))

    async def pause(self, run_id: str) -> bool:
        """Pause a run and its specialists at their next step; False if it had finished."""
        return await self.drive(steer_steps(self.keys, self._due(), run_id, PauseRun(), ""))

    async def resume(self, run_id: str) -> bool:
        """Let a paused run go on; False if it had finished."""
        return await self.drive(steer_steps(self.keys, self._due(), run_id, ResumeRun(), ""))

    async def reply(self, run_id: str, text: str, strategy: ReplyStrategy = "enqueue") -> None:
        """Continue a run with a new request (`Relay.reply`)."""
        await self.drive(reply_steps(self.keys, self._due(), run_id, text, strategy))

    # --- following -----------------------------------------------------------------------

    async def stream(
        self, run_id: str, after: str = "0", *, timeout: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The run's live events after the id `after` until it finishes (`Relay.stream`):
        pass the last id seen as `after` to resume."""
        async for event in self.connection.iterate(stream_steps(self.keys, run_id, after, timeout)):
            yield event

    async def watch(
        self, run_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[TraceEntry]:
        """The trace of a run and its descendants as it happens (`Relay.watch`)."""
        async for entry in self.connection.iterate(watch_steps(self.keys, run_id, timeout)):
            yield entry


def _check_yes(yes: object) -> None:
    if not isinstance(yes, bool):
        raise DecisionRefused(f"a decision is True or False, got {yes!r}")
