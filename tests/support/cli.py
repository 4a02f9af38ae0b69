"""Running the `relay` command as a person would: in a subprocess, a pipe or a terminal.

`clean_env()` is the test process's environment without any RELAY_* variable (but those
of `KEPT`, which CI sets for a whole pass),
so a command sees only what a test gives it. `marked()` adds a unique marker
variable that every child inherits; `left_running(marker)` finds any process
still carrying it, which is how tests prove the embedded Redis and worker are gone.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "ROOT",
    "Background",
    "Terminal",
    "clean_env",
    "left_running",
    "marked",
    "relay",
    "relay_args",
    "wait_until_gone",
]

ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\r")


KEPT = ("RELAY_INLINE_MS",)
"""Variables CI sets for a whole pass (continuation off), which every worker must see."""


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k in KEPT or not k.startswith(("RELAY_", "FLOWER_"))
    }
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}


def marked(env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    marker = f"relay-test-{uuid.uuid4().hex}"
    return {**env, "RELAY_TEST_MARKER": marker}, marker


def relay_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "workers.cli", *args]


def relay(
    *args: str, env: Mapping[str, str], timeout: float = 120, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run `relay ARGS` to the end with no terminal (stdin is /dev/null)."""
    return subprocess.run(
        relay_args(*args),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def left_running(marker: str) -> list[str]:
    """Return 'pid: command' for every live process whose environment holds `marker`."""
    found = []
    needle = f"RELAY_TEST_MARKER={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(f"{entry.name}: {command.strip()}")
    return found


def wait_until_gone(marker: str, timeout: float = 10) -> list[str]:
    """Return what still runs with `marker` after up to `timeout` seconds (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = left_running(marker)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


class Background:
    """`relay ARGS` running with no terminal, its stdout and stderr gathered as they come."""

    def __init__(self, *args: str, env: Mapping[str, str], cwd: Path = ROOT) -> None:
        self.process = subprocess.Popen(
            relay_args(*args),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_interruptible,  # noqa: PLW1509 - only a signal disposition is set
        )
        self._lock = threading.Lock()
        self._text = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self._text += line

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """Wait for `pattern` (a regex) in the output; return its match."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.text)) is None:
            if time.monotonic() > deadline or (
                self.process.poll() is not None and not self._reader.is_alive()
            ):
                raise AssertionError(f"no {pattern!r} in the output:\n{self.text}")
            time.sleep(0.05)
        return found

    def wait(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


class Terminal:
    """`relay ARGS` on a pseudo-terminal of its own, as if typed into a shell."""

    def __init__(self, *args: str, env: Mapping[str, str], cwd: Path = ROOT) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.text = ""
        self.process = subprocess.Popen(
            relay_args(*args),
            env={**env, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"},
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_take_terminal,  # noqa: PLW1509 - the test process starts no threads here
        )
        os.close(slave)

    def read(self, seconds: float = 0.1) -> str:
        """Read what the command wrote meanwhile; return all of it so far, without ANSI codes."""
        ready, _, _ = select.select([self.master], [], [], seconds)
        if ready:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the other side closed
                chunk = b""
            self.text += _ANSI.sub("", chunk.decode(errors="replace"))
        return self.text

    def expect(self, needle: str, timeout: float = 60) -> str:
        """Read until `needle` shows; fail if it does not within `timeout` or relay exits first."""
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {needle!r} in {timeout} s; the terminal shows:\n{self.text}"
                )
            exited = self.process.poll() is not None
            before = len(self.text)
            self.read()
            if exited and len(self.text) == before and needle not in self.text:
                raise AssertionError(f"relay exited before {needle!r}:\n{self.text}")
        return self.text

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.read()
        code = self.process.wait(max(0.1, deadline - time.monotonic()))
        for _ in range(20):  # drain what is left
            before = len(self.text)
            self.read(0.05)
            if len(self.text) == before:
                break
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)


def _interruptible() -> None:
    """Let SIGINT interrupt the child whatever the test process inherited.

    A shell starts a background job (`pytest ... &`) with SIGINT ignored, which
    its children inherit and Python keeps: `relay` would then never see Ctrl-C.
    The tests are about what a person's Ctrl-C does, so the child starts as a
    foreground command would.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _take_terminal() -> None:
    """Make the pty the child's controlling terminal, so Ctrl-C reaches it as SIGINT."""
    _interruptible()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
