"""A batch of task messages in one broker round trip.

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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu import Producer
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

__all__ = ["one_round_trip"]

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
