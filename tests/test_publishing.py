"""A batch's task messages go to a Redis broker in one round trip (`celery_app.sending`).

A private Redis, watched with MONITOR while the runtime's `send` publishes a
batch: kombu alone would read the exchange's bindings and push once per message.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers import Settings
from workers.engine.effects import Message

_LINE = re.compile(r'^\S+ \[\d+ (?P<client>\S+)\] "(?P<command>\w+)"')


@contextmanager
def monitored(port: int, path: Path) -> Iterator[None]:
    with path.open("wb") as out:
        process = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=out)
    try:
        time.sleep(0.3)  # MONITOR takes hold before the work starts
        yield
        time.sleep(0.3)
    finally:
        process.terminate()
        process.wait(10)


def _commands(path: Path) -> list[tuple[str, str]]:
    found = (_LINE.match(line) for line in path.read_text().splitlines())
    return [(m["client"], m["command"].upper()) for m in found if m]


def test_a_batch_of_eight_is_published_in_one_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        batch = [Message("run_tool", "r1", call=f"call-{n}", tool="sleep") for n in range(8)]
        relay.runtime.send(batch[:1])  # the broker connection made, the queue declared
        writes = _count_writes(monkeypatch)
        watched = tmp_path / "monitor.txt"
        with monitored(server.port, watched):
            relay.runtime.send(batch)
        # One write (kombu alone: an LPUSH and a PUBLISH per message, each awaited in turn).
        assert len(writes) == 1, writes
        commands = _commands(watched)
        pushes = [client for client, name in commands if name == "LPUSH"]
        assert len(pushes) == 8, commands
        assert len(set(pushes)) == 1, commands
        # Each message's task-sent event (Flower's) went in the same pipeline.
        events = [client for client, name in commands if name == "PUBLISH"]
        assert events == pushes, commands
        client = redis.Redis.from_url(server.url)
        try:
            assert client.llen(relay.queues.tools) == 9
        finally:
            client.close()


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Note each write of commands to a Redis socket from now on (a pipeline is one)."""
    writes: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        writes.append(1)
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return writes


def test_nothing_to_send_touches_no_broker(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": server.url}))
        relay.runtime.send([Message("advance", "r1")])
        watched = tmp_path / "monitor.txt"
        with monitored(server.port, watched):
            relay.runtime.send([])
        assert _commands(watched) == []
