"""Processes the benchmarks start and stop (by their own process group), and Redis counters.

`Worker` runs a `relay worker` or a bare `celery worker` in its own session,
logging to a file, and stops exactly that process group. `Counters` reads
what Redis says it did (`INFO commandstats`, bytes in and out, memory), so a
benchmark can take the difference over a window.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from workers.processes import stop_group

__all__ = ["Counters", "Worker", "bare_worker", "cpu_seconds", "relay_worker", "session_pids"]

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def session_pids(leader: int) -> list[int]:
    """The processes of the session `leader` started (a worker and its pool's children)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == leader:  # (after the name: state, ppid, pgrp, session)
            found.append(int(entry))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time (user and system) the processes `pids` have used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


class Worker:
    """A worker process in its own session; `stop()` ends its process group only."""

    def __init__(self, command: list[str], env: Mapping[str, str], log: Path) -> None:
        self.command = command
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, ready: str = "ready.", timeout: float = 90) -> Worker:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while ready not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready in {timeout} s:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def cpu_s(self) -> float:
        """The CPU time its processes (the pool's children too) have used so far."""
        return cpu_seconds(session_pids(self.pid))

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        self.process = None
        stop_group(process, 20)

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def relay_worker(env: Mapping[str, str], log: Path, name: str, *args: str) -> Worker:
    """A `relay worker` for `bench.app:relay` (all queues unless `args` say otherwise)."""
    command = [sys.executable, "-c", "from workers.cli import main; main()"]
    command += ["--app", "bench.app:relay", "worker", "--loglevel", "INFO"]
    command += ["--hostname", f"{name}@bench", *args]
    return Worker(command, env, log)


def bare_worker(env: Mapping[str, str], log: Path, name: str, *args: str) -> Worker:
    """A plain `celery worker` for `bench.bare:app` (its queue from BENCH_QUEUE and `-Q`)."""
    command = [sys.executable, "-m", "celery", "-A", "bench.bare:app", "worker"]
    command += ["--loglevel=INFO", f"--hostname={name}@bench", *args]
    return Worker(command, env, log)


@dataclass
class Counters:
    """What Redis had done at one moment: calls and µs per command, bytes, memory."""

    at: float
    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    used_memory: int = 0
    cpu_usec: int = 0
    """The CPU time of Redis's main thread (where every command runs), user and system:
    what commands cost, and reading and writing their sockets besides."""

    @classmethod
    def read(cls, client: Any) -> Counters:
        stats = client.info("commandstats")
        counters = cls(at=time.monotonic())
        for name, value in stats.items():
            command = name.removeprefix("cmdstat_")
            counters.calls[command] = int(value["calls"])
            counters.usec[command] = int(value["usec"])
        info = client.info("stats")
        counters.bytes_in = int(info["total_net_input_bytes"])
        counters.bytes_out = int(info["total_net_output_bytes"])
        counters.used_memory = int(client.info("memory")["used_memory"])
        cpu = client.info("cpu")
        main = cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]
        counters.cpu_usec = round(float(main) * 1_000_000)
        return counters

    def since(self, before: Counters) -> Counters:
        """Return the difference `self - before`, less the INFO calls that measured it."""
        delta = Counters(at=self.at - before.at)
        for command, calls in self.calls.items():
            grew = calls - before.calls.get(command, 0)
            if command == "info":
                grew -= 4  # the four INFO calls of one `read`
            if grew > 0:
                delta.calls[command] = grew
                delta.usec[command] = self.usec[command] - before.usec.get(command, 0)
        delta.bytes_in = self.bytes_in - before.bytes_in
        delta.bytes_out = self.bytes_out - before.bytes_out
        delta.used_memory = self.used_memory - before.used_memory
        delta.cpu_usec = self.cpu_usec - before.cpu_usec
        return delta

    def less(self, background: Counters, seconds: float) -> Counters:
        """Return this window less what `background` (an idle window) does in `seconds`."""
        scale = seconds / background.at if background.at > 0 else 0.0
        out = Counters(at=self.at, used_memory=self.used_memory)
        for command, calls in self.calls.items():
            idle = background.calls.get(command, 0) * scale
            out.calls[command] = max(0, round(calls - idle))
            idle_usec = background.usec.get(command, 0) * scale
            out.usec[command] = max(0, round(self.usec[command] - idle_usec))
        out.bytes_in = max(0, round(self.bytes_in - background.bytes_in * scale))
        out.bytes_out = max(0, round(self.bytes_out - background.bytes_out * scale))
        out.cpu_usec = max(0, round(self.cpu_usec - background.cpu_usec * scale))
        return out

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def total_usec(self) -> int:
        return sum(self.usec.values())
