"""A Relay app's Redis broker channel keeps one redis-py client (`celery_app.channels`).

kombu alone builds a new `redis.Redis` for every task message, task event and
acknowledgement it sends: tens of microseconds of CPU each, several times a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis

from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import Settings
from workers.celery_app.channels import KeptClientChannel, RelayConnection


def _count_clients(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the redis-py clients made from now on, in this process."""
    made: list[int] = []
    real_init = redis.Redis.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counted)
    return made


def test_forty_task_messages_are_sent_with_one_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        app = relay.celery
        queue = relay.queues.tools
        with app.producer_or_acquire() as producer:
            assert isinstance(producer.channel, KeptClientChannel)
            app.send_task("relay.run_tool", args=["warm"], queue=queue, producer=producer)
            made = _count_clients(monkeypatch)
            for n in range(40):
                app.send_task("relay.run_tool", args=[f"r{n}"], queue=queue, producer=producer)
        # (kombu's own channel makes one for each message and one for each task event.)
        assert made == [], len(made)
        plain = redis.Redis.from_url(server.url)
        assert plain.llen(queue) == 41
        plain.close()
        # What the worker's banner and Flower show of the broker is kombu's own URL.
        assert app.connection_for_write().as_uri() == f"redis://127.0.0.1:{server.port}/0"


def test_twenty_messages_are_taken_and_acknowledged_with_one_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        with relay.celery.connection_for_read() as connection:
            queue = connection.SimpleQueue("kept-client-check")
            for n in range(21):
                queue.put({"n": n})
            queue.get(timeout=5).ack()
            made = _count_clients(monkeypatch)
            taken = []
            for _ in range(20):
                message = queue.get(timeout=5)
                taken.append(message.payload["n"])
                message.ack()  # the unacked index's bookkeeping: a client each with kombu's
            queue.close()
        assert taken == list(range(1, 21))
        assert made == [], len(made)


def test_a_channel_makes_a_new_client_when_its_pool_is_replaced(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        with relay.celery.connection_for_write() as connection:
            channel = connection.default_channel
            first = channel._create_client()
            assert channel._create_client() is first
            channel._pool = None  # as kombu does when the channel's connections are dropped
            second = channel._create_client()
            assert second is not first
            assert second.connection_pool is channel.pool
            assert second.ping()
            # The event loop's own client is kombu's, made apart.
            assert channel._create_client(asynchronous=True) is not second


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("redis://127.0.0.1:1/0", True),
        ("rediss://127.0.0.1:1/0", True),
        ("sentinel://127.0.0.1:1", False),  # its own channel (SentinelChannel), as it is
        ("amqp://guest:guest@127.0.0.1:1//", False),
    ],
)
def test_only_a_plain_redis_transport_gets_the_kept_client(url: str, kept: bool) -> None:
    transport = RelayConnection(url).create_transport()  # no connection made yet
    assert (getattr(transport, "Channel", None) is KeptClientChannel) is kept
    assert isinstance(transport, kombu_redis.Transport) is not url.startswith("amqp")
