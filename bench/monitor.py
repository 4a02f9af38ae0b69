"""Every command Redis ran while a few runs went by, sorted by who asked for it.

`Monitor` runs `redis-cli monitor` (a subprocess, stopped by its pid) into a
file; `tally` reads it back. Commands are grouped by component: Relay's run
store (its Lua scripts by name, with the commands they run inside), the Celery
broker (publish, receive, the unacked bookkeeping of late acks), and Celery's
task events. Round trips are estimated: a command that follows the same
connection's previous line within `PIPELINE_GAP_S` went out in the same
pipeline (Redis ran it straight after, with no reply in between).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from workers.store import scripts

__all__ = ["Monitor", "Tally", "tally"]

PIPELINE_GAP_S = 60e-6
_LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] "([A-Za-z|]+)"(?: "((?:[^"\\]|\\.)*)")?(.*)$')
_TASK = re.compile(r'\\"task\\": \\"([a-z_.]+)\\"')
_SCRIPT_NAMES = {
    hashlib.sha1(scripts.lua(path.stem).encode()).hexdigest(): path.stem.upper()
    for path in (Path(scripts.__file__).parent / "lua").glob("*.lua")
}
_BROKER_KEYS = ("unacked", "unacked_index", "unacked_mutex", "_kombu.binding")


class Monitor:
    """`with Monitor(port, path):` records every command Redis runs meanwhile."""

    def __init__(self, port: int, path: Path) -> None:
        self.port = port
        self.path = path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Monitor:
        with self.path.open("wb") as out:
            self.process = subprocess.Popen(
                ["redis-cli", "-p", str(self.port), "monitor"], stdout=out
            )
        time.sleep(0.3)  # let MONITOR take hold before the work starts
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        time.sleep(0.3)
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)


_COUNTERS = ("commands", "inner", "inner_commands", "round_trips", "messages")


@dataclass
class Tally:
    """Commands by component and name, Lua's inner commands by script, round trips by component."""

    commands: Counter[str] = field(default_factory=Counter)
    """'component: COMMAND' -> count (top-level commands only)."""
    inner: Counter[str] = field(default_factory=Counter)
    """script name -> commands run inside it."""
    inner_commands: Counter[str] = field(default_factory=Counter)
    """command name (lower case, as INFO commandstats names it) -> times run inside a script."""
    round_trips: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    """task name -> messages published (LPUSH)."""
    bytes: Counter[str] = field(default_factory=Counter)
    """component -> bytes of the top-level commands' arguments (MONITOR's escapes undone)."""
    command_bytes: Counter[str] = field(default_factory=Counter)
    """'component: COMMAND' -> its bytes (`bytes` by command: a script's own, say)."""
    lost_saves: int = 0
    """SAVE scripts that found the version moved on (they run one command: HGET v)."""

    def minus(self, other: Tally) -> Tally:
        out = Tally()
        for name in (*_COUNTERS, "bytes", "command_bytes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            getattr(out, name).update({k: mine[k] - theirs.get(k, 0) for k in mine})
        out.lost_saves = self.lost_saves - other.lost_saves
        return out

    def scaled(self, factor: float) -> dict[str, dict[str, float]]:
        return {
            name: {k: round(v * factor, 2) for k, v in sorted(getattr(self, name).items()) if v}
            for name in (*_COUNTERS, "command_bytes")
        }


def _component(command: str, key: str) -> str:
    if key.startswith("bare:"):
        return "driver"
    if command in {"LPUSH", "BRPOP", "RPUSH", "BLPOP"}:
        return "broker"
    if command == "PUBLISH":
        return "heartbeat" if "worker.heartbeat" in key else "events"
    if command in {"MULTI", "EXEC"} or key in _BROKER_KEYS:
        return "broker"
    if command in {"INFO", "XREAD", "CLIENT", "PING"}:
        return "driver"
    return "store"


_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}|\\.")
_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _size(key: str, rest: str) -> int:
    """The bytes of a command's arguments as MONITOR quoted them (each escape one byte)."""
    arguments = [key, *_ARGUMENT.findall(rest)]
    return sum(len(_ESCAPE.sub("x", a).encode()) for a in arguments)


def _label(command: str, key: str) -> str:
    if command == "EVALSHA":
        return f"EVALSHA {_SCRIPT_NAMES.get(key, key[:8])}"
    if command == "SCRIPT":
        return f"SCRIPT {key}"
    return command


@dataclass
class _Reader:
    """The state of a pass over a MONITOR file."""

    out: Tally = field(default_factory=Tally)
    last: tuple[str, float] = ("", 0.0)
    """Who ran the previous line, and when."""
    script: str = ""
    inner_run: int = 0
    in_multi: set[str] = field(default_factory=set)

    def lua(self, when: float, command: str) -> None:
        self.out.inner[self.script] += 1
        self.out.inner_commands[command.lower()] += 1
        self.inner_run += 1
        self.last = (self.last[0], when)

    def command(self, when: float, client: str, command: str, key: str, rest: str) -> None:
        if self.script == "SAVE" and self.inner_run == 1:
            self.out.lost_saves += 1
        self.inner_run = 0
        component, label = _component(command, key), _label(command, key)
        if command == "EVALSHA":
            self.script = label.removeprefix("EVALSHA ")
        self.out.commands[f"{component}: {label}"] += 1
        size = _size(key, rest)
        self.out.bytes[component] += size
        self.out.command_bytes[f"{component}: {label}"] += size
        if not self._pipelined(when, client, command):
            self.out.round_trips[component] += 1
        if command == "LPUSH":
            task = _TASK.search(rest)
            self.out.messages[task.group(1) if task else "?"] += 1
        self.last = (client, when)

    def _pipelined(self, when: float, client: str, command: str) -> bool:
        """Whether this command went out with the previous one (no reply in between)."""
        pipelined = client == self.last[0] and when - self.last[1] <= PIPELINE_GAP_S
        if command == "MULTI":
            self.in_multi.add(client)
        elif client in self.in_multi:
            pipelined = True
            if command == "EXEC":
                self.in_multi.discard(client)
        return pipelined


def tally(path: Path, skip_clients: frozenset[str] = frozenset()) -> Tally:
    """Read a MONITOR file into a `Tally` (commands of `skip_clients` addresses left out)."""
    reader = _Reader()
    for line in path.read_text(errors="replace").splitlines():
        found = _LINE.match(line)
        if found is None:
            continue
        at, client, command, key, rest = found.groups()
        when = float(at)
        if client == "lua":
            reader.lua(when, command)
        elif client in skip_clients:
            reader.last = (client, when)
        else:
            reader.command(when, client, command.upper(), key or "", rest)
    return reader.out
