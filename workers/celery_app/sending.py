"""Sending a step's messages: as Celery tasks, in one broker round trip, ids fixed.

Two or more advances sent at once (many starts, the tick's re-sends, a schedule's
firings) go out as `relay.advances` messages of at most MOST_RUNS runs each
(`celery_app.grouped`): one message, one delivery, one ack for many runs that each
need one short step. Each run keeps its own outbox entry, so a grouped message that is
lost is sent again by the tick run by run, as any lost advance.

A model call's and a tool call's task id is the same at every sending
(`<run>:m<seq>`, `<run>:<call>`), so Flower shows one task however often the
tick sends it again. A message that cannot be sent is logged and left to the
tick, which finds it in the outbox. `WorkerReach` says which messages this
worker may keep and run itself (`workers.runtime.continuation`).

A batch of task messages in one broker round trip.

Through Celery, each message is a publish of its own. On kombu's Redis
transport (5.x) that is an LPUSH (`Channel._put`) and, with task events on, a
PUBLISH of its `task-sent` event (`Channel._put_fanout`): two round trips per
message, one after the other, on the producer's connection (seen with MONITOR,
tests/test_publishing.py). `one_round_trip` lends the whole batch one producer
and, on Redis, for the length of the block, makes that producer's channel queue
those LPUSHes and PUBLISHes in one pipeline, sent when the block ends. On
RabbitMQ the batch shares the producer's one channel (publisher confirms stay
off), and its frames go out back to back.

The channel is ours alone while the producer is borrowed from the app's pool,
and what is patched is that one channel object, put back when the block ends.
If the pipeline cannot be sent, nothing of it was: every message is still in
the outbox, and the tick sends it again.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu import Producer
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from workers.celery_app.app import Queues
from workers.engine.effects import Message, Outgoing
from workers.settings import Settings

__all__ = [
    "MOST_RUNS",
    "Sender",
    "WorkerReach",
    "advance_task_id",
    "grouped_advances",
    "model_task_id",
    "one_round_trip",
    "sender",
    "tool_task_id",
]

log = logging.getLogger(__name__)


class WorkerReach:
    """Which steps a worker of `app` may continue in place (`runtime.continuation.Reach`)."""

    def __init__(
        self, app: Celery, queues: Queues, tool_limit_s: Callable[[str], float], settings: Settings
    ) -> None:
        self._app = app
        self._queues = {"advance": queues.advance, "call_model": queues.model}
        self._queues["run_tool"] = queues.tools
        self._tool_limit_s = tool_limit_s
        # A model call usually answers within one read timeout. One killed at the limit
        # is recovered like a crash (its lease lapses, the tick sends it again): paid
        # twice at worst, never lost. A tool is continued only within its own limit.
        self._model_s = settings.model_timeout + 30

    def owns(self, message: Message) -> bool:
        # The queues this worker consumes: `-Q`'s selection, set before a prefork pool
        # forks (so its children see it too); every declared queue when none was given.
        return self._queues[message.kind] in self._app.amqp.queues.consume_from

    def needs_s(self, message: Message) -> float:
        if message.kind == "run_tool":  # the time limit its own message would carry
            return _tool_time_limit(self._tool_limit_s, message.tool)
        return self._model_s if message.kind == "call_model" else 0.0


MOST_RUNS = 100
"""The most runs one `relay.advances` message carries: its task's events and summary stay
small, and no run waits behind more than 99 others' first steps in one worker slot."""


def advance_task_id(run_id: str) -> str:
    """A new task id for an advance of `run_id` (a run is advanced many times: each its own)."""
    return f"{run_id}:advance:{secrets.token_hex(4)}"


def model_task_id(run_id: str, seq: int) -> str:
    """The task id of a run's model call: the same at every sending."""
    return f"{run_id}:m{seq}"


def tool_task_id(run_id: str, call_id: str) -> str:
    """The task id of a run's tool call: the same at every sending."""
    return f"{run_id}:{call_id}"


class Sender:
    """Sends messages as tasks, with deterministic ids where they matter (`sender`)."""

    def __init__(self, send: Callable[[list[Message]], None]) -> None:
        self._send = send
        self._local = threading.local()

    def __call__(self, outgoing: list[Message] | Outgoing) -> None:
        # (A client command's steps emit `Outgoing`: its driver hands it here as it is.)
        messages = outgoing.messages if isinstance(outgoing, Outgoing) else outgoing
        gathered: list[Message] | None = getattr(self._local, "gathered", None)
        if gathered is not None:
            gathered.extend(messages)
        else:
            self._send(messages)

    @contextmanager
    def together(self) -> Iterator[None]:
        """Within this block, what this thread sends goes out when the block ends, in one
        batch (so its advances are grouped): the tick's schedule firings and re-sends.
        Each message's outbox entry covers the wait."""
        if getattr(self._local, "gathered", None) is not None:
            yield  # (an enclosing block sends them)
            return
        gathered: list[Message] = []
        self._local.gathered = gathered
        try:
            yield
        finally:
            self._local.gathered = None
            self._send(gathered)


def sender(
    app: Celery, queues: Queues, tool_time_limit: Callable[[str], float], slice_ms: int = 0
) -> Sender:
    """Return what sends messages as tasks, with deterministic ids where they matter.

    It takes a list of messages, or a client command's `Outgoing` as its steps emit it.
    A message that cannot be sent is logged and left to the tick, which finds
    it in the outbox and sends it again. `slice_ms` is the workers' RELAY_INLINE_MS: a
    tool's task gets that much more time limit (see `_tool_task_limit`).
    """
    task_limit = _tool_task_limit(tool_time_limit, math.ceil(max(slice_ms, 0) / 1000))

    def send(messages: list[Message]) -> None:
        if not messages:
            return
        groups, alone = grouped_advances(messages)
        try:  # a batch in one broker round trip (one_round_trip, below)
            with one_round_trip(app) as producer:
                for runs in groups:
                    try:
                        _send_advances(app, queues.advance, runs, producer)
                    except Exception as error:  # noqa: BLE001 - the outbox keeps them
                        log.warning("could not send the advances of %d runs: %s", len(runs), error)
                for message in alone:
                    try:
                        _send_one(app, queues, message, task_limit, producer)
                    except Exception as error:  # noqa: BLE001 - the outbox keeps it
                        what = f"{message.kind} for run {message.run}"
                        log.warning("could not send %s: %s", what, error)
        except Exception as error:  # noqa: BLE001 - the outbox keeps them; the tick re-sends
            log.warning("could not send %d message(s): %s", len(messages), error)

    return Sender(send)


def grouped_advances(messages: list[Message]) -> tuple[list[list[str]], list[Message]]:
    """Split `messages` into the runs whose advances go out together (chunks of at most
    MOST_RUNS, each of two or more runs) and the messages sent one by one.

    An advance applies everything in its run's inbox, so two advances of one run in one
    batch are one. A delayed advance keeps its own message (its countdown)."""
    runs = list(dict.fromkeys(m.run for m in messages if _is_quick_advance(m)))
    if len(runs) < 2:
        return [], messages
    chunks = [runs[i : i + MOST_RUNS] for i in range(0, len(runs), MOST_RUNS)]
    alone = [m for m in messages if not _is_quick_advance(m)]
    alone += [Message("advance", chunk[0]) for chunk in chunks if len(chunk) == 1]
    return [chunk for chunk in chunks if len(chunk) > 1], alone


def _is_quick_advance(message: Message) -> bool:
    return message.kind == "advance" and message.delay_ms <= 0


def _send_advances(app: Celery, queue: str, runs: list[str], producer: Producer) -> None:
    """Send one `relay.advances` message for `runs` (celery_app.grouped)."""
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    app.send_task(
        "relay.advances",
        args=[runs],
        task_id=f"advances:{secrets.token_hex(8)}",
        argsrepr=f"{len(runs)} runs: {shown}",
        queue=queue,
        producer=producer,
    )


def _send_one(
    app: Celery,
    queues: Queues,
    m: Message,
    task_limit: Callable[[str], int],
    producer: Producer,
) -> None:
    if m.kind == "call_model":
        app.send_task(
            "relay.call_model",
            args=[m.run, m.seq],
            task_id=model_task_id(m.run, m.seq),
            argsrepr=f"run={m.run} step={m.seq}",
            queue=queues.model,
            countdown=m.delay_ms / 1000 if m.delay_ms > 0 else None,
            producer=producer,
        )
    elif m.kind == "run_tool":
        app.send_task(
            "relay.run_tool",
            args=[m.run, m.call],
            task_id=tool_task_id(m.run, m.call),
            argsrepr=f"run={m.run} call={m.call} tool={m.tool or '?'}",
            queue=queues.tools,
            time_limit=task_limit(m.tool),
            producer=producer,
        )
    else:
        app.send_task(
            "relay.advance",
            args=[m.run],
            task_id=advance_task_id(m.run),
            argsrepr=f"run={m.run}",
            queue=queues.advance,
            producer=producer,
        )


def _tool_time_limit(tool_time_limit: Callable[[str], float], tool: str) -> int:
    """A tool call's hard time limit: its own timeout, and a minute to report it."""
    return int(tool_time_limit(tool)) + 60


def _tool_task_limit(tool_time_limit: Callable[[str], float], room_s: int) -> Callable[[str], int]:
    """The hard time limit of a tool's task: the call's own, and `room_s` (the slice).

    A task that continues its run runs a step only if that step's own limit fits in
    what is left of the task's (`Continuation`). With the call's limit alone, a tool's
    task could never run the run's next tool call after it, however fast both were:
    past the task's first instant, what is left is less than a whole limit. Each turn
    would then cost a message. A step starts only within the slice, so the slice's
    length of room lets a call with the same limit begun in it run all of its own.
    (A hung call is killed that much later: a second, by default.)"""
    return lambda tool: _tool_time_limit(tool_time_limit, tool) + room_s


# --- one round trip ----------------------------------------------------------------


_PATCHED = ("_put", "_put_fanout")


@contextmanager
def one_round_trip(app: Celery) -> Iterator[Producer]:
    """Yield a producer to publish a batch with (`send_task(..., producer=...)`); on Redis,
    what it publishes goes out in one pipeline when the block ends without error."""
    with app.producer_or_acquire() as producer:
        channel = producer.channel
        if not isinstance(channel, kombu_redis.Channel):
            yield producer
            return
        pipe = _batch_into(channel)
        try:
            yield producer
        finally:
            for name in _PATCHED:
                channel.__dict__.pop(name, None)
        pipe.execute()


def _batch_into(channel: Any) -> Any:
    """Make `channel` put into a pipeline (kombu's own `_put` and `_put_fanout`, writing
    to it instead of a client); return the pipeline."""
    pipe = channel._create_client().pipeline(transaction=False)

    def put(queue: str, message: dict[str, Any], **_: Any) -> None:
        priority = channel._get_message_priority(message, reverse=False)
        pipe.lpush(channel._q_for_pri(queue, priority), dumps(message))

    def put_fanout(exchange: str, message: dict[str, Any], routing_key: str, **_: Any) -> None:
        pipe.publish(channel._get_publish_topic(exchange, routing_key), dumps(message))

    channel._put = put
    channel._put_fanout = put_fanout
    return pipe
