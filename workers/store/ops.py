"""What the store asks of Redis, written once for both transports (sync and asyncio).

A read or change that takes more than one round trip is a generator of steps: it
yields each operation (a `Command`, a `Batch` of commands sent together, or a
`ScriptCall`), receives its answer, and returns what it found. The keys, the
arguments and the reading of the answers live in the generator; only the driver
does I/O: `Connection.drive` with redis-py's client, `AsyncConnection.drive`
with `redis.asyncio`'s. So `Relay` and `AsyncRelay` send the same commands and
read the same answers, and neither has a twin of the other's logic.

    def outcome_steps(keys, run_id) -> Steps[...]:
        meta, follow_up = yield Command(("HMGET", keys.run(run_id), RECORD, FOLLOW_UP))
        ...
        return record, follow_up is not None
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from workers.store.scripts import ScriptCall

__all__ = ["Batch", "Command", "Emit", "Op", "Steps", "answer_of", "command_steps", "just"]

T = TypeVar("T")


@dataclass(frozen=True)
class Command:
    """One Redis command, as `execute_command` takes it: `("HMGET", key, field, ...)`.
    Its answer comes back as redis-py's response callbacks read it (the same for both
    clients)."""

    args: tuple[Any, ...]


@dataclass(frozen=True)
class Batch:
    """Commands sent in one round trip; the answer is their answers, in order. With
    `transaction`, they run as one (MULTI/EXEC: their keys in one slot on a cluster)."""

    commands: tuple[Command, ...]
    transaction: bool = False


@dataclass(frozen=True)
class Emit:
    """Not an operation: a value the steps hand to whoever iterates them (a stream's
    event, a trace line), sent back None. `iterate` and `aiterate` yield these."""

    value: Any


Op = Command | Batch | ScriptCall[Any] | Emit
Steps = Generator[Op, Any, T]
"""Yields operations, is sent each one's answer, returns its result."""


def just(value: T) -> Steps[T]:
    """Steps that ask nothing and return `value` (for a branch with nothing to read)."""
    return value
    yield  # a generator, though it never yields  # type: ignore[unreachable]


def command_steps(*args: Any) -> Steps[Any]:
    """Steps of one command (`command_steps("SET", key, 1, "NX")`): its answer."""
    answer = yield Command(args)
    return answer


def answer_of(op: Op, raw: Any) -> Any:
    """What a step is sent for `op`, given what the client answered: a script's answer
    read by its call; a command's or a batch's as the client gave it."""
    if isinstance(op, ScriptCall):
        return op.read(raw)
    return raw
