"""Where a worker's time goes: py-spy samples of one process, sorted into named parts.

`Spy(pid, path)` runs `py-spy record` (raw collapsed stacks, idle samples
included, one line per thread) and stops it with SIGINT. `breakdown` assigns
each sample of the worker's main thread to the innermost frame that names a
part of a step (a run-store call, restoring the agent, sending a message, the
broker's bookkeeping, ...) and to the kind of work at the very top of the stack
(waiting on Redis, pydantic, json, the agent core, ...). Samples of the helper
thread that runs a model or tool call are counted apart.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["IDLE", "Breakdown", "Spy", "breakdown", "py_spy"]

IDLE = "idle: waiting for the next message"
_FRAME = re.compile(r"^(.*) \((.*?):\d+\)$")

# (file part, function pattern, part name): the innermost frame that matches names the part.
_PARTS: list[tuple[str, str, str]] = [
    ("kombu/utils/eventio.py", "poll", IDLE),
    ("workers/runtime/leases.py", "run_leased", "call: start helper thread, wait for it"),
    ("workers/store/runs.py", r"RunStore\.(\w+)", "store.{0}"),
    ("workers/kit/agents.py", "restore", "restore agent from snapshot"),
    ("workers/engine/decide.py", r"^decide$", "engine decide (apply events, next step)"),
    ("celery/events/", "", "Celery task events (PUBLISH)"),
    ("celery/app/base.py", "send_task", "send message (send_task)"),
    ("workers/runtime/steps.py", "", "runtime (other)"),
    ("workers/runtime/calls.py", "", "runtime (other)"),
    ("kombu/transport/redis.py", r"QoS\.(ack|reject)", "Celery ack (unacked index)"),
    ("kombu/message.py", r"Message\.ack", "Celery ack (unacked index)"),
    ("kombu/transport/redis.py", r"QoS\.append", "Celery receive (unacked index)"),
    ("kombu/transport/redis.py", r"_brpop", "Celery receive (BRPOP)"),
    ("logging/", "", "Celery logging (task received/succeeded lines)"),
]

# Used only when no frame of the stack matches a rule above.
_FALLBACK: list[tuple[str, str, str]] = [
    ("celery/app/trace.py", "", "Celery task tracing (other)"),
    ("celery/worker/", "", "Celery worker (other)"),
    ("kombu/", "", "Celery worker (other)"),
]

_KINDS: list[tuple[str, str]] = [
    ("httpcore/_backends/", "waiting on the model server"),
    ("redis/_parsers/", "waiting on Redis"),
    ("redis/connection.py", "waiting on Redis"),
    ("socket.py", "socket"),
    ("pydantic", "pydantic"),
    ("json/", "json"),
    ("agent_core/", "agent core"),
    ("redis/", "redis-py"),
    ("threading.py", "threading"),
    ("httpx/", "httpx"),
    ("httpcore/", "httpx"),
    ("celery/", "celery/kombu"),
    ("kombu/", "celery/kombu"),
    ("workers/", "relay"),
]


def py_spy() -> str | None:
    """Return the py-spy executable beside this Python, or on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Spy:
    """`with Spy(pid, path, rate):` samples the process meanwhile."""

    def __init__(self, pid: int, path: Path, rate: int = 500) -> None:
        self.pid = pid
        self.path = path
        self.rate = rate
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Spy:
        executable = py_spy()
        if executable is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        command = [executable, "record", "--pid", str(self.pid), "--rate", str(self.rate)]
        command += ["--nonblocking", "--idle", "--threads", "--format", "raw"]
        command += ["-o", str(self.path)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # attached and sampling
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(60)


@dataclass
class Breakdown:
    """Samples by part and by (part, kind); `ms(n)` turns a count into ms per unit of work."""

    rate: int
    parts: Counter[str] = field(default_factory=Counter)
    kinds: Counter[tuple[str, str]] = field(default_factory=Counter)
    helper: Counter[str] = field(default_factory=Counter)

    def ms(self, samples: int, units: int) -> float:
        return samples / self.rate * 1000 / max(units, 1)


def _frames(stack: str) -> list[tuple[str, str]]:
    frames = []
    for raw in stack.split(";")[1:]:
        found = _FRAME.match(raw)
        if found:
            frames.append((found.group(1), found.group(2)))
    return frames


def _part(frames: list[tuple[str, str]]) -> str:
    for rules in (_PARTS, _FALLBACK):
        for function, path in reversed(frames):
            for file_part, pattern, name in rules:
                if file_part not in path:
                    continue
                found = re.search(pattern, function) if pattern else None
                if pattern and found is None:
                    continue
                return name.format(*(found.groups() if found else ()))
    return "other (no Python frame, or unrecognised)"


def _kind(frames: list[tuple[str, str]]) -> str:
    if not frames:
        return "other"
    path = frames[-1][1]
    return next((kind for part, kind in _KINDS if part in path), "other")


def breakdown(path: Path, rate: int) -> Breakdown:
    """Read a raw py-spy file into a `Breakdown` of the worker's main thread and call thread."""
    out = Breakdown(rate)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        thread = stack.split(";", 1)[0]
        frames = _frames(stack)
        if thread.endswith("MainThread"):
            part = _part(frames)
            out.parts[part] += count
            out.kinds[(part, _kind(frames))] += count
        elif thread.endswith("relay-call"):
            out.helper[_helper_part(frames)] += count
    return out


def _helper_part(frames: list[tuple[str, str]]) -> str:
    kind = _kind(frames)
    if any("model_client.py" in path for _, path in frames):
        return f"model call: {kind}"
    if any("workers/kit/tools.py" in path or "bench/app.py" in path for _, path in frames):
        return "tool function"
    return f"helper thread: {kind}"
