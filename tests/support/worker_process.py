"""Real `relay worker` processes for runtime tests, in their own process groups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from workers.processes import kill_group, stop_group

__all__ = ["RelayProcess"]

ROOT = Path(__file__).resolve().parents[2]


class RelayProcess:
    """A `relay ...` command running in the background; its output goes to a log file.

    `start()` waits until the output contains `ready_text`. `kill()` sends
    SIGKILL to the whole process group (the worker and its pool children).
    """

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        ready_text: str = "ready.",
        python_args: bool = False,
    ) -> None:
        self.args = args
        self.python_args = python_args
        """`args` are the Python interpreter's (e.g. `-m celery ...`), not `relay`'s."""
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.log_path = log_path
        self.ready_text = ready_text
        self.process: subprocess.Popen[bytes] | None = None
        self._log = None

    def start(self, timeout: float = 60) -> RelayProcess:
        relay = ["-c", "from workers.cli import main; main()"]
        command = [sys.executable, *([] if self.python_args else relay), *self.args]
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            env=self.env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if self.ready_text:
            self._wait_for(self.ready_text, timeout)
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"relay exited early:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"relay did not print {text!r} in {timeout} s:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crashed machine would."""
        if self.process is not None:
            kill_group(self.process)

    def stop(self) -> None:
        if self.process is None:
            return
        stop_group(self.process, 15)
        if self._log is not None:
            self._log.close()
        self.process = None

    def __enter__(self) -> RelayProcess:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
