"""A private vhost on the machine's RabbitMQ for one test, removed when the test ends.

The server itself is shared (127.0.0.1:5672, guest/guest, or RELAY_TEST_AMQP_URL):
each test gets a vhost of its own, so its queues, exchanges and messages are
its alone and go with the vhost. The vhost is made through the management API
when the plugin answers (port 15672), and with `rabbitmqctl` otherwise.

Without a RabbitMQ to reach, tests that need one are skipped, unless
RELAY_TEST_REQUIRE_AMQP=1 (CI sets it), which makes them fail instead.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlsplit

import httpx
import pytest

__all__ = ["AMQP_URL", "VHOSTS_MADE", "rabbit_vhost", "require_rabbitmq"]

AMQP_URL = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")
"""The shared server, without a vhost."""
MANAGEMENT_PORT = 15672
VHOSTS_MADE: list[str] = []
"""Every vhost made so far in this process (each deleted again), in order."""


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_rabbitmq() -> None:
    """Skip the test (fail it under RELAY_TEST_REQUIRE_AMQP=1) when RabbitMQ is not up."""
    parts = urlsplit(AMQP_URL)
    if _answers(parts.hostname or "127.0.0.1", parts.port or 5672):
        return
    message = f"no RabbitMQ at {parts.hostname}:{parts.port} (rabbitmq-server -detached starts one)"
    if os.environ.get("RELAY_TEST_REQUIRE_AMQP") == "1":
        pytest.fail(message)
    pytest.skip(message)


class _Management:
    """The management plugin's HTTP API."""

    def __init__(self, host: str, user: str, password: str) -> None:
        self.base = f"http://{host}:{MANAGEMENT_PORT}/api"
        self.auth = (user, password)
        self.user = user

    def add(self, vhost: str) -> None:
        name = quote(vhost, safe="")
        for path, body in (
            (f"/vhosts/{name}", {}),
            (f"/permissions/{name}/{quote(self.user, safe='')}", _EVERYTHING),
        ):
            httpx.put(self.base + path, json=body, auth=self.auth, timeout=10).raise_for_status()

    def delete(self, vhost: str) -> None:
        url = f"{self.base}/vhosts/{quote(vhost, safe='')}"
        httpx.delete(url, auth=self.auth, timeout=30).raise_for_status()


_EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


class _Ctl:
    """`rabbitmqctl`, on the machine that runs the server."""

    def __init__(self, user: str) -> None:
        executable = shutil.which("rabbitmqctl")
        if executable is None:
            raise RuntimeError("RabbitMQ's management API is off and rabbitmqctl is not on PATH")
        self.executable = executable
        self.user = user

    def _run(self, *args: str) -> None:
        subprocess.run([self.executable, "-q", *args], check=True, capture_output=True, timeout=60)

    def add(self, vhost: str) -> None:
        self._run("add_vhost", vhost)
        self._run("set_permissions", "-p", vhost, self.user, ".*", ".*", ".*")

    def delete(self, vhost: str) -> None:
        self._run("delete_vhost", vhost)


def _admin() -> _Management | _Ctl:
    parts = urlsplit(AMQP_URL)
    host, user = parts.hostname or "127.0.0.1", parts.username or "guest"
    if _answers(host, MANAGEMENT_PORT):
        return _Management(host, user, parts.password or "guest")
    return _Ctl(user)


@contextmanager
def rabbit_vhost() -> Iterator[str]:
    """Yield the broker URL of a new vhost on the shared RabbitMQ; delete the vhost after."""
    require_rabbitmq()
    admin = _admin()
    vhost = f"relay-test-{os.getpid()}-{secrets.token_hex(4)}"
    admin.add(vhost)
    VHOSTS_MADE.append(vhost)
    try:
        yield f"{AMQP_URL.rstrip('/')}/{quote(vhost, safe='')}"
    finally:
        admin.delete(vhost)
