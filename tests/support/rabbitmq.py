"""A private vhost on the machine's RabbitMQ for one test, removed when the test ends
(or, for a test of the server's own configuration, a private RabbitMQ node).

The server itself is shared (127.0.0.1:5672, guest/guest, or RELAY_TEST_AMQP_URL):
each test gets a vhost of its own, so its queues, exchanges and messages are
its alone and go with the vhost. The vhost is made through the management API
when the plugin answers (port 15672), and with `rabbitmqctl` otherwise.

Without a RabbitMQ to reach, tests that need one are skipped, unless
RELAY_TEST_REQUIRE_AMQP=1 (CI sets it), which makes them fail instead.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.support.redis_server import free_port

__all__ = ["AMQP_URL", "VHOSTS_MADE", "private_node", "rabbit_vhost", "require_rabbitmq"]

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


@contextmanager
def private_node(config: str) -> Iterator[tuple[str, int, int]]:
    """Run a RabbitMQ node of its own with `config` (rabbitmq.conf text); yield (node, port, pid).

    It listens on a free loopback port, keeps its data in a temporary folder, and
    is stopped (by its pid) and removed on exit. The machine's `rabbitmq-server`
    runs as the `rabbitmq` user: when the tests run as root, the folder is given
    to that user; other users cannot start one, and the test is skipped.
    """
    executable = shutil.which("rabbitmq-server")
    if executable is None or os.geteuid() != 0:
        message = "a RabbitMQ node of its own needs rabbitmq-server and root"
        if os.environ.get("RELAY_TEST_REQUIRE_AMQP") == "1":
            pytest.fail(message)
        pytest.skip(message)
    directory = Path(tempfile.mkdtemp(prefix="relay-rabbitmq-"))
    port, distribution = free_port(), free_port()
    node = f"relay-test-{port}@localhost"
    conf = directory / "rabbitmq.conf"
    conf.write_text(f"{config}\nlisteners.tcp.default = 127.0.0.1:{port}\n")
    owner = pwd.getpwnam("rabbitmq")
    for path in (directory, conf):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(distribution),
        "RABBITMQ_CONFIG_FILE": str(conf),
        "RABBITMQ_MNESIA_BASE": str(directory / "data"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(directory / "node.pid"),
    }
    with (directory / "out.log").open("wb") as out:
        launcher = subprocess.Popen(
            [executable],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file = directory / "node.pid"
    try:
        deadline = time.monotonic() + 60
        while not (_answers("127.0.0.1", port) and pid_file.exists()):
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((directory / "out.log").read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        _await_startup(node, directory)
        yield node, port, int(pid_file.read_text().strip())
    finally:
        _stop_node(launcher, pid_file)
        shutil.rmtree(directory, ignore_errors=True)


def _await_startup(node: str, directory: Path) -> None:
    """Wait until the node's `rabbit` app has started, not only its port: a port that
    answers comes first, and a health check asked between the two fails (as in CI once).
    """
    ctl = shutil.which("rabbitmqctl") or "rabbitmqctl"
    waited = subprocess.run(
        [ctl, "-n", node, "await_startup", "--timeout", "60"],
        capture_output=True,
        timeout=90,
        check=False,
    )
    if waited.returncode != 0:
        said = (waited.stdout + waited.stderr).decode(errors="replace")[-1500:]
        log = (directory / "out.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"node {node} did not start: {said}\n{log}")


def _stop_node(launcher: subprocess.Popen[bytes], pid_file: Path) -> None:
    """Stop the node by the pid it wrote (the launcher's `su` runs it in a session of its
    own), then its launcher."""
    if pid_file.exists():
        pid = int(pid_file.read_text().strip())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        launcher.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
