"""Redis Cluster: the client, and the short hash tags that put an index shard in a slot.

On a cluster (`RELAY_REDIS_URL=redis+cluster://...` or `RELAY_REDIS_CLUSTER=1`)
every key of a run tree carries the tree's hash tag `{root}`, so one Lua script
only ever touches one slot; the fleet-wide indexes are cut into one shard per
hash slot, and a tree's entries go to the shard of its own slot (tagged with a
short text that hashes to that slot, `slot_tag`). `workers.store.layout` has the map.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import ClusterDownError, TryAgainError

__all__ = [
    "FAILOVER_S",
    "PatientCluster",
    "cluster_url",
    "connect",
    "connect_async",
    "key_slot",
    "node_client",
    "plain_url",
    "slot_tag",
]

FAILOVER_S = 10.0
"""How long a command waits for a failover: a dead master's slots answer nothing until
its replica is elected (after the cluster's `cluster-node-timeout`, then an election)."""

_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_url(url: str) -> bool:
    """True for a `redis+cluster://` (or `rediss+cluster://`) URL."""
    return urlsplit(url).scheme in _SCHEMES


def plain_url(url: str) -> str:
    """The URL redis-py understands: `redis://` for `redis+cluster://`, with no
    database (a cluster has only database 0)."""
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", parts.query, parts.fragment))


def connect_async(url: str, *, cluster: bool) -> Any:
    """The `redis.asyncio` client for run state, as `connect` makes the sync one (a
    cluster's async client follows failovers with redis-py's own retries)."""
    options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}
    if cluster or cluster_url(url):
        return AsyncRedisCluster.from_url(plain_url(url), **options)
    return AsyncRedis.from_url(url, health_check_interval=30, **options)


def connect(url: str, *, cluster: bool) -> Any:
    """A client for run state: a `RedisCluster` (it learns the other nodes from the one
    in the URL, and follows failovers), or a plain `Redis`."""
    options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": 30}
    if cluster or cluster_url(url):
        return PatientCluster.from_url(plain_url(url), **options)  # type: ignore[no-untyped-call]
    return redis.Redis.from_url(url, health_check_interval=30, **options)


class PatientCluster(RedisCluster):
    """A `RedisCluster` whose commands wait out a failover (up to FAILOVER_S).

    redis-py re-reads the slot map and retries at once, which is over before a
    replica is elected. Only what surely never ran is tried again: a refused
    connection, or a node saying its slots are down (CLUSTERDOWN, TRYAGAIN). A
    command cut off mid-way is not (it may have run); it fails as before, and the
    outbox sends its message again. Pipelines are not retried either.
    """

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        deadline, pause = time.monotonic() + FAILOVER_S, 0.05
        while True:
            try:
                return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except (ClusterDownError, TryAgainError, redis.ConnectionError) as error:
                never_sent = not isinstance(error, redis.ConnectionError) or (
                    "connecting to" in str(error)
                )
                if not never_sent or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1.0)


def node_client(client: Any, key: str | None = None) -> Any:
    """The plain client of the master serving `key` (any master for None) on a cluster,
    `client` itself on a single Redis: for what must run on one node's connection
    (WAIT covers the writes of the connection it runs on; INFO describes one server)."""
    if not isinstance(client, RedisCluster):
        return client
    cluster: Any = client  # redis-py leaves these methods unannotated
    node = cluster.get_node_from_key(key) if key else cluster.get_primaries()[0]
    return cluster.get_redis_connection(node)


@cache
def _tags() -> tuple[str, ...]:
    # The first hex numbers that land in each slot: found once per process, in about
    # a quarter of a second (315k CRCs), and only on a cluster.
    found: dict[int, str] = {}
    number = 0
    while len(found) < REDIS_CLUSTER_HASH_SLOTS:
        text = format(number, "x")
        found.setdefault(key_slot(text.encode()), text)
        number += 1
    return tuple(found[slot] for slot in range(REDIS_CLUSTER_HASH_SLOTS))


def slot_tag(slot: int) -> str:
    """A short text (at most five hex digits) whose hash slot is `slot`."""
    return _tags()[slot]
