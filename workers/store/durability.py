"""Durable claims (`RELAY_DURABLE_CLAIMS=1`): a claim that must survive a Redis crash.

A call that is not idempotent runs at most once because its claim counts the
attempt (`a:<call>`) before it runs; a redelivered message then sees a second
attempt and records "outcome unknown" instead of running it again. With AOF
`appendfsync everysec`, a Redis crash can forget the last second of writes, the
claim among them, and the redelivered message would run the call again. So with
durable claims on, a worker waits after such a claim until Redis says it is safe:

- Redis 7.2+ with `appendonly yes`: `WAITAOF 1 0` (on this server's disk);
- `appendonly yes` with `appendfsync always`: every write is on disk before Redis
  answers, so there is nothing to wait for;
- a connected replica: `WAIT 1` (on a replica, which takes over after a crash).

Otherwise the worker refuses to start, naming the Redis setting to change. The
cost is one more round trip (and an fsync or a replica's ack) per claim of a
non-idempotent call; idempotent calls and model calls never wait.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import redis

from workers.settings import SettingsError

__all__ = ["Durability", "probe", "wait_durable"]


class Durability(StrEnum):
    """How this Redis makes a write durable."""

    WAITAOF = "waitaof"
    FSYNC_ALWAYS = "fsync-always"
    REPLICA = "replica"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def probe(client: Any) -> Durability:
    """Return how `client`'s Redis can make a claim durable.

    Raises:
        SettingsError: it cannot (one line naming the setting to change).
        redis.RedisError: Redis cannot be reached.
    """
    info = client.info()
    version = str(info.get("redis_version", "0"))
    aof = int(info.get("aof_enabled", 0)) == 1
    if aof and _version(version) >= (7, 2):
        return Durability.WAITAOF
    if aof and _fsync_policy(client) == "always":
        return Durability.FSYNC_ALWAYS
    if _online_replicas(client) > 0:
        return Durability.REPLICA
    raise SettingsError(
        f"RELAY_DURABLE_CLAIMS: Redis {version} cannot make a claim durable: set"
        " `appendonly yes` and `appendfsync always` in its configuration (or run Redis"
        " 7.2+ with `appendonly yes`, or give it a replica)"
    )


def _online_replicas(client: Any) -> int:
    """Replicas that are in sync (one still loading its first copy cannot acknowledge)."""
    replication = client.info("replication")
    return sum(
        1
        for key, value in replication.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )


def _fsync_policy(client: Any) -> str:
    try:
        found = client.config_get("appendfsync")
    except redis.ResponseError:  # CONFIG renamed or refused (managed Redis)
        return "unknown"
    value = found.get("appendfsync", "")
    return value.decode() if isinstance(value, bytes) else str(value)


def wait_durable(
    client: Any, mode: Durability, run_key: str, attempts_field: str, timeout_ms: int
) -> bool:
    """Wait until the claim just made (and every write before it) is durable; False if
    Redis could not say so within `timeout_ms`.

    WAIT and WAITAOF cover the writes of the connection they run on, so a write on
    the same connection (`HINCRBY` of the attempt count by 0: it changes nothing,
    but it is replicated after the claim) goes first, in one pipeline.
    """
    if mode is Durability.FSYNC_ALWAYS:
        return True
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(run_key, attempts_field, 0)
    if mode is Durability.WAITAOF:
        pipe.execute_command("WAITAOF", 1, 0, timeout_ms)
    else:
        pipe.execute_command("WAIT", 1, timeout_ms)
    _, acknowledged = pipe.execute()
    if mode is Durability.WAITAOF:
        return int(acknowledged[0]) >= 1
    return int(acknowledged) >= 1
