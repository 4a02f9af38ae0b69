"""A Redis broker channel that keeps one redis-py client, not a new one for every command.

Why: kombu's Redis channel (5.x) builds a fresh `redis.Redis` over its pool for
every command it sends outside its event loop: each task message (`_put`), each
task event (`_put_fanout`), and the worker's bookkeeping of every message it takes
and acknowledges (`QoS.append`, `QoS.ack`). redis-py 6 fills a table of some two
hundred reply callbacks in each one: about 60 µs of CPU, several times a step.
Under `bench/many.py`'s load that was 4-7 % of a worker's CPU (py-spy).

A redis-py client is safe to share between threads: each command takes a
connection from the pool and gives it back. So the channel keeps the client it
made, and makes another only when its pool is replaced (kombu drops the pool when
the channel closes). Nothing else of kombu's changes: the same pool, the same
commands, the same errors.

`RelayAMQP` gives a Celery app connections whose Redis transport uses this channel
(`Celery(..., amqp=RelayAMQP)`); the broker URL and what Flower and the worker's
banner show of it stay kombu's own. A Sentinel transport, with a channel of its
own, is left as it is.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP
from kombu import Connection
from kombu.connection import ConnectionPool, PooledConnection
from kombu.transport import redis as kombu_redis

__all__ = ["KeptClientChannel", "RelayAMQP", "RelayConnection"]


class KeptClientChannel(kombu_redis.Channel):
    """kombu's Redis channel, its plain (not event-loop) client made once per pool."""

    _kept: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the loop's own client: kombu caches it already
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool
        kept = self._kept
        if kept is None or kept.connection_pool is not pool:
            kept = self._kept = super()._create_client()  # type: ignore[misc]
        return kept


def _kept_clients(transport: Any) -> Any:
    """Have `transport` make `KeptClientChannel`s if it is kombu's plain Redis one."""
    if type(transport) is kombu_redis.Transport:  # not Sentinel, not RabbitMQ
        transport.Channel = KeptClientChannel
    return transport


class RelayConnection(Connection):
    """A kombu connection whose plain Redis transport makes `KeptClientChannel`s, as do
    the connections of its pool (which Celery's producers are taken from)."""

    def create_transport(self) -> Any:
        return _kept_clients(super().create_transport())

    def Pool(self, limit: int | None = None, **kwargs: Any) -> Any:  # noqa: N802 - kombu's name
        return _Pool(self, limit=limit, **kwargs)


class _Pooled(PooledConnection, RelayConnection):  # type: ignore[misc]  # kombu: __enter__ typed apart
    """A connection of `_Pool`: kombu's pooled connection, with `RelayConnection`'s transport."""


class _Pool(ConnectionPool):
    def new(self) -> Any:
        # kombu's own `new`, with the pooled connection above in place of its own.
        return _Pooled(self, **dict(self.connection._info(resolve=False)))


class RelayAMQP(AMQP):
    """A Celery app's messaging, its broker connections `RelayConnection`s."""

    Connection = RelayConnection
