"""A private Redis Cluster on loopback: three masters with one replica each.

Six `redis-server --cluster-enabled yes` processes on free ports in a temporary
directory, joined by `redis-cli --cluster create ... --cluster-replicas 1`, with a
short `cluster-node-timeout` so that a killed master's replica takes over in a
second or two. One cluster serves a whole test session (`redis_cluster` fixture);
each fleet on it keeps to a key prefix of its own. Every process is stopped by its
pid at the end; the machine's Redis (6379) is never touched.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from tests.support.redis_server import RedisServer

__all__ = ["NODE_TIMEOUT_MS", "Cluster", "redis_cluster"]

NODE_TIMEOUT_MS = 3_000
"""How long a master may be silent before its replica is elected in its place: short, so
the failover test is quick, but not so short that a node starved of CPU on a busy CI
machine is taken for dead (a failover nobody asked for loses the last writes)."""


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports (all held at once while they are picked)."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


class Cluster:
    """Three masters and three replicas; `url` names one master (a client learns the rest)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.nodes: list[RedisServer] = []
        ports = _free_ports(12)
        for port, bus in zip(ports[:6], ports[6:], strict=True):
            node = RedisServer(directory)
            node.port = port
            node.extra = (
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{node.port}.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # A replica takes over however long ago it last heard from its master.
                "--cluster-replica-validity-factor", "0",
                # The bus port is given, not port + 10000 (which may be past 65535).
                "--cluster-port", str(bus),
            )  # fmt: skip
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not on the PATH")
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        self.wait_synced()
        return self

    def wait_synced(self, timeout: float = 30) -> None:
        """Wait until every live replica has its master's data (its link is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            links = []
            for node in self.nodes:
                if node.process is None:
                    continue
                client = node.client()
                info = client.info("replication")
                client.close()
                if info["role"] == "slave":
                    links.append(info.get("master_link_status") == "up")
            if len(links) >= 2 and all(links):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster's replicas did not catch up")

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until every live node says `cluster_state:ok` and sees three masters."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._ok(node) for node in self.nodes if node.process is not None):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        client = node.client()
        try:
            info = client.execute_command("CLUSTER INFO")  # parsed: {"cluster_state": "ok", ...}
            nodes = client.execute_command("CLUSTER NODES")  # {address: {"flags": ...}}
        except redis.RedisError:
            return False
        finally:
            client.close()
        flags = [str(node["flags"]) for node in nodes.values()]
        masters = [f for f in flags if "master" in f and "fail" not in f]
        return info.get("cluster_state") == "ok" and len(masters) == 3

    def master_of(self, key: str) -> RedisServer:
        """The node serving the slot of `key` now."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            try:
                ranges = client.execute_command("CLUSTER SLOTS")
            except redis.RedisError:
                continue
            finally:
                client.close()
            for start, end, master, *_ in ranges:
                if start <= slot <= end:
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no node serves slot {slot}")

    def key_count(self) -> int:
        """Keys held by the masters now, all together."""
        count = 0
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            if client.execute_command("ROLE")[0] in (b"master", "master"):
                count += int(client.dbsize())
            client.close()
        return count

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One private cluster for the session (about two seconds to start)."""
    cluster = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
