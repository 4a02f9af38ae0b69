"""Stopping a child process that runs in a session of its own, with everything it started.

Workers start pool children; stopping only the leader would leave them behind.
Each child is started with `start_new_session=True`, so its process group has
its pid, and is stopped by signalling that group. Used by the embedded
default (`workers.cli.embedded`), the tests' and the benchmarks' processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["kill_group", "stop_group"]


def stop_group(
    process: subprocess.Popen[bytes], grace: float, first: signal.Signals = signal.SIGTERM
) -> None:
    """Send `first` to the process's group, SIGKILL it if the leader outlives `grace`
    seconds, and kill what is left of the group (pool children) once the leader is gone."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, first)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(grace)
    # The group outlives its leader while any member lives, so its id is not reused.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def kill_group(process: subprocess.Popen[bytes], wait: float = 10) -> None:
    """SIGKILL the whole group at once, as a crashed machine would, and reap the leader."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(wait)
