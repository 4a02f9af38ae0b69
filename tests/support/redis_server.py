"""A private redis-server on a free loopback port, which a test may kill and restart."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

__all__ = ["RedisServer", "free_port", "wait_for_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30) -> None:
    """Return once something listens on 127.0.0.1:`port`; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on 127.0.0.1:{port} within {timeout:g} s")


class RedisServer:
    """`with RedisServer(tmp_path) as server: server.url` — stopped (by its pid) on exit."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        password: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.appendonly = appendonly
        self.password = password
        self.extra = extra
        """More redis-server arguments, e.g. ("--replicaof", "127.0.0.1", "6380")."""
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        executable = shutil.which("redis-server")
        if executable is None:
            raise RuntimeError("redis-server is not on the PATH")
        self.executable = executable

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--dbfilename", f"dump-{self.port}.rdb",
            "--appendfilename", f"appendonly-{self.port}.aof",
            "--appenddirname", f"aof-{self.port}",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--loglevel", "warning",
            "--logfile", str(self.directory / f"redis-{self.port}.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.02)
            finally:
                client.close()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
