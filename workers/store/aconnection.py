"""The asyncio twin of `Connection`'s transport, and nothing else: it runs the same
steps (`workers.store.ops`) on `redis.asyncio`'s client, for `AsyncRelay`.

The keys, commands, scripts and the reading of their answers are the store's,
written once; this only awaits them. Made inside the event loop that uses it
(redis.asyncio binds its connections to one loop).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from workers.store.cluster import cluster_url, connect_async
from workers.store.connection import redis_errors
from workers.store.layout import Keys
from workers.store.ops import Batch, Emit, Op, Steps, answer_of
from workers.store.scripts import ScriptCall, lua

__all__ = ["AsyncConnection"]

A = TypeVar("A")


class AsyncConnection:
    """An asyncio client of one Redis (or cluster), its keys and its scripts."""

    def __init__(self, url: str, prefix: str, *, cluster: bool = False) -> None:
        self.url = url
        self.keys = Keys(prefix, cluster=cluster or cluster_url(url))
        with redis_errors(url):
            self.redis: Any = connect_async(url, cluster=self.keys.cluster)
        self._scripts: dict[str, Any] = {}

    async def drive(
        self, steps: Steps[A], on_emit: Callable[[Any], Awaitable[object]] | None = None
    ) -> A:
        """Run `steps` as `Connection.drive` does, awaiting each operation (and
        `on_emit` for each value they emit)."""
        answer: Any = None
        while True:
            with redis_errors(self.url):
                try:
                    op = steps.send(answer)
                except StopIteration as done:
                    result: A = done.value
                    return result
                if not isinstance(op, Emit):
                    answer = answer_of(op, await self.execute(op))
                    continue
            answer = None
            if on_emit is not None:
                await on_emit(op.value)

    async def iterate(self, steps: Steps[A]) -> AsyncIterator[Any]:
        """Run `steps` as `Connection.iterate` does, yielding each value they emit."""
        answer: Any = None
        while True:
            with redis_errors(self.url):
                try:
                    op = steps.send(answer)
                except StopIteration:
                    return
                if not isinstance(op, Emit):
                    answer = answer_of(op, await self.execute(op))
                    continue
            answer = None
            yield op.value

    async def execute(self, op: Op) -> Any:
        """What the client answers to one operation (a script's answer not yet read)."""
        if isinstance(op, ScriptCall):
            script = self._scripts.get(op.name)
            if script is None:
                script = self._scripts[op.name] = self.redis.register_script(lua(op.name))
            return await script(keys=op.keys, args=op.args)
        if isinstance(op, Batch):
            pipe = self.redis.pipeline(transaction=op.transaction)
            for command in op.commands:
                pipe.execute_command(*command.args)
            return await pipe.execute()
        assert not isinstance(op, Emit)
        return await self.redis.execute_command(*op.args)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.redis.aclose()
